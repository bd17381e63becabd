#include "root_context.h"

#include <torch/csrc/autograd/engine.h>

namespace fsdp {

int RootContext::num_unsharded_non_root() const {
  int n = 0;
  for (FSDPUnit* u : units) {
    // no_shard / zero1 units hold their full params as state, not as transient unsharded units.
    if (u != root && !u->keeps_full_params() && u->sharded_state() != ShardedState::kSharded) ++n;
  }
  return n;
}

void RootContext::prefetch(FSDPUnit* unit) {
  if (unit == nullptr || unit->sharded_state() != ShardedState::kSharded) return;
  int limit = root->options().max_unsharded_units;
  if (unit != root && num_unsharded_non_root() >= limit) return;
  unit->unshard_async();
}

void RootContext::ensure_final_callback() {
  if (callback_queued) return;
  callback_queued = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { final_callback(); });
}

void RootContext::final_callback() {
  callback_queued = false;
  // Units whose post-backward hook could not run (their inputs need no gradient, e.g. the root
  // taking token ids) reduce here.
  for (FSDPUnit* u : units) {
    if (u->training_state() == TrainingState::kPreBackward) u->post_backward();
  }
  for (FSDPUnit* u : units) u->finish_reduce_scatter();
  for (FSDPUnit* u : units) u->reshard();
  last_reduce_scatter = nullptr;
}

}  // namespace fsdp
