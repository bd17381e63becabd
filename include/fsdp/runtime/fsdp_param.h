// FSDPParam: one parameter's sharded/unsharded lifecycle (layer 3). See docs/architecture.md,
// "[Note: storage-resize free]".
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

#include "fsdp/common/check.h"
#include "fsdp/shard/layout.h"

namespace fsdp {

/// One parameter managed by an FSDP unit: its sharded storage, its unsharded storage, and the
/// copies between them and the communication buffers. Not thread-safe; owned by its unit.
///
/// - `sharded_param` (leaf tensor, shape (real_rows(rank), d1, ...), original dtype, requires_grad as
///   the module's parameter): this rank's rows. It is what optimizers update, and its .grad() is the
///   sharded gradient (fp32 when the module is fp32). A view of `sharded_storage`.
/// - `sharded_storage` (shape (rows_per_rank, d1, ...)): the rows plus zero padding rows, a view of
///   the unit's flat shard buffer.
/// - `module_param`: the parameter object the module computes with (the unsharded param). Its data
///   always views `unsharded_padded`, whose storage is allocated while the unit is unsharded and
///   resized to 0 bytes while it is sharded; views of it saved by autograd see the re-gathered data.
///   Strategies whose params alias the shards (no_shard without a dtype cast): `unsharded_padded`
///   *is* `sharded_storage` (never freed); zero1 keeps its storage allocated between steps.
struct FSDPParam {
  std::string fqn;                 ///< name relative to the unit's module
  std::vector<int64_t> shape;      ///< unsharded shape
  shard::ParamShardSpec spec;      ///< dim-0 layout at the unit's shard world size
  bool requires_grad = true;
  at::Tensor module_param;         ///< the module's Parameter (unsharded param)
  at::Tensor sharded_storage;      ///< (rows_per_rank, d1, ...), original dtype
  at::Tensor sharded_param;        ///< (real_rows, d1, ...) leaf view of sharded_storage
  at::Tensor unsharded_padded;     ///< (world_size*rows_per_rank, d1, ...), param_dtype

  /// Makes this rank's shard: copies rows [row_offset(rank), +real_rows) of module_param into
  /// `storage` (shape (rows_per_rank * row_numel), a slice of the unit's flat buffer; no copy when
  /// module_param holds no values: a meta param, or one moved off the meta device), creates
  /// sharded_param, and points module_param at unsharded_padded (param_dtype, on storage's
  /// device), which aliases the storage when `alias` is true and is freed otherwise. spec must be
  /// set. Not collective.
  void init_shard(const at::Tensor& storage, int64_t rank, c10::ScalarType param_dtype, bool alias);

  /// Copies rows [row_offset(rank), +real_rows(rank)) of `full` (the param's unsharded shape,
  /// any dtype) into sharded_storage. spec must be set. Not collective.
  void copy_rows_from(const at::Tensor& full, int64_t rank);
  /// Turns a module_param built on the meta device into an empty (shape [0]) tensor on `device`,
  /// keeping the parameter object (TensorImpl), its name and requires_grad, before init_shard.
  /// Call before anything took the param's gradient accumulator. No-op for a non-meta param.
  void move_meta_param_to(c10::DeviceType device);
  /// Points module_param back at its unsharded storage when allocated (aliasing or persistent
  /// params), or at an empty tensor (shape [0]) when freed: the state after a write of full
  /// values into module_param (fsdp::materialize).
  void restore_module_param();
  /// Allocates unsharded_padded's storage (no-op when allocated) and points module_param at it.
  void alloc_unsharded();
  /// Frees unsharded_padded's storage (0 bytes); module_param then holds an empty tensor (shape
  /// [0]) until the next alloc_unsharded.
  void free_unsharded();
  /// True while module_param holds no data (freed, and the param is not empty itself).
  bool resharded() const;
  /// Bytes of the unsharded padded storage when allocated.
  int64_t unsharded_bytes() const;
  /// Bytes of unsharded storage allocated now (0 when freed).
  int64_t allocated_unsharded_bytes() const;

  /// Copies this param's rows out of an all-gather result: `blocks` is (world, S) rank-major, or
  /// (h, H, S) in the host-aware order (rank k*h + l's block at [l][k]: host k, place l; [Note:
  /// host-aware collectives]), with this param's slice at [offset, offset + padded_shard_numel) of
  /// every block. Allocates first.
  void copy_in_unsharded(const at::Tensor& blocks, int64_t offset);
  /// Takes module_param's unsharded gradient of this backward out of the param (which then holds
  /// none): returns it in the param's shape and dtype, or an undefined tensor when this rank has
  /// no gradient for it. Throws fsdp::Error (kInvalidArgument, at `where`) when the gradient's
  /// shape differs from the param's (the gradient is then left in place). Every gradient
  /// reduction (reduce-scatter input, DDP bucket) packs through it.
  at::Tensor release_unsharded_grad(const ErrorContext& where);
  /// Writes module_param's unsharded gradient into a reduce-scatter input `blocks` ((world, S)
  /// rank-major, or (h, H, S) in the host-aware order as for copy_in_unsharded) at
  /// [offset, offset + padded_shard_numel) of every block (rank-major rows, zero padding; zeros when
  /// there is no gradient on this rank), then frees the unsharded gradient. Throws fsdp::Error
  /// (naming `where`) when the gradient's shape differs from the param's.
  void take_unsharded_grad(const at::Tensor& blocks, int64_t offset, const std::string& where);
  /// Points module_param's data at unsharded_padded's first dim0 rows, in the param's shape.
  void point_module_param_at_unsharded();
  /// sharded_param.grad() += piece (cast to the param's dtype), or = a copy when undefined.
  /// piece: (real_rows, d1, ...) or anything of that numel.
  void accumulate_sharded_grad(const at::Tensor& piece);
};

}  // namespace fsdp
