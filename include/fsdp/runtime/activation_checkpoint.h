// Activation checkpointing: run a region of the forward without keeping its activations, and
// recompute them in backward. libtorch's C++ frontend has no torch.utils.checkpoint; this is one,
// and it composes with FSDP units. docs/architecture.md, "[Note: activation checkpointing]".
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <utility>
#include <vector>

#include "fsdp/runtime/fully_shard.h"

namespace fsdp {

/// The forward of a checkpointed region: tensors in, tensors out. It must compute the same
/// function when it is run again in backward (same modules, same control flow; random ops are
/// replayed, see checkpoint_activations), and it must stay callable until that backward has run.
using RegionForward = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// Returns fn(inputs), keeping only `inputs` for backward instead of every activation inside fn.
/// With grad enabled, fn runs under no grad; when the gradient of the outputs arrives, backward
/// re-runs fn with grad enabled on detached copies of the inputs (the CPU generator's state set to
/// the one fn saw the first time, so dropout draws the same masks; restored afterwards), then
/// backpropagates through that recomputed graph: parameter gradients accumulate as in a plain
/// run, and the inputs' gradients are returned. With grad disabled it is fn(inputs), nothing else.
///
/// FSDP units called inside fn (through fsdp::call) are resharded after their forward, register
/// no backward hooks then, and are replayed by the recompute: each use is unsharded again (an
/// all-gather tagged "backward (recompute)"), keeps its place in the tree's forward order (so
/// backward prefetch is unchanged), and runs its pre-backward and post-backward (reduce-scatter)
/// once, as in a plain run. Every rank must checkpoint the same regions (the usual call-order rule
/// of the units' collectives). no_shard units used inside a region reduce their buckets at the end
/// of that backward (a parameter may get its gradient from several recomputes).
///
/// Memory: the inputs (and the outputs, which the caller keeps) of each region stay alive until
/// its backward; the activations inside one region exist only during its recompute.
/// Blocking where the units' all-gathers are. Throws fsdp::Error: kUnsupported for a region
/// inside another region's forward or recompute, or one that calls the root unit of a tree;
/// kState when the recompute uses other units, or in another order, than the forward did.
std::vector<at::Tensor> checkpoint_activations(RegionForward fn, const std::vector<at::Tensor>& inputs);

/// One tensor in, one out: checkpoint_activations over fn.
at::Tensor checkpoint_activations(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input);

/// fsdp::call(module, input) as a checkpointed region: the usual way to checkpoint one block
/// (e.g. a transformer block that is an FSDP unit). `module` (a ModuleHolder, std::shared_ptr or
/// raw pointer) is copied into the region and must stay alive until backward.
template <typename Holder>
at::Tensor call_checkpointed(Holder module, const at::Tensor& input) {
  return checkpoint_activations(
      std::function<at::Tensor(const at::Tensor&)>(
          [module](const at::Tensor& x) mutable -> at::Tensor { return fsdp::call(module, x); }),
      input);
}

}  // namespace fsdp
