// Tier `mpi`: the acceptance scenarios S1-S9 of shared/SCENARIOS.md against a single-process
// reference trained on the concatenation of all ranks' batches (mean loss).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;

namespace {

at::Tensor mse(const at::Tensor& out, const at::Tensor& y) { return F::mse_loss(out, y); }

ParityRun mlp_run(int64_t in, int64_t hidden, int64_t out, bool relu, int64_t extra,
                  fsdp::ShardingStrategy strategy) {
  ParityRun run;
  run.make_model = [=] { return MLP(in, hidden, out, relu, extra).ptr(); };
  run.shard = [=](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr g) {
    auto mlp = std::dynamic_pointer_cast<MLPImpl>(m);
    fsdp::fully_shard(mlp->fc1.ptr(), g, options_for(strategy, g->size()));
    fsdp::fully_shard(mlp->fc2.ptr(), g, options_for(strategy, g->size()));
    fsdp::fully_shard(mlp, g, options_for(strategy, g->size()));
  };
  run.forward = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x) {
    auto mlp = std::dynamic_pointer_cast<MLPImpl>(m);
    return fsdp::call(mlp, x);
  };
  run.loss = mse;
  run.batch = [=](int step, int64_t rows) { return regression_batch(step, rows, in, out); };
  return run;
}

}  // namespace

// S1: Linear(6,10) -> Tanh -> Linear(10,3), each Linear a unit plus root, 4 rows per rank, MSE,
// 5 SGD steps (lr 0.1), every strategy.
TEST(Scenarios, S1_ParityEveryStrategy) {
  for (auto strategy : implemented_strategies()) {
    SCOPED_TRACE("strategy " + fsdp::to_string(strategy));
    ParityRun run = mlp_run(6, 10, 3, false, 0, strategy);
    run.make_optimizer = sgd(0.1);
    run.steps = 5;
    run_parity(run, world());
  }
}

// S2: Linear(13,19) -> ReLU -> Linear(19,3) (numel 247, 19, 57, 3) plus a 5-element parameter;
// 5 AdamW steps with weight decay 0.1. Padding slots stay exactly zero; full shapes are original.
TEST(Scenarios, S2_PaddingStaysZeroAndShapesAreOriginal) {
  for (auto strategy : implemented_strategies()) {
    SCOPED_TRACE("strategy " + fsdp::to_string(strategy));
    ParityRun run = mlp_run(13, 19, 3, true, 5, strategy);
    run.make_optimizer = adamw(1e-2, 0.1);
    run.steps = 5;
    run.after_step = [](int step, const std::shared_ptr<torch::nn::Module>& model) {
      for (const auto& sp : fsdp::sharded_parameters(model)) {
        const auto& p = *sp.param;
        const int64_t rows = p.spec.real_rows(sp.unit->shard_rank());
        at::Tensor pad = p.sharded_storage.reshape({p.spec.rows_per_rank, p.spec.row_numel})
                             .narrow(0, rows, p.spec.rows_per_rank - rows);
        EXPECT_EQ(pad.count_nonzero().item<int64_t>(), 0)
            << "padding of " << sp.name << " after step " << step;
      }
      auto full = fsdp::full_state_dict(model);
      ASSERT_EQ(full.size(), 5u);
      int64_t numel = 0;
      for (auto& kv : full) numel += kv.second.numel();
      EXPECT_EQ(numel, 247 + 19 + 57 + 3 + 5);
    };
    run_parity(run, world());
  }
}

// S3: Linear(2,1) (3 elements) as the whole model; with N = 4 ranks 1..3 own no row of the weight.
// 3 Adam steps with clipping at 1.0; full state dict round trip is exact.
TEST(Scenarios, S3_EmptyShardsJoinEveryCollective) {
  for (auto strategy : implemented_strategies()) {
    SCOPED_TRACE("strategy " + fsdp::to_string(strategy));
    ParityRun run;
    run.make_model = [] { return torch::nn::Linear(2, 1).ptr(); };
    run.shard = [=](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr g) {
      fsdp::fully_shard(m, g, options_for(strategy, g->size()));
    };
    run.forward = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x) {
      auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(m);
      return fsdp::call(lin, x);
    };
    run.loss = mse;
    run.batch = [](int step, int64_t rows) { return regression_batch(step, rows, 2, 1); };
    run.make_optimizer = adam(0.1);
    run.steps = 3;
    run.clip_max_norm = 1.0;
    run.after_step = [](int, const std::shared_ptr<torch::nn::Module>& model) {
      auto full = fsdp::full_state_dict(model);
      std::map<std::string, at::Tensor> dict(full.begin(), full.end());
      torch::manual_seed(99);
      auto other = torch::nn::Linear(2, 1).ptr();
      fsdp::fully_shard(other, world());
      fsdp::load_full_state_dict(other, dict);
      auto back = fsdp::full_state_dict(other);
      for (size_t i = 0; i < full.size(); ++i) {
        EXPECT_EQ(back[i].first, full[i].first);
        EXPECT_TRUE(at::equal(back[i].second, full[i].second)) << "round trip of " << full[i].first;
      }
    };
    run_parity(run, world());
  }
}

// S4: unit Linear(8,8) with frozen weight and trainable bias, then trainable Linear(8,4); AdamW
// (lr 1e-2, wd 0.1), 5 steps. The frozen weight never changes, has no grad and no optimizer state,
// and the unit holds gradient bytes for the bias shard only.
TEST(Scenarios, S4_FrozenAndTrainableInOneUnit) {
  auto g = world();
  for (auto strategy : implemented_strategies()) {
    SCOPED_TRACE("strategy " + fsdp::to_string(strategy));
    ParityRun run = mlp_run(8, 8, 4, false, 0, strategy);
    auto make = run.make_model;
    run.make_model = [make] {
      auto m = make();
      std::dynamic_pointer_cast<MLPImpl>(m)->fc1->weight.set_requires_grad(false);
      return m;
    };
    run.make_optimizer = adamw(1e-2, 0.1);
    std::shared_ptr<at::Tensor> frozen_before;
    run.after_step = [&](int step, const std::shared_ptr<torch::nn::Module>& model) {
      auto mlp = std::dynamic_pointer_cast<MLPImpl>(model);
      auto unit = fsdp::find_unit(mlp->fc1.get());
      const fsdp::FSDPParam* w = nullptr;
      for (const auto& p : unit->params()) if (p.fqn == "weight") w = &p;
      ASSERT_NE(w, nullptr);
      EXPECT_FALSE(w->sharded_param.grad().defined()) << "frozen weight got a gradient";
      if (!frozen_before) frozen_before = std::make_shared<at::Tensor>(w->sharded_param.clone());
      EXPECT_TRUE(at::equal(w->sharded_param, *frozen_before)) << "frozen weight changed, step " << step;
      // bias rows only: ceil(8 / S) rows on the ranks that own rows, S the shard group size
      // (N for full_shard, shard_grad_op, zero1; the hybrid size; 1 for no_shard)
      const int64_t S = unit->shard_group()->size();
      const int64_t bias_rows = (8 + S - 1) / S;
      int64_t real = std::clamp<int64_t>(8 - unit->shard_rank() * bias_rows, 0, bias_rows);
      EXPECT_EQ(unit->sharded_grad_bytes(), real * 4);
    };
    run_parity(run, g);
  }
}

// S5: root with units A and B (Linear(4,4)); odd steps use only A, even steps only B. The unused
// unit's params get no gradient, stay bitwise unchanged, and hold only their shard after backward.
TEST(Scenarios, S5_UnusedUnitGetsNoGradient) {
  struct TwoImpl : torch::nn::Module {
    TwoImpl() {
      a = register_module("a", torch::nn::Linear(4, 4));
      b = register_module("b", torch::nn::Linear(4, 4));
    }
    at::Tensor forward(at::Tensor x) { return use_a ? fsdp::call(a, x) : fsdp::call(b, x); }
    bool use_a = true;
    torch::nn::Linear a{nullptr}, b{nullptr};
  };
  auto g = world();
  const int N = g->size(), r = g->rank();
  for (bool use_adam : {false, true}) {
    SCOPED_TRACE(use_adam ? "adam" : "sgd");
    torch::manual_seed(5);
    auto ref = std::make_shared<TwoImpl>();
    torch::manual_seed(5);
    auto model = std::make_shared<TwoImpl>();
    fsdp::fully_shard(model->a.ptr(), g);
    fsdp::fully_shard(model->b.ptr(), g);
    fsdp::fully_shard(model, g);
    auto make = use_adam ? std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>(adam(0.05))
                         : std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>(sgd(0.1));
    auto ref_opt = make(ref->parameters());
    auto opt = make(fsdp::parameters(model));
    for (int step = 1; step <= 4; ++step) {
      bool use_a = step % 2 == 1;
      ref->use_a = model->use_a = use_a;
      auto [x, y] = regression_batch(step, N * 2, 4, 4);
      ref_opt->zero_grad();
      mse(ref->forward(x), y).backward();
      opt->zero_grad();
      at::Tensor loss = mse(fsdp::call(model, x.narrow(0, r * 2, 2)), y.narrow(0, r * 2, 2));
      loss.backward();
      auto unused = fsdp::find_unit(use_a ? model->b.get() : model->a.get());
      std::vector<at::Tensor> before;
      for (const auto& p : unused->params()) {
        EXPECT_FALSE(p.sharded_param.grad().defined()) << "unused unit got a grad, step " << step;
        before.push_back(p.sharded_param.clone());
      }
      EXPECT_EQ(unused->sharded_state(), fsdp::ShardedState::kSharded);
      EXPECT_EQ(unused->unsharded_param_bytes(), 0);
      compare_with_reference(model, ref, true, 1e-5, 1e-6, "step " + std::to_string(step));
      ref_opt->step();
      opt->step();
      for (size_t i = 0; i < before.size(); ++i) {
        EXPECT_TRUE(at::equal(before[i], unused->params()[i].sharded_param)) << "unused unit changed";
      }
    }
    compare_with_reference(model, ref, false, 1e-5, 1e-6, "final");
  }
}

// S6: Linear(8,16) -> Linear(16,16) -> Linear(16,4), max_norm 0.01, norm types 2 and inf. The norm
// is identical on all ranks and equals the reference norm; clipped grads equal the reference's.
// Variants: all sharded, middle unit replicated (no_shard inside a full_shard tree), all
// replicated (no_shard), and hybrid_shard (replicated across shard groups).
TEST(Scenarios, S6_ClipGradNormMatchesReference) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  using S = fsdp::ShardingStrategy;
  struct Variant {
    const char* name;
    S outer, middle;
  };
  const Variant variants[] = {{"all sharded", S::kFullShard, S::kFullShard},
                              {"middle unit replicated", S::kFullShard, S::kNoShard},
                              {"all replicated", S::kNoShard, S::kNoShard},
                              {"hybrid", S::kHybridShard, S::kHybridShard}};
  for (const auto& variant : variants)
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(std::string(variant.name) + ", norm type " + std::to_string(norm_type));
    torch::manual_seed(6);
    auto ref = Chain(std::vector<int64_t>{8, 16, 16, 4}).ptr();
    torch::manual_seed(6);
    auto model = Chain(std::vector<int64_t>{8, 16, 16, 4}).ptr();
    for (size_t i = 0; i < model->layers.size(); ++i) {
      fsdp::fully_shard(model->layers[i].ptr(), g, options_for(i == 1 ? variant.middle : variant.outer, N));
    }
    fsdp::fully_shard(model, g, options_for(variant.outer, N));
    if (variant.middle == S::kNoShard) {
      EXPECT_EQ(fsdp::find_unit(model->layers[1].get())->num_replicas(), N);
    }
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = regression_batch(step, N * 3, 8, 4);
      ref->zero_grad();
      mse(ref->forward(x), y).backward();
      for (const auto& p : fsdp::parameters(model)) p.mutable_grad() = at::Tensor();
      mse(fsdp::call(model, x.narrow(0, r * 3, 3)), y.narrow(0, r * 3, 3)).backward();
      double ref_norm = torch::nn::utils::clip_grad_norm_(ref->parameters(), 0.01, norm_type);
      double norm = fsdp::clip_grad_norm(model, 0.01, norm_type);
      EXPECT_NEAR(norm, ref_norm, 1e-6 * ref_norm) << "step " << step;
      at::Tensor all = at::empty({N}, at::kDouble);
      g->all_gather_into_tensor(all, at::tensor({norm}, at::kDouble))->wait();
      EXPECT_TRUE(at::equal(all, at::full({N}, norm, at::kDouble))) << "norm differs across ranks";
      compare_with_reference(model, ref, true, 1e-5, 1e-8, "clipped grads step " + std::to_string(step));
    }
  }
}

// S7: 4 micro-batches of 2 rows per rank per step, loss scaled 1/4, 3 steps; accumulation by
// calling backward 4 times (sync every time) and with set_requires_gradient_sync(false) for the
// first 3. The gradient of each step equals one 8-row batch per rank.
TEST(Scenarios, S7_GradientAccumulation) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  for (auto strategy : implemented_strategies()) {
    for (bool no_sync : {false, true}) {
      SCOPED_TRACE(fsdp::to_string(strategy) + (no_sync ? " no_sync" : " sync"));
      torch::manual_seed(7);
      auto ref = MLP(6, 10, 3).ptr();
      torch::manual_seed(7);
      auto model = MLP(6, 10, 3).ptr();
      fsdp::fully_shard(model->fc1.ptr(), g, options_for(strategy, N));
      fsdp::fully_shard(model->fc2.ptr(), g, options_for(strategy, N));
      fsdp::fully_shard(model, g, options_for(strategy, N));
      auto ref_opt = sgd(0.1)(ref->parameters());
      auto opt = sgd(0.1)(fsdp::parameters(model));
      for (int step = 0; step < 3; ++step) {
        auto [x, y] = regression_batch(step, N * 8, 6, 3);
        ref_opt->zero_grad();
        at::Tensor ref_loss = mse(ref->forward(x), y);
        ref_loss.backward();
        opt->zero_grad();
        double local = 0;
        for (int micro = 0; micro < 4; ++micro) {
          if (no_sync) fsdp::set_requires_gradient_sync(model, micro == 3);
          int64_t off = r * 8 + micro * 2;
          at::Tensor l = mse(fsdp::call(model, x.narrow(0, off, 2)), y.narrow(0, off, 2)) / 4;
          l.backward();
          local += l.item<double>();
        }
        at::Tensor gl = at::tensor({local}, at::kDouble);
        g->all_reduce(gl, fsdp::comm::ReduceOp::kAvg)->wait();
        EXPECT_NEAR(gl.item<double>(), ref_loss.item<double>(), 1e-6);
        compare_with_reference(model, ref, true, 1e-5, 1e-6, "step " + std::to_string(step));
        ref_opt->step();
        opt->step();
      }
    }
  }
}

// S8: three separately wrapped roots encA, encB (3 x Linear(64,64) each) and head Linear(64,8); 10
// eval iterations under no-grad; then one training step. Nothing stays unsharded after a root's
// forward; live unsharded bytes never exceed the largest unit; memory is flat over iterations.
TEST(Scenarios, S8_InferenceReshardsEverything) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  auto build = [&](bool shard) {
    torch::manual_seed(8);
    auto a = Chain(std::vector<int64_t>{64, 64, 64, 64}).ptr();
    auto b = Chain(std::vector<int64_t>{64, 64, 64, 64}).ptr();
    auto head = torch::nn::Linear(64, 8).ptr();
    if (shard) {
      fsdp::fully_shard_tree(a, g, fsdp::wrap_by_type<torch::nn::LinearImpl>());
      fsdp::fully_shard_tree(b, g, fsdp::wrap_by_type<torch::nn::LinearImpl>());
      fsdp::fully_shard(head, g);
    }
    return std::make_tuple(a, b, head);
  };
  auto [ra, rb, rhead] = build(false);
  auto [a, b, head] = build(true);
  std::vector<std::shared_ptr<torch::nn::Module>> roots{a, b, head};
  // largest unit, as stored unsharded: Linear(64,64) with its dim 0 padded to a multiple of N
  const int64_t rows = (64 + N - 1) / N * N;
  const int64_t largest_unit = (rows * 64 + rows) * 4;
  auto run = [&](const at::Tensor& x) {
    const bool eval = !at::GradMode::is_enabled();
    at::Tensor h = fsdp::call(a, x);
    for (auto& u : fsdp::units_of(a)) {
      if (eval) EXPECT_EQ(u->sharded_state(), fsdp::ShardedState::kSharded) << u->name();
    }
    h = fsdp::call(b, h);
    for (auto& u : fsdp::units_of(b)) {
      if (eval) EXPECT_EQ(u->sharded_state(), fsdp::ShardedState::kSharded) << u->name();
    }
    return fsdp::call(head, h);
  };
  int64_t mem_at_1 = 0;
  for (int it = 1; it <= 10; ++it) {
    torch::NoGradGuard no_grad;
    for (auto& m : roots) fsdp::accounting::reset_peak_unsharded_bytes(m);
    auto [x, y] = regression_batch(it, 2, 64, 8);
    at::Tensor out = run(x);
    for (auto& m : roots) {
      auto s = fsdp::accounting::model_state_bytes(m);
      EXPECT_EQ(s.unsharded_param_bytes, 0);
      EXPECT_LE(s.peak_unsharded_param_bytes, largest_unit);
      EXPECT_GT(s.peak_unsharded_param_bytes, 0);
    }
    out = at::Tensor();
    if (it == 1) mem_at_1 = fsdp::accounting::current_bytes();
    if (it == 10) EXPECT_EQ(fsdp::accounting::current_bytes(), mem_at_1) << "memory grew over eval";
  }
  // one training step against the reference
  auto [x, y] = regression_batch(42, N * 2, 64, 8);
  at::Tensor ref_loss = mse(rhead->forward(rb->forward(ra->forward(x))), y);
  ref_loss.backward();
  at::Tensor loss = mse(run(x.narrow(0, r * 2, 2)), y.narrow(0, r * 2, 2));
  loss.backward();
  compare_with_reference(a, ra, true, 1e-5, 1e-6, "encA");
  compare_with_reference(b, rb, true, 1e-5, 1e-6, "encB");
  compare_with_reference(head, rhead, true, 1e-5, 1e-6, "head");
}

// S9: units A and B (Linear(8,8)); (a) out = A(B(A(B(x)))) with reshard after forward and
// backward; (b) two forwards then two backwards before one step. Grads are the sums over uses.
TEST(Scenarios, S9_UnitUsedTwice) {
  struct TwiceImpl : torch::nn::Module {
    TwiceImpl() {
      a = register_module("a", torch::nn::Linear(8, 8));
      b = register_module("b", torch::nn::Linear(8, 8));
    }
    at::Tensor forward(at::Tensor x) {
      return fsdp::call(a, fsdp::call(b, fsdp::call(a, fsdp::call(b, x))));
    }
    torch::nn::Linear a{nullptr}, b{nullptr};
  };
  auto g = world();
  const int N = g->size(), r = g->rank();
  for (bool two_forwards : {false, true}) {
    SCOPED_TRACE(two_forwards ? "(b) two forwards, two backwards" : "(a) A(B(A(B(x))))");
    torch::manual_seed(9);
    auto ref = std::make_shared<TwiceImpl>();
    torch::manual_seed(9);
    auto model = std::make_shared<TwiceImpl>();
    fsdp::fully_shard(model->a.ptr(), g);
    fsdp::fully_shard(model->b.ptr(), g);
    fsdp::fully_shard(model, g);
    auto ref_opt = sgd(0.1)(ref->parameters());
    auto opt = sgd(0.1)(fsdp::parameters(model));
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = regression_batch(step, N * 2, 8, 8);
      auto [x2, y2] = regression_batch(step + 100, N * 2, 8, 8);
      ref_opt->zero_grad();
      opt->zero_grad();
      at::Tensor xl = x.narrow(0, r * 2, 2), yl = y.narrow(0, r * 2, 2);
      if (!two_forwards) {
        mse(ref->forward(x), y).backward();
        mse(fsdp::call(model, xl), yl).backward();
      } else {
        (mse(ref->forward(x), y) + mse(ref->forward(x2), y2)).backward();
        at::Tensor l1 = mse(fsdp::call(model, xl), yl);
        at::Tensor l2 = mse(fsdp::call(model, x2.narrow(0, r * 2, 2)), y2.narrow(0, r * 2, 2));
        l1.backward();
        l2.backward();
      }
      for (auto& u : fsdp::units_of(model)) {
        EXPECT_EQ(u->sharded_state(), fsdp::ShardedState::kSharded) << u->name();
        EXPECT_EQ(u->training_state(), fsdp::TrainingState::kIdle) << u->name();
      }
      compare_with_reference(model, ref, true, 1e-5, 1e-6, "step " + std::to_string(step));
      ref_opt->step();
      opt->step();
    }
    compare_with_reference(model, ref, false, 1e-5, 1e-6, "final");
  }
}
