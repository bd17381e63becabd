// FSDPUnit: the parameters wrapped by one fully_shard call, communicated together (layer 3).
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/fsdp_param.h"
#include "fsdp/runtime/options.h"

namespace fsdp {

/// Where a unit stands in the step (checked at every hook; illegal transitions throw).
enum class TrainingState { kIdle, kForward, kPreBackward, kPostBackward };
/// Whether the unit's module params hold data: kSharded (storage freed), kUnsharding (all-gather in
/// flight), kUnsharded.
enum class ShardedState { kSharded, kUnsharding, kUnsharded };
const char* to_string(TrainingState s);
const char* to_string(ShardedState s);
inline std::ostream& operator<<(std::ostream& os, TrainingState s) { return os << to_string(s); }
inline std::ostream& operator<<(std::ostream& os, ShardedState s) { return os << to_string(s); }

struct StrategyTraits;  // fsdp/runtime/strategy_traits.h

namespace detail {
class AllGatherCodec;
class BufferCast;
class GradientSync;
class NodeShard;
class Scheduler;
class SubGroupCache;
struct AllGatherResult;
/// Names every unit of root's tree by its path from root ("root" for root itself). Internal.
void name_units_by_path(torch::nn::Module& root);
}  // namespace detail

/// The state machine of one FSDP unit: SHARDED -> (unshard: all-gather) -> UNSHARDED -> (reshard:
/// free) -> SHARDED, driven by the hooks fsdp::call and the autograd functions run. What a strategy
/// does is a row of traits (src/runtime/strategy.h); the collectives are free functions over the
/// unit's params (src/runtime/unit_collectives.h); the tree's order, prefetch and end-of-backward
/// live in its Scheduler. Created by fully_shard; not copyable.
///
/// Call-order rule: all ranks of the group run the same units in the same order (same forward,
/// same backward), as for any collective. Hooks run on the thread that runs forward / backward.
class FSDPUnit : public std::enable_shared_from_this<FSDPUnit> {
 public:
  /// Shards `params` (entries with fqn, shape, requires_grad and module_param filled in; see
  /// fully_shard, which collects them). Collective over group: checks that every rank passes the
  /// same names, shapes, dtypes, requires_grad flags and options (fsdp::Error, kind kMismatch,
  /// naming the parameter and both ranks' values otherwise), then takes the strategy's shard and
  /// replicate groups from `sub_groups`. Throws fsdp::Error (kInvalidArgument) for options that do
  /// not apply or are out of range, and for unsupported dtypes or devices.
  FSDPUnit(std::shared_ptr<torch::nn::Module> module, std::string name, comm::ProcessGroupPtr group,
           FullyShardOptions options, std::vector<FSDPParam> params, detail::SubGroupCache& sub_groups);
  ~FSDPUnit();
  FSDPUnit(const FSDPUnit&) = delete;
  FSDPUnit& operator=(const FSDPUnit&) = delete;

  /// The unit's path in its model ("h.3", "experts.1"; "root" for the tree's root module). Units
  /// made by fully_shard_tree are named so at once; plain fully_shard names a unit by its module's
  /// type until its root's first forward (or sharded_parameters(root)) names the tree's units by
  /// their paths. Collectives, errors, the flight recorder, traces and checkpoints use it.
  const std::string& name() const { return name_; }
  /// The tag of this unit's collectives in `phase`: name(), phase and the tree's forward pass
  /// (-1 before the tree's first forward). Not collective.
  comm::OpTag tag(const char* phase) const;
  /// A number unique to this unit in the process, never reused.
  uint64_t id() const { return id_; }
  /// "rank R, unit NAME, op OP" for errors.
  ErrorContext where(const std::string& op) const;
  /// The wrapped module (the unit holds it weakly: it must be alive).
  torch::nn::Module& module() { return *module_raw_; }
  /// True while the wrapped module is alive.
  bool module_alive() const { return !module_.expired(); }
  /// The unit's data-parallel group: every rank that trains this unit (the fully_shard argument).
  const comm::ProcessGroupPtr& group() const { return group_; }
  /// The group the params are sharded over (all-gather / reduce-scatter); rows of the specs are
  /// indexed by shard_rank(). full_shard, shard_grad_op, zero1: group(); hybrid_shard: the
  /// hybrid_shard_group_size consecutive ranks containing this rank; no_shard: a group of this rank
  /// alone (every rank holds all rows). Sub-groups are split once per (group, size) and shared by
  /// all units (see fully_shard).
  const comm::ProcessGroupPtr& shard_group() const { return shard_group_; }
  /// This rank's index into the params' dim-0 layout (ParamShardSpec::real_rows(shard_rank())).
  int64_t shard_rank() const { return shard_group_->rank(); }
  /// The ranks holding the same rows as this one (gradients are all-reduced over it), or nullptr
  /// when each rank's rows are distinct. no_shard: group(); hybrid_shard: ranks with the same
  /// position in their shard group (null when the shard group is the whole group).
  const comm::ProcessGroupPtr& replicate_group() const { return replicate_group_; }
  /// How many ranks hold a copy of each shard (1 when every rank holds distinct rows).
  int64_t num_replicas() const { return replicate_group_ ? replicate_group_->size() : 1; }
  /// True for strategies whose module params keep their full data between steps (no_shard,
  /// zero1): they are not counted against max_unsharded_units.
  bool keeps_full_params() const;
  const FullyShardOptions& options() const { return options_; }
  std::vector<FSDPParam>& params() { return params_; }
  const std::vector<FSDPParam>& params() const { return params_; }
  TrainingState training_state() const { return training_state_; }
  ShardedState sharded_state() const { return sharded_state_; }
  bool is_root() const;

  /// Issues the all-gather of this unit's params (non-blocking). No-op unless kSharded. `phase`
  /// tags the collective ("forward", "backward", ...) for the cross-rank check and the flight
  /// recorder.
  void unshard_async(const char* phase = "unshard");
  /// Makes the params usable: issues the all-gather if needed, waits, copies the output into the
  /// params' unsharded storage. Blocks. Throws fsdp::Error if the all-gather failed.
  void unshard(const char* phase = "unshard");
  /// Frees the unsharded storage (resize to 0 bytes): the module's params then hold empty tensors
  /// (shape [0]) until the next unshard; FSDPParam::shape keeps each one's unsharded shape.
  void reshard();
  /// Bytes of the node-local shard this unit keeps now (reshard_after_forward_group_size: from a
  /// grad-enabled forward to its backward; 0 otherwise).
  int64_t node_shard_bytes() const;
  /// The node-local group of reshard_after_forward_group_size, or nullptr when the unit keeps no
  /// node-local shard.
  comm::ProcessGroupPtr node_group() const;
  /// The groups of the unit's host-aware collectives (collective_host_size; [Note: host-aware
  /// collectives]): the ranks of this rank's host, then the ranks at its place on every host; both
  /// nullptr when off.
  std::pair<comm::ProcessGroupPtr, comm::ProcessGroupPtr> host_groups() const;
  /// Frees the node-local shard kept by a forward (no-op when none). Not collective: every rank
  /// calls it at the same points of the program (a new forward of the tree, the end of backward).
  void drop_node_shard() noexcept;
  /// The shards were written outside the unit's own steps (a state dict or checkpoint load):
  /// drops any unsharded copy, so the next use all-gathers the current rows. Waits for an
  /// all-gather in flight; zero1's persistent full params are kept but marked stale. Not
  /// collective. Throws fsdp::Error (kState) inside this unit's forward.
  void invalidate_unsharded();

  /// When false, post-backward keeps the unsharded gradients (accumulating over backward passes)
  /// and issues no reduce-scatter; the next backward with true reduces everything accumulated.
  void set_requires_gradient_sync(bool sync);
  bool requires_gradient_sync() const { return requires_gradient_sync_; }

  // Hooks (called by fsdp::call and the autograd functions; public for tests and drivers).
  std::vector<at::Tensor> pre_forward(std::vector<at::Tensor> inputs);
  std::vector<at::Tensor> post_forward(std::vector<at::Tensor> outputs);
  void pre_backward(int64_t forward_index);
  /// The forward between pre_forward and post_forward threw: back to IDLE (the root puts its whole
  /// tree back: Scheduler::abort_forward), so the program may run the model again. No-op unless
  /// the unit is in FORWARD or is the root of a tree still in forward. Throws nothing of its own.
  void abort_forward();
  /// [Note: failed steps] (src/runtime/scheduler.cpp): back to IDLE and resharded after an
  /// exception in the step. Waits for an all-gather in flight; with drop_grads (a failed
  /// backward) also waits for the gradient reductions in flight and drops their results and every
  /// unsharded gradient. Buffers cast for compute go back to their stored dtype. Not collective;
  /// never throws (errors of the collectives waited for are the failed step's, already reported).
  void reset_after_error(bool drop_grads) noexcept;
  /// End of a backward of the tree (its final callback): buffers cast for compute go back to their
  /// stored dtype, and the unit reshards.
  void end_of_backward();
  void post_backward();
  /// Waits for this unit's in-flight gradient reduction and adds its result to the sharded grads:
  /// the reduce-scatter (plus, for hybrid_shard, the all-reduce across replicas, blocking); for
  /// no_shard, at the end of a backward the unit took part in, first issues every bucket not issued
  /// yet (parameters without a gradient contribute zeros), then waits for all of them.
  void finish_reduce_scatter();
  /// True when a trainable param holds an unsharded gradient not reduced yet (accumulated while
  /// requires_gradient_sync was false).
  bool has_pending_grads() const;
  /// End of a synced backward in which this unit took no part: issues the reduction of the
  /// gradients it accumulated earlier (params without one contribute zeros). Collective over the
  /// unit's groups; the scheduler calls it on every rank for the same units.
  void reduce_pending_grads();

  /// True while the unit's params were built on the meta device and fsdp::materialize has not
  /// written this rank's rows yet ([Note: deferred initialisation], docs/architecture.md); a
  /// forward then throws fsdp::Error (kState). Never true on a simulated group (no values).
  bool values_pending() const { return values_pending_; }
  /// Called by fsdp::materialize once every row of this rank is written. Not collective.
  void set_values_materialized() { values_pending_ = false; }
  /// This rank's flat shard buffer of all params (1-D, original dtype, padding included).
  const at::Tensor& sharded_flat() const { return sharded_flat_; }

  /// Bytes this rank holds for the sharded params (padding included) / sharded grads.
  int64_t sharded_param_bytes() const;
  int64_t sharded_grad_bytes() const;
  /// Bytes of unsharded gradients alive now (between backward and reduce-scatter, or accumulated
  /// while requires_gradient_sync is false).
  int64_t unsharded_grad_bytes() const;
  /// Bytes of unsharded param storage allocated now: the gathered params of an unsharded unit, and
  /// zero1's full params, which stay allocated between steps (0 for a resharded unit and for
  /// no_shard without a cast, whose module params are the sharded storage).
  int64_t unsharded_param_bytes() const;
  /// dtype of the unsharded params / all-gather, and of the reduce-scatter.
  c10::ScalarType param_dtype() const { return param_dtype_; }
  c10::ScalarType reduce_dtype() const { return reduce_dtype_; }

  /// The tree's scheduler (null before the root's first forward). Internal.
  const std::shared_ptr<detail::Scheduler>& scheduler() const { return scheduler_; }
  /// Binds the unit to its tree's scheduler (Scheduler::init_tree, at the root's first forward)
  /// and arms its gradient hooks when it syncs gradients. Internal.
  void attach_scheduler(std::shared_ptr<detail::Scheduler> scheduler);

 private:
  void init_shards();
  void follow_requires_grad();
  bool has_trainable_params() const;
  // Throws fsdp::Error (kInvalidArgument) when the module's subtree registers a parameter the
  // unit does not manage (added or replaced after fully_shard) or no longer registers one it does.
  void check_params_registered() const;
  friend void detail::name_units_by_path(torch::nn::Module& root);
  bool reshard_after_forward() const;
  bool params_fresh() const;  // lazy gather: the full params hold the current sharded rows

  uint64_t id_;
  std::weak_ptr<torch::nn::Module> module_;
  torch::nn::Module* module_raw_;
  std::string name_;
  comm::ProcessGroupPtr group_;
  comm::ProcessGroupPtr shard_group_;
  comm::ProcessGroupPtr replicate_group_;
  FullyShardOptions options_;
  const StrategyTraits* traits_;
  std::vector<FSDPParam> params_;
  shard::FlatLayout gather_layout_;  // all params
  c10::ScalarType orig_dtype_ = c10::kFloat;
  c10::ScalarType param_dtype_ = c10::kFloat;
  c10::ScalarType reduce_dtype_ = c10::kFloat;
  bool params_alias_ = false;  // module params are the shard storage (no copy, never freed)
  bool values_pending_ = false;  // meta params: rows to be written by fsdp::materialize

  TrainingState training_state_ = TrainingState::kIdle;
  ShardedState sharded_state_ = ShardedState::kSharded;
  bool requires_gradient_sync_ = true;
  bool backward_active_ = false;  // a hook of this unit ran in the current backward
  // [Note: master and gather shards] (src/runtime/all_gather_codec.h): the optimizer's master
  // shard is sharded_flat_ (every FSDPParam::sharded_param views it); what the all-gather sends is
  // made from it by gather_codec_ at each unshard (today the buffer itself, or its param_dtype
  // cast). Where the master lives (host, device) is the codec's business.
  at::Tensor sharded_flat_;       // (S) this rank's padded master shards of all params, original dtype
  std::unique_ptr<detail::AllGatherCodec> gather_codec_;
  // [Note: node-local reshard] (src/runtime/node_shard.h): null unless reshard_after_forward_group_size
  // is below the shard group size; gather_from_node_ while gather_ is its all-gather.
  std::unique_ptr<detail::NodeShard> node_shard_;
  bool gather_from_node_ = false;
  // [Note: host-aware collectives]: null unless collective_host_size lies strictly between 1 and the
  // shard group size.
  comm::ProcessGroupPtr host_group_, cross_host_group_;
  int64_t forward_index_ = 0;
  std::unique_ptr<detail::AllGatherResult> gather_;
  std::unique_ptr<detail::GradientSync> grad_sync_;  // chosen once from traits_->grad_sync
  std::shared_ptr<detail::Scheduler> scheduler_;
  std::unique_ptr<detail::BufferCast> buffer_cast_;  // buffer_dtype: buffers cast during forward
  // Lazy gather: versions of the sharded params when the full params were last gathered.
  std::vector<int64_t> gathered_versions_;
  bool grads_reduced_since_gather_ = false;  // a reduced gradient may have been applied
};

}  // namespace fsdp
