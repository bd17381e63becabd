#include "plan/calibration/step_update.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "fsdp/optim/clip.h"
#include "fsdp/optim/fused_adamw.h"
#include "plan/calibration/rank_values.h"

namespace apps::plan::calibration {
namespace fp = fsdp::planner;
using fsdp::comm::CollectiveKind;
using fsdp::comm::now_s;

std::vector<fp::UpdatePoint> step_update_points(fp::OptimizerKind kind, WorkTimer& timer) {
  fsdp::comm::ProcessGroup& g = timer.group();
  at::Tensor flush = at::empty({int64_t{1} << 25}, at::kFloat);
  std::vector<fp::UpdatePoint> points;
  std::vector<double> per_tensor_s;
  for (int log2 = 10; log2 <= 24; log2 += 2) {
    const int64_t E = int64_t{1} << log2, count = std::max<int64_t>(1, (int64_t{1} << 20) / E);
    std::vector<at::Tensor> params, grads;
    for (int64_t i = 0; i < count; ++i) {
      params.push_back(at::randn({E}).requires_grad_(true));
      grads.push_back(at::randn({E}));
    }
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (kind == fp::OptimizerKind::kAdamW) {
      // fsdp-train's default optimizer (--adamw-kernel fused): the rate it will see.
      opt = std::make_unique<fsdp::optim::FusedAdamW>(params, torch::optim::AdamWOptions(1e-4));
    } else {
      opt = std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(1e-4).momentum(kind == fp::OptimizerKind::kSgdMomentum ? 0.9 : 0.0));
    }
    auto once = [&] {
      for (int64_t i = 0; i < count; ++i) params[i].mutable_grad() = grads[i].clone();
      flush.fill_(1.0f);
      return timer.seconds_to_own_end([&] {
        double squares = 0.0;  // as fsdp::clip_grad_norm sums them
        for (const auto& p : params) squares += fsdp::sum_of_squares(p.grad());
        const double norm = std::sqrt(squares);
        if (norm > 1.0) {
          for (const auto& p : params) p.grad().mul_(1.0 / norm);
        }
        opt->step();
        opt->zero_grad();
      });
    };
    g.barrier()->wait();
    once();
    std::vector<double> t;
    for (int r = 0; r < (timer.together() ? 9 : 5); ++r) t.push_back(once());
    points.push_back({E, 0.0});
    per_tensor_s.push_back(median(t) / static_cast<double>(count));
  }
  per_tensor_s = timer.together() ? mean_across_ranks(g, per_tensor_s) : across_ranks(g, per_tensor_s, /*min=*/false);
  for (size_t i = 0; i < points.size(); ++i) points[i].seconds = per_tensor_s[i];
  return points;
}

}  // namespace apps::plan::calibration
