// MPI backend of ProcessGroup (Open MPI or any MPI-3 library with MPI_THREAD_MULTIPLE).
#pragma once

#include <mpi.h>

#include "fsdp/comm/backend.h"
#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

/// Initialises MPI with MPI_THREAD_MULTIPLE if it is not initialised yet and registers
/// MPI_Finalize at exit. Throws fsdp::Error (kind kUnsupported) if the MPI library offers a lower
/// thread level. Idempotent; call before any other MPI use of the process.
void init_mpi();

/// Installs the JobChannel over MPI_COMM_WORLD (job_channel.h). Needs init_mpi() first; called by
/// mpi_world().
void install_mpi_job_channel();

/// The group of all processes (MPI_COMM_WORLD, duplicated), named "world". Calls init_mpi() first,
/// then install_mpi_job_channel().
/// Collective: every process calls it once, before any other fsdp-cpp collective.
ProcessGroupPtr mpi_world(const ProcessGroupOptions& options = ProcessGroupOptions::from_env());

/// Backend over one MPI communicator (owned: freed when the backend is destroyed, unless MPI is
/// already finalized). Tensors live on the CPU; at most INT_MAX elements per collective.
///
/// Threading: every ProcessGroup runs its ops on its own communication thread, and groups made by
/// split() may run at once, so MPI must provide MPI_THREAD_MULTIPLE (init_mpi). Errors: the
/// communicator uses MPI_ERRORS_RETURN and every return code becomes an fsdp::Error (kind
/// kCollective) naming the rank, the MPI call and the MPI error string. Collectives are started
/// non-blocking and completed by polling with short sleeps, so a waiting rank does not busy-spin
/// on a core its compute thread needs ([Note: polling] in mpi_backend.cpp).
class MpiBackend final : public Backend {
 public:
  /// Takes ownership of `comm` (a communicator of this process, e.g. from MPI_Comm_dup).
  /// Collective over `comm` (finds which ranks share a host).
  explicit MpiBackend(MPI_Comm comm);
  ~MpiBackend() override;

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
  int64_t max_elements() const override;
  /// Hosts as MPI sees them: ranks that share an MPI_COMM_TYPE_SHARED communicator (the same node
  /// of the launcher, hence shared memory between them) are one host.
  const std::vector<int>& host_of_ranks() const override { return host_of_ranks_; }
  MPI_Comm comm() const { return comm_; }

  void all_gather(const at::Tensor& output, const at::Tensor& input) override;
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  void all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  void all_to_all(const at::Tensor& output, const at::Tensor& input) override;
  void broadcast(const at::Tensor& tensor, int root) override;
  void barrier() override;
  std::unique_ptr<Backend> split(int color, int key) override;
  /// Collective over comm(): a backend over an MPI_Comm_dup of it (same ranks, same order, its
  /// own communication context), for ProcessGroup's control channel. Throws fsdp::Error
  /// (kCollective) when MPI_Comm_dup fails.
  std::unique_ptr<Backend> make_control_channel() override;
  [[noreturn]] void abort_job(int code) override;

 private:
  // Takes ownership of `comm`, whose ranks sit on `host_of_ranks` (known already: not collective
  // beyond what MPI_Comm_set_errhandler needs).
  MpiBackend(MPI_Comm comm, std::vector<int> host_of_ranks);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> host_of_ranks_;
};

}  // namespace fsdp::comm
