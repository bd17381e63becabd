// FusedAdamW: the AdamW update in closed form at step 1, agreement with libtorch's AdamW over many
// steps (with and without amsgrad, two param groups), and that it is an AdamW to the rest of the
// library.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/optim/fused_adamw.h"
#include "fsdp/optim/optimizer_state.h"

namespace {

std::vector<torch::optim::OptimizerParamGroup> two_groups(const std::vector<at::Tensor>& ps, double wd) {
  std::vector<torch::optim::OptimizerParamGroup> g;
  g.emplace_back(std::vector<at::Tensor>{ps[0], ps[1]},
                 std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(wd)));
  g.emplace_back(std::vector<at::Tensor>{ps[2]},
                 std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(3e-3).weight_decay(0.0)));
  return g;
}

std::vector<at::Tensor> make_params(int64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> ps = {torch::randn({64, 33}), torch::randn({1000}), torch::randn({7, 5, 3})};
  for (auto& p : ps) p.set_requires_grad(true);
  return ps;
}

TEST(FusedAdamW, StepOneIsSignStepClosedForm) {
  // t = 1: m/(1-b1) = g and sqrt(v/(1-b2)) = |g|, so p1 = p0 (1 - lr wd) - lr g / (|g| + eps).
  auto ps = make_params(1);
  std::vector<at::Tensor> p0, g;
  for (auto& p : ps) {
    p.mutable_grad() = torch::randn_like(p);
    p0.push_back(p.detach().clone());
    g.push_back(p.grad().clone());
  }
  fsdp::optim::FusedAdamW opt(two_groups(ps, 0.1));
  opt.step();
  const double lr[] = {1e-2, 1e-2, 3e-3}, wd[] = {0.1, 0.1, 0.0};
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto expect = p0[i] * (1 - lr[i] * wd[i]) - lr[i] * g[i] / (g[i].abs() + 1e-8);
    EXPECT_LT((ps[i].detach() - expect).abs().max().item<double>(), 1e-7) << "param " << i;
  }
}

void expect_matches_libtorch(bool amsgrad) {
  auto a = make_params(2), b = make_params(2);
  auto ga = two_groups(a, 0.05), gb = two_groups(b, 0.05);
  for (auto* gs : {&ga, &gb}) {
    for (auto& grp : *gs) static_cast<torch::optim::AdamWOptions&>(grp.options()).amsgrad(amsgrad);
  }
  fsdp::optim::FusedAdamW fused(std::move(ga));
  torch::optim::AdamW plain(std::move(gb));
  for (int step = 0; step < 30; ++step) {
    torch::manual_seed(100 + step);
    for (size_t i = 0; i < a.size(); ++i) {
      const auto g = torch::randn_like(a[i]) * (step % 3 + 1);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    fused.step();
    plain.step();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const double rel = ((a[i] - b[i]).abs().max() / b[i].abs().max()).item<double>();
    EXPECT_LT(rel, 2e-6) << "param " << i << " amsgrad " << amsgrad;
    EXPECT_GT((a[i] - make_params(2)[i]).abs().max().item<double>(), 1e-3) << "param " << i << " moved";
    const auto& sa = static_cast<const torch::optim::AdamWParamState&>(*fused.state().at(a[i].unsafeGetTensorImpl()));
    const auto& sb = static_cast<const torch::optim::AdamWParamState&>(*plain.state().at(b[i].unsafeGetTensorImpl()));
    EXPECT_EQ(sa.step(), 30);
    EXPECT_LT((sa.exp_avg() - sb.exp_avg()).abs().max().item<double>(), 1e-6);
    EXPECT_LT((sa.exp_avg_sq() - sb.exp_avg_sq()).abs().max().item<double>(), 1e-6);
    EXPECT_EQ(sa.max_exp_avg_sq().defined(), amsgrad);
  }
}

TEST(FusedAdamW, MatchesLibtorchAdamWOver30Steps) { expect_matches_libtorch(false); }
TEST(FusedAdamW, MatchesLibtorchAdamWOver30StepsAmsgrad) { expect_matches_libtorch(true); }

TEST(FusedAdamW, IsAnAdamWToTheLibrary) {
  auto ps = make_params(3);
  fsdp::optim::FusedAdamW opt(two_groups(ps, 0.1));
  EXPECT_EQ(fsdp::optim::optimizer_kind(opt), fsdp::optim::OptimizerKind::kAdamW);
}

TEST(FusedAdamW, SkipsParamsWithoutGradAndRejectsMismatchedGrad) {
  auto ps = make_params(4);
  const auto before = ps[1].detach().clone();
  ps[0].mutable_grad() = torch::randn_like(ps[0]);
  fsdp::optim::FusedAdamW opt(two_groups(ps, 0.1));
  opt.step();
  EXPECT_TRUE(torch::equal(ps[1].detach(), before));
  EXPECT_EQ(opt.state().count(ps[1].unsafeGetTensorImpl()), 0u);
  ps[2].mutable_grad() = torch::randn_like(ps[2]).to(at::kDouble);
  EXPECT_THROW(opt.step(), c10::Error);
}

}  // namespace
