// FlightRecorder: the last collectives a process issued, with their state, for diagnosing a job
// that stalled or diverged (PyTorch's NCCL flight recorder, for any backend).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "fsdp/comm/comm_stats.h"

namespace fsdp::comm {

/// What a collective is for: the FSDP unit, the phase and the training forward it belongs to.
/// Carried into the cross-rank check, the flight recorder and error messages; empty for plain
/// collectives.
struct OpTag {
  std::string unit;   ///< FSDP unit name, its path in the model ("" when none)
  std::string phase;  ///< "forward", "backward", "optimizer", "checkpoint", ... ("" when none)
  /// The unit's tree's training forward this collective belongs to (1, 2, ...; the count of root
  /// forwards run with grad enabled), -1 outside a tree's step.
  int64_t forward_pass = -1;
  /// The tree's completed backward passes that reduced gradients (steps an optimizer may have
  /// taken) when the collective was issued, -1 outside a tree's step. A failed step is recoverable
  /// only among ranks with the same count ([Note: abandoned steps]).
  int64_t sync_epoch = -1;
};

/// Where a collective stands on this rank.
enum class OpState { kQueued, kRunning, kCompleted, kFailed, kTimedOut };
/// "queued", "running", "completed", "failed", "timed out".
const char* to_string(OpState state);

/// One collective as this rank saw it. Times in seconds on the comm::now_s() clock (-1: not yet).
struct CollectiveRecord {
  std::string group;     ///< the group's name, e.g. "world" or "world/split(1)"
  int64_t seq = 0;       ///< sequence number within the group (0, 1, ... in issue order)
  CollectiveKind kind = CollectiveKind::kBarrier;
  std::string dtype;     ///< "float32", "bfloat16", ... ("" for barrier and split)
  int64_t numel = 0;     ///< elements of the input (broadcast/all-reduce: of the tensor)
  int64_t bytes = 0;     ///< logical bytes as counted by CommStats
  OpTag tag;
  double issue_s = -1, start_s = -1, end_s = -1;
  OpState state = OpState::kQueued;
  std::string error;     ///< what() of the failure (kFailed)
};

/// The last `capacity` collectives of a family of process groups (a group and the groups split
/// from it share one recorder). Thread-safe. A ring of `capacity` slots, filled as collectives
/// come: once full, a new record takes the oldest one's slot (no allocation per collective beyond
/// the record's own strings).
class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 2048);
  /// Adds a record in state kQueued; returns its id for the updates below.
  uint64_t add(CollectiveRecord record);
  void mark_running(uint64_t id, double start_s);
  void mark_done(uint64_t id, double end_s, OpState state, const std::string& error);
  /// The records kept, oldest first.
  std::vector<CollectiveRecord> records() const;
  /// Writes {"rank", "world_size", "reason", "reasons", "time_s", "records": [...]} as JSON to
  /// DIR/rank-RRRRR.json (DIR created if missing), `rank` being this process's rank in the root
  /// group of the family, through a temporary file renamed at the end. Returns the path, or ""
  /// when writing failed, then with *error (when given) saying why ("cannot write
  /// 'DIR/rank-00001.json': No space left on device") and no temporary file left. Never throws.
  /// Blocks while another dump of this process is being written (one at a time: two groups of one
  /// rank write the same file). A later dump rewrites the file with the newer records and keeps the
  /// first dump's reason as "reason"; "reasons" lists every dump's, oldest first.
  std::string dump(const std::string& dir, int rank, int world_size, const std::string& reason,
                   std::string* error = nullptr) const;

 private:
  mutable std::mutex mu_;
  size_t capacity_;
  uint64_t next_id_ = 0;
  std::vector<CollectiveRecord> ring_;  // record id lives in ring_[id % capacity_]
  mutable std::vector<std::string> dump_reasons_;  // every dump's reason, oldest first
  CollectiveRecord* find(uint64_t id);
};

}  // namespace fsdp::comm
