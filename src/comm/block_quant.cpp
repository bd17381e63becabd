#include "fsdp/comm/block_quant.h"

#include <ATen/ATen.h>

namespace fsdp::comm {
namespace {

// The payload's scales ((blocks) float32) and values ((numel) int8) of one row.
at::Tensor scales_of(const at::Tensor& payload, int64_t numel) {
  return payload.narrow(-1, 0, 4 * int8_block_count(numel)).view(at::kFloat);
}
at::Tensor values_of(const at::Tensor& payload, int64_t numel) {
  return payload.narrow(-1, 4 * int8_block_count(numel), numel).view(at::kChar);
}

// Applies f(blocks, per_block) to the full blocks of `x` ((numel)) as a (full, 256) view with
// per_block's first `full` entries as a column, then to the short tail block, if any.
template <typename F>
void for_blocks(const at::Tensor& x, const at::Tensor& per_block, F f) {
  const int64_t numel = x.numel(), full = numel / kInt8BlockNumel, tail = numel - full * kInt8BlockNumel;
  if (full > 0) {
    f(x.narrow(0, 0, full * kInt8BlockNumel).view({full, kInt8BlockNumel}), per_block.narrow(0, 0, full).unsqueeze(1));
  }
  if (tail > 0) f(x.narrow(0, full * kInt8BlockNumel, tail).unsqueeze(0), per_block.narrow(0, full, 1).unsqueeze(1));
}

}  // namespace

at::Tensor int8_block_quantize(const at::Tensor& flat) {
  TORCH_CHECK(flat.dim() == 1 && at::isFloatingType(flat.scalar_type()),
              "int8_block_quantize: expected a 1-D floating-point tensor, got ", flat.sizes(), " ", flat.scalar_type());
  at::NoGradGuard no_grad;
  const int64_t numel = flat.numel();
  at::Tensor payload = at::zeros({int8_payload_bytes(numel)}, flat.options().dtype(at::kByte));
  if (numel == 0) return payload;
  at::Tensor q = flat.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);  // (numel) float32, ours
  at::Tensor scales = scales_of(payload, numel);
  for_blocks(q, scales, [](const at::Tensor& blocks, at::Tensor s) { s.copy_(blocks.abs().amax(1, true) / 127.0); });
  // All-zero blocks divide by 1 (their values are 0); non-finite scales make non-finite quotients,
  // which are zeroed before the cast (a NaN has no int8 value) and decode to NaN or inf anyway.
  const at::Tensor divisor = at::where(scales == 0, at::ones_like(scales), scales);
  for_blocks(q, divisor, [](at::Tensor blocks, const at::Tensor& d) { blocks.div_(d); });
  q.round_().nan_to_num_(0.0, 0.0, 0.0).clamp_(-127, 127);
  values_of(payload, numel).copy_(q);
  return payload;
}

void int8_block_dequantize(const at::Tensor& payloads, int64_t numel, at::Tensor& out) {
  TORCH_CHECK(payloads.dim() == 2 && payloads.scalar_type() == at::kByte && payloads.size(1) == int8_payload_bytes(numel),
              "int8_block_dequantize: expected payloads (R, ", int8_payload_bytes(numel), ") uint8, got ",
              payloads.sizes(), " ", payloads.scalar_type());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == payloads.size(0) && out.size(1) == numel &&
                  at::isFloatingType(out.scalar_type()),
              "int8_block_dequantize: expected out (", payloads.size(0), ", ", numel, ") floating point, got ",
              out.sizes(), " ", out.scalar_type());
  at::NoGradGuard no_grad;
  if (numel == 0) return;
  const at::Tensor scales = scales_of(payloads, numel), values = values_of(payloads, numel);
  // One row at a time: a float32 row is the only temporary (x' rounded once into out's dtype).
  at::Tensor row = at::empty({numel}, out.options().dtype(at::kFloat));
  for (int64_t r = 0; r < payloads.size(0); ++r) {
    row.copy_(values[r]);
    for_blocks(row, scales[r], [](at::Tensor blocks, const at::Tensor& s) { blocks.mul_(s); });
    out[r].copy_(row);
  }
}

}  // namespace fsdp::comm
