// Public API of the sharding runtime: fully_shard, wrap policies, fsdp::call, sharded parameters.
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/fsdp_unit.h"
#include "fsdp/runtime/options.h"

namespace fsdp {

/// Makes `module` an FSDP unit over `group` and shards its parameters now.
///
/// The unit owns every parameter of module's subtree that no already-created unit owns (create
/// nested units first: fully_shard_tree does). Each rank keeps rows [r*c, r*c + real_rows) of every
/// parameter's dim 0 (c = ceil(d0 / world size)). While the unit is resharded (outside its forward
/// and backward under full_shard; between steps under shard_grad_op and hybrid_shard) the module's
/// parameter objects hold empty tensors, shape [0], no data; unsharded they hold their full shapes.
/// The unsharded shape of each is FSDPParam::shape (sharded_parameters(root)[i].param->shape).
/// no_shard keeps full parameters from the start, zero1 from its first forward. Shared (tied)
/// parameters inside one unit are managed once. The module must not gain, lose or replace parameters afterwards (an
/// adapter is added before sharding): the next forward throws fsdp::Error naming them.
///
/// Collective and blocking: all ranks of `group` call it for the same modules in the same order with
/// the same parameter names and shapes (checked: a mismatch throws fsdp::Error naming the parameter
/// and both shapes, on every rank, instead of hanging). Every rank must hold the same initial
/// values (same seed), as with PyTorch FSDP.
/// Strategies (options.strategy; docs/architecture.md, "Strategies"): rows are spread over the
/// unit's shard group (the whole group; hybrid_shard_group_size ranks for kHybridShard; this rank
/// alone for kNoShard), and replicated over the replicate group. kHybridShard and kNoShard split
/// `group` into sub-groups on first use (collective: same order on all ranks, which the rule above
/// guarantees), cached per (group, size) and shared by all units. Strategies may differ per unit,
/// but all units of one tree must use the same `group` (checked at the first forward).
/// The unit is named module->name() (its type) until its root's first forward names every unit of
/// the tree by its path in the model (FSDPUnit::name()); fully_shard_tree names them so at once.
/// Throws fsdp::Error for an invalid option (hybrid_shard_group_size not dividing the group size,
/// reshard_after_forward=true with kNoShard/kZero1, bucket_cap_bytes <= 0, options that differ
/// across ranks), a module already wrapped, or a parameter owned by another unit (a parameter
/// shared across two units).
/// The module must be called through fsdp::call for the hooks to run.
std::shared_ptr<FSDPUnit> fully_shard(std::shared_ptr<torch::nn::Module> module,
                                      comm::ProcessGroupPtr group,
                                      const FullyShardOptions& options = {});

/// Chooses the submodules that become units. Arguments: qualified name from the root, the module.
using WrapPolicy = std::function<bool(const std::string& qualified_name, torch::nn::Module& module)>;

/// Wraps modules whose dynamic type is ModuleImpl (e.g. wrap_by_type<BlockImpl>()).
template <typename ModuleImpl>
WrapPolicy wrap_by_type() {
  return [](const std::string&, torch::nn::Module& m) {
    return dynamic_cast<ModuleImpl*>(&m) != nullptr;
  };
}
/// Wraps modules whose subtree holds at least min_numel parameter elements not yet in a unit.
WrapPolicy wrap_by_min_numel(int64_t min_numel);

/// Applies fully_shard bottom-up to every proper submodule of root selected by policy (children
/// before parents) with `options`, then to root with `root_options` (default: `options`; e.g. a
/// root with mixed_precision.output_dtype = fp32 for the loss). Returns the root unit. Same
/// collective rules as fully_shard.
std::shared_ptr<FSDPUnit> fully_shard_tree(std::shared_ptr<torch::nn::Module> root,
                                           comm::ProcessGroupPtr group, const WrapPolicy& policy,
                                           const FullyShardOptions& options = {},
                                           const std::optional<FullyShardOptions>& root_options = std::nullopt);

/// The unit that wraps exactly this module, or nullptr.
std::shared_ptr<FSDPUnit> find_unit(const torch::nn::Module* module);

/// All units in root's subtree (root included if it is one), in module pre-order.
std::vector<std::shared_ptr<FSDPUnit>> units_of(const std::shared_ptr<torch::nn::Module>& root);

/// One sharded parameter: fully qualified name from root, and the leaf tensor of this rank's rows
/// (shape (real_rows, d1, ...), the dtype the module was built with). Pass `tensor` to any
/// torch::optim optimizer: it updates this rank's shard only (sharded AdamW / SGD). Its .grad() is
/// the sharded gradient after backward.
struct ShardedParameter {
  std::string name;
  at::Tensor tensor;
  FSDPUnit* unit;
  const FSDPParam* param;
};
/// Every unit's params under root, units in module pre-order. When root is a unit, names the
/// units of its tree by their paths first (as its first forward does). Not collective.
std::vector<ShardedParameter> sharded_parameters(const std::shared_ptr<torch::nn::Module>& root);
/// Just the tensors of sharded_parameters(root) (for torch::optim constructors).
std::vector<at::Tensor> parameters(const std::shared_ptr<torch::nn::Module>& root);

/// Sets requires_gradient_sync on every unit under root (FSDP2's set_requires_gradient_sync): with
/// false, backward accumulates unsharded gradients locally and communicates nothing.
void set_requires_gradient_sync(const std::shared_ptr<torch::nn::Module>& root, bool sync);

/// [Note: abandoned steps] Call in the catch block of a failed step. A step that failed on this
/// rank between the tree's forward and its backward (the loss; the start of backward, before any
/// unit's hook ran) leaves a training forward whose backward never starts, while a peer whose step
/// did not fail may be in that backward, waiting in collectives this rank will never issue: this
/// abandons the pass as failed (every unit resharded, unreduced gradients dropped). Collective and
/// blocking over the tree's groups: returns once every rank has abandoned the pass (a peer's
/// collectives of that pass fail with fsdp::Error, kStepAbandoned, which fails its step too); a
/// peer that finished the pass makes every rank's later collectives fail (kMismatch). No-op when
/// no backward is pending (a failure inside forward or backward is handled where it happens).
/// Without it, the root's next forward abandons the pass as one that ran to its end (an
/// evaluation with grad enabled), which cannot be told from a failed one when the peers' steps
/// failed in forward: the group then refuses later collectives (kMismatch). Never throws.
void abandon_step(const std::shared_ptr<torch::nn::Module>& root);

/// Blocks until every collective issued by units under root has completed and their results are
/// applied (called automatically at the end of each backward).
void wait_for_pending(const std::shared_ptr<torch::nn::Module>& root);

/// Drops every unsharded copy of the params under root (FSDPUnit::invalidate_unsharded), so that
/// the next forward all-gathers the current shards. load_full_state_dict, checkpoint::load_sharded
/// and checkpoint::import_full call it; call it after writing the fsdp::parameters() tensors
/// yourself outside an optimizer step (a unit gathered by a forward without backward, the root or
/// a shard_grad_op unit, would otherwise keep computing with the old values). Not collective.
void invalidate_unsharded(const std::shared_ptr<torch::nn::Module>& root);

namespace detail {
// Applies the unit's pre_forward to the at::Tensor arguments of a call and post_forward to the
// tensors of the result; see fsdp::call.
template <typename T>
constexpr bool is_tensor_v = std::is_same_v<std::decay_t<T>, at::Tensor>;

template <typename T>
void collect_tensor(std::vector<at::Tensor>& out, T&& arg) {
  if constexpr (is_tensor_v<T>) out.push_back(arg);
}

template <typename T>
decltype(auto) take_arg(T&& arg, std::vector<at::Tensor>& replaced, size_t index) {
  if constexpr (is_tensor_v<T>) {
    return at::Tensor(replaced[index]);
  } else {
    return std::forward<T>(arg);
  }
}

template <typename... Args, size_t... I>
constexpr std::array<size_t, sizeof...(Args)> tensor_indices(std::index_sequence<I...>) {
  constexpr bool flags[] = {is_tensor_v<Args>..., false};
  std::array<size_t, sizeof...(Args)> idx{};
  size_t count = 0;
  for (size_t k = 0; k < sizeof...(Args); ++k) {
    idx[k] = count;
    if (flags[k]) ++count;
  }
  return idx;
}

template <typename R>
R apply_post_forward(FSDPUnit& unit, R&& result) {
  using D = std::decay_t<R>;
  if constexpr (std::is_same_v<D, at::Tensor>) {
    return unit.post_forward({result})[0];
  } else if constexpr (std::is_same_v<D, std::vector<at::Tensor>>) {
    return unit.post_forward(result);
  } else {
    static_assert(std::is_same_v<D, at::Tensor> || std::is_same_v<D, std::vector<at::Tensor>>,
                  "fsdp::call supports modules returning at::Tensor or std::vector<at::Tensor>; "
                  "wrap other outputs in a module that returns tensors");
  }
}

template <typename Holder>
const torch::nn::Module* module_ptr(const Holder& m) {
  if constexpr (std::is_pointer_v<std::decay_t<Holder>>) {
    return m;
  } else {
    return m.get();
  }
}

// The unit's forward threw (called from a catch block): puts the unit back to IDLE and rethrows.
// A libtorch error while parameters of other units of the tree hold no data (resharded) becomes an
// fsdp::Error naming them and the remedies (a parameter used outside its unit's forward).
[[noreturn]] void rethrow_forward_error(FSDPUnit& unit);

template <typename Holder, typename... Args, size_t... I>
auto call_unit(FSDPUnit& unit, Holder& m, std::index_sequence<I...> seq, Args&&... args) {
  std::vector<at::Tensor> inputs;
  (collect_tensor(inputs, args), ...);
  std::vector<at::Tensor> replaced = unit.pre_forward(std::move(inputs));
  constexpr auto idx = tensor_indices<Args...>(seq);
  try {
    return apply_post_forward(unit, m->forward(take_arg(std::forward<Args>(args), replaced, idx[I])...));
  } catch (...) {
    rethrow_forward_error(unit);
  }
}
}  // namespace detail

/// Calls module->forward(args...) and, if the module is an FSDP unit, runs the unit's hooks around
/// it: unshard (all-gather) and forward prefetch before, reshard after, and the autograd hooks that
/// unshard again before its backward and reduce-scatter its gradients after. libtorch's C++ frontend
/// has no module hooks, so models route calls of sharded submodules through fsdp::call; for a module
/// that is no unit it is exactly module->forward(args...).
/// `module` is a ModuleHolder (torch::nn::Linear), a std::shared_ptr<Impl> or an Impl*.
/// Supported with units: at::Tensor arguments (others pass through), results at::Tensor or
/// std::vector<at::Tensor>. Blocking where the all-gather has not completed yet.
/// An exception from the module's forward (or from the unit's own gather, e.g. fsdp::OutOfMemory
/// under a memory budget) reaches the caller as thrown, after the unit (at the root: the whole
/// tree) is back to IDLE and resharded, so the loop may skip the batch and call the model again
/// ([Note: failed steps], docs/training_loops.md). A libtorch error whose wording says a kernel got
/// a tensor with no elements ("vec (0)", "of shape [0]", ...) while other units are resharded stays
/// a c10::Error: libtorch's message first, then the likely cause (a parameter of another unit read
/// outside that unit's forward) and the remedies.
template <typename Holder, typename... Args>
auto call(Holder&& module, Args&&... args) {
  auto unit = find_unit(detail::module_ptr(module));
  if (!unit) return module->forward(std::forward<Args>(args)...);
  return detail::call_unit(*unit, module, std::index_sequence_for<Args...>{},
                           std::forward<Args>(args)...);
}

}  // namespace fsdp
