// Tier `mpi`: activation checkpointing (fsdp::checkpoint_activations, fsdp::call_checkpointed)
// with FSDP units, for every strategy: parity with a single-process plain reference; parity with
// the same FSDP model run without checkpointing (dropout masks replayed, a unit used twice, same
// collectives); activations inside a region freed after its forward; the errors.
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/loss.h>

#include <cmath>

#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "../common/step_comm.h"
#include "fsdp/runtime/activation_checkpoint.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
using S = fsdp::ShardingStrategy;

namespace {

constexpr int64_t kVocab = 29, kDim = 16, kHeads = 2, kCtx = 6;

// Embeddings, blocks b0, b1, then b0 again (a unit used twice in one forward), a head tied to the
// token embedding. With `checkpoint`, each block use is a checkpointed region; with dropout_p > 0
// each region ends in dropout (its mask drawn inside the region, so the recompute must replay it).
struct ReuseNetImpl : torch::nn::Module {
  explicit ReuseNetImpl(double dropout_p = 0.0) : dropout_p(dropout_p) {
    wte = register_parameter("wte", torch::randn({kVocab, kDim}) * 0.02);
    wpe = register_parameter("wpe", torch::randn({kCtx, kDim}) * 0.02);
    b0 = register_module("b0", TinyBlock(kDim, kHeads));
    b1 = register_module("b1", TinyBlock(kDim, kHeads));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
  }
  at::Tensor block(TinyBlock b, const at::Tensor& x) {
    const double p = dropout_p;
    auto region = [b, p](const at::Tensor& h) mutable {
      at::Tensor y = fsdp::call(b, h);
      return p > 0 ? at::dropout(y, p, /*train=*/true) : y;
    };
    return checkpoint ? fsdp::checkpoint_activations(region, x) : region(x);
  }
  at::Tensor forward(at::Tensor idx) {  // (B, T) int64 -> logits (B, T, vocab)
    at::Tensor x = at::embedding(wte, idx) + wpe.narrow(0, 0, idx.size(1));
    x = block(b0, x);
    x = block(b1, x);
    x = block(b0, x);
    return at::matmul(ln_f(x), wte.t());
  }
  double dropout_p;
  bool checkpoint = false;
  at::Tensor wte, wpe;
  TinyBlock b0{nullptr}, b1{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(ReuseNet);

at::Tensor token_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return F::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape({-1}));
}

std::pair<at::Tensor, at::Tensor> token_batch(int step, int64_t rows) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(700 + step);
  at::Tensor tok = at::randint(0, kVocab, {rows, kCtx + 1}, gen);
  return {tok.narrow(1, 0, kCtx).contiguous(), tok.narrow(1, 1, kCtx).contiguous()};
}

std::shared_ptr<ReuseNetImpl> sharded_net(S s, double dropout_p, bool checkpoint) {
  torch::manual_seed(77);
  auto net = ReuseNet(dropout_p).ptr();
  net->checkpoint = checkpoint;
  fsdp::fully_shard_tree(net, world(), fsdp::wrap_by_type<TinyBlockImpl>(), options_for(s, world()->size()));
  return net;
}

}  // namespace

// Checkpointed blocks (b0 used twice) on N ranks against a single-process plain model: losses,
// gradients every step and parameters after 6 AdamW steps, every strategy.
TEST(ActivationCheckpoint, ParityWithPlainReference) {
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    ParityRun run;
    run.make_model = [] { return ReuseNet().ptr(); };
    run.shard = [=](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr g) {
      std::dynamic_pointer_cast<ReuseNetImpl>(m)->checkpoint = true;
      fsdp::fully_shard_tree(m, g, fsdp::wrap_by_type<TinyBlockImpl>(), options_for(s, g->size()));
    };
    run.forward = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& idx) {
      auto net = std::dynamic_pointer_cast<ReuseNetImpl>(m);
      return fsdp::call(net, idx);
    };
    run.loss = token_loss;
    run.batch = token_batch;
    run.make_optimizer = adamw(1e-3, 0.1);
    run.rows_per_rank = 2;
    run.steps = 6;
    run_parity(run, world());
  }
}

// The same sharded model with and without checkpointing, dropout 0.2 inside every region, same
// seed before each step: losses, gradients and parameters agree to 1e-6 (the recompute replays
// the masks), the generator continues as in the plain run, and every unit runs its hooks once per
// use: the same reduce-scatters and all-reduces, and for full_shard / hybrid_shard the same
// all-gathers (the recompute's gather replaces the pre-backward's).
TEST(ActivationCheckpoint, SameResultsAndCollectivesAsWithout) {
  auto g = world();
  const int r = g->rank();
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    auto plain = sharded_net(s, 0.2, false);
    auto ckpt = sharded_net(s, 0.2, true);
    torch::optim::AdamW plain_opt(fsdp::parameters(plain), torch::optim::AdamWOptions(1e-2));
    torch::optim::AdamW ckpt_opt(fsdp::parameters(ckpt), torch::optim::AdamWOptions(1e-2));
    for (int step = 0; step < 4; ++step) {
      auto [x, y] = token_batch(step, 2 * g->size());
      x = x.narrow(0, 2 * r, 2);
      y = y.narrow(0, 2 * r, 2);
      std::vector<double> losses, draws;
      std::vector<StepComm> comm;
      for (auto* net : {&plain, &ckpt}) {
        torch::manual_seed(900 + step + 13 * r);
        const auto before = g->stats().snapshot();
        at::Tensor loss = token_loss(fsdp::call(*net, x), y);
        loss.backward();
        comm.push_back(delta(before, g->stats().snapshot()));
        losses.push_back(loss.item<double>());
        draws.push_back(torch::rand({1}).item<double>());  // where the generator stands now
      }
      const std::string when = "step " + std::to_string(step);
      EXPECT_NEAR(losses[1], losses[0], 1e-6) << when;
      EXPECT_EQ(draws[1], draws[0]) << when << ": the generator must continue as in the plain run";
      EXPECT_EQ(comm[1].rs_calls, comm[0].rs_calls) << when << " reduce-scatters";
      EXPECT_EQ(comm[1].ar_calls, comm[0].ar_calls) << when << " all-reduces";
      if (s == S::kFullShard || s == S::kHybridShard) {
        EXPECT_EQ(comm[1].ag_calls, comm[0].ag_calls) << when << " all-gathers";
      }
      auto a = fsdp::sharded_parameters(plain), b = fsdp::sharded_parameters(ckpt);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        expect_close(b[i].tensor.grad(), a[i].tensor.grad(), 1e-6, 1e-6, when + " sharded grad of " + a[i].name);
      }
      plain_opt.step();
      ckpt_opt.step();
      plain_opt.zero_grad();
      ckpt_opt.zero_grad();
    }
    auto a = fsdp::sharded_parameters(plain), b = fsdp::sharded_parameters(ckpt);
    for (size_t i = 0; i < a.size(); ++i) expect_close(b[i].tensor, a[i].tensor, 1e-6, 1e-6, "final " + a[i].name);
  }
}

// A region's activations are not kept: a 3-layer tanh MLP of width 256 keeps 3 activations after
// a plain forward; as one region it keeps its output and the generator state, exactly.
TEST(ActivationCheckpoint, KeepsOnlyTheRegionInputs) {
  torch::manual_seed(3);
  auto mlp = torch::nn::Sequential(torch::nn::Linear(256, 256), torch::nn::Tanh(), torch::nn::Linear(256, 256),
                                   torch::nn::Tanh(), torch::nn::Linear(256, 256), torch::nn::Tanh());
  at::Tensor x = torch::randn({64, 256}, torch::requires_grad());
  auto alive_after_forward = [&](bool checkpoint) {
    const int64_t before = fsdp::accounting::current_bytes();
    at::Tensor y = checkpoint ? fsdp::checkpoint_activations([&](const at::Tensor& h) { return mlp->forward(h); }, x)
                              : mlp->forward(x);
    const int64_t alive = fsdp::accounting::current_bytes() - before;
    y.sum().backward();
    return alive;
  };
  const int64_t act = 64 * 256 * 4;  // bytes of one (64, 256) fp32 activation
  const int64_t rng_state_bytes = static_cast<int64_t>(at::detail::getDefaultCPUGenerator().get_state().nbytes());
  const int64_t plain = alive_after_forward(false);
  at::Tensor plain_grad = x.grad().clone();
  x.mutable_grad() = at::Tensor();
  const int64_t ckpt = alive_after_forward(true);
  // Each tanh keeps its output, which is also the next Linear's saved input; the last is y.
  EXPECT_EQ(plain, 3 * act) << "the plain forward keeps its 3 tanh outputs";
  EXPECT_EQ(ckpt, act + rng_state_bytes)
      << "checkpointed: only the region's output (its input is the caller's) and the generator state";
  expect_close(x.grad(), plain_grad, 1e-6, 1e-7, "input gradient");
}

// Nested regions and a region around the root unit are rejected with fsdp::Error, not run wrong.
TEST(ActivationCheckpoint, RejectsNestedRegionsAndTheRoot) {
  at::Tensor x = torch::randn({2, 3}, torch::requires_grad());
  auto inner = [](const at::Tensor& h) { return fsdp::checkpoint_activations([](const at::Tensor& z) { return z * 2; }, h); };
  try {
    fsdp::checkpoint_activations(inner, x);
    ADD_FAILURE() << "nested checkpointing ran";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("nested"), std::string::npos) << e.what();
  }
  auto net = sharded_net(S::kFullShard, 0.0, false);
  at::Tensor idx = token_batch(0, 2).first;
  try {
    fsdp::checkpoint_activations([net](const at::Tensor& i) { return fsdp::call(net, i); }, idx);
    ADD_FAILURE() << "a region around the root unit ran";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kUnsupported) << e.what();
  }
  // The tree still trains afterwards.
  at::Tensor loss = token_loss(fsdp::call(net, idx), token_batch(0, 2).second);
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
}
