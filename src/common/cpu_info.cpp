#include "fsdp/common/cpu_info.h"

#include <ATen/Context.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <stdexcept>
#include <set>
#include <sstream>

namespace fsdp {
namespace {

// libtorch's own answer to "would a matmul of this dtype go to oneDNN": the operators behind
// torch.ops.mkldnn._is_mkldnn_bf16_supported / _is_mkldnn_fp16_supported.
bool ask_libtorch(const char* op) {
  try {
    auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
    return handle && handle->typed<bool()>().call();
  } catch (...) {
    return false;
  }
}

CpuInfo read_cpu_info() {
  CpuInfo c;
  std::ifstream in("/proc/cpuinfo");
  std::set<std::string> flags;
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && c.model == "unknown CPU" && !value.empty()) c.model = value;
    if (key == "flags" && flags.empty()) {
      std::istringstream words(value);
      for (std::string w; words >> w;) flags.insert(w);
    }
  }
  c.avx512_bf16 = flags.count("avx512_bf16") > 0;
  c.amx_bf16 = flags.count("amx_bf16") > 0;
  c.avx512_fp16 = flags.count("avx512_fp16") > 0;
  c.amx_fp16 = flags.count("amx_fp16") > 0;
  c.capability = at::get_cpu_capability();
  c.onednn_bf16 = ask_libtorch("mkldnn::_is_mkldnn_bf16_supported");
  c.onednn_fp16 = ask_libtorch("mkldnn::_is_mkldnn_fp16_supported");
  return c;
}

std::string units(bool a, const char* a_name, bool b, const char* b_name) {
  std::string s;
  if (a) s += a_name;
  if (b) s += std::string(s.empty() ? "" : ", ") + b_name;
  return s;
}

}  // namespace

std::string CpuInfo::summary() const {
  std::string bf = units(avx512_bf16, "avx512_bf16", amx_bf16, "amx_bf16");
  std::string fp = units(avx512_fp16, "avx512_fp16", amx_fp16, "amx_fp16");
  auto part = [](const char* dtype, bool fast, const std::string& u) {
    return std::string(dtype) + (fast ? " accelerated (" + u + ")" : " not accelerated" +
                                                                         (u.empty() ? "" : " (" + u + " without oneDNN)"));
  };
  return model + ", libtorch " + capability + "; matmuls: " + part("bf16", bf16_accelerated(), bf) +
         ", " + part("fp16", fp16_accelerated(), fp);
}

double matmul_time_ratio_vs_fp32(c10::ScalarType dtype, int64_t dim, int reps) {
  if ((dtype != at::kBFloat16 && dtype != at::kHalf) || dim < 16 || reps < 1) {
    throw std::invalid_argument("matmul_time_ratio_vs_fp32: dtype must be bfloat16 or half (got " +
                                std::string(c10::toString(dtype)) + "), dim >= 16 (got " +
                                std::to_string(dim) + "), reps >= 1 (got " + std::to_string(reps) + ")");
  }
  auto best_s = [&](c10::ScalarType t) {
    const at::Tensor a = at::randn({dim, dim}).to(t), b = at::randn({dim, dim}).to(t);
    at::mm(a, b);  // first call: kernel selection, oneDNN primitive creation
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      at::mm(a, b);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return std::max(best, 1e-9);
  };
  const double low = best_s(dtype);
  return low / best_s(at::kFloat);
}

const CpuInfo& cpu_info() {
  static const CpuInfo info = read_cpu_info();
  return info;
}

}  // namespace fsdp
