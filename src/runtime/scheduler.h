// Scheduler: the state one root unit's tree shares (internal): forward order, prefetch and its
// bound, the reduce-scatters in flight, the end-of-backward callback, unsharded-bytes counters.
// docs/architecture.md, "[Note: root and final callback]".
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"

namespace fsdp {
class FSDPUnit;

namespace detail {

/// Created by the root unit at its first forward; every unit of the tree holds it, and it holds the
/// units weakly (a unit that died is skipped). Hooks run on the thread that runs forward and
/// backward; not thread-safe beyond that.
class Scheduler : public std::enable_shared_from_this<Scheduler> {
 public:
  /// [Note: root and final callback] The lazy init of a tree, at its root unit's first forward
  /// (tree_init.cpp): names every unit below `root` by its path, checks that they train over
  /// root's group, belong to no other tree and leave max_unsharded_units to the root (fsdp::Error
  /// kInvalidArgument / kState at root's "forward" otherwise), and binds them all to one new
  /// Scheduler. Not collective.
  static void init_tree(FSDPUnit& root);
  /// units: every unit of the tree, root first. max_unsharded_units: the tree's bound (>= 1).
  Scheduler(const std::vector<std::shared_ptr<FSDPUnit>>& units, int max_unsharded_units);

  /// True for the tree's root unit (compared by address, never dereferenced).
  bool is_root(const FSDPUnit* unit) const { return unit == root_; }
  /// The units alive now, root first.
  std::vector<std::shared_ptr<FSDPUnit>> units() const;
  int max_unsharded_units() const { return max_unsharded_units_; }

  // -- forward --
  /// The root's forward starts: clears this forward's order and, when grad_enabled, counts a
  /// training forward (forward_pass()). Throws fsdp::Error (kState, at `where`) when the root's
  /// forward is re-entered.
  void begin_forward(const ErrorContext& where, bool grad_enabled);
  bool in_forward() const { return in_forward_; }
  /// Records a unit's use in this forward; returns its index in the forward order.
  int64_t record_use(FSDPUnit* unit);
  /// Whether `unit` ran its forward (through fsdp::call) in the forward now running.
  bool used_in_this_forward(const FSDPUnit* unit) const;
  /// Forward prefetch: issues the all-gather of the unit used after `index` in the last forward.
  void prefetch_next(int64_t index);
  /// The root's forward ends; with grad disabled every unit is resharded (inference).
  void end_forward(bool grad_enabled);
  /// The root's forward threw ([Note: failed steps]): the tree's groups are put back in step with
  /// the peers (comm::abandon_step: collective, blocking, every rank whose step failed), then every
  /// unit back to IDLE and resharded, buffer casts undone, and the step's unreduced gradients
  /// dropped (those accumulated without sync by earlier micro-batches). Never throws: a group that
  /// cannot be put back refuses its later collectives with the reason.
  void abort_forward();
  /// The tree's last training forward ended and its backward never started: the step failed in
  /// between (the loss, the start of backward before any unit's hook) on this rank, or the loop
  /// dropped it. Abandons that forward pass as a failed step does (comm::abandon_step over the
  /// tree's groups, collective and blocking), and when a peer had gone on into its backward (its
  /// collectives met this rank's markers and failed), drops what a failed step drops, so every
  /// rank keeps the same state. No-op when no backward is pending. Never throws. Called by the
  /// root's next forward (failed_here false: the pass ran to its end here, and is dropped only when
  /// a peer was in its backward), and by fsdp::abandon_step (failed_here true: the loop's step
  /// failed, dropped always).
  void abandon_pending_pass(bool failed_here);
  /// Training forwards of this tree so far (root forwards run with grad enabled). Every collective
  /// of the tree carries it into the collective check, so a rank that ran one training forward
  /// more or fewer than its peers fails at its next collective instead of pairing with another
  /// step's, and an abandoned step names the pass it abandons ([Note: abandoned steps]).
  int64_t forward_pass() const { return forward_pass_; }
  /// Backward passes of this tree that reduced gradients (ended with requires_gradient_sync on
  /// every unit): the steps an optimizer may have taken. Carried by every collective with
  /// forward_pass: a failed step is recovered only among ranks at the same count.
  int64_t sync_epoch() const { return sync_epoch_; }
  /// True from fsdp::abandon_step until the next root forward: a backward of the abandoned pass
  /// is refused (its peers have left it).
  bool pass_abandoned() const { return pass_abandoned_; }

  // -- backward --
  /// Queues the end-of-backward callback on the autograd engine, once per backward pass. When the
  /// backward fails instead (an exception in any node, hook or reduction), the engine drops the
  /// callback without running it, and dropping it runs abort_backward.
  void ensure_final_callback();
  /// A backward of this tree failed ([Note: failed steps]): puts the tree's groups back in step
  /// (as abort_forward), waits for the reductions in flight and
  /// drops their results, drops every unsharded gradient (the failed batch's, and any accumulated
  /// with requires_gradient_sync false), puts every unit back to IDLE and resharded. Never throws.
  void abort_backward();
  /// Backward prefetch: issues the all-gather of the unit used before `index` in this forward.
  void prefetch_previous(int64_t index);
  /// `unit` reports that it issued its reduce-scatter: the scheduler finishes the previous
  /// unit's (one in flight at a time besides the newest), bounding the gradient buffers alive.
  /// The unit's own calls never call back into the scheduler (the unit reports, the scheduler
  /// drives); finishing a unit with nothing in flight is a no-op.
  void on_reduce_scatter_issued(FSDPUnit* unit);

  // -- accounting of transient unsharded params (strategies that keep full params excluded) --
  void on_unsharded(int64_t bytes);
  void on_resharded(int64_t bytes);
  int64_t unsharded_param_bytes() const { return unsharded_param_bytes_; }
  int64_t peak_unsharded_param_bytes() const { return peak_unsharded_param_bytes_; }
  void reset_peak_unsharded_param_bytes() { peak_unsharded_param_bytes_ = unsharded_param_bytes_; }

 private:
  // [Note: abandoned steps] in src/comm/collective_check.cpp: every group the tree's units use, put back in
  // step with the peers that may have issued more or fewer of the failed step's collectives.
  // The reason sent to the peers: the exception being handled, or `otherwise`. Returns the
  // rounds abandon_step took (0 when it failed).
  // Every unit IDLE and resharded, the step's unreduced gradients dropped (a failed step).
  void drop_failed_step();
  comm::AbandonResult abandon_collectives(comm::AbandonedPass::Kind kind, const char* otherwise) noexcept;

  // Issues the all-gather of the unit (if alive) when it is sharded and the bound allows it.
  void prefetch(const std::weak_ptr<FSDPUnit>& unit, const char* phase);
  // Units (root excluded, full-param strategies excluded) holding or gathering params now.
  int num_unsharded_counted() const;
  // End of backward: post-backward of units whose hook could not run, gradients accumulated
  // without sync, wait for every reduction, reshard every unit.
  void final_callback();
  void reduce_accumulated(const std::vector<std::shared_ptr<FSDPUnit>>& alive);

  using Units = std::vector<std::weak_ptr<FSDPUnit>>;
  const FSDPUnit* root_;
  Units units_;
  int max_unsharded_units_;
  Units forward_order_;       // uses in this forward, in order
  Units last_forward_order_;  // uses in the last finished forward
  bool in_forward_ = false;
  int64_t forward_pass_ = 0;
  int64_t sync_epoch_ = 0;       // backward passes that reduced gradients (sync_epoch())
  bool forward_with_grad_ = false;  // the forward in progress (or last) ran with grad enabled
  bool pass_abandoned_ = false;     // fsdp::abandon_step abandoned the last forward pass
  bool callback_queued_ = false;
  bool backward_pending_ = false;  // a training forward ended and its backward has not started
  bool unsynced_since_sync_ = false;  // a backward ran with sync off since the last synced one
  std::weak_ptr<FSDPUnit> last_reduce_scatter_;  // the newest unit that issued one
  int64_t unsharded_param_bytes_ = 0;
  int64_t peak_unsharded_param_bytes_ = 0;
};

}  // namespace detail
}  // namespace fsdp
