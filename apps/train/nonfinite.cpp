// The non-finite check (nonfinite.h).
#include "train/nonfinite.h"

#include <ATen/ops/isfinite.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fsdp/runtime/fully_shard.h"
#include "train/errors.h"

namespace apps::train {
namespace {

bool local_grads_finite(const std::shared_ptr<torch::nn::Module>& model) {
  for (const auto& sp : fsdp::sharded_parameters(model)) {
    const at::Tensor g = sp.tensor.grad();
    if (g.defined() && g.numel() > 0 && !at::isfinite(g).all().item<bool>()) return false;
  }
  return true;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

}  // namespace

std::vector<int> ranks_where(bool mine, fsdp::comm::ProcessGroup& group) {
  at::Tensor flags = at::zeros({group.size()}, at::kLong);  // (N,)
  if (mine) flags[group.rank()] = 1;
  group.all_reduce(flags, fsdp::comm::ReduceOp::kSum)->wait();
  std::vector<int> out;
  for (int r = 0; r < group.size(); ++r) {
    if (flags[r].item<int64_t>() != 0) out.push_back(r);
  }
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::optional<NonFiniteInjection> nonfinite_injection_from_env() {
  const char* v = std::getenv("FSDP_TRAIN_INJECT_NONFINITE");
  if (v == nullptr || *v == '\0') return std::nullopt;
  NonFiniteInjection inj;
  long long step = 0;
  int rank = 0, used = 0;
  if (std::sscanf(v, "%lld:%d%n", &step, &rank, &used) != 2 || v[used] != '\0' || step < 1 || rank < 0) {
    throw UsageError(std::string("FSDP_TRAIN_INJECT_NONFINITE='") + v +
                     "': expected STEP:RANK (STEP >= 1, RANK >= 0)");
  }
  inj.step = step;
  inj.rank = rank;
  return inj;
}

std::string nonfinite_report(int64_t step, double local_loss, double grad_norm, bool check_grad_norm,
                             const std::shared_ptr<torch::nn::Module>& model,
                             fsdp::comm::ProcessGroup& group) {
  const std::vector<int> bad_loss = ranks_where(!std::isfinite(local_loss), group);
  const bool bad_norm = check_grad_norm && !std::isfinite(grad_norm);
  if (bad_loss.empty() && !bad_norm) return "";
  std::string what = "step " + std::to_string(step) + ": ";
  if (!bad_loss.empty()) {
    what += "non-finite loss (NaN or inf) on " + rank_list(bad_loss);
  }
  if (bad_norm) {
    // grad_norm is the same on every rank, so every rank takes this branch (collective).
    const std::vector<int> bad_grads = ranks_where(!local_grads_finite(model), group);
    what += std::string(bad_loss.empty() ? "" : "; ") + "gradient norm " + num(grad_norm) +
            (bad_grads.empty() ? std::string() : " (non-finite gradients on " + rank_list(bad_grads) + ")");
  }
  return what;
}

}  // namespace apps::train
