// What this machine's CPU offers libtorch's kernels: the ISA level libtorch dispatches to and the
// low-precision matmul units (bf16/fp16) that make mixed precision faster than fp32 on a CPU.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

namespace fsdp {

/// The CPU as libtorch sees it. Read once per process (cpu_info() caches it).
struct CpuInfo {
  std::string model = "unknown CPU";  ///< "model name" of /proc/cpuinfo
  std::string capability;             ///< at::get_cpu_capability(): "AVX512", "AVX2", "DEFAULT", ...
  bool avx512_bf16 = false, amx_bf16 = false;  ///< CPU flags of bf16 dot-product units
  bool avx512_fp16 = false, amx_fp16 = false;  ///< CPU flags of fp16 arithmetic units
  bool onednn_bf16 = false;  ///< libtorch sends bf16 matmuls to oneDNN (mkldnn bf16 device check)
  bool onednn_fp16 = false;  ///< libtorch sends fp16 matmuls to oneDNN (mkldnn fp16 device check)

  /// bf16 matmuls run on bf16 units through oneDNN (faster than fp32); otherwise libtorch emulates
  /// them or takes a reference kernel, which is slower than fp32.
  bool bf16_accelerated() const { return onednn_bf16 && (avx512_bf16 || amx_bf16); }
  /// Same for fp16.
  bool fp16_accelerated() const { return onednn_fp16 && (avx512_fp16 || amx_fp16); }
  /// One line, e.g. "AMD EPYC, libtorch AVX512; bf16 matmuls accelerated (avx512_bf16), fp16 not".
  std::string summary() const;
};

/// This machine's CpuInfo (computed at the first call; thread-safe). Not collective. Never throws:
/// a field it cannot read keeps its default.
const CpuInfo& cpu_info();

/// How many times longer a square matmul takes in `dtype` (kBFloat16 or kHalf) than in fp32 on
/// this CPU, measured now in the calling thread: C = A·B with A, B of shape [dim, dim] (best of
/// `reps` timed runs each, after one untimed run), through at::mm and the caller's intra-op thread
/// setting. Blocks: dim = 128 takes about 1 ms on a CPU with bf16 units and 20-60 ms where libtorch
/// emulates them. Not collective. Throws std::invalid_argument for another dtype, dim < 16 or
/// reps < 1.
double matmul_time_ratio_vs_fp32(c10::ScalarType dtype, int64_t dim = 128, int reps = 3);

}  // namespace fsdp
