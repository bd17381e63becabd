// FSDPParam: one parameter's sharded/unsharded lifecycle (layer 3). See docs/architecture.md,
// "[Note: storage-resize free]".
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "fsdp/shard/layout.h"

namespace fsdp {

/// One parameter managed by an FSDP unit.
///
/// - `sharded_param` (leaf tensor, shape (real_rows(rank), d1, ...), original dtype, requires_grad as
///   the module's parameter): this rank's rows. It is what optimizers update, and its .grad() is the
///   sharded gradient (fp32 when the module is fp32). A view of `sharded_storage`.
/// - `sharded_storage` (shape (rows_per_rank, d1, ...)): the rows plus zero padding rows.
/// - `module_param`: the parameter object the module computes with (the unsharded param). Its data
///   always views `unsharded_padded`, whose storage is allocated while the unit is unsharded and
///   resized to 0 bytes while it is sharded; views of it saved by autograd see the re-gathered data.
///   Strategies: with no_shard and no param_dtype cast, `unsharded_padded` *is* `sharded_storage`
///   (the module param aliases the full rows, never freed); with zero1 its storage stays allocated
///   between steps (full params), refreshed by an all-gather when the rows changed.
struct FSDPParam {
  std::string fqn;                 ///< name relative to the unit's module
  std::vector<int64_t> shape;      ///< unsharded shape
  shard::ParamShardSpec spec;      ///< dim-0 layout at the unit's world size
  bool requires_grad = true;
  at::Tensor module_param;         ///< the module's Parameter (unsharded param)
  at::Tensor sharded_storage;      ///< (rows_per_rank, d1, ...), original dtype
  at::Tensor sharded_param;        ///< (real_rows, d1, ...) leaf view of sharded_storage
  at::Tensor unsharded_padded;     ///< (world_size*rows_per_rank, d1, ...), param_dtype

  /// Bytes of the unsharded padded storage when allocated.
  int64_t unsharded_bytes() const;
};

}  // namespace fsdp
