// fsdp::cpu_info() and matmul_time_ratio_vs_fp32 (include/fsdp/common/cpu_info.h).
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "fsdp/common/cpu_info.h"

namespace {

TEST(CpuInfo, SummaryNamesTheModelTheCapabilityAndBothLowPrecisionDtypes) {
  const fsdp::CpuInfo& c = fsdp::cpu_info();
  EXPECT_FALSE(c.capability.empty());
  const std::string s = c.summary();
  EXPECT_EQ(s.rfind(c.model + ", libtorch " + c.capability + "; matmuls: bf16 ", 0), 0u) << s;
  EXPECT_NE(s.find(", fp16 "), std::string::npos) << s;
  // Accelerated means the CPU flag and libtorch's oneDNN check both say so.
  EXPECT_EQ(c.bf16_accelerated(), c.onednn_bf16 && (c.avx512_bf16 || c.amx_bf16));
  EXPECT_EQ(&c, &fsdp::cpu_info());  // computed once
}

TEST(CpuInfo, MatmulTimeRatioIsMeasuredForBf16AndHalfAndRefusesOtherArguments) {
  for (auto dt : {at::kBFloat16, at::kHalf}) {
    const double r = fsdp::matmul_time_ratio_vs_fp32(dt, 32, 1);
    EXPECT_TRUE(std::isfinite(r) && r > 0) << c10::toString(dt) << ": " << r;
  }
  EXPECT_THROW(fsdp::matmul_time_ratio_vs_fp32(at::kFloat), std::invalid_argument);
  EXPECT_THROW(fsdp::matmul_time_ratio_vs_fp32(at::kBFloat16, 8), std::invalid_argument);
  EXPECT_THROW(fsdp::matmul_time_ratio_vs_fp32(at::kBFloat16, 64, 0), std::invalid_argument);
  try {
    fsdp::matmul_time_ratio_vs_fp32(at::kDouble);
    FAIL() << "no throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("got Double"), std::string::npos) << e.what();
  }
}

}  // namespace
