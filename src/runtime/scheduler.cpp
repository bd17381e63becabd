#include "scheduler.h"

#include <torch/csrc/autograd/engine.h>

#include <algorithm>

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

void Scheduler::begin_forward(const ErrorContext& where) {
  FSDP_CHECK(!in_forward_, ErrorKind::kState, where, "root forward re-entered");
  in_forward_ = true;
  forward_order_.clear();
}

int64_t Scheduler::record_use(FSDPUnit* unit) {
  forward_order_.push_back(unit->weak_from_this());
  return static_cast<int64_t>(forward_order_.size()) - 1;
}

void Scheduler::prefetch_next(int64_t index) {
  const size_t next = static_cast<size_t>(index) + 1;
  if (next < last_forward_order_.size()) prefetch(last_forward_order_[next]);
}

void Scheduler::end_forward(bool grad_enabled) {
  in_forward_ = false;
  last_forward_order_ = forward_order_;
  if (!grad_enabled) {
    // Inference: nothing stays gathered (prefetched units that were not used included).
    for (const auto& u : units()) u->reshard();
  }
}

void Scheduler::prefetch_previous(int64_t index) {
  if (index > 0 && index <= static_cast<int64_t>(forward_order_.size())) prefetch(forward_order_[index - 1]);
}

int Scheduler::num_unsharded_counted() const {
  int n = 0;
  for (const auto& u : units()) {
    // no_shard / zero1 units hold their full params as state, not as transient unsharded units.
    if (!is_root(u.get()) && !u->keeps_full_params() && u->sharded_state() != ShardedState::kSharded) ++n;
  }
  return n;
}

void Scheduler::prefetch(const std::weak_ptr<FSDPUnit>& which) {
  auto unit = which.lock();
  if (!unit || unit->sharded_state() != ShardedState::kSharded) return;
  if (!is_root(unit.get()) && num_unsharded_counted() >= max_unsharded_units_) return;
  unit->unshard_async();
}

void Scheduler::ensure_final_callback() {
  if (callback_queued_) return;
  callback_queued_ = true;
  std::weak_ptr<Scheduler> self = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto s = self.lock()) s->final_callback();
  });
}

void Scheduler::on_reduce_scatter_issued(FSDPUnit* unit) {
  auto previous = last_reduce_scatter_.lock();
  last_reduce_scatter_ = unit->weak_from_this();
  if (previous && previous.get() != unit) previous->finish_reduce_scatter();
}

void Scheduler::on_reduce_scatter_finished(FSDPUnit* unit) {
  if (last_reduce_scatter_.lock().get() == unit) last_reduce_scatter_.reset();
}

void Scheduler::on_unsharded(int64_t bytes) {
  unsharded_param_bytes_ += bytes;
  peak_unsharded_param_bytes_ = std::max(peak_unsharded_param_bytes_, unsharded_param_bytes_);
}

void Scheduler::on_resharded(int64_t bytes) { unsharded_param_bytes_ -= bytes; }

void Scheduler::final_callback() {
  callback_queued_ = false;
  // Units whose post-backward hook could not run (their inputs need no gradient, e.g. the root
  // taking token ids) reduce here.
  const auto alive = units();
  for (const auto& u : alive) {
    if (u->training_state() == TrainingState::kPreBackward) u->post_backward();
  }
  for (const auto& u : alive) u->finish_reduce_scatter();
  for (const auto& u : alive) u->reshard();
  last_reduce_scatter_.reset();
}

}  // namespace fsdp::detail
