// no_shard's gradient reduction (DDP): the bucket policy apart from the transport, as in
// Flashlight's Reducer (internal). docs/architecture.md, "Strategies", no_shard.
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"
#include "fsdp/runtime/fsdp_param.h"

namespace fsdp::detail {

/// Which trainable params share an all-reduce bucket and when a bucket may go out: DDP's policy.
/// Trainable params in reverse registration order (roughly the order backward produces their
/// gradients), packed greedily into buckets of at most cap_elems elements (a larger param gets a
/// bucket of its own); a bucket is issued once all its gradients are ready and every earlier bucket
/// is issued, so all ranks issue the same buckets in the same order. No tensors, no communication.
class BucketPlan {
 public:
  /// numels[i]: elements of param i, or -1 for a frozen param (no bucket).
  BucketPlan(const std::vector<int64_t>& numels, int64_t cap_elems);
  size_t num_buckets() const { return buckets_.size(); }
  /// Param indices of bucket b, in packing order.
  const std::vector<int>& params_of(size_t b) const { return buckets_[b].params; }
  int64_t numel_of(size_t b) const { return buckets_[b].numel; }
  /// Marks param i's gradient of this backward ready; returns the buckets that may be issued now,
  /// in order. Returns false in *twice when it was already ready in this backward (nothing marked).
  std::vector<size_t> mark_ready(int i, bool* twice);
  /// The buckets not issued yet, in order (end of backward); all count as issued afterwards.
  std::vector<size_t> take_remaining();
  /// Starts a new backward: nothing ready, nothing issued.
  void reset();

 private:
  struct Bucket {
    std::vector<int> params;
    int64_t numel = 0;
    int ready = 0;
  };
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // param -> bucket (-1: frozen)
  std::vector<char> ready_;
  size_t next_ = 0;  // first bucket not issued
};

/// The transport side: packs a bucket's unsharded gradients, all-reduces it (average, in
/// reduce_dtype) over the replicate group, and adds the result into the sharded grads. Owns the
/// AccumulateGrad post-hooks that report ready gradients (the tensor holds its AccumulateGrad node
/// only weakly: the reducer keeps the nodes alive; the hooks hold the reducer weakly), installed
/// by ensure_hooks ([Note: reducer hooks] in ddp_reducer.cpp).
class DdpReducer : public std::enable_shared_from_this<DdpReducer> {
 public:
  /// The tag of the unit's collectives in `phase` (its name and the tree's forward pass, read when
  /// a bucket is issued).
  using TagFn = std::function<comm::OpTag(const char* phase)>;
  /// params: the unit's params (outlives the reducer); group: the replicate group (all ranks).
  static std::shared_ptr<DdpReducer> create(std::vector<FSDPParam>& params, comm::ProcessGroupPtr group,
                                            c10::ScalarType reduce_dtype, int64_t cap_bytes, TagFn tag);
  /// Whether the hooks reduce now (the unit syncs gradients and belongs to a tree).
  void set_armed(bool armed) { armed_ = armed; }
  /// Hooks the AccumulateGrad node each trainable param has now, unless it is the one hooked
  /// already. Call while the module params point at their unsharded tensors (after the unit's
  /// unshard, before its forward uses them). Cheap when nothing changed (one pointer compare per
  /// param).
  void ensure_hooks();
  /// From the AccumulateGrad post-hook of param i: issues the buckets that became complete.
  /// Throws fsdp::Error (kState) when param i's gradient is accumulated twice in one backward.
  void on_grad_accumulated(int i);
  /// The next backward issues no bucket from the hooks: all go at its end (finish), as the
  /// parameters' gradients may be accumulated more than once (the nested backward passes of
  /// activation-checkpointed regions). Same on every rank, as the regions are.
  void defer_to_end_of_backward() { deferred_ = true; }
  /// True when a gradient was reported in the current backward.
  bool touched() const { return touched_; }
  /// End of a backward: when `issue_rest`, issues the buckets not issued yet (params without a
  /// gradient on this rank contribute zeros); waits for every issued bucket and adds it into the
  /// sharded grads; starts a new backward. Blocking.
  void finish(bool issue_rest);
  /// Waits for buckets in flight without using their results (errors ignored), then starts a new
  /// backward with nothing ready: a failed backward's gradients are dropped (also at destruction).
  /// Never throws.
  void abandon() noexcept;

 private:
  DdpReducer(std::vector<FSDPParam>& params, comm::ProcessGroupPtr group, c10::ScalarType reduce_dtype,
             int64_t cap_bytes, TagFn tag);
  ErrorContext where(const char* op) const { return ErrorContext{group_->rank(), tag_("").unit, op}; }
  void issue(size_t b);

  std::vector<FSDPParam>& params_;
  comm::ProcessGroupPtr group_;
  c10::ScalarType reduce_dtype_;
  TagFn tag_;
  BucketPlan plan_;
  std::vector<at::Tensor> buffers_;      // per bucket, while issued
  std::vector<comm::WorkPtr> works_;     // per bucket, while issued
  // Per param: the hooked AccumulateGrad node (kept alive) and its address, null when none yet.
  std::vector<std::shared_ptr<void>> grad_accumulators_;
  std::vector<const void*> hooked_nodes_;
  bool armed_ = false;
  bool touched_ = false;
  bool deferred_ = false;
};

}  // namespace fsdp::detail
