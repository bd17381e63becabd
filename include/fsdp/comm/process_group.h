// ProcessGroup: the collectives fsdp-cpp needs, independent of FSDP (layer 1 of docs/architecture.md).
#pragma once

#include <ATen/Tensor.h>

#include <array>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/comm/work.h"

namespace fsdp::comm {

/// Reduction applied by reduce_scatter_tensor / all_reduce. kAvg divides the sum by the group size.
enum class ReduceOp { kSum, kAvg, kMax, kMin };

/// Kinds of collective, as counted by CommStats.
enum class CollectiveKind { kAllGather = 0, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
constexpr int kNumCollectiveKinds = 5;
const char* to_string(CollectiveKind kind);
const char* to_string(ReduceOp op);

/// Calls, logical bytes and communication-thread seconds per collective kind. Logical bytes are the
/// size of the tensor the collective is about in the dtype the caller passed: the all-gather output,
/// the reduce-scatter input, the all-reduce tensor, the broadcast tensor (bf16 counts 2 bytes/elem even
/// where the backend widens to fp32 on the wire). Thread-safe.
class CommStats {
 public:
  struct Entry {
    int64_t calls = 0;
    int64_t bytes = 0;
    double busy_s = 0.0;
  };
  using Snapshot = std::array<Entry, kNumCollectiveKinds>;
  /// One collective as it ran on the communication thread; times in seconds on the now_s() clock.
  struct Event {
    CollectiveKind kind;
    int64_t bytes;
    double start_s;
    double end_s;
  };

  void record_issue(CollectiveKind kind, int64_t bytes);
  void record_time(CollectiveKind kind, double start_s, double end_s, int64_t bytes);
  Snapshot snapshot() const;
  void reset();
  /// Keep one Event per collective (for traces) until take_events(). Off by default.
  void set_record_events(bool on);
  /// Returns and clears the recorded events.
  std::vector<Event> take_events();

 private:
  mutable std::mutex mu_;
  Snapshot entries_{};
  bool record_events_ = false;
  std::vector<Event> events_;
};

/// Seconds on a monotonic clock shared by CommStats events and callers that trace compute.
double now_s();

/// A group of ranks that run collectives together (the c10d Backend shape).
///
/// Call-order rule: every rank of the group issues the same collectives, with the same sizes and
/// dtypes, in the same order (as with MPI and NCCL). Ops are validated on the calling thread, then
/// queued and executed in issue order on the group's communication thread, so the caller may compute
/// while they run. Every op returns a Work whose wait() blocks and rethrows the op's error. Tensors
/// passed to an op must stay alive and untouched until its Work completes.
///
/// Supported dtypes: float32, float64, bfloat16, float16, int32, int64, uint8 (uint8 for gathers and
/// broadcast only). Reductions of bfloat16/float16 are computed in float32 and rounded once at the end
/// (no overflow or rounding in partial sums; a result above the dtype's range becomes inf, which
/// the fp16 loss scaler is built to detect). Tensors must be contiguous and on this group's device.
/// A group created by split() is itself a ProcessGroup with its own communication thread.
class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// This process's rank in the group, in [0, size()).
  int rank() const { return rank_; }
  /// Number of ranks in the group (the world size of this group).
  int size() const { return size_; }
  /// Backend name, e.g. "mpi" or "threaded".
  virtual std::string backend_name() const = 0;

  /// output (size()*n elements) = concat over ranks r of rank r's input (n elements), rank-major.
  /// Shapes are free; only numel and dtype matter. Throws fsdp::Error on numel/dtype mismatch.
  WorkPtr all_gather_into_tensor(at::Tensor output, at::Tensor input);

  /// output (n elements) = reduce over ranks of input[rank*n : (rank+1)*n] (input: size()*n
  /// elements). op: kSum or kAvg (kMax/kMin also accepted). Throws fsdp::Error on numel/dtype mismatch.
  WorkPtr reduce_scatter_tensor(at::Tensor output, at::Tensor input, ReduceOp op = ReduceOp::kSum);

  /// tensor = reduce over ranks of tensor, in place.
  WorkPtr all_reduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum);

  /// tensor on every rank = tensor of rank root (a rank of this group), in place.
  WorkPtr broadcast(at::Tensor tensor, int root);

  /// Completes once every rank of the group has issued its barrier.
  WorkPtr barrier();

  /// Collective over this group (blocking): ranks with the same color form a new group, ordered by
  /// (key, rank). Every rank must call it in the same order as its other collectives.
  std::shared_ptr<ProcessGroup> split(int color, int key);

  /// Counters of this group and of every group split from it (one object per family of groups).
  CommStats& stats() { return *stats_; }
  std::shared_ptr<CommStats> stats_ptr() const { return stats_; }

 protected:
  ProcessGroup(int rank, int size, std::shared_ptr<CommStats> stats);

  // Backend operations: run synchronously on the communication thread, in issue order, on
  // validated, contiguous tensors. Reductions get float32/float64/int32/int64 only and op kSum, kMax
  // or kMin (the base class widens half types and turns kAvg into kSum + division).
  virtual void run_all_gather(const at::Tensor& output, const at::Tensor& input) = 0;
  virtual void run_reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) = 0;
  virtual void run_all_reduce(const at::Tensor& tensor, ReduceOp op) = 0;
  virtual void run_broadcast(const at::Tensor& tensor, int root) = 0;
  virtual void run_barrier() = 0;
  virtual std::shared_ptr<ProcessGroup> run_split(int color, int key) = 0;

  /// Stops the communication thread after draining queued ops. Backends call it first in their
  /// destructor, so that no op runs on a half-destroyed backend.
  void shutdown();

 private:
  // Queues fn for the communication thread; logical_bytes < 0 keeps the op out of stats().
  WorkPtr enqueue(CollectiveKind kind, int64_t logical_bytes, std::function<void()> fn);
  void worker_loop();

  int rank_;
  int size_;
  std::shared_ptr<CommStats> stats_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Op {
    CollectiveKind kind;
    bool counted;
    int64_t bytes;
    std::function<void()> fn;
    WorkPtr work;
  };
  std::deque<Op> queue_;
  // Runs one op, records its time, releases its tensors, completes its Work.
  void run_op(Op& op);
  bool stopping_ = false;
  std::thread worker_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

/// Every rank's `mine`, in rank order (element r is rank r's string; any lengths, any bytes).
/// Collective and blocking over group: two all-gathers (the lengths as int64, then the bytes
/// padded to the longest). Throws fsdp::Error when a collective fails.
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine);

}  // namespace fsdp::comm
