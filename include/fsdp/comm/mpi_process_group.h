// MPI backend of ProcessGroup (OpenMPI or any MPI-3 library with MPI_THREAD_MULTIPLE).
#pragma once

#include <mpi.h>

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

/// ProcessGroup over an MPI communicator. Tensors must be on the CPU.
///
/// Threading: every group runs its ops on its own communication thread, and groups made by split()
/// may run at once, so MPI is initialised with MPI_THREAD_MULTIPLE (init_mpi() throws if the MPI
/// library offers less). Errors: the communicator uses MPI_ERRORS_RETURN and every return code is
/// decoded into an fsdp::Error that names the rank, the op and the MPI error string.
class MpiProcessGroup final : public ProcessGroup {
 public:
  /// The group of all processes (MPI_COMM_WORLD, duplicated). Calls init_mpi() first. Collective:
  /// every process calls it once, before any other fsdp-cpp collective.
  static std::shared_ptr<MpiProcessGroup> world();

  /// Initialises MPI with MPI_THREAD_MULTIPLE if not yet initialised and registers MPI_Finalize at
  /// exit. Throws fsdp::Error if the library provides a lower thread level. Idempotent.
  static void init_mpi();

  ~MpiProcessGroup() override;
  std::string backend_name() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }

 private:
  MpiProcessGroup(MPI_Comm comm, std::shared_ptr<CommStats> stats);

  void run_all_gather(const at::Tensor& output, const at::Tensor& input) override;
  void run_reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  void run_all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  void run_broadcast(const at::Tensor& tensor, int root) override;
  void run_barrier() override;
  std::shared_ptr<ProcessGroup> run_split(int color, int key) override;

  MPI_Comm comm_;
};

}  // namespace fsdp::comm
