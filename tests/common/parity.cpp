#include "parity.h"

#include <torch/nn/utils/clip_grad.h>

#include <mutex>

namespace fsdp_test {

void run_parity(const ParityRun& run, const fsdp::comm::ProcessGroupPtr& group) {
  const int N = group->size(), r = group->rank();
  std::shared_ptr<torch::nn::Module> ref, model;
  {
    // The global generator is shared by the threads of a threaded world: build under a lock.
    static std::mutex construct_mu;
    std::lock_guard<std::mutex> lock(construct_mu);
    torch::manual_seed(run.seed);
    ref = run.make_model();
    torch::manual_seed(run.seed);
    model = run.make_model();
  }
  run.shard(model, group);
  std::vector<at::Tensor> ref_params;  // unique tensors (tied params once)
  for (const auto& p : ref->parameters()) {
    bool seen = false;
    for (const auto& q : ref_params) seen = seen || q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
    if (!seen) ref_params.push_back(p);
  }
  auto ref_opt = run.make_optimizer(ref_params);
  auto opt = run.make_optimizer(fsdp::parameters(model));
  const int64_t B = run.rows_per_rank;
  for (int step = 0; step < run.steps; ++step) {
    auto [x, y] = run.batch(step, N * B);
    ref_opt->zero_grad();
    at::Tensor ref_loss = run.loss(run.forward(ref, x), y);
    ref_loss.backward();
    opt->zero_grad();
    at::Tensor loss = run.loss(run.forward(model, x.narrow(0, r * B, B)), y.narrow(0, r * B, B));
    loss.backward();
    at::Tensor global = loss.detach().clone().reshape({1});
    group->all_reduce(global, fsdp::comm::ReduceOp::kAvg)->wait();
    EXPECT_NEAR(global.item<double>(), ref_loss.item<double>(), run.loss_tol) << "loss at step " << step;
    std::string when = "step " + std::to_string(step);
    compare_with_reference(model, ref, /*grad=*/true, run.grad_rtol, run.grad_atol, when);
    if (run.clip_max_norm > 0) {
      double ref_norm = torch::nn::utils::clip_grad_norm_(ref_params, run.clip_max_norm);
      double norm = fsdp::clip_grad_norm(model, run.clip_max_norm);
      EXPECT_NEAR(norm, ref_norm, 1e-6 * std::max(1.0, ref_norm)) << "grad norm at " << when;
    }
    ref_opt->step();
    opt->step();
    if (run.after_step) run.after_step(step, model);
  }
  compare_with_reference(model, ref, /*grad=*/false, run.param_rtol, run.param_atol, "final");
}

}  // namespace fsdp_test
