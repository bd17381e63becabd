// BlockingBackend (alias Backend): the transport under a ProcessGroup. It only moves and reduces
// bytes; validation, statistics and the collective check live in ProcessGroup, issue order, the
// communication thread and the deadline in its executor (src/comm/issue_order_executor.h).
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/comm_stats.h"

namespace fsdp::comm {

/// Reduction applied by reduce-scatter and all-reduce. kAvg divides the sum by the group size.
enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* to_string(ReduceOp op);

/// One rank's endpoint of a group of ranks in some transport (MPI, in-process threads, Gloo;
/// NCCL later), whose operations block the calling thread. Owned by exactly one ProcessGroup,
/// whose issue-order executor calls it from the group's communication thread only, one operation
/// at a time, in issue order, with arguments already validated:
///  - tensors are contiguous, on device_type(), with numel() <= max_elements();
///  - every (op, dtype) pair passes supports(); reductions (reduce_scatter, all_reduce) get op
///    kSum, kMax or kMin (ProcessGroup turns kAvg into kSum followed by a division, and reduces
///    bfloat16/float16 in float32 itself through all_to_all when supports() refuses them);
///  - all_gather, all_to_all and broadcast move raw bytes.
/// Every call blocks until the operation has completed on this rank and throws fsdp::Error (kind
/// kCollective) naming the op when the transport fails, or (kind kTimeout) when it has not
/// completed by deadline_s(), waiting without busy-spinning. Implementations need not be
/// thread-safe. The ProcessGroup wraps each call into a Work (work.h) for its caller.
class BlockingBackend {
 public:
  virtual ~BlockingBackend() = default;

  /// "mpi", "threaded", ...
  virtual std::string name() const = 0;
  /// This rank in the group, in [0, size()).
  virtual int rank() const = 0;
  /// Ranks in the group.
  virtual int size() const = 0;
  /// Where the tensors of this backend live (kCPU for MPI and threads).
  virtual c10::DeviceType device_type() const = 0;
  /// Largest numel() of one tensor argument (MPI counts are C ints).
  virtual int64_t max_elements() const = 0;
  /// The host of every rank of the group (element r: rank r's host), numbered 0, 1, ... in the
  /// order of each host's lowest rank. A host is what the transport treats as one machine (MPI:
  /// MPI_COMM_TYPE_SHARED, i.e. the launcher's node; threads: as configured). Not collective:
  /// known from construction on.
  virtual const std::vector<int>& host_of_ranks() const = 0;
  /// Whether this backend runs `kind` on tensors of `dtype` (ProcessGroup refuses any other pair
  /// with fsdp::Error kInvalidArgument on the calling thread, before anything is queued; kBarrier
  /// ignores the dtype). The default is what every CPU transport here (MPI, threads, Gloo) does:
  /// all_gather, all_to_all and broadcast of float32, float64, bfloat16, float16, int32, int64 and
  /// uint8 (raw bytes); reduce_scatter and all_reduce of float32, float64, int32 and int64
  /// (bfloat16/float16 reductions are ProcessGroup's, over all_to_all). A backend that reduces
  /// bfloat16/float16 itself (NCCL) returns true for those, and ProcessGroup then calls it.
  virtual bool supports(CollectiveKind kind, c10::ScalarType dtype) const;

  /// output (size() * n elements) = concat over ranks r of rank r's input (n elements).
  virtual void all_gather(const at::Tensor& output, const at::Tensor& input) = 0;
  /// output (n) = reduce over ranks of input[rank*n : (rank+1)*n] (input: size() * n elements).
  virtual void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) = 0;
  /// tensor = reduce over ranks of tensor, in place; every rank gets bitwise the same result.
  virtual void all_reduce(const at::Tensor& tensor, ReduceOp op) = 0;
  /// output block q (n elements) = rank q's input block rank() (input, output: size() * n).
  virtual void all_to_all(const at::Tensor& output, const at::Tensor& input) = 0;
  /// tensor on every rank = tensor of rank root, in place.
  virtual void broadcast(const at::Tensor& tensor, int root) = 0;
  /// Completes once every rank has entered it.
  virtual void barrier() = 0;
  /// Collective: the ranks with the same color form a new backend, ordered by (key, rank).
  virtual std::unique_ptr<BlockingBackend> split(int color, int key) = 0;
  /// Collective: groups of ranks whose colors follow from the rank alone, ordered by rank:
  /// strided false gives `block` consecutive ranks [k*block, (k+1)*block), strided true the
  /// size() / block ranks with the same rank % block. block divides size() (checked by the
  /// caller). The default is split(color, rank()) with color rank() / block or rank() % block; a
  /// backend that cannot learn the other ranks' colors (SimulatedBackend) overrides it.
  virtual std::unique_ptr<BlockingBackend> split_blocks(int block, bool strided) {
    return split(strided ? rank() % block : rank() / block, rank());
  }
  /// [Note: control channel] Collective over this backend's ranks (blocking; every rank calls it
  /// at the same point of its calls on this backend, as it would a split): a new CPU backend over
  /// the same ranks in the same order (same rank(), size()), a communicator of its own, which
  /// ProcessGroup uses for its CPU control traffic (the collective check's signature exchange)
  /// so that the data backend carries the user's ops only. The CPU backends implement it (MPI: an
  /// MPI_Comm_dup; Gloo: a second context over the same store under its own key prefix; threads:
  /// a channel of its own; simulated: another simulated rank). The default throws fsdp::Error
  /// (kUnsupported) naming the backend: a device backend (NCCL) cannot carry CPU byte tensors,
  /// and its ProcessGroup must be given a CPU control backend (MPI or Gloo) over the same ranks.
  virtual std::unique_ptr<BlockingBackend> make_control_channel();
  /// True for a backend that simulates its ranks inside this process, holding none of their data
  /// (SimulatedBackend, for dry runs). ProcessGroup then also passes it CPU tensors beside
  /// device_type() ones, which the backend handles by its own rule or refuses.
  virtual bool simulated() const { return false; }
  /// Ends every process of the job after an unrecoverable failure (a collective that timed out
  /// cannot be cancelled). Does not return. MPI: MPI_Abort on MPI_COMM_WORLD.
  [[noreturn]] virtual void abort_job(int code) = 0;

  /// The time (comm::now_s() clock) by which the current operation must complete. Set by
  /// the group's executor before every operation; infinity means no limit.
  void set_deadline(double deadline_s) { deadline_s_ = deadline_s; }
  double deadline_s() const { return deadline_s_; }

 private:
  double deadline_s_ = std::numeric_limits<double>::infinity();
};

/// The name every backend derives from (MPI, threads, Gloo, simulated): the blocking interface.
using Backend = BlockingBackend;

/// "float32", "bfloat16", "int64", ... (PyTorch's names; c10's for any other dtype).
std::string dtype_name(c10::ScalarType dtype);

}  // namespace fsdp::comm
