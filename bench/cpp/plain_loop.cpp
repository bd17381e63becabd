// The plain libtorch training loop that fsdp-train is measured against at N = 1: the same model
// (models::build_model of a preset), the same loss, gradient clipping and AdamW (two param groups,
// weight decay on the weight matrices only; libtorch's or the fused kernel), and no FSDP: no
// units, no hooks, no process group, no flat buffers. Batches are random token ids (a step's cost
// does not depend on their values). fp32 only: bf16 mixed precision has no plain-libtorch
// counterpart short of writing the policy itself.
//
// Writes fsdp-train's metrics format (one JSON line per step: step, step_time_s, tokens, loss,
// and an "end" line) so that bench/compare.py reads both the same way:
//
//   fsdp-plain-loop --model micro --global-batch-size 8 --seq-len 128 --steps 10 --threads 1 \
//     --metrics out.jsonl [--adamw-kernel fused|libtorch] [--vocab-size 8192]
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/optim/fused_adamw.h"
#include "models/gpt.h"
#include "models/model_config.h"

namespace {

struct Options {
  std::string model = "micro";
  int64_t vocab_size = 8192;
  int64_t global_batch_size = 8;
  int64_t seq_len = 128;
  int64_t steps = 10;
  int threads = 1;
  double lr = 3e-3;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  std::string adamw_kernel = "fused";
  std::string metrics;
  uint64_t seed = 1337;
};

// AdamW over the model's parameters as fsdp-train groups them (apps/train/model_setup.cpp).
std::unique_ptr<torch::optim::AdamW> make_adamw(apps::models::CausalLMImpl& model,
                                                const apps::models::ModelConfig& cfg, const Options& o) {
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& item : model.named_parameters()) {
    const bool decays = item.value().dim() >= 2 && !apps::models::is_embedding_param(cfg, item.key());
    (decays ? decay : no_decay).push_back(item.value());
  }
  auto options = [&](double wd) {
    auto a = std::make_unique<torch::optim::AdamWOptions>(o.lr);
    a->betas({0.9, 0.95}).eps(1e-8).weight_decay(wd);
    return a;
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(o.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  if (o.adamw_kernel == "fused") {
    return std::make_unique<fsdp::optim::FusedAdamW>(std::move(groups), torch::optim::AdamWOptions(o.lr));
  }
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(o.lr));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"The plain libtorch loop fsdp-train is measured against (bench/compare.py --peers plain)"};
  app.add_option("--model", o.model, "Model preset (as fsdp-train's --model)");
  app.add_option("--vocab-size", o.vocab_size, "Vocabulary (fsdp-train's default tokenizer: 8192)");
  app.add_option("--global-batch-size", o.global_batch_size, "Sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--seq-len", o.seq_len, "Tokens per sequence")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "Steps")->check(CLI::PositiveNumber);
  app.add_option("--threads", o.threads, "Intra-op threads")->check(CLI::PositiveNumber);
  app.add_option("--adamw-kernel", o.adamw_kernel, "fused or libtorch (as fsdp-train's)")
      ->check(CLI::IsMember({"fused", "libtorch"}));
  app.add_option("--metrics", o.metrics, "JSON-lines file of the steps")->required();
  app.add_option("--seed", o.seed, "Seed of the initialisation and the batches");
  CLI11_PARSE(app, argc, argv);
  try {
    at::set_num_threads(o.threads);
    torch::manual_seed(o.seed);
    const apps::models::ModelConfig cfg = apps::models::model_preset(o.model, o.vocab_size);
    if (cfg.context() < o.seq_len) {
      throw std::invalid_argument("--seq-len " + std::to_string(o.seq_len) + " exceeds the model's context " +
                                  std::to_string(cfg.context()));
    }
    auto model = apps::models::build_model(cfg, at::kCPU);
    model->train();
    auto optimizer = make_adamw(*model, cfg, o);
    std::ofstream out(o.metrics);
    if (!out) throw std::runtime_error("cannot write --metrics '" + o.metrics + "'");
    const int64_t tokens = o.global_batch_size * o.seq_len;
    for (int64_t step = 1; step <= o.steps; ++step) {
      at::Tensor batch = at::randint(o.vocab_size, {o.global_batch_size, o.seq_len + 1}, at::kLong);
      const auto t0 = std::chrono::steady_clock::now();
      at::Tensor logits = model->forward(batch.slice(1, 0, o.seq_len));  // (G, T, V)
      at::Tensor loss = apps::models::gpt_loss(logits.to(at::kFloat), batch.slice(1, 1, o.seq_len + 1));
      loss.backward();
      const double grad_norm = torch::nn::utils::clip_grad_norm_(model->parameters(), o.grad_clip);
      optimizer->step();
      optimizer->zero_grad();
      const double loss_value = loss.item<double>();
      const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      out << nlohmann::json{{"event", "step"}, {"step", step}, {"step_time_s", step_s}, {"tokens", tokens},
                            {"loss", loss_value}, {"grad_norm", grad_norm}, {"mem", nlohmann::json::object()}}
                 .dump()
          << "\n";
    }
    out << nlohmann::json{{"event", "end"}, {"steps", o.steps}}.dump() << "\n";
    if (!out.flush()) throw std::runtime_error("writing --metrics '" + o.metrics + "' failed");
  } catch (const std::exception& e) {
    std::cerr << "fsdp-plain-loop: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
