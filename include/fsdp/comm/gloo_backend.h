// Gloo backend of ProcessGroup (the system's Gloo library, TCP transport), and its rendezvous.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/backend.h"
#include "fsdp/comm/process_group.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
namespace transport {
class Device;
}
}  // namespace gloo

namespace fsdp::comm {

/// Where and how the processes of a Gloo job meet (docs/notes.md, "Gloo backend").
struct GlooRendezvous {
  int rank = 0;        ///< this process, in [0, world_size)
  int world_size = 1;  ///< processes of the job
  /// Non-empty: a directory every rank can see, used as Gloo's file store (no TCP store).
  std::string file_store_dir;
  /// TCP store (c10d::TCPStore) address, used when file_store_dir is empty.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// Connect as a client to a store the launcher already serves (torchrun's agent store,
  /// TORCHELASTIC_USE_AGENT_STORE); false: rank 0 serves it.
  bool store_is_served = false;
  /// Prepended to every store key: torchrun's restart count, so that a restarted generation
  /// never reads the keys of the one before.
  std::string key_prefix = "fsdp/";
  /// Seconds to wait for every rank to reach the store and connect (from_env: FSDP_RENDEZVOUS_TIMEOUT_S,
  /// an integer in [1, 86400], when set).
  double connect_timeout_s = 300.0;

  /// From the torchrun environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (required),
  /// TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT (optional); or, when
  /// FSDP_GLOO_FILE_STORE names a directory, a file store with RANK and WORLD_SIZE; or, with
  /// neither RANK nor WORLD_SIZE set and no launcher at all, a job of one process over a TCP store
  /// on 127.0.0.1 at a free port. Throws fsdp::Error (kInvalidArgument) naming the variable that
  /// is missing or malformed, or naming the MPI launcher that started this process without them.
  static GlooRendezvous from_env();
};

/// The name of the first MPI launcher variable set in this process's environment
/// (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK), or nullptr when none is: an MPI launcher started
/// it. Read it before MPI_Init: a singleton MPI_Init in a process started by hand sets PMIX_RANK.
const char* mpi_launcher_variable();

/// Outside an MPI launcher, RANK and WORLD_SIZE are both set or both unset (read as the rendezvous
/// reads them: an empty value is unset). Throws fsdp::Error (kInvalidArgument) naming the one
/// that is missing: a launch half set up by hand would otherwise train as jobs of one rank.
void check_rank_and_world_size_paired();

/// True when this process was started by torchrun (or any launcher that sets RANK and WORLD_SIZE
/// the same way) and not by an MPI launcher (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK unset).
bool torchrun_environment();

/// The group of all processes over Gloo, named "world". Collective: every process of the job
/// calls it once, before any other fsdp-cpp collective; blocks until every rank has connected
/// (rendezvous.connect_timeout_s, then fsdp::Error kind kTimeout). Throws fsdp::Error
/// (kUnsupported) when the Gloo symbols of this process do not come from the system's Gloo library
/// (check_gloo_binding).
ProcessGroupPtr gloo_world(const GlooRendezvous& rendezvous = GlooRendezvous::from_env(),
                           const ProcessGroupOptions& options = ProcessGroupOptions::from_env());

/// Checks that this process calls the Gloo library its headers came from: libtorch exports a
/// Gloo of its own (another version, another ABI), and the system's must come first on the link
/// line. Throws fsdp::Error (kUnsupported) naming the library the symbols resolved to.
void check_gloo_binding();

/// Backend over one Gloo context (full mesh of TCP pairs). Tensors live on the CPU.
///
/// Collectives map to Gloo's: all_gather -> gloo::allgather, all_reduce -> gloo::allreduce (ring:
/// every segment is reduced on one rank and copied to the others, so every rank holds bitwise the
/// same result), all_to_all -> gloo::alltoall, broadcast, barrier. Gloo has no reduce-scatter of
/// one block per rank: reduce_scatter runs an all-to-all of the blocks and sums the size() blocks
/// received in rank order (deterministic; the cost is in docs/notes.md). bfloat16/float16 travel as
/// raw bytes (ProcessGroup reduces them in float32). Every op gets the time left to
/// Backend::deadline_s() as Gloo's timeout; Gloo waits on condition variables, not spinning. A
/// Gloo failure becomes fsdp::Error kCollective, a wait past the deadline kTimeout; either leaves
/// the context unusable. split() rendezvous a new context through the same store under a fresh key
/// prefix. abort_job ends this process (std::_Exit): the launcher (torchrun) then ends the others.
class GlooBackend final : public Backend {
 public:
  /// Collective over the `size` ranks meeting in `store` under `prefix`: connects the full mesh,
  /// then learns every rank's host (all-gather of host names).
  GlooBackend(std::shared_ptr<gloo::rendezvous::Store> store, std::shared_ptr<gloo::transport::Device> device,
              std::string prefix, int rank, int size, double connect_timeout_s);
  ~GlooBackend() override;

  std::string name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  c10::DeviceType device_type() const override { return c10::DeviceType::CPU; }
  /// Gloo counts bytes in size_t; one tensor is held to INT32_MAX elements as under MPI.
  int64_t max_elements() const override;
  /// Ranks with the same host name (gethostname) are one host.
  const std::vector<int>& host_of_ranks() const override { return host_of_ranks_; }

  void all_gather(const at::Tensor& output, const at::Tensor& input) override;
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) override;
  void all_reduce(const at::Tensor& tensor, ReduceOp op) override;
  void all_to_all(const at::Tensor& output, const at::Tensor& input) override;
  void broadcast(const at::Tensor& tensor, int root) override;
  void barrier() override;
  std::unique_ptr<Backend> split(int color, int key) override;
  /// Collective over this backend's ranks: a second context over the same store and device
  /// (same ranks, same order, its own TCP pairs) under the key prefix prefix + "control<k>/",
  /// for ProcessGroup's control channel. Blocks until every rank has connected (the connect
  /// timeout, then fsdp::Error kTimeout); kCollective when the connection fails.
  std::unique_ptr<Backend> make_control_channel() override;
  [[noreturn]] void abort_job(int code) override;

 private:
  // Connects like the public constructor; the ranks' hosts are given (no all-gather).
  GlooBackend(std::shared_ptr<gloo::rendezvous::Store> store, std::shared_ptr<gloo::transport::Device> device,
              std::string prefix, int rank, int size, double connect_timeout_s, std::vector<int> host_of_ranks);
  // Connects the full mesh under prefix_ (collective; the connect timeout).
  void connect();

  // Runs one Gloo call with the time left to the deadline, turning Gloo's exceptions into
  // fsdp::Error naming `op`.
  template <typename F>
  void run(const char* op, F&& call);

  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::string prefix_;
  int rank_ = 0;
  int size_ = 1;
  double connect_timeout_s_ = 300.0;
  int splits_ = 0;  // split() calls so far: each new context's key prefix
  int controls_ = 0;  // make_control_channel() calls so far: each control context's key prefix
  std::shared_ptr<gloo::Context> context_;
  std::vector<int> host_of_ranks_;
};

}  // namespace fsdp::comm
