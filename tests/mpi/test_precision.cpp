// Tier `mpi`: mixed precision policy (dtypes at every boundary, bytes of the collectives, bf16 vs
// fp32 loss curves) and fp16 dynamic loss scaling with an overflow on one rank's shard.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
using fsdp::comm::CollectiveKind;

namespace {

// Records the dtypes its weight and input have while it computes.
struct ProbeImpl : torch::nn::Module {
  ProbeImpl(int64_t in, int64_t out) { lin = register_module("lin", torch::nn::Linear(in, out)); }
  at::Tensor forward(at::Tensor x) {
    seen_weight = lin->weight.scalar_type();
    seen_input = x.scalar_type();
    return lin(x);
  }
  torch::nn::Linear lin{nullptr};
  c10::ScalarType seen_weight = c10::kFloat, seen_input = c10::kFloat;
};
TORCH_MODULE(Probe);

struct TwoProbesImpl : torch::nn::Module {
  TwoProbesImpl() {
    a = register_module("a", Probe(8, 16));
    b = register_module("b", Probe(16, 4));
  }
  at::Tensor forward(at::Tensor x) { return fsdp::call(b, torch::tanh(fsdp::call(a, x))); }
  Probe a{nullptr}, b{nullptr};
};

fsdp::FullyShardOptions mp_options(c10::ScalarType param, c10::ScalarType reduce) {
  fsdp::FullyShardOptions o;
  o.mixed_precision.param_dtype = param;
  o.mixed_precision.reduce_dtype = reduce;
  return o;
}

int64_t kind_bytes(const fsdp::comm::CommStats::Snapshot& a, const fsdp::comm::CommStats::Snapshot& b,
                   CollectiveKind k) {
  return b[static_cast<int>(k)].bytes - a[static_cast<int>(k)].bytes;
}

}  // namespace

// bf16 params and all-gather, fp32 or bf16 reduce-scatter, fp32 sharded params, grads and AdamW
// state; bytes of the all-gather in bf16 are half of fp32's.
TEST(MixedPrecision, DtypesAtEveryBoundaryAndCollectiveBytes) {
  auto g = world();
  std::map<std::string, int64_t> ag_bytes, rs_bytes;
  for (auto [name, param, reduce] :
       {std::make_tuple("fp32", c10::kFloat, c10::kFloat), std::make_tuple("bf16/fp32", c10::kBFloat16, c10::kFloat),
        std::make_tuple("bf16/bf16", c10::kBFloat16, c10::kBFloat16)}) {
    SCOPED_TRACE(name);
    torch::manual_seed(3);
    auto model = std::make_shared<TwoProbesImpl>();
    auto opts = mp_options(param, reduce);
    fsdp::fully_shard(model->a.ptr(), g, opts);
    fsdp::fully_shard(model->b.ptr(), g, opts);
    auto root_opts = opts;
    root_opts.mixed_precision.output_dtype = c10::kFloat;
    fsdp::fully_shard(model, g, root_opts);
    torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(1e-3));
    auto [x, y] = regression_batch(0, 4, 8, 4);
    auto before = g->stats().snapshot();
    at::Tensor out = fsdp::call(model, x);
    EXPECT_EQ(model->a->seen_weight, param);
    EXPECT_EQ(model->a->seen_input, param);
    EXPECT_EQ(model->b->seen_weight, param);
    EXPECT_EQ(out.scalar_type(), c10::kFloat) << "root output_dtype";
    fsdp::set_requires_gradient_sync(model, false);
    F::mse_loss(out, y).backward();
    for (auto& u : fsdp::units_of(model)) {
      for (auto& p : u->params()) {
        ASSERT_TRUE(p.module_param.grad().defined()) << p.fqn;
        EXPECT_EQ(p.module_param.grad().scalar_type(), param) << "unsharded grad of " << p.fqn;
      }
    }
    fsdp::set_requires_gradient_sync(model, true);
    F::mse_loss(fsdp::call(model, x), y).backward();
    opt.step();
    auto after = g->stats().snapshot();
    ag_bytes[name] = kind_bytes(before, after, CollectiveKind::kAllGather);
    rs_bytes[name] = kind_bytes(before, after, CollectiveKind::kReduceScatter);
    for (const auto& sp : fsdp::sharded_parameters(model)) {
      EXPECT_EQ(sp.tensor.scalar_type(), c10::kFloat) << sp.name;
      EXPECT_EQ(sp.tensor.grad().scalar_type(), c10::kFloat) << "sharded grad " << sp.name;
      EXPECT_EQ(sp.unit->param_dtype(), param);
      EXPECT_EQ(sp.unit->reduce_dtype(), reduce);
    }
    for (const auto& kv : opt.state()) {
      auto& st = static_cast<torch::optim::AdamWParamState&>(*kv.second);
      EXPECT_EQ(st.exp_avg().scalar_type(), c10::kFloat);
      EXPECT_EQ(st.exp_avg_sq().scalar_type(), c10::kFloat);
    }
  }
  EXPECT_GT(ag_bytes["fp32"], 0);
  EXPECT_EQ(ag_bytes["bf16/fp32"] * 2, ag_bytes["fp32"]) << "bf16 all-gather bytes are half";
  EXPECT_EQ(rs_bytes["bf16/fp32"], rs_bytes["fp32"]);
  EXPECT_EQ(rs_bytes["bf16/bf16"] * 2, rs_bytes["fp32"]);
  if (g->rank() == 0) {
    std::printf("[mixed precision] all-gather bytes per step: fp32 %lld, bf16 %lld\n",
                (long long)ag_bytes["fp32"], (long long)ag_bytes["bf16/fp32"]);
  }
}

// bf16 and fp16 runs of the small transformer (fp16 with dynamic loss scaling) track the fp32 run's
// loss within 2% at every one of 50 steps, with the counting allocator installed (mpi_main): on a
// CPU with bf16/fp16 units these matmuls run in oneDNN, whose scratch memory comes from
// raw_allocate. After warm-up the allocator's live bytes are the same at the end of every step.
TEST(MixedPrecision, Bf16TracksFp32LossOver50Steps) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  ASSERT_TRUE(fsdp::accounting::counting_allocator_installed());
  constexpr int64_t V = 37, D = 32, T = 16;
  auto data = [&](int step) {
    // learnable sequences: t[i+1] = (3 t[i] + 1) mod V from a random start
    auto gen = at::make_generator<at::CPUGeneratorImpl>(77 + step);
    at::Tensor start = at::randint(0, V, {N * 2, 1}, gen);
    std::vector<at::Tensor> cols{start};
    for (int64_t i = 0; i < T; ++i) cols.push_back((cols.back() * 3 + 1) % V);
    return at::cat(cols, 1).narrow(0, r * 2, 2);
  };
  std::map<std::string, std::vector<double>> losses;
  for (auto dtype : {c10::kFloat, c10::kBFloat16, c10::kHalf}) {
    torch::manual_seed(11);
    auto model = TinyTransformer(V, D, 2, 2, T).ptr();
    fsdp::FullyShardOptions o;
    o.mixed_precision.param_dtype = dtype;
    o.mixed_precision.reduce_dtype = c10::kFloat;
    auto root = o;
    root.mixed_precision.output_dtype = c10::kFloat;  // logits in fp32 for the loss
    fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<TinyBlockImpl>(), o, root);
    torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(3e-3));
    // fp16: a scale that never overflows here, so every step updates like the fp32 run.
    fsdp::GradScaler scaler(fsdp::GradScalerOptions{256.0, 2.0, 0.5, 1000000});
    const bool fp16 = dtype == c10::kHalf;
    auto& curve = losses[c10::toString(dtype)];
    int64_t live_after_warmup = -1;
    for (int step = 0; step < 50; ++step) {
      at::Tensor tok = data(step);
      at::Tensor logits = fsdp::call(model, tok.narrow(1, 0, T).contiguous());
      at::Tensor loss = F::cross_entropy(logits.reshape({-1, V}), tok.narrow(1, 1, T).reshape({-1}));
      if (fp16) {
        scaler.scale(loss).backward();
        EXPECT_TRUE(scaler.step(opt, model)) << "fp16 step " << step << " overflowed";
        scaler.update();
      } else {
        loss.backward();
        opt.step();
      }
      opt.zero_grad();
      at::Tensor l = loss.detach().reshape({1}).to(at::kDouble);
      g->all_reduce(l, fsdp::comm::ReduceOp::kAvg)->wait();
      curve.push_back(l.item<double>());
      tok = at::Tensor();
      logits = at::Tensor();
      loss = at::Tensor();
      l = at::Tensor();
      if (step == 2) live_after_warmup = fsdp::accounting::current_bytes();
      if (step > 2) {
        EXPECT_EQ(fsdp::accounting::current_bytes(), live_after_warmup)
            << c10::toString(dtype) << " step " << step << ": live CPU bytes changed (a leak?)";
      }
    }
  }
  const auto& a = losses["Float"];
  EXPECT_LT(a.back(), a.front() - 1.0) << "the fp32 run must learn for the comparison to mean much";
  for (const char* low : {"BFloat16", "Half"}) {
    const auto& b = losses[low];
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      double rel = std::abs(b[i] - a[i]) / a[i];
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 0.02) << "step " << i << ": " << low << " " << b[i] << " vs fp32 " << a[i];
    }
    if (r == 0) {
      std::printf("[mixed precision] loss fp32 %.4f -> %.4f, %s %.4f -> %.4f, worst rel diff %.4f\n",
                  a.front(), a.back(), low, b.front(), b.back(), worst);
    }
  }
}

// fp16 with dynamic loss scaling: an inf injected into one rank's gradient shard makes every rank
// skip that step (params bitwise unchanged) and halve the scale; the next step updates again.
TEST(MixedPrecision, Fp16OverflowOnOneRankSkipsTheStepEverywhere) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  torch::manual_seed(4);
  auto model = MLP(8, 16, 4).ptr();
  auto o = mp_options(c10::kHalf, c10::kFloat);
  fsdp::fully_shard(model->fc1.ptr(), g, o);
  fsdp::fully_shard(model->fc2.ptr(), g, o);
  o.mixed_precision.output_dtype = c10::kFloat;
  fsdp::fully_shard(model, g, o);
  torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(1e-2));
  fsdp::GradScaler scaler(fsdp::GradScalerOptions{1024.0, 2.0, 0.5, 2});
  const int bad_rank = N - 1;
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = regression_batch(step, N * 2, 8, 4);
    at::Tensor loss = F::mse_loss(fsdp::call(model, x.narrow(0, r * 2, 2)), y.narrow(0, r * 2, 2));
    scaler.scale(loss).backward();
    std::vector<at::Tensor> before;
    for (auto& p : fsdp::parameters(model)) before.push_back(p.detach().clone());
    if (step == 1 && r == bad_rank) {
      // inject: the first non-empty shard gradient on this rank gets an inf
      for (auto& p : fsdp::parameters(model)) {
        if (p.grad().defined() && p.grad().numel() > 0) {
          p.grad().view(-1)[0] = std::numeric_limits<float>::infinity();
          break;
        }
      }
    }
    double scale_before = scaler.get_scale();
    bool stepped = scaler.step(opt, model);
    scaler.update();
    opt.zero_grad();
    auto params = fsdp::parameters(model);
    bool changed = false;
    for (size_t i = 0; i < params.size(); ++i) changed = changed || !at::equal(params[i], before[i]);
    if (step == 1) {
      EXPECT_FALSE(stepped) << "rank " << r << " stepped despite the overflow on rank " << bad_rank;
      EXPECT_FALSE(changed) << "params changed on a skipped step";
      EXPECT_EQ(scaler.get_scale(), scale_before * 0.5);
    } else {
      EXPECT_TRUE(stepped) << "step " << step;
      EXPECT_TRUE(changed) << "step " << step;
      EXPECT_TRUE(std::isfinite(loss.item<double>()));
    }
  }
  // two good steps in a row (2, 3) with growth_interval 2 grow the scale back: 1024 -> 512 -> 1024
  EXPECT_EQ(scaler.get_scale(), 1024.0);
}
