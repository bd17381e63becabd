// Per-tree state shared by the units of one root (internal).
#pragma once

#include <vector>

#include "fsdp/runtime/fsdp_unit.h"

namespace fsdp {

/// State of one root unit's tree, shared by all its units: forward order (for prefetch), the
/// backward final callback, and the unsharded-bytes counters. See docs/architecture.md,
/// "[Note: root and final callback]".
struct RootContext {
  FSDPUnit* root = nullptr;
  std::vector<FSDPUnit*> units;               ///< every unit of the tree, root first
  std::vector<FSDPUnit*> forward_order;       ///< uses in this forward, in order
  std::vector<FSDPUnit*> last_forward_order;  ///< uses in the last finished forward
  bool in_forward = false;
  bool callback_queued = false;
  FSDPUnit* last_reduce_scatter = nullptr;    ///< unit whose reduce-scatter was issued last
  int64_t unsharded_param_bytes = 0;
  int64_t peak_unsharded_param_bytes = 0;

  /// Units (root excluded) holding or gathering unsharded params now.
  int num_unsharded_non_root() const;
  /// Issues unit's all-gather if it is sharded and the bound on unsharded units allows it.
  void prefetch(FSDPUnit* unit);
  /// Queues final_callback() on the autograd engine once per backward pass.
  void ensure_final_callback();
  /// End of backward: fallback post-backward for units whose post-backward hook did not run,
  /// wait for all reduce-scatters, reshard every unit.
  void final_callback();
};

}  // namespace fsdp
