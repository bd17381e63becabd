// Tier `mpi`: buffers. Running statistics are broadcast from rank 0 at each training forward (as
// DDP does), buffer_dtype computes in a dtype without changing what is stored, and batch norm
// inside a bf16 policy runs with fp32 statistics.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>

#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "fsdp/runtime/state_dict.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;

namespace {

// A running mean of its inputs (what BatchNorm keeps), recorded as seen at each forward.
struct RunningImpl : torch::nn::Module {
  RunningImpl() {
    fc = register_module("fc", torch::nn::Linear(3, 3));
    running = register_buffer("running", torch::zeros({3}));
  }
  at::Tensor forward(at::Tensor x) {
    seen = running.clone();
    seen_dtype = running.scalar_type();
    if (is_training()) {
      at::NoGradGuard no_grad;
      running.mul_(0.5).add_(x.mean(0).to(running.scalar_type()), 0.5);
    }
    return fc(x) + running.to(x.scalar_type());
  }
  torch::nn::Linear fc{nullptr};
  at::Tensor running, seen;
  c10::ScalarType seen_dtype = c10::kFloat;
};
TORCH_MODULE(Running);

struct Wrapper : torch::nn::Module {
  Wrapper() { inner = register_module("inner", Running()); }
  at::Tensor forward(at::Tensor x) { return fsdp::call(inner, x); }
  Running inner{nullptr};
};

struct ConvBNImpl : torch::nn::Module {
  ConvBNImpl() {
    lin = register_module("lin", torch::nn::Linear(6, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    out = register_module("out", torch::nn::Linear(8, 2));
  }
  at::Tensor forward(at::Tensor x) {
    return fsdp::call(out, torch::relu(fsdp::call(bn, fsdp::call(lin, x))));
  }
  torch::nn::Linear lin{nullptr}, out{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(ConvBN);

}  // namespace

// Every rank feeds different data; at each forward every rank sees rank 0's running mean (the
// value a single process fed rank 0's batches has), for every strategy. With sync_buffers off the
// ranks drift apart.
TEST(Buffers, BroadcastFromRankZeroAtEachTrainingForward) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  for (auto s : implemented_strategies()) {
    for (bool sync : {true, false}) {
      SCOPED_TRACE(fsdp::to_string(s) + (sync ? " sync_buffers" : " no sync"));
      torch::manual_seed(3);
      auto ref = Running().ptr();  // fed rank 0's rows only
      torch::manual_seed(3);
      auto model = std::make_shared<Wrapper>();
      auto o = options_for(s, N);
      o.sync_buffers = sync;
      fsdp::fully_shard(model->inner.ptr(), g, o);
      fsdp::fully_shard(model, g, o);
      for (int step = 0; step < 3; ++step) {
        auto [x, y] = regression_batch(step, N * 2, 3, 3);
        ref->forward(x.narrow(0, 0, 2));
        F::mse_loss(fsdp::call(model, x.narrow(0, r * 2, 2)), y.narrow(0, r * 2, 2)).backward();
        at::Tensor seen = model->inner->seen.clone();
        at::Tensor all = at::empty({N * 3});
        g->all_gather_into_tensor(all, seen)->wait();
        const bool equal = at::equal(all.view({N, 3}), seen.unsqueeze(0).expand({N, 3}));
        if (sync) {
          EXPECT_TRUE(equal) << "step " << step << ": ranks saw different running means";
          expect_close(seen, ref->seen, 0, 0, "running mean at step " + std::to_string(step));
        } else if (N > 1 && step > 0) {
          EXPECT_FALSE(equal) << "without sync_buffers the ranks' statistics should drift apart";
        }
      }
    }
  }
}

// buffer_dtype bf16: the forward sees a bf16 buffer, the stored buffer stays fp32 (its values
// rounded through bf16 once per forward), and the state dict keeps fp32.
TEST(Buffers, BufferDtypeComputesWithoutChangingWhatIsStored) {
  auto g = world();
  auto model = std::make_shared<Wrapper>();
  fsdp::FullyShardOptions o;
  o.mixed_precision.buffer_dtype = at::kBFloat16;
  fsdp::fully_shard(model->inner.ptr(), g, o);
  fsdp::fully_shard(model, g);
  auto [x, y] = regression_batch(0, 4, 3, 3);
  F::mse_loss(fsdp::call(model, x), y).backward();
  EXPECT_EQ(model->inner->seen_dtype, at::kBFloat16) << "the forward computes with the cast buffer";
  EXPECT_EQ(model->inner->running.scalar_type(), at::kFloat) << "the stored buffer keeps its dtype";
  for (const auto& b : model->named_buffers()) EXPECT_EQ(b.value().scalar_type(), at::kFloat) << b.key();
  at::Tensor expected = at::zeros({3}, at::kBFloat16).mul_(0.5).add_(x.mean(0).to(at::kBFloat16), 0.5).to(at::kFloat);
  expect_close(model->inner->running, expected, 0, 0, "updated running mean (computed in bf16, stored in fp32)");
}

// BatchNorm under a bf16 policy: one unit holding it is rejected at fully_shard, naming the module
// and the remedy; fully_shard_tree gives it a unit of its own in fp32 (weights and statistics),
// and the model trains with finite, falling loss and statistics equal on every rank.
TEST(Buffers, BatchNormUnderBf16RunsWithFp32Statistics) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  fsdp::FullyShardOptions bf16;
  bf16.mixed_precision.param_dtype = at::kBFloat16;
  bf16.mixed_precision.reduce_dtype = at::kFloat;
  {
    auto model = ConvBN().ptr();
    try {
      fsdp::fully_shard(model, g, bf16);
      ADD_FAILURE() << "a bf16 unit holding BatchNorm was accepted";
    } catch (const fsdp::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("bn"), std::string::npos) << msg;
      EXPECT_NE(msg.find("BatchNorm1d"), std::string::npos) << msg;
      EXPECT_NE(msg.find("running statistics"), std::string::npos) << msg;
    }
  }
  torch::manual_seed(8);
  auto model = ConvBN().ptr();
  auto root = bf16;
  root.mixed_precision.output_dtype = at::kFloat;
  fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<torch::nn::LinearImpl>(), bf16, root);
  auto bn_unit = fsdp::find_unit(model->bn.get());
  ASSERT_TRUE(bn_unit) << "fully_shard_tree did not give BatchNorm a unit";
  EXPECT_EQ(bn_unit->param_dtype(), at::kFloat);
  EXPECT_EQ(fsdp::find_unit(model->lin.get())->param_dtype(), at::kBFloat16);
  torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(0.01));
  double first = 0, last = 0;
  for (int step = 0; step < 25; ++step) {
    auto [x, y] = regression_batch(step % 5, N * 8, 6, 2);
    at::Tensor loss = F::mse_loss(fsdp::call(model, x.narrow(0, r * 8, 8)), y.narrow(0, r * 8, 8));
    loss.backward();
    opt.step();
    opt.zero_grad();
    ASSERT_TRUE(std::isfinite(loss.item<double>())) << "step " << step;
    if (step == 0) first = loss.item<double>();
    if (step == 20) last = loss.item<double>();  // the same batch as step 0
  }
  EXPECT_LT(last, first) << "the model does not train";
  EXPECT_EQ(model->bn->running_mean.scalar_type(), at::kFloat);
  EXPECT_EQ(model->bn->weight.scalar_type(), at::kFloat);
}
