#include "plan/calibration/training_pass.h"

#include <ATen/ops/mm.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "fsdp/planner/time_model.h"
#include "models/model_config.h"
#include "plan/calibration/rank_values.h"

namespace apps::plan::calibration {
namespace fp = fsdp::planner;
using fsdp::comm::now_s;
namespace {

// The model of the architecture (its layers cut to `n_layer`) at its vocabulary.
apps::models::ModelConfig config_of(const fp::Architecture& a, int64_t n_layer) {
  if (a.kind == fp::BlockKind::kGpt) {
    apps::models::GPTConfig c;
    c.vocab_size = a.vocab_size;
    c.n_layer = n_layer;
    c.n_head = a.n_head;
    c.n_embd = a.n_embd;
    c.block_size = a.context;
    c.attention = a.attention;
    return c;
  }
  apps::models::LlamaConfig c;
  c.vocab_size = a.vocab_size;
  c.n_layer = n_layer;
  c.n_head = a.n_head;
  c.n_kv_head = a.n_kv_head;
  c.d_model = a.n_embd;
  c.ffn = a.ffn_hidden;
  c.max_seq = a.context;
  return c;
}

}  // namespace

TrainingPass::TrainingPass(const fp::ModelSpec& m, const fp::StepSetup& step, at::ScalarType dtype, int64_t ranks_on_node)
    : arch(m.arch) {
  if (arch.kind == fp::BlockKind::kNone) {
    x = at::randn({step.micro_batch_size * step.seq_len, 1024}).to(dtype);
    w = at::randn({1024, 1024}).to(dtype);
    return;
  }
  const double block_bytes = 16.0 * static_cast<double>(m.units.size() > 1 ? m.units[1].numel() : 0);
  const double root_bytes = 16.0 * static_cast<double>(m.units[0].numel());
  const double budget = 0.5 * static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                        static_cast<double>(sysconf(_SC_PAGESIZE)) / static_cast<double>(ranks_on_node);
  n_layer = arch.n_layer;
  while (n_layer > 1 && root_bytes + static_cast<double>(n_layer) * block_bytes > budget) --n_layer;
  module = apps::models::build_model(config_of(arch, n_layer), at::kCPU);
  module->to(dtype);
  idx = at::randint(arch.vocab_size, {step.micro_batch_size, step.seq_len}, at::kLong);
  flops = fp::unit_flops(m, 0, step).forward + fp::unit_flops(m, 0, step).backward +
          static_cast<double>(n_layer) * (fp::unit_flops(m, 1, step).forward + fp::unit_flops(m, 1, step).backward);
}

double TrainingPass::run(const std::function<void()>& between) {
  const double t0 = now_s();
  if (!module) {
    for (int i = 0; i < 8; ++i) at::mm(x, w.t());
    if (between) between();
    for (int i = 0; i < 8; ++i) {
      at::mm(x, w);
      at::mm(x.t(), x);
    }
    return now_s() - t0;
  }
  for (auto& p : module->parameters()) p.mutable_grad() = at::Tensor();
  at::Tensor logits = std::static_pointer_cast<apps::models::CausalLMImpl>(module)->forward(idx);
  at::Tensor loss =
      torch::nn::functional::cross_entropy(logits.reshape({-1, arch.vocab_size}).to(at::kFloat), idx.reshape({-1}));
  if (between) between();
  loss.backward();
  return now_s() - t0;
}

void TrainingPass::sample(WorkTimer& timer) {
  fsdp::comm::ProcessGroup& g = timer.group();
  g.barrier()->wait();  // all ranks compute at once, as in training
  const double first_s = across_ranks(g, {run()}, /*min=*/false)[0];
  const int reps = static_cast<int>(std::clamp(std::ceil(2.0 / std::max(first_s, 1e-9)), 5.0, 25.0));
  for (int r = 0; r < reps; ++r) samples_s.push_back(timer.seconds([&] { run(); }));
}

double model_rate(TrainingPass& pass, fsdp::comm::ProcessGroup& g) {
  return across_ranks(g, {pass.flops / median(pass.samples_s)}, /*min=*/true)[0];
}

}  // namespace apps::plan::calibration
