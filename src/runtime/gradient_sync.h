// GradientSync: how one unit's gradients leave it after backward (internal), chosen once per unit
// from its strategy's traits row (StrategyTraits::grad_sync): a reduce-scatter over the shard group
// at post-backward (reduce_scatter_sync.cpp), or DDP buckets all-reduced from the AccumulateGrad
// hooks (bucket_sync.cpp, over DdpReducer). The unit calls the interface and never asks which one
// it has. docs/architecture.md, "Seams".
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/fsdp_param.h"
#include "strategy.h"
#include "unit_collectives.h"

namespace fsdp::detail {

/// What a gradient-sync mechanism works over: the unit's params and groups. `params` outlives the
/// mechanism and is never resized (the unit owns both).
struct GradientSyncArgs {
  std::vector<FSDPParam>* params = nullptr;
  comm::ProcessGroupPtr shard_group;      ///< the reduce-scatter's group
  comm::ProcessGroupPtr replicate_group;  ///< all-reduce over replicas (may be null for reduce-scatter)
  c10::ScalarType reduce_dtype = c10::kFloat;
  int64_t bucket_cap_bytes = 0;           ///< DDP bucket size (buckets only)
  /// The reduce-scatter's wire (reduce-scatter only): FullyShardOptions::reduce_scatter_codec and
  /// the host-aware groups ([Note: host-aware collectives]).
  WireCodec reduce_scatter_codec = WireCodec::kNone;
  HostGroups hosts;
  /// The tag of the unit's collectives in a phase (its name and the tree's forward pass).
  std::function<comm::OpTag(const char* phase)> tag;
};

/// One unit's gradient reduction. Every call comes from the unit, on the thread that runs
/// forward and backward; collectives follow the unit's call-order rule (same units, same order on
/// every rank). Gradients are averaged over the ranks and added into each param's sharded_param
/// .grad() (accumulated, in the param's dtype).
class GradientSync {
 public:
  virtual ~GradientSync() = default;

  /// True when the unit's gradients go out at its post-backward, as one reduction the unit's
  /// tree sequences (the scheduler finishes the previous unit's when this one's is issued);
  /// false when they go out from the AccumulateGrad hooks and at the end of backward.
  virtual bool reduces_at_post_backward() const = 0;
  /// Issues the reduction of every trainable param's unsharded gradient (freed once packed;
  /// zeros for params without one on this rank). Non-blocking. Only when
  /// reduces_at_post_backward() and nothing is in flight (has_reduction_in_flight() false).
  virtual void issue(const comm::OpTag& tag) = 0;
  /// True while a reduction issued by issue() or reduce_pending() has not been finished.
  virtual bool has_reduction_in_flight() const = 0;
  /// Waits for what is in flight and adds its result into the sharded grads. Buckets: at the end
  /// of a backward the unit took part in (`took_part`, or a gradient reported by a hook) and
  /// with `sync` on, first issues every bucket not issued yet. Blocking; rethrows a collective's
  /// error. Returns true when a reduce-scatter's result was added (the shards' gradients changed).
  virtual bool finish(bool took_part, bool sync) = 0;
  /// End of a synced backward in which the unit took no part: reduces the gradients it
  /// accumulated earlier (params without one contribute zeros). Reduce-scatter: issues it (the
  /// next finish() adds it); buckets: issues and finishes every bucket. Collective.
  virtual void reduce_pending(const comm::OpTag& tag) = 0;
  /// The set of trainable params changed (nothing in flight): rebuilds the layout or buckets;
  /// `armed` as in set_armed.
  virtual void rebuild(bool armed) = 0;
  /// Whether gradient hooks reduce now (the unit syncs gradients and belongs to a tree). No-op
  /// for the reduce-scatter.
  virtual void set_armed(bool armed) = 0;
  /// The module params are their unsharded tensors now: (re)installs gradient hooks where they
  /// changed. No-op for the reduce-scatter.
  virtual void ensure_hooks() = 0;
  /// The next backward may accumulate a param's gradient more than once (an activation-checkpointed
  /// region's nested backward): nothing goes out before its end. No-op for the reduce-scatter.
  virtual void defer_to_end_of_backward() = 0;
  /// A failed step: waits for everything in flight (errors ignored) and drops its results. Never
  /// throws.
  virtual void drop() noexcept = 0;
  /// At the unit's destruction, before its buffers go: waits for the reduce-scatter in flight
  /// (rethrows its error; the unit ignores it). Buckets are waited for by their destructor.
  virtual void wait_issued() = 0;
};

/// The mechanism of `kind` over `args` (the unit's traits row picks kind once).
std::unique_ptr<GradientSync> make_gradient_sync(GradSync kind, GradientSyncArgs args);
/// The two mechanisms (reduce_scatter_sync.cpp, bucket_sync.cpp).
std::unique_ptr<GradientSync> make_reduce_scatter_sync(GradientSyncArgs args);
std::unique_ptr<GradientSync> make_bucket_sync(GradientSyncArgs args);

}  // namespace fsdp::detail
