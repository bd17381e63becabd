// Exposed communication: the seconds a thread spent blocked in Work::wait, i.e. waiting for a
// collective that compute did not hide, by the phase of the step the waiting thread was in (its
// fsdp::Activity, set by the runtime's hooks and by the training loop). A process-wide record,
// cheap enough to stay on: one clock read per wait that blocks, nothing for a wait on a finished op.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::comm {

/// Where a blocking wait happened, from the waiting thread's fsdp::Activity phase.
enum class WaitPhase : int {
  kForward = 0,     ///< "forward...": a unit's all-gather before its forward
  kBackward,        ///< "backward...", "post-backward": all-gathers and reduce-scatters inside backward
  kEndOfBackward,   ///< "end of backward": the last reduce-scatters / all-reduces of the step
  kOptimizer,       ///< "optimizer...": gradient-norm all-reduce, zero1's all-gathers
  kOther,           ///< anything else (the loss, evaluation, checkpoints, an unmarked thread)
};
constexpr int kWaitPhaseCount = 5;

/// "forward", "backward", "end_of_backward", "optimizer", "other" (metric keys).
const char* to_string(WaitPhase phase);

/// The phase of an fsdp::Activity phase string (nullptr: kOther).
WaitPhase wait_phase_of(const char* activity_phase);

/// Accumulated blocked seconds per WaitPhase since the process started (monotonic; subtract two
/// snapshots for an interval). Thread-safe.
std::array<double, kWaitPhaseCount> exposed_wait_s();

/// One blocking wait, for a trace: seconds on comm::now_s()'s clock.
struct WaitEvent {
  WaitPhase phase;
  double start_s;
  double end_s;
};

/// Starts (true) or stops keeping WaitEvents; stopping drops those kept. Thread-safe.
void set_record_wait_events(bool on);
/// The WaitEvents kept since the last call (at most 1,000,000 between calls; later ones are
/// counted in exposed_wait_s but not kept). Thread-safe.
std::vector<WaitEvent> take_wait_events();

/// Adds one blocking wait of the calling thread (Work::wait calls it); nothing while a
/// CommunicationThreadScope is alive on that thread. Thread-safe.
void record_blocking_wait(double start_s, double end_s);

/// Marks the calling thread, for the scope's lifetime, as one that runs collectives rather than
/// compute (a group's communication thread): its blocking waits (a chained op waiting for the
/// stage before it, [Note: chained ops] in process_group.h) hide nothing from compute and are not
/// exposed communication, so record_blocking_wait ignores them. Scopes nest. Not copyable.
class CommunicationThreadScope {
 public:
  CommunicationThreadScope();
  ~CommunicationThreadScope();
  CommunicationThreadScope(const CommunicationThreadScope&) = delete;
  CommunicationThreadScope& operator=(const CommunicationThreadScope&) = delete;
};

}  // namespace fsdp::comm
