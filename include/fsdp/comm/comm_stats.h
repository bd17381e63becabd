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

/// The peer traffic one rank's collective implies, split by where the peers sit.
struct HostSplit {
  int64_t intra_host_bytes = 0;  // exchanged with ranks on this rank's host
  int64_t inter_host_bytes = 0;  // exchanged with ranks on other hosts
};

/// [Note: host traffic] The bytes one rank receives from its peers in a bandwidth-optimal
/// collective (ring or pairwise exchange), split by whether the peer shares this rank's host:
/// with group size N, `ranks_on_host` = m ranks of the group on this rank's host (itself
/// included) and logical bytes S (as CommStats counts them), the peer volume V is S (N-1)/N for
/// all-gather, reduce-scatter, all-to-all and broadcast, 2 S (N-1)/N for all-reduce
/// (reduce-scatter then all-gather) and 0 for a barrier; V (m-1)/(N-1) of it comes from this host
/// and V (N-m)/(N-1) from other hosts (the data is spread evenly over the peers). Summed over the
/// ranks of a host, the inter-host part is what that host's link must carry in at least; an MPI
/// library may move more (a ring crossing hosts several times) or less (hierarchical
/// algorithms), which is what docs/BENCHMARKS.md measures. N = 1 gives zeros. Throws fsdp::Error
/// (kInvalidArgument) unless 1 <= ranks_on_host <= group_size and bytes >= 0.
HostSplit split_by_host(CollectiveKind kind, int64_t bytes, int group_size, int ranks_on_host);

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
    /// bytes split by host ([Note: host traffic]), from the issuing group's host layout.
    int64_t intra_host_bytes = 0;
    int64_t inter_host_bytes = 0;
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

  /// One more call of `kind` with `bytes` logical bytes, split by host as `split` says.
  void record_issue(CollectiveKind kind, int64_t bytes, HostSplit split = {});
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
