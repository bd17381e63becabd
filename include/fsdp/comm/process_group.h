// ProcessGroup: the collectives fsdp-cpp needs, independent of FSDP (layer 1 of docs/architecture.md).
#pragma once

#include <ATen/Tensor.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/comm/backend.h"
#include "fsdp/comm/comm_stats.h"
#include "fsdp/comm/work.h"

namespace fsdp::comm {

/// A group of ranks that run collectives together, over a Backend it owns (the c10d shape).
///
/// Call-order rule: every rank of the group issues the same collectives, with the same sizes and
/// dtypes, in the same order (as with MPI and NCCL). Every op is validated on the calling thread
/// (fsdp::Error, kind kInvalidArgument, naming the rank, the op and expected vs actual), numbered
/// (its sequence number in the group), counted in stats(), then queued and executed in issue order
/// on the group's communication thread, so the caller may compute while it runs. Every op returns
/// a Work whose wait() blocks and rethrows the op's error. Tensors passed to an op must stay alive
/// and untouched until its Work completes. A group of one rank runs its ops inline (a local copy
/// or nothing) and completes them before returning.
///
/// Tensors: contiguous, on the backend's device (the CPU for MPI and threads), at most the
/// backend's max_elements() elements, dtype float32, float64, bfloat16, float16, int32, int64 or
/// uint8 (uint8 for gathers, all-to-all and broadcast only). Reductions of bfloat16/float16 move
/// the low-precision bytes (an all-to-all of the blocks) and add them up in float32 in rank order,
/// rounding once at the end: no overflow or rounding in partial sums, half the bytes of a float32
/// reduction on the wire; a result above the dtype's range becomes inf, which the fp16 loss scaler
/// is built to detect. Thread-safe: any thread may issue ops; their order is the order of issue.
class ProcessGroup final : public std::enable_shared_from_this<ProcessGroup> {
 public:
  /// Wraps `backend` (owned). `stats`: counters shared with the group this one was split from
  /// (null: new counters). Starts the communication thread when the group has more than one rank.
  explicit ProcessGroup(std::unique_ptr<Backend> backend, std::shared_ptr<CommStats> stats = nullptr);
  /// Finishes every queued op, stops the communication thread, then destroys the backend.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// This process's rank in the group, in [0, size()).
  int rank() const { return rank_; }
  /// Number of ranks in the group (the world size of this group).
  int size() const { return size_; }
  /// Backend name, e.g. "mpi" or "threaded".
  const std::string& backend_name() const { return backend_name_; }

  /// output (size()*n elements) = concat over ranks r of rank r's input (n elements), rank-major.
  /// Shapes are free; only numel and dtype matter.
  WorkPtr all_gather_into_tensor(at::Tensor output, at::Tensor input);

  /// output (n elements) = reduce over ranks of input[rank*n : (rank+1)*n] (input: size()*n
  /// elements). op: kSum, kAvg, kMax or kMin. output may alias input's block of this rank.
  WorkPtr reduce_scatter_tensor(at::Tensor output, at::Tensor input, ReduceOp op = ReduceOp::kSum);

  /// tensor = reduce over ranks of tensor, in place; bitwise the same on every rank.
  WorkPtr all_reduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum);

  /// output block q (n elements) = rank q's input block rank() (input and output: size()*n).
  WorkPtr all_to_all(at::Tensor output, at::Tensor input);

  /// tensor on every rank = tensor of rank root (a rank of this group), in place.
  WorkPtr broadcast(at::Tensor tensor, int root);

  /// Completes once every rank of the group has issued its barrier.
  WorkPtr barrier();

  /// Collective over this group (blocking): ranks with the same color form a new group, ordered by
  /// (key, rank), sharing this group's stats(). Every rank must call it in the same order as its
  /// other collectives.
  std::shared_ptr<ProcessGroup> split(int color, int key);

  /// Counters of this group and of every group split from it (one object per family of groups).
  CommStats& stats() { return *stats_; }
  std::shared_ptr<CommStats> stats_ptr() const { return stats_; }

 private:
  struct Op {
    CollectiveKind kind;
    bool counted;
    int64_t bytes;
    int64_t seq;
    std::function<void()> fn;
    WorkPtr work;
  };
  // Numbers, counts and queues fn (runs it inline for a group of one rank); logical_bytes < 0
  // keeps the op out of stats() (set-up, e.g. split).
  WorkPtr enqueue(CollectiveKind kind, int64_t logical_bytes, std::function<void()> fn);
  void worker_loop();
  // Runs one op, records its time, releases its tensors, completes its Work.
  void run_op(Op& op);
  // Validation on the calling thread.
  void check_tensor(const char* op, const char* what, const at::Tensor& t) const;
  // bf16/fp16 reductions: all-to-all of the blocks, float32 sum in rank order, one rounding.
  void reduce_scatter_low_precision(const at::Tensor& output, const at::Tensor& input, ReduceOp op);
  void all_reduce_low_precision(const at::Tensor& tensor, ReduceOp op);

  std::unique_ptr<Backend> backend_;
  int rank_;
  int size_;
  std::string backend_name_;
  std::shared_ptr<CommStats> stats_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  int64_t next_seq_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

/// Every rank's `mine`, in rank order (element r is rank r's string; any lengths, any bytes).
/// Collective and blocking over group: two all-gathers (the lengths as int64, then the bytes
/// padded to the longest). Throws fsdp::Error when a collective fails.
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine);

}  // namespace fsdp::comm
