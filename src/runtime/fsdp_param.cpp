#include "fsdp/runtime/fsdp_param.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>

#include "fsdp/common/check.h"

namespace fsdp {
namespace {

std::vector<int64_t> shape_with_rows(const FSDPParam& p, int64_t rows) {
  std::vector<int64_t> s = p.shape;
  if (s.empty()) return {rows};  // 0-dim params are one row of one element
  s[0] = rows;
  return s;
}

}  // namespace

// [Note: storage-resize free] The unsharded param keeps one StorageImpl for its whole life; reshard
// frees the bytes (size 0), unshard allocates them again. Autograd may have saved views of the
// param (e.g. weight.t() in linear): they share the StorageImpl, so they see the re-gathered data
// in backward and hold no memory in between (the approach of PyTorch FSDP2's storage resize_(0)).
// While resharded, the module's parameter object itself holds an empty tensor (shape [0]), so code
// that reads it outside its unit's forward gets an empty tensor or an ATen shape error, which
// fsdp::call turns into an error naming the parameter, never a read of freed memory.
void FSDPParam::free_unsharded() {
  auto* impl = unsharded_padded.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, unsharded_padded.device()));
  impl->set_nbytes(0);
  module_param.set_data(at::empty({0}, unsharded_padded.options()));
}

void FSDPParam::alloc_unsharded() {
  auto* impl = unsharded_padded.storage().unsafeGetStorageImpl();
  const int64_t nbytes = unsharded_bytes();
  if (unsharded_padded.is_meta()) {
    impl->set_nbytes(nbytes);  // a dry run: the bytes are counted, none exist
  } else if (!(static_cast<int64_t>(impl->nbytes()) == nbytes && impl->data() != nullptr)) {
    c10::Allocator* alloc = c10::GetAllocator(unsharded_padded.device().type());
    impl->set_data_ptr_noswap(alloc->allocate(nbytes));
    impl->set_nbytes(nbytes);
  }
  point_module_param_at_unsharded();
}

void FSDPParam::point_module_param_at_unsharded() {
  at::Tensor view = unsharded_padded.narrow(0, 0, spec.dim0);
  if (module_param.data_ptr() == view.data_ptr() && module_param.sizes().vec() == shape) return;
  // A 0-dim param is one row of one element. (view({}) would pick view(ScalarType) and
  // reinterpret the bytes as uint8: the shape must be spelled as an IntArrayRef.)
  module_param.set_data(shape.empty() ? view.view(at::IntArrayRef{}) : view);
}

void FSDPParam::move_meta_param_to(c10::DeviceType device) {
  if (!module_param.is_meta()) return;
  // Variable::set_data refuses to change a tensor between the meta and another device type; the
  // TensorImpl itself may take another's metadata (what set_data does once its check passed), so
  // every handle of the module (e.g. a `weight` member) sees the new device.
  at::Tensor empty = at::empty({0}, module_param.options().device(device));
  module_param.unsafeGetTensorImpl()->shallow_copy_from(empty.getIntrusivePtr());
}

void FSDPParam::restore_module_param() {
  if (allocated_unsharded_bytes() > 0 || unsharded_padded.is_same(sharded_storage)) {
    point_module_param_at_unsharded();
  } else {
    module_param.set_data(at::empty({0}, unsharded_padded.options()));
  }
}

bool FSDPParam::resharded() const { return module_param.numel() == 0 && spec.numel() > 0; }

int64_t FSDPParam::unsharded_bytes() const {
  return spec.padded_numel() * static_cast<int64_t>(unsharded_padded.element_size());
}

int64_t FSDPParam::allocated_unsharded_bytes() const {
  return unsharded_padded.defined() ? static_cast<int64_t>(unsharded_padded.storage().nbytes()) : 0;
}

void FSDPParam::init_shard(const at::Tensor& storage, int64_t rank, c10::ScalarType param_dtype,
                           bool alias) {
  at::NoGradGuard no_grad;
  const auto& s = spec;
  sharded_storage = storage.view(shape_with_rows(*this, s.rows_per_rank));
  const int64_t rows = s.real_rows(rank);
  const bool has_values = !module_param.is_meta() && module_param.numel() == s.numel();
  if (has_values) copy_rows_from(module_param, rank);
  sharded_param = sharded_storage.narrow(0, 0, rows).detach();
  sharded_param.set_requires_grad(requires_grad);
  unsharded_padded = alias ? sharded_storage
                           : at::empty(shape_with_rows(*this, s.rows_per_rank * s.world_size),
                                       at::dtype(param_dtype).device(storage.device()));
  point_module_param_at_unsharded();
  if (!alias) free_unsharded();
}

void FSDPParam::copy_rows_from(const at::Tensor& full, int64_t rank) {
  at::NoGradGuard no_grad;
  const auto& s = spec;
  const int64_t rows = s.real_rows(rank);
  if (rows == 0) return;
  sharded_storage.view({s.rows_per_rank, s.row_numel})
      .narrow(0, 0, rows)
      .copy_(full.detach().reshape({s.dim0, s.row_numel}).narrow(0, s.row_offset(rank), rows));
}

namespace {

// blocks as (h, H, S): a rank-major (world, S) is the host-aware order with one host.
at::Tensor host_order(const at::Tensor& blocks) { return blocks.dim() == 2 ? blocks.unsqueeze(1) : blocks; }

}  // namespace

void FSDPParam::copy_in_unsharded(const at::Tensor& blocks, int64_t offset) {
  at::NoGradGuard no_grad;
  alloc_unsharded();
  const auto& s = spec;
  if (s.padded_shard_numel() == 0) return;
  const at::Tensor b = host_order(blocks);
  const int64_t per_host = b.size(0), hosts = b.size(1);
  // Rank k*h + l's rows come from [l][k]: one strided copy puts them in rank order.
  unsharded_padded.view({hosts, per_host, s.rows_per_rank, s.row_numel})
      .copy_(b.narrow(2, offset, s.padded_shard_numel())
                 .view({per_host, hosts, s.rows_per_rank, s.row_numel})
                 .transpose(0, 1));
}

at::Tensor FSDPParam::release_unsharded_grad(const ErrorContext& where) {
  at::Tensor g = module_param.grad();
  if (g.defined()) {
    FSDP_CHECK(g.sizes().vec() == shape, ErrorKind::kInvalidArgument, where,
               expected_actual("gradient shape of '" + fqn + "'", shard::shape_to_string(shape), g.sizes()));
  }
  module_param.mutable_grad() = at::Tensor();
  return g;
}

void FSDPParam::take_unsharded_grad(const at::Tensor& blocks, int64_t offset, const std::string& where) {
  at::NoGradGuard no_grad;
  const auto& s = spec;
  const at::Tensor b = host_order(blocks);
  const int64_t per_host = b.size(0), hosts = b.size(1);
  at::Tensor g = release_unsharded_grad(ErrorContext{-1, where, "reduce_scatter"});  // freed once packed
  if (s.padded_shard_numel() == 0) return;
  at::Tensor rows = g.defined() ? g.reshape({s.dim0, s.row_numel}) : at::Tensor();
  for (int64_t k = 0; k < hosts; ++k) {
    // Host k's ranks k*h .. k*h+h-1, a (h, rows_per_rank, row_numel) view of their blocks.
    at::Tensor out = b.select(1, k).narrow(1, offset, s.padded_shard_numel()).view({per_host, s.rows_per_rank, s.row_numel});
    if (!rows.defined()) {
      out.zero_();  // no gradient on this rank this step: zeros
      continue;
    }
    const int64_t first_row = k * per_host * s.rows_per_rank;
    const int64_t real = std::clamp<int64_t>(s.dim0 - first_row, 0, per_host * s.rows_per_rank);
    const int64_t full = s.rows_per_rank ? real / s.rows_per_rank : 0;  // ranks with all rows real
    const int64_t rem = real - full * s.rows_per_rank;
    if (full > 0) {
      out.narrow(0, 0, full).copy_(rows.narrow(0, first_row, full * s.rows_per_rank).view({full, s.rows_per_rank, s.row_numel}));
    }
    if (full < per_host) {
      // The rank holding the last real rows, then padding (and ranks with empty shards) as zeros.
      at::Tensor partial = out[full];
      if (rem > 0) partial.narrow(0, 0, rem).copy_(rows.narrow(0, first_row + full * s.rows_per_rank, rem));
      partial.narrow(0, rem, s.rows_per_rank - rem).zero_();
      if (full + 1 < per_host) out.narrow(0, full + 1, per_host - full - 1).zero_();
    }
  }
}

void FSDPParam::accumulate_sharded_grad(const at::Tensor& piece) {
  at::NoGradGuard no_grad;
  at::Tensor p = piece.view(sharded_param.sizes());
  at::Tensor& grad = sharded_param.mutable_grad();
  if (!grad.defined()) {
    grad = p.to(sharded_param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  } else {
    grad.add_(p.to(sharded_param.scalar_type()));
  }
}

}  // namespace fsdp
