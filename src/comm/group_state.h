// What one ProcessGroup's rooms share (internal): the family of split groups, a queued op and its
// signature, and the group's state after failures (unusable, diverged, the last dump).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "fsdp/comm/backend.h"
#include "fsdp/comm/comm_stats.h"
#include "fsdp/comm/flight_recorder.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/comm/work.h"

namespace fsdp::comm::detail {

/// What split groups share: stats, recorder, and this process's rank and size in the group the
/// family started from (for dump file names).
struct Family {
  std::shared_ptr<CommStats> stats;
  std::shared_ptr<FlightRecorder> recorder;
  int root_rank;
  int root_size;
};

/// The fixed-size description of one op exchanged by the collective check
/// ([Note: collective check]). An abandon marker (marker >= 0) carries the failed step's reason
/// in unit[]. 152 bytes (the docs state the size).
struct Signature {
  int64_t seq;
  int32_t kind;
  int32_t dtype;
  int64_t numel;
  int32_t reduce_op;
  int32_t root;
  int64_t forward_pass;    // OpTag::forward_pass
  int64_t sync_epoch;      // OpTag::sync_epoch
  int32_t marker;          // an abandon marker's kind (AbandonedPass::Kind; + kConfirmation), -1 for other ops
  int32_t marker_ordinal;  // 1 for the first marker of this rank's abandon_step, 2, ...; a
                           // confirmation: 1 when no marker of this rank met a real op
  uint64_t unit_hash;      // of the whole unit name (unit[] holds its first 63 bytes, for errors)
  char unit[64];
  char phase[24];
};
static_assert(sizeof(Signature) == 152, "docs/architecture.md and process_group.h state the signature's size");

/// Added to a marker's kind once its group settled (abandon_step's confirmation).
constexpr int32_t kConfirmation = 8;

/// One collective, numbered and recorded, waiting for (or in) the executor.
struct Op {
  CollectiveKind kind = CollectiveKind::kBarrier;
  bool counted = false;
  int64_t bytes = 0;
  int64_t seq = 0;
  Signature signature{};
  std::string unit;   // the whole unit name (signature.unit holds its first 63 bytes)
  std::string phase;  // the whole phase (signature.phase holds its first 23 bytes)
  uint64_t record_id = 0;
  std::function<void()> fn;  // moves the data through the backend (blocking)
  std::shared_ptr<Work> work;
  WorkPtr after;  // the op starts once this has completed (null: at once)
  std::function<void()> before;  // run once `after` completed, ahead of the check and deadline
  std::shared_ptr<MarkerOutcome> marker_outcome;  // an abandon marker's verdict
};

/// A group's identity and its state after failures. Thread-safe.
class GroupState {
 public:
  /// `backend` (the data backend) and `control` (the control channel) outlive this object (the
  /// ProcessGroup owns all three).
  GroupState(BlockingBackend& backend, BlockingBackend& control, ProcessGroupOptions options, std::string name,
             std::shared_ptr<Family> family);

  /// The data backend: the user's ops only.
  BlockingBackend& backend() const { return backend_; }
  /// The control channel: the collective check's signatures ([Note: control channel]).
  BlockingBackend& control() const { return control_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const ProcessGroupOptions& options() const { return options_; }
  const Family& family() const { return *family_; }
  FlightRecorder& recorder() const { return *family_->recorder; }
  CommStats& stats() const { return *family_->stats; }

  /// Why the group is unusable (a timed-out collective), "" while usable.
  std::string broken() const;
  /// Why the group refuses every op ([Note: abandoned steps]), "" while it does not.
  std::string diverged() const;
  /// Refuses every later op with `why` (the first reason stays).
  void refuse(const std::string& why);
  /// A failure that leaves the group unusable (timeout): records it, dumps the flight recorder
  /// (once: the caller marks the failed op's record first, so the dump says how it ended), and
  /// arms the abort of the job after options().abort_grace_s when abort_after_timeout.
  void on_unrecoverable(const std::string& what);
  /// Writes the flight recorder to options().flight_recorder_dir (if set); returns the path.
  std::string dump_flight_recorder(const std::string& reason);
  /// Where the last dump went, for error messages (ProcessGroup::flight_recorder_note).
  std::string flight_recorder_note() const;

 private:
  BlockingBackend& backend_;
  BlockingBackend& control_;
  const int rank_;
  const int size_;
  const std::string name_;
  const ProcessGroupOptions options_;
  const std::shared_ptr<Family> family_;
  mutable std::mutex mu_;
  std::string broken_;      // guarded by mu_
  std::string diverged_;    // guarded by mu_
  std::string dump_error_;  // why the last dump failed ("" when written); guarded by mu_
};

}  // namespace fsdp::comm::detail
