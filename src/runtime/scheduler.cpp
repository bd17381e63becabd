#include "scheduler.h"

#include <torch/csrc/autograd/engine.h>

#include <ATen/ATen.h>

#include <algorithm>

#include "fsdp/comm/comm_context.h"
#include "fsdp/common/activity.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/fsdp_unit.h"

namespace fsdp::detail {

Scheduler::Scheduler(const std::vector<std::shared_ptr<FSDPUnit>>& units, int max_unsharded_units)
    : root_(units.front().get()), units_(units.begin(), units.end()), max_unsharded_units_(max_unsharded_units) {}

std::vector<std::shared_ptr<FSDPUnit>> Scheduler::units() const {
  std::vector<std::shared_ptr<FSDPUnit>> alive;
  for (const auto& w : units_) {
    if (auto u = w.lock()) alive.push_back(std::move(u));
  }
  return alive;
}

void Scheduler::begin_forward(const ErrorContext& where, bool grad_enabled) {
  FSDP_CHECK(!in_forward_, ErrorKind::kState, where, "root forward re-entered");
  abandon_pending_pass(/*failed_here=*/false);
  pass_abandoned_ = false;
  in_forward_ = true;
  // [Note: node-local reshard] A new forward of the tree: shards kept by an earlier one (whose
  // backward never came for them) hold rows the optimizer may have changed since.
  for (const auto& u : units()) u->drop_node_shard();
  if (grad_enabled) ++forward_pass_;
  forward_with_grad_ = grad_enabled;
  forward_order_.clear();
}

int64_t Scheduler::record_use(FSDPUnit* unit) {
  forward_order_.push_back(unit->weak_from_this());
  return static_cast<int64_t>(forward_order_.size()) - 1;
}

void Scheduler::prefetch_next(int64_t index) {
  const size_t next = static_cast<size_t>(index) + 1;
  if (next < last_forward_order_.size()) prefetch(last_forward_order_[next], "forward");
}

void Scheduler::end_forward(bool grad_enabled) {
  in_forward_ = false;
  backward_pending_ = grad_enabled;
  last_forward_order_ = forward_order_;
  if (!grad_enabled) {
    // Inference: nothing stays gathered (prefetched units that were not used included).
    for (const auto& u : units()) u->reshard();
  }
}

// [Note: failed steps] An exception inside a step (user code in a unit's forward or a backward
// hook, a memory budget refusing a gather, a failed collective) must leave the model usable: the
// loop catches it, skips the step and goes on. A forward that throws unwinds through fsdp::call
// of every unit it entered; each puts its unit back to IDLE, and the root's puts the whole tree
// back (abort_forward). A backward that throws never runs the end-of-backward callback, and the
// engine drops the callback with its graph: the callback's guard then runs abort_backward, before
// backward() rethrows to the caller. Either way a failed step drops every gradient that had not
// reached the shards, those accumulated by earlier micro-batches with requires_gradient_sync
// false included (optimizer.zero_grad() cannot reach them: they live on the module's parameters);
// those already added to the sharded gradients are there as in a plain model's .grad, and the
// loop's optimizer.zero_grad() drops them (docs/training_loops.md). The ranks may fail at
// different points of the step, or one alone: before anything is reset, abandon_collectives
// pairs the collectives one rank issued and another did not, and a peer still in the step fails
// it too ([Note: abandoned steps] in src/comm/collective_check.cpp); only then are the in-flight works waited
// for, which no longer wait on a peer.
comm::AbandonResult Scheduler::abandon_collectives(comm::AbandonedPass::Kind kind, const char* otherwise) noexcept {
  std::vector<comm::ProcessGroup*> groups;
  for (const auto& u : units()) {
    const comm::ProcessGroupPtr node = u->node_group();  // [Note: node-local reshard]
    const auto [host, cross] = u->host_groups();         // [Note: host-aware collectives]
    for (const auto* g : {&u->group(), &u->shard_group(), &u->replicate_group(), &node, &host, &cross}) {
      if (*g && std::find(groups.begin(), groups.end(), g->get()) == groups.end()) groups.push_back(g->get());
    }
  }
  std::string reason = otherwise;  // unless an exception is being handled
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      reason = ex.what();
    } catch (...) {
    }
  }
  // Shortest useful form for the peers: the first line, without the "[fsdp rank R] " prefix.
  reason = reason.substr(0, reason.find('\n'));
  if (reason.rfind("[fsdp", 0) == 0 && reason.find("] ") != std::string::npos) reason = reason.substr(reason.find("] ") + 2);
  try {
    const auto result = comm::abandon_step(groups, comm::AbandonedPass{kind, forward_pass_, sync_epoch_, reason});
    // A peer that ran a later micro-batch of the step counted more forwards: every rank goes on
    // from the latest, so that the next step's collectives carry the same pass everywhere.
    forward_pass_ = std::max(forward_pass_, result.forward_pass);
    return result;
  } catch (...) {
    // A group that could not be put back (timed out, or a peer finished the step) refuses its later
    // collectives with the reason, on every rank; the step's own error is the caller's to report.
    return comm::AbandonResult{};
  }
}

bool Scheduler::used_in_this_forward(const FSDPUnit* unit) const {
  for (const auto& w : forward_order_) {
    if (w.lock().get() == unit) return true;
  }
  return false;
}

void Scheduler::abandon_pending_pass(bool failed_here) {
  if (!backward_pending_) return;
  backward_pending_ = false;
  pass_abandoned_ = failed_here;
  // Ran to its end here: when every rank skipped this backward alike it settles in one round and
  // nothing is dropped (a forward with grad enabled and no backward, e.g. an evaluation, is legal);
  // a peer that went on into its backward had its step failed by the markers and dropped its
  // gradients: so does this rank. A failure of the pass on a peer with no rank in its backward is
  // not recoverable (comm::abandon_step refuses it). Failed here: dropped always.
  using Kind = comm::AbandonedPass::Kind;
  const auto settled = abandon_collectives(failed_here ? Kind::kFailedWithGrad : Kind::kCompleted,
                                           failed_here ? "its step failed between forward and backward"
                                                       : "it ran that forward and no backward");
  if (!failed_here && settled.rounds == 1) return;
  drop_failed_step();
}

void Scheduler::drop_failed_step() {
  for (const auto& u : units()) u->reset_after_error(/*drop_grads=*/true);
  last_reduce_scatter_.reset();
  unsynced_since_sync_ = false;  // no unsharded gradient is left on any unit
}

void Scheduler::abort_forward() {
  in_forward_ = false;
  backward_pending_ = false;
  abandon_collectives(forward_with_grad_ ? comm::AbandonedPass::Kind::kFailedWithGrad
                                         : comm::AbandonedPass::Kind::kFailedWithoutGrad,
                      "its forward threw");
  drop_failed_step();
}

void Scheduler::abort_backward() {
  callback_queued_ = false;
  backward_pending_ = false;
  abandon_collectives(comm::AbandonedPass::Kind::kFailedWithGrad, "its backward threw");
  drop_failed_step();
  exchange_activity(Activity{});
}

void Scheduler::prefetch_previous(int64_t index) {
  if (index > 0 && index <= static_cast<int64_t>(forward_order_.size())) {
    prefetch(forward_order_[index - 1], "backward");
  }
}

int Scheduler::num_unsharded_counted() const {
  int n = 0;
  for (const auto& u : units()) {
    // no_shard / zero1 units hold their full params as state, not as transient unsharded units.
    if (!is_root(u.get()) && !u->keeps_full_params() && u->sharded_state() != ShardedState::kSharded) ++n;
  }
  return n;
}

void Scheduler::prefetch(const std::weak_ptr<FSDPUnit>& which, const char* phase) {
  auto unit = which.lock();
  if (!unit || unit->sharded_state() != ShardedState::kSharded) return;
  if (!is_root(unit.get()) && num_unsharded_counted() >= max_unsharded_units_) return;
  unit->unshard_async(phase);
}

namespace {

// Owned by the end-of-backward callback (its copies share it): when the engine drops the callback
// without running it to its end (the backward failed, or the callback itself threw), the guard's
// destruction puts the tree back ([Note: failed steps]).
struct BackwardGuard {
  std::weak_ptr<Scheduler> scheduler;
  bool finished = false;
  explicit BackwardGuard(std::weak_ptr<Scheduler> s) : scheduler(std::move(s)) {}
  ~BackwardGuard() {
    if (finished) return;
    if (auto s = scheduler.lock()) s->abort_backward();
  }
};

}  // namespace

void Scheduler::ensure_final_callback() {
  backward_pending_ = false;  // the backward started: a failure from here on is abort_backward's
  if (callback_queued_) return;
  callback_queued_ = true;
  auto guard = std::make_shared<BackwardGuard>(weak_from_this());
  torch::autograd::Engine::get_default_engine().queue_callback([guard] {
    if (auto s = guard->scheduler.lock()) s->final_callback();
    guard->finished = true;
  });
}

void Scheduler::on_reduce_scatter_issued(FSDPUnit* unit) {
  auto previous = last_reduce_scatter_.lock();
  last_reduce_scatter_ = unit->weak_from_this();
  if (previous && previous.get() != unit) previous->finish_reduce_scatter();
}

void Scheduler::on_unsharded(int64_t bytes) {
  unsharded_param_bytes_ += bytes;
  peak_unsharded_param_bytes_ = std::max(peak_unsharded_param_bytes_, unsharded_param_bytes_);
}

void Scheduler::on_resharded(int64_t bytes) { unsharded_param_bytes_ -= bytes; }

// [Note: accumulation without sync] Gradients accumulated while requires_gradient_sync was false
// are reduced by the next synced backward. A unit that backward does not reach (used only in the
// earlier micro-batches) still holds them: after such a series, the ranks agree (one all-reduce of
// a flag per unit, only then) on the units with pending gradients anywhere, and each reduces them
// (a rank without any contributes zeros), so no gradient is lost and every rank issues the same
// collectives even when the micro-batches used units differently across ranks.
void Scheduler::reduce_accumulated(const std::vector<std::shared_ptr<FSDPUnit>>& alive) {
  bool any_unsynced = false;
  for (const auto& u : alive) any_unsynced = any_unsynced || !u->requires_gradient_sync();
  if (any_unsynced) {
    unsynced_since_sync_ = true;
    return;
  }
  if (!unsynced_since_sync_ || alive.empty()) return;
  unsynced_since_sync_ = false;
  comm::ProcessGroup& group = *alive.front()->group();
  at::Tensor mine = at::zeros({static_cast<int64_t>(alive.size())}, at::kInt);  // filled here, then moved
  for (size_t i = 0; i < alive.size(); ++i) mine[i] = alive[i]->has_pending_grads() ? 1 : 0;
  at::Tensor pending = mine.to(comm::CommContext::for_group(group).flag_device);
  group.all_reduce(pending, comm::ReduceOp::kMax,
                   comm::OpTag{"", "backward (accumulated)", forward_pass_, sync_epoch_})->wait();
  pending = pending.to(mine.device());
  const int* flag = pending.data_ptr<int>();
  for (size_t i = 0; i < alive.size(); ++i) {
    if (flag[i]) alive[i]->reduce_pending_grads();
  }
}

void Scheduler::final_callback() {
  callback_queued_ = false;
  exchange_activity(Activity{nullptr, "end of backward"});
  // Units whose post-backward hook could not run (their inputs need no gradient, e.g. the root
  // taking token ids) reduce here.
  const auto alive = units();
  for (const auto& u : alive) {
    if (u->training_state() == TrainingState::kPreBackward) u->post_backward();
  }
  exchange_activity(Activity{nullptr, "end of backward"});  // post_backward marked "backward"
  reduce_accumulated(alive);
  for (const auto& u : alive) u->finish_reduce_scatter();
  for (const auto& u : alive) u->end_of_backward();
  last_reduce_scatter_.reset();
  // [Note: abandoned steps] The backward's last collective, after its last allocation: a rank
  // whose backward fails anywhere before it (a hook on the input's gradient, a refusal at the
  // tail of backward, a peer's reduction failed by markers in another group) never issues it,
  // and its markers fail this barrier on every peer, so no rank leaves the backward that another
  // abandoned. One barrier of the tree's group per backward, not counted in stats().
  if (!alive.empty()) {
    alive.front()->group()->barrier(comm::OpTag{"", "end of backward", forward_pass_, sync_epoch_}, /*counted=*/false)->wait();
  }
  bool synced = true;
  for (const auto& u : alive) synced = synced && u->requires_gradient_sync();
  if (synced) ++sync_epoch_;  // gradients reached the shards: an optimizer step may follow
  exchange_activity(Activity{});  // the backward is over (the root's pre-backward marked it)
}

}  // namespace fsdp::detail
