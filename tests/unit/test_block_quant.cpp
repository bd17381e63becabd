// Block-wise int8 quantisation (include/fsdp/comm/block_quant.h): payload bytes by formula, the
// round trip within its closed-form bound per block, and non-finite blocks staying non-finite.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "fsdp/comm/block_quant.h"

using namespace fsdp::comm;

namespace {

// x with block b scaled by 10^(b mod 7 - 3), so that blocks differ by up to six orders of magnitude
// (one scale per tensor would wipe out the small blocks).
at::Tensor mixed_magnitudes(int64_t numel, at::ScalarType dtype) {
  at::manual_seed(7);
  at::Tensor x = at::randn({numel}, at::kFloat);
  for (int64_t b = 0; b < int8_block_count(numel); ++b) {
    const int64_t begin = b * kInt8BlockNumel, len = std::min(kInt8BlockNumel, numel - begin);
    x.narrow(0, begin, len).mul_(std::pow(10.0, static_cast<double>(b % 7) - 3.0));
  }
  return x.to(dtype);
}

at::Tensor round_trip(const at::Tensor& x, at::ScalarType out_dtype) {
  at::Tensor out = at::empty({1, x.numel()}, at::dtype(out_dtype));
  int8_block_dequantize(int8_block_quantize(x).unsqueeze(0), x.numel(), out);
  return out[0];
}

}  // namespace

TEST(BlockQuant, PayloadBytesByFormula) {
  // 4 bytes of scale per started block of 256, one byte per element, rounded up to 4.
  EXPECT_EQ(int8_payload_bytes(0), 0);
  EXPECT_EQ(int8_payload_bytes(1), 4 + 4);
  EXPECT_EQ(int8_payload_bytes(256), 4 + 256);
  EXPECT_EQ(int8_payload_bytes(257), 8 + 260);
  EXPECT_EQ(int8_payload_bytes(1000), 16 + 1000);
  EXPECT_EQ(int8_block_quantize(at::zeros({1001})).numel(), 16 + 1004);
  EXPECT_EQ(int8_block_quantize(at::zeros({1001})).scalar_type(), at::kByte);
}

TEST(BlockQuant, RoundTripWithinHalfAStepOfEachBlock) {
  // 1000 elements: three full blocks and a tail of 232. Bound: |x - x'| <= s_b / 2, s_b = max|x| / 127
  // over block b (round to nearest), plus the float32 rounding of q x s_b (relative 2^-24).
  for (auto in_dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor x = mixed_magnitudes(1000, in_dtype);
    const at::Tensor xf = x.to(at::kFloat), back = round_trip(x, at::kFloat);
    const at::Tensor payload = int8_block_quantize(x);
    const at::Tensor scales = payload.narrow(0, 0, 4 * 4).view(at::kFloat);
    for (int64_t b = 0; b < 4; ++b) {
      const int64_t begin = b * kInt8BlockNumel, len = std::min<int64_t>(kInt8BlockNumel, 1000 - begin);
      const at::Tensor xb = xf.narrow(0, begin, len), eb = (back.narrow(0, begin, len) - xb).abs();
      const double absmax = xb.abs().max().item<double>();
      EXPECT_NEAR(scales[b].item<double>(), absmax / 127.0, absmax * 1e-6) << "scale of block " << b;
      const double bound = absmax / 254.0 * (1 + 1e-6);
      EXPECT_LE(eb.max().item<double>(), bound) << "block " << b << " of " << at::toString(in_dtype);
      // Not trivially exact: the worst element uses a good part of its half step.
      EXPECT_GT(eb.max().item<double>(), 0.25 * bound) << "block " << b;
      // The largest element is +-127 steps, so it decodes to itself up to float rounding.
      const int64_t at_max = xb.abs().argmax().item<int64_t>();
      EXPECT_NEAR(back[begin + at_max].item<double>(), xb[at_max].item<double>(), absmax * 1e-6);
    }
  }
}

TEST(BlockQuant, SixteenBitOutputAddsOnlyItsOwnRounding) {
  // Decoding into bf16 rounds q x s_b (float32) once: |x - x'| <= s_b / 2 + |x'| 2^-8.
  const at::Tensor x = mixed_magnitudes(700, at::kFloat);
  const at::Tensor back32 = round_trip(x, at::kFloat), back16 = round_trip(x, at::kBFloat16);
  EXPECT_TRUE(at::equal(back16, back32.to(at::kBFloat16))) << "bf16 decode must be the rounded float32 decode";
}

TEST(BlockQuant, ZeroBlocksStayZeroAndNonFiniteBlocksStayNonFinite) {
  at::Tensor x = at::randn({3 * kInt8BlockNumel});
  x.narrow(0, 0, kInt8BlockNumel).zero_();
  at::Tensor with_nan = x.clone(), with_inf = x.clone();
  with_nan[kInt8BlockNumel + 5] = std::numeric_limits<float>::quiet_NaN();
  with_inf[2 * kInt8BlockNumel + 9] = std::numeric_limits<float>::infinity();
  const at::Tensor a = round_trip(with_nan, at::kFloat), b = round_trip(with_inf, at::kFloat);
  EXPECT_TRUE(at::equal(a.narrow(0, 0, kInt8BlockNumel), at::zeros({kInt8BlockNumel})));
  EXPECT_TRUE(a.narrow(0, kInt8BlockNumel, kInt8BlockNumel).isnan().all().item<bool>()) << "the NaN's block";
  EXPECT_TRUE(a.narrow(0, 2 * kInt8BlockNumel, kInt8BlockNumel).isfinite().all().item<bool>()) << "a finite block";
  EXPECT_FALSE(b.narrow(0, 2 * kInt8BlockNumel, kInt8BlockNumel).isfinite().any().item<bool>()) << "the inf's block";
  EXPECT_TRUE(b.narrow(0, kInt8BlockNumel, kInt8BlockNumel).isfinite().all().item<bool>());
}

TEST(BlockQuant, BlocksRestartAtEverySegment) {
  // A segment of 100 values near 1 (a LayerNorm gain) then one of 300 near 0.01 (weights): each
  // block's step is its own segment's, so the small values keep 1/254 of their own scale.
  at::Tensor gain = 1 + 0.01 * at::randn({100}), small = 0.01 * at::randn({300});
  const at::Tensor x = at::cat({gain, small});
  const std::vector<int64_t> segments{100, 300};
  EXPECT_EQ(fsdp::comm::int8_block_count(segments), 1 + 2);
  EXPECT_EQ(fsdp::comm::int8_payload_bytes(segments), 4 * 3 + 400);
  const at::Tensor payload = int8_block_quantize(x, segments);
  ASSERT_EQ(payload.numel(), 4 * 3 + 400);
  at::Tensor out = at::empty({1, 400});
  int8_block_dequantize(payload.unsqueeze(0), segments, out);
  const at::Tensor err = (out[0] - x).abs();
  EXPECT_LE(err.narrow(0, 100, 256).max().item<double>(), small.narrow(0, 0, 256).abs().max().item<double>() / 254 * (1 + 1e-6));
  EXPECT_LE(err.narrow(0, 356, 44).max().item<double>(), small.narrow(0, 256, 44).abs().max().item<double>() / 254 * (1 + 1e-6));
  // One segment over all 400: the first block mixes both, and the small values lose most of their digits.
  at::Tensor whole = at::empty({1, 400});
  int8_block_dequantize(int8_block_quantize(x).unsqueeze(0), 400, whole);
  EXPECT_GT((whole[0] - x).abs().narrow(0, 100, 156).max().item<double>(), 10 * err.narrow(0, 100, 156).max().item<double>());
  EXPECT_THROW(int8_block_quantize(x, {100, 299}), c10::Error);
}

TEST(BlockQuant, RowsDecodeIndependentlyAndShapesAreChecked) {
  // Two payloads laid end to end (an all-gather's output) decode as each alone.
  const at::Tensor x0 = mixed_magnitudes(300, at::kFloat), x1 = -3 * x0.flip(0);
  at::Tensor out = at::empty({2, 300});
  int8_block_dequantize(at::cat({int8_block_quantize(x0), int8_block_quantize(x1)}).view({2, -1}), 300, out);
  EXPECT_TRUE(at::equal(out[0], round_trip(x0, at::kFloat)));
  EXPECT_TRUE(at::equal(out[1], round_trip(x1, at::kFloat)));
  at::Tensor wrong = at::empty({2, 299});
  EXPECT_THROW(int8_block_dequantize(at::zeros({2, int8_payload_bytes(300)}, at::kByte), 300, wrong), c10::Error);
  EXPECT_THROW(int8_block_quantize(at::zeros({4}, at::kInt)), c10::Error);
}
