#include "fsdp/comm/block_quant.h"

#include <ATen/ATen.h>

namespace fsdp::comm {
namespace {

int64_t total_numel(const std::vector<int64_t>& segments) {
  int64_t n = 0;
  for (int64_t s : segments) {
    TORCH_CHECK(s >= 0, "int8 block quantisation: negative segment length ", s);
    n += s;
  }
  return n;
}

// The payload's scales ((blocks) float32) and values ((numel) int8), along its last dimension.
at::Tensor scales_of(const at::Tensor& payload, int64_t blocks) {
  return payload.narrow(-1, 0, 4 * blocks).view(at::kFloat);
}
at::Tensor values_of(const at::Tensor& payload, int64_t blocks, int64_t numel) {
  return payload.narrow(-1, 4 * blocks, numel).view(at::kChar);
}

// Applies f(blocks, per_block) segment by segment: the full blocks of a segment as a (full, 256)
// view of `x` ((numel)) with their entries of `per_block` ((blocks)) as a column, then its short
// tail block, if any.
template <typename F>
void for_blocks(const at::Tensor& x, const std::vector<int64_t>& segments, const at::Tensor& per_block, F f) {
  int64_t offset = 0, block = 0;
  for (int64_t numel : segments) {
    const int64_t full = numel / kInt8BlockNumel, tail = numel - full * kInt8BlockNumel;
    if (full > 0) {
      f(x.narrow(0, offset, full * kInt8BlockNumel).view({full, kInt8BlockNumel}),
        per_block.narrow(0, block, full).unsqueeze(1));
    }
    if (tail > 0) {
      f(x.narrow(0, offset + full * kInt8BlockNumel, tail).unsqueeze(0), per_block.narrow(0, block + full, 1).unsqueeze(1));
    }
    offset += numel;
    block += int8_block_count(numel);
  }
}

}  // namespace

int64_t int8_block_count(const std::vector<int64_t>& segments) {
  int64_t n = 0;
  for (int64_t s : segments) n += int8_block_count(s);
  return n;
}

int64_t int8_payload_bytes(const std::vector<int64_t>& segments) {
  const int64_t numel = total_numel(segments);
  return 4 * int8_block_count(segments) + (numel + 3) / 4 * 4;
}

at::Tensor int8_block_quantize(const at::Tensor& flat) { return int8_block_quantize(flat, {flat.numel()}); }

at::Tensor int8_block_quantize(const at::Tensor& flat, const std::vector<int64_t>& segments) {
  TORCH_CHECK(flat.dim() == 1 && at::isFloatingType(flat.scalar_type()),
              "int8_block_quantize: expected a 1-D floating-point tensor, got ", flat.sizes(), " ", flat.scalar_type());
  const int64_t numel = flat.numel(), blocks = int8_block_count(segments);
  TORCH_CHECK(total_numel(segments) == numel, "int8_block_quantize: segments sum to ", total_numel(segments),
              " elements, the tensor holds ", numel);
  at::NoGradGuard no_grad;
  if (flat.is_meta()) return at::empty({int8_payload_bytes(segments)}, flat.options().dtype(at::kByte));  // a dry run
  at::Tensor payload = at::zeros({int8_payload_bytes(segments)}, flat.options().dtype(at::kByte));
  if (numel == 0) return payload;
  at::Tensor q = flat.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);  // (numel) float32, ours
  at::Tensor scales = scales_of(payload, blocks);
  for_blocks(q, segments, scales,
             [](const at::Tensor& b, at::Tensor s) { s.copy_(b.abs().amax(1, true) / 127.0); });
  // All-zero blocks divide by 1 (their values are 0); non-finite scales make non-finite quotients,
  // which are zeroed before the cast (a NaN has no int8 value) and decode to NaN or inf anyway.
  const at::Tensor divisor = at::where(scales == 0, at::ones_like(scales), scales);
  for_blocks(q, segments, divisor, [](at::Tensor b, const at::Tensor& d) { b.div_(d); });
  q.round_().nan_to_num_(0.0, 0.0, 0.0).clamp_(-127, 127);
  values_of(payload, blocks, numel).copy_(q);
  return payload;
}

void int8_block_dequantize(const at::Tensor& payloads, int64_t numel, at::Tensor& out) {
  int8_block_dequantize(payloads, std::vector<int64_t>{numel}, out);
}

void int8_block_dequantize(const at::Tensor& payloads, const std::vector<int64_t>& segments, at::Tensor& out) {
  const int64_t numel = total_numel(segments), blocks = int8_block_count(segments);
  TORCH_CHECK(payloads.dim() == 2 && payloads.scalar_type() == at::kByte &&
                  payloads.size(1) == int8_payload_bytes(segments),
              "int8_block_dequantize: expected payloads (R, ", int8_payload_bytes(segments), ") uint8, got ",
              payloads.sizes(), " ", payloads.scalar_type());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == payloads.size(0) && out.size(1) == numel &&
                  at::isFloatingType(out.scalar_type()),
              "int8_block_dequantize: expected out (", payloads.size(0), ", ", numel, ") floating point, got ",
              out.sizes(), " ", out.scalar_type());
  at::NoGradGuard no_grad;
  if (numel == 0 || payloads.is_meta() || out.is_meta()) return;  // a dry run: sizes only
  const at::Tensor scales = scales_of(payloads, blocks), values = values_of(payloads, blocks, numel);
  // One row at a time: a float32 row is the only temporary (x' rounded once into out's dtype).
  at::Tensor row = at::empty({numel}, out.options().dtype(at::kFloat));
  for (int64_t r = 0; r < payloads.size(0); ++r) {
    row.copy_(values[r]);
    for_blocks(row, segments, scales[r], [](at::Tensor b, const at::Tensor& s) { b.mul_(s); });
    out[r].copy_(row);
  }
}

}  // namespace fsdp::comm
