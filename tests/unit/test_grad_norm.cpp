// Tier `unit`: fsdp::sum_of_squares, the gradient norm's reduction ([Note: gradient norm accuracy]
// in docs/architecture.md): accurate in double and independent of how a tensor is split into
// dim-0 shards, in fp32, bf16 and fp16.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "fsdp/optim/clip.h"
#include "fsdp/shard/layout.h"

namespace {

// The reference: every element cast to double, squared and summed in double.
double reference(const at::Tensor& t) { return t.to(at::kDouble).square().sum().item<double>(); }

double rel(double a, double b) { return std::abs(a - b) / std::abs(b); }

}  // namespace

// 3M + 7 N(0,1) elements (a gradient the size of a small model's embedding): within 1e-9 of the
// double reference (each fp32 square rounds once). libtorch's fp32 linalg_vector_norm of the same
// tensor may be off by ~1e-4 (printed, not asserted: it depends on the CPU's kernels).
TEST(GradNorm, SumOfSquaresMatchesTheDoubleReference) {
  at::manual_seed(3);
  const at::Tensor g = at::randn({(int64_t{3} << 20) + 7});
  const double ref = reference(g);
  const double ours = fsdp::sum_of_squares(g);
  EXPECT_LT(rel(ours, ref), 1e-9) << "ours " << ours << " reference " << ref;
  const double fp32 = std::pow(at::linalg_vector_norm(g, 2).item<double>(), 2);
  std::printf("[ info ] 3M elements: sum_of_squares rel err %.2e, fp32 linalg_vector_norm^2 rel err %.2e\n",
              rel(ours, ref), rel(fp32, ref));
}

// The sum over the dim-0 shards of any world size (padding rows excluded, empty shards included)
// equals the whole tensor's to 1e-14: the norm of a sharded gradient does not depend on N.
TEST(GradNorm, ShardsAddUpToTheWholeAtEveryWorldSize) {
  at::manual_seed(5);
  const at::Tensor g = at::randn({8191, 257}) * 1e-3;  // an odd-rowed gradient, 2.1M elements
  const double whole = fsdp::sum_of_squares(g);
  for (int64_t world : {1, 2, 3, 4, 5, 8, 64, 10000}) {
    const auto spec = fsdp::shard::ParamShardSpec::make({8191, 257}, world);
    double parts = 0.0;
    for (int64_t r = 0; r < world; ++r) parts += fsdp::sum_of_squares(g.narrow(0, spec.row_offset(r), spec.real_rows(r)));
    EXPECT_LT(rel(parts, whole), 1e-14) << "world size " << world << ": shards " << parts << " whole " << whole;
  }
}

// bf16 and fp16 gradients: each square is exact in fp32, so the result equals the double reference
// of the upcast values to double rounding; an empty tensor gives 0; NaN and inf propagate.
TEST(GradNorm, LowPrecisionEmptyAndNonFinite) {
  at::manual_seed(7);
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    const at::Tensor g = at::randn({300001}).to(dt);
    EXPECT_LT(rel(fsdp::sum_of_squares(g), reference(g)), 1e-13) << at::toString(dt);
  }
  EXPECT_EQ(fsdp::sum_of_squares(at::empty({0, 4})), 0.0);
  at::Tensor g = at::ones({600000});
  g[599999] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(fsdp::sum_of_squares(g)));
  g[599999] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(fsdp::sum_of_squares(g)));
  // A non-contiguous view (a transposed gradient) reads the same elements.
  const at::Tensor m = at::randn({513, 1031});
  EXPECT_LT(rel(fsdp::sum_of_squares(m.t()), reference(m)), 1e-9);
}
