// The decoder-only models' shared part (causal_lm.h): generation.
#include "models/causal_lm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/where.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace apps::models {

std::vector<int64_t> CausalLMImpl::generate(const std::vector<int64_t>& prompt_ids, int64_t n_tokens,
                                            double temperature, int64_t top_k, uint64_t seed) {
  if (prompt_ids.empty()) throw std::invalid_argument("generate: empty prompt");
  if (temperature <= 0.0) throw std::invalid_argument("generate: temperature must be > 0");
  at::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<int64_t> ids = prompt_ids;
  CausalLMImpl* self = this;
  for (int64_t n = 0; n < n_tokens; ++n) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(ids.size()), context());
    at::Tensor idx = at::tensor(std::vector<int64_t>(ids.end() - T, ids.end()), at::kLong).view({1, T});
    at::Tensor logits = fsdp::call(self, idx).select(1, T - 1).squeeze(0).to(at::kFloat);  // (V,)
    logits = logits / temperature;
    if (top_k > 0 && top_k < logits.size(0)) {
      at::Tensor kth = std::get<0>(at::topk(logits, top_k)).select(0, top_k - 1);
      logits = at::where(logits < kth, at::full_like(logits, -INFINITY), logits);
    }
    at::Tensor probs = at::softmax(logits, 0);
    ids.push_back(at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>());
  }
  return std::vector<int64_t>(ids.begin() + static_cast<int64_t>(prompt_ids.size()), ids.end());
}

}  // namespace apps::models
