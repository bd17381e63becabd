// What the calling thread is doing right now (which FSDP unit, which phase of the step): a cheap
// thread-local marker that the runtime sets from its hooks and that the memory budget reads when it
// refuses an allocation (include/fsdp/accounting/budget.h). docs/architecture.md, "[Note: memory
// budget]".
#pragma once

namespace fsdp {

/// One thread's current activity. Both fields point at strings that outlive the marker (string
/// literals, or the name of a unit, which lives as long as its module); nullptr means unknown.
struct Activity {
  const char* unit = nullptr;   ///< the FSDP unit whose hook or forward runs, e.g. "h.3"
  const char* phase = nullptr;  ///< "forward", "backward", "optimizer step", ...
};

/// The calling thread's activity (unit and phase both null when nothing was marked). Not
/// collective; costs a thread-local read.
Activity current_activity();

/// Replaces the calling thread's activity and returns the previous one (for hooks that cannot use
/// a scope because they begin and end in different calls, e.g. pre- and post-backward).
Activity exchange_activity(Activity next);

/// Makes `next` the calling thread's activity and remembers the current one on a per-thread
/// stack; pop_activity() restores it. For hooks that begin and end in different calls (a unit's
/// pre- and post-forward); they nest like the calls.
void push_activity(Activity next);
/// Restores the activity saved by the matching push_activity() (nothing when none is saved).
void pop_activity();

/// Marks the calling thread's activity for the scope's lifetime and restores the previous one on
/// exit (scopes nest: a unit's forward inside its parent's). Not copyable.
class ActivityScope {
 public:
  ActivityScope(const char* unit, const char* phase) : previous_(exchange_activity(Activity{unit, phase})) {}
  ~ActivityScope() { exchange_activity(previous_); }
  ActivityScope(const ActivityScope&) = delete;
  ActivityScope& operator=(const ActivityScope&) = delete;

 private:
  Activity previous_;
};

/// While alive, the memory budget counts but never refuses the calling thread's allocations.
/// The communication thread of every ProcessGroup holds one: a refusal there would fail one
/// rank's collective while its peers wait in it, so refusals happen only on the threads that run
/// the model, at points every rank reaches in the same order. Not copyable; scopes nest.
class BudgetExemptScope {
 public:
  BudgetExemptScope();
  ~BudgetExemptScope();
  BudgetExemptScope(const BudgetExemptScope&) = delete;
  BudgetExemptScope& operator=(const BudgetExemptScope&) = delete;
};

/// True while the calling thread holds a BudgetExemptScope.
bool budget_exempt();

}  // namespace fsdp
