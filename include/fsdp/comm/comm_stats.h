// CommStats: what a family of process groups communicated (calls, logical bytes, busy time, and
// optionally one event per collective for traces).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

namespace fsdp::comm {

/// Kinds of collective, as counted by CommStats.
enum class CollectiveKind { kAllGather = 0, kReduceScatter, kAllReduce, kBroadcast, kBarrier, kAllToAll };
constexpr int kNumCollectiveKinds = 6;
/// "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "all_to_all".
const char* to_string(CollectiveKind kind);

/// Seconds on a monotonic clock shared by CommStats events and callers that trace compute.
double now_s();

/// Calls, logical bytes and communication-thread seconds per collective kind. Logical bytes are the
/// size of the tensor the collective is about in the dtype the caller passed: the all-gather output,
/// the reduce-scatter input, the all-reduce tensor, the broadcast tensor, the all-to-all input
/// (bf16 counts 2 bytes/elem). Thread-safe.
class CommStats {
 public:
  struct Entry {
    int64_t calls = 0;
    int64_t bytes = 0;
    double busy_s = 0.0;
  };
  using Snapshot = std::array<Entry, kNumCollectiveKinds>;
  /// One collective as it ran; times in seconds on the now_s() clock. seq: the op's sequence
  /// number in its group (0, 1, ... in issue order).
  struct Event {
    CollectiveKind kind;
    int64_t bytes;
    double start_s;
    double end_s;
    int64_t seq;
  };

  void record_issue(CollectiveKind kind, int64_t bytes);
  void record_time(CollectiveKind kind, double start_s, double end_s, int64_t bytes, int64_t seq);
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

}  // namespace fsdp::comm
