// FSDPUnit: the parameters wrapped by one fully_shard call, communicated together (layer 3).
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
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

struct RootContext;

/// The state of one FSDP unit: its params' shards, the communication buffers of one all-gather and
/// one reduce-scatter, and the hooks run by fsdp::call. Created by fully_shard; not copyable.
///
/// Call-order rule: all ranks of the group run the same units in the same order (same forward,
/// same backward), as for any collective. Hooks run on the thread that runs forward / backward.
class FSDPUnit {
 public:
  /// Shards `params` (entries with fqn, shape, requires_grad and module_param filled in; see
  /// fully_shard, which collects them). Collective over group: checks that every rank passes the
  /// same names, shapes, dtypes and requires_grad flags (fsdp::Error naming the parameter and both
  /// ranks' values otherwise). Throws fsdp::Error for unsupported options.
  FSDPUnit(std::shared_ptr<torch::nn::Module> module, std::string name,
           comm::ProcessGroupPtr group, FullyShardOptions options, std::vector<FSDPParam> params);
  ~FSDPUnit();
  FSDPUnit(const FSDPUnit&) = delete;
  FSDPUnit& operator=(const FSDPUnit&) = delete;

  const std::string& name() const { return name_; }
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

  /// Issues the all-gather of this unit's params (non-blocking). No-op unless kSharded.
  void unshard_async();
  /// Makes the params usable: issues the all-gather if needed, waits, copies the output into the
  /// params' unsharded storage. Blocks. Throws fsdp::Error if the all-gather failed.
  void unshard();
  /// Frees the unsharded storage (resize to 0 bytes). Params keep their shapes but hold no data.
  void reshard();

  /// When false, post-backward keeps the unsharded gradients (accumulating over backward passes)
  /// and issues no reduce-scatter; the next backward with true reduces everything accumulated.
  void set_requires_gradient_sync(bool sync) { requires_gradient_sync_ = sync; }
  bool requires_gradient_sync() const { return requires_gradient_sync_; }

  // Hooks (called by fsdp::call and the autograd functions; public for tests and drivers).
  std::vector<at::Tensor> pre_forward(std::vector<at::Tensor> inputs);
  std::vector<at::Tensor> post_forward(std::vector<at::Tensor> outputs);
  void pre_backward(int64_t forward_index);
  void post_backward();

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

  // Internal: set by the root's lazy init.
  std::shared_ptr<RootContext> root_context() const { return root_; }
  void set_root_context(std::shared_ptr<RootContext> root) { root_ = std::move(root); }
  /// Waits for this unit's in-flight gradient reduction and adds its result to the sharded grads:
  /// the reduce-scatter (plus, for hybrid_shard, the all-reduce across replicas, blocking); for
  /// no_shard, at the end of a backward the unit took part in, first issues every bucket not issued
  /// yet (parameters without a gradient contribute zeros), then waits for all of them.
  void finish_reduce_scatter();
  /// no_shard: called by the AccumulateGrad post-hook of trainable parameter `index` once its
  /// gradient of this backward is accumulated; issues the buckets that became complete, in order.
  void on_grad_accumulated(int index);

 private:
  std::string where() const;  // "[fsdp rank R] unit 'name'"
  void init_shards();
  void lazy_init_root();
  void check_consistency_across_ranks(int shard_size);
  void copy_out_all_gather();
  void issue_reduce_scatter();
  bool reshard_after_forward() const;
  bool params_aliased() const;   // no_shard with param_dtype == original dtype
  bool params_fresh() const;     // zero1: full params hold the current sharded rows
  void build_buckets();
  void issue_bucket(size_t b);

  std::weak_ptr<torch::nn::Module> module_;
  torch::nn::Module* module_raw_;
  std::string name_;
  comm::ProcessGroupPtr group_;
  comm::ProcessGroupPtr shard_group_;
  comm::ProcessGroupPtr replicate_group_;
  FullyShardOptions options_;
  std::vector<FSDPParam> params_;
  shard::FlatLayout gather_layout_;  // all params
  shard::FlatLayout reduce_layout_;  // params with requires_grad, in order
  std::vector<int> reduce_param_index_;
  c10::ScalarType orig_dtype_ = c10::kFloat;
  c10::ScalarType param_dtype_ = c10::kFloat;
  c10::ScalarType reduce_dtype_ = c10::kFloat;

  TrainingState training_state_ = TrainingState::kIdle;
  ShardedState sharded_state_ = ShardedState::kSharded;
  bool requires_gradient_sync_ = true;
  at::Tensor sharded_flat_;  // this rank's padded shards of all params, original dtype
  int64_t forward_index_ = 0;
  at::Tensor all_gather_input_, all_gather_output_;
  comm::WorkPtr all_gather_work_;
  at::Tensor reduce_scatter_input_, reduce_scatter_output_;
  comm::WorkPtr reduce_scatter_work_;
  std::shared_ptr<RootContext> root_;
  // zero1: versions of the sharded params when the full params were last gathered.
  std::vector<int64_t> gathered_versions_;
  bool grads_reduced_since_gather_ = false;  // zero1: a reduced gradient may have been applied
  // no_shard gradient buckets (reverse parameter order), see docs/architecture.md "Strategies".
  struct Bucket {
    std::vector<int> params;  // indices into params_
    int64_t numel = 0;
    int ready = 0;
    bool issued = false;
    at::Tensor buffer;
    comm::WorkPtr work;
  };
  std::vector<Bucket> buckets_;
  std::vector<int> param_bucket_;    // params_ index -> bucket (-1: frozen)
  std::vector<char> param_ready_;    // gradient of this backward accumulated
  size_t next_bucket_ = 0;
  bool backward_active_ = false;     // a hook of this unit ran in the current backward
  // AccumulateGrad nodes of the trainable params (owning references: the tensor holds them
  // weakly, and a node that dies takes its post-hook with it).
  std::vector<std::shared_ptr<void>> grad_accumulators_;
  std::shared_ptr<FSDPUnit*> self_cell_;  // read by the hooks; nulled by the destructor
};

}  // namespace fsdp
