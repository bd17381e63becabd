// Tier `mpi`: paths that used to give silently wrong results, each against a single-process
// reference for every strategy it concerns: requires_grad changed after wrapping, gradients
// accumulated without sync by a unit the synced micro-batch does not use, 0-dim parameters, a
// parameter read outside its unit's forward, ranks that call units differently.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "fsdp/runtime/state_dict.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
using S = fsdp::ShardingStrategy;

namespace {

// Every strategy's options at this world size.
fsdp::FullyShardOptions opts(S s) { return options_for(s, world()->size()); }

// The gradient every rank's shard adds up to, gathered, against the reference's.
void expect_grads_match(const std::shared_ptr<torch::nn::Module>& model, const std::shared_ptr<torch::nn::Module>& ref,
                        const std::string& when) {
  compare_with_reference(model, ref, /*grad=*/true, 1e-5, 1e-6, when);
}

// --- a unit whose micro-batches differ: y = a(x) for which == 0, b(x) for which == 1 ---------
struct TwoBranchImpl : torch::nn::Module {
  TwoBranchImpl() {
    a = register_module("a", torch::nn::Linear(4, 3));
    b = register_module("b", torch::nn::Linear(4, 3));
    scale = register_parameter("scale", torch::ones({3}));
  }
  at::Tensor forward(at::Tensor x, int64_t which) {
    return (which == 0 ? fsdp::call(a, x) : fsdp::call(b, x)) * scale;
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(TwoBranch);

// --- 0-dim parameters: a learnable scale and a frozen temperature -----------------------------
struct ScalarsImpl : torch::nn::Module {
  ScalarsImpl() {
    fc = register_module("fc", torch::nn::Linear(5, 4));
    scale = register_parameter("scale", torch::tensor(1.5));
    temperature = register_parameter("temperature", torch::tensor(2.0), /*requires_grad=*/false);
  }
  at::Tensor forward(at::Tensor x) {
    seen_dims = {scale.dim(), temperature.dim()};
    return fsdp::call(fc, x) * scale / temperature;
  }
  torch::nn::Linear fc{nullptr};
  at::Tensor scale, temperature;
  std::vector<int64_t> seen_dims;
};
TORCH_MODULE(Scalars);

// --- an output head tied to an embedding that is a unit of its own ----------------------------
struct TiedImpl : torch::nn::Module {
  TiedImpl() {
    emb = register_module("emb", torch::nn::Embedding(11, 6));
    mid = register_module("mid", torch::nn::Linear(6, 6));
  }
  at::Tensor forward(at::Tensor idx) {
    at::Tensor h = torch::tanh(fsdp::call(mid, fsdp::call(emb, idx)));
    return at::linear(h, emb->weight);  // reads the embedding unit's parameter directly
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear mid{nullptr};
};
TORCH_MODULE(Tied);

// --- a unit called directly: mid(h) instead of fsdp::call(mid, h) --------------------------------
struct DirectImpl : torch::nn::Module {
  DirectImpl() {
    emb = register_module("emb", torch::nn::Embedding(11, 6));
    mid = register_module("mid", torch::nn::Linear(6, 6));
  }
  at::Tensor forward(at::Tensor idx) { return mid(fsdp::call(emb, idx)); }  // mid is a unit of its own
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear mid{nullptr};
};
TORCH_MODULE(Direct);

// --- experts: each its own unit; the routing may differ by rank -------------------------------
struct ExpertsImpl : torch::nn::Module {
  explicit ExpertsImpl(bool same_size) {
    e0 = register_module("e0", torch::nn::Linear(4, 4));
    e1 = register_module("e1", torch::nn::Linear(torch::nn::LinearOptions(4, 4).bias(same_size)));
  }
  at::Tensor forward(at::Tensor x, int64_t expert) { return expert == 0 ? fsdp::call(e0, x) : fsdp::call(e1, x); }
  torch::nn::Linear e0{nullptr}, e1{nullptr};
};
TORCH_MODULE(Experts);

}  // namespace

// Freezing fc1 after fully_shard (steps 2-4) and unfreezing it (from step 5): the layer does not
// move while frozen, keeps no gradient in memory, and every step matches a single-process model
// frozen the same way (losses, gradients, parameters; AdamW).
TEST(Correctness, RequiresGradChangedAfterWrappingIsFollowed) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    torch::manual_seed(21);
    auto ref = MLP(6, 10, 3).ptr();
    torch::manual_seed(21);
    auto model = MLP(6, 10, 3).ptr();
    fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<torch::nn::LinearImpl>(), opts(s));
    torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(0.02));
    torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(0.02));
    auto unit_fc1 = fsdp::find_unit(model->fc1.get());
    for (int step = 0; step < 8; ++step) {
      const bool frozen = step >= 2 && step < 5;
      for (auto* m : {&ref->fc1, &model->fc1}) {
        (*m)->weight.requires_grad_(!frozen);
        (*m)->bias.requires_grad_(!frozen);
      }
      auto [x, y] = regression_batch(step, N * 2, 6, 3);
      ref_opt.zero_grad();
      F::mse_loss(ref->forward(x), y).backward();
      opt.zero_grad();
      at::Tensor loss = F::mse_loss(fsdp::call(model, x.narrow(0, r * 2, 2)), y.narrow(0, r * 2, 2));
      loss.backward();
      const std::string when = "step " + std::to_string(step) + (frozen ? " (fc1 frozen)" : "");
      expect_grads_match(model, ref, when);
      EXPECT_EQ(unit_fc1->unsharded_grad_bytes(), 0) << when << ": an unreduced gradient stayed in memory";
      for (const auto& p : unit_fc1->params()) {
        EXPECT_EQ(p.sharded_param.requires_grad(), !frozen) << when << " " << p.fqn;
        EXPECT_EQ(p.sharded_param.grad().defined(), !frozen) << when << " " << p.fqn;
      }
      ref_opt.step();
      opt.step();
      compare_with_reference(model, ref, /*grad=*/false, 1e-5, 1e-6, when + " params");
    }
  }
}

// Micro-batch 1 runs branch a with set_requires_gradient_sync(false), micro-batch 2 runs only
// branch b, synced: a's accumulated gradient must still be reduced (it used to stay local, and
// grow), for every strategy, and match the reference summed over both micro-batches.
TEST(Correctness, AccumulationWithoutSyncReducesUnitsTheSyncedMicroBatchDoesNotUse) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    torch::manual_seed(31);
    auto ref = TwoBranch().ptr();
    torch::manual_seed(31);
    auto model = TwoBranch().ptr();
    fsdp::fully_shard(model->a.ptr(), g, opts(s));
    fsdp::fully_shard(model->b.ptr(), g, opts(s));
    fsdp::fully_shard(model, g, opts(s));
    for (int step = 0; step < 3; ++step) {
      auto [x1, y1] = regression_batch(10 + step, N * 2, 4, 3);
      auto [x2, y2] = regression_batch(20 + step, N * 2, 4, 3);
      ref->zero_grad();
      (F::mse_loss(ref->forward(x1, 0), y1) + F::mse_loss(ref->forward(x2, 1), y2)).backward();
      for (const auto& p : fsdp::parameters(model)) p.mutable_grad() = at::Tensor();
      fsdp::set_requires_gradient_sync(model, false);
      F::mse_loss(fsdp::call(model, x1.narrow(0, r * 2, 2), int64_t{0}), y1.narrow(0, r * 2, 2)).backward();
      fsdp::set_requires_gradient_sync(model, true);
      F::mse_loss(fsdp::call(model, x2.narrow(0, r * 2, 2), int64_t{1}), y2.narrow(0, r * 2, 2)).backward();
      expect_grads_match(model, ref, "step " + std::to_string(step));
      for (const auto& u : fsdp::units_of(model)) {
        EXPECT_EQ(u->unsharded_grad_bytes(), 0) << u->name() << " kept gradient after the synced backward";
      }
    }
  }
}

// A trainable 0-dim scale and a frozen 0-dim temperature: they shard (one row of one element),
// keep their dtype, and train as in one process.
TEST(Correctness, ZeroDimParametersShardAndTrain) {
  auto g = world();
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    ParityRun run;
    run.make_model = [] { return Scalars().ptr(); };
    run.shard = [=](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr grp) {
      auto sc = std::dynamic_pointer_cast<ScalarsImpl>(m);
      fsdp::fully_shard(sc->fc.ptr(), grp, options_for(s, grp->size()));
      fsdp::fully_shard(sc, grp, options_for(s, grp->size()));
      for (const auto& sp : fsdp::sharded_parameters(sc)) {
        EXPECT_EQ(sp.tensor.scalar_type(), at::kFloat) << sp.name;
        EXPECT_EQ(sp.tensor.requires_grad(), sp.name != "temperature") << sp.name;
      }
    };
    run.forward = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x) {
      auto sc = std::dynamic_pointer_cast<ScalarsImpl>(m);
      at::Tensor out = fsdp::call(sc, x);
      EXPECT_EQ(sc->seen_dims, (std::vector<int64_t>{0, 0})) << "the forward sees 0-dim parameters";
      return out;
    };
    run.loss = [](const at::Tensor& o, const at::Tensor& y) { return F::mse_loss(o, y); };
    run.batch = [](int step, int64_t rows) { return regression_batch(step, rows, 5, 4); };
    run.make_optimizer = adamw(0.05, 0.0);
    run.rows_per_rank = 2;
    run.steps = 4;
    run_parity(run, g);
  }
}

// The head reads the embedding unit's weight directly: by default (the embedding resharded after
// its forward) every rank gets libtorch's error (still a c10::Error) with the parameter, the unit
// and the remedies added; a unit module called directly (mid(h)) is named as one, with fsdp::call;
// with reshard_after_forward=false on the embedding unit it trains as in one process.
TEST(Correctness, ParameterUsedOutsideItsUnitsForward) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  {
    auto model = Tied().ptr();
    fsdp::fully_shard(model->emb.ptr(), g, opts(S::kFullShard));
    fsdp::fully_shard(model->mid.ptr(), g, opts(S::kFullShard));
    fsdp::fully_shard(model, g, opts(S::kFullShard));
    try {
      (void)fsdp::call(model, at::randint(0, 11, {2, 5}));
      ADD_FAILURE() << "reading a resharded parameter outside its unit was accepted";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_EQ(msg.rfind("size mismatch", 0), 0u) << "libtorch's message first: " << msg;
      EXPECT_NE(msg.find("'weight' of unit 'emb'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("reshard_after_forward=false"), std::string::npos) << msg;
    }
    // The model can run again after the error (no state left half-way).
    EXPECT_THROW((void)fsdp::call(model, at::randint(0, 11, {2, 5})), c10::Error);
  }
  {  // A unit called directly (mid(h)): named as such, with fsdp::call as the remedy.
    auto model = Direct().ptr();
    fsdp::fully_shard(model->emb.ptr(), g, opts(S::kFullShard));
    fsdp::fully_shard(model->mid.ptr(), g, opts(S::kFullShard));
    fsdp::fully_shard(model, g, opts(S::kFullShard));
    try {
      (void)fsdp::call(model, at::randint(0, 11, {2, 5}));
      ADD_FAILURE() << "a unit called without fsdp::call was accepted";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("Unit(s) 'mid' ran no FSDP forward in this pass: a module that is an FSDP unit called "
                         "directly (module(x) or module->forward(x)) is never gathered; call it through "
                         "fsdp::call(module, args...)"),
                std::string::npos)
          << msg;
    }
  }
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    torch::manual_seed(41);
    auto ref = Tied().ptr();
    torch::manual_seed(41);
    auto model = Tied().ptr();
    auto keep = opts(s);
    if (s != S::kNoShard && s != S::kZero1) keep.reshard_after_forward = false;
    fsdp::fully_shard(model->emb.ptr(), g, keep);
    fsdp::fully_shard(model->mid.ptr(), g, opts(s));
    fsdp::fully_shard(model, g, opts(s));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD opt(fsdp::parameters(model), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + step);
      at::Tensor idx = at::randint(0, 11, {N * 2, 5}, gen);
      at::Tensor tgt = at::randint(0, 11, {N * 2, 5}, gen);
      auto ce = [](const at::Tensor& logits, const at::Tensor& t) {
        return F::cross_entropy(logits.reshape({-1, 11}), t.reshape({-1}));
      };
      ref_opt.zero_grad();
      ce(ref->forward(idx), tgt).backward();
      opt.zero_grad();
      ce(fsdp::call(model, idx.narrow(0, r * 2, 2)), tgt.narrow(0, r * 2, 2)).backward();
      expect_grads_match(model, ref, "tied step " + std::to_string(step));
      ref_opt.step();
      opt.step();
    }
  }
}

// Each expert is a unit; rank r routes to expert r % 2. Equal sizes would pair the two experts'
// all-gathers silently, different sizes made MPI abort: both are an fsdp::Error (kMismatch) on
// every rank, naming the collective's number, both units, the phase and the ranks.
TEST(Correctness, RanksCallingDifferentUnitsAreNamedNotPaired) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  if (N < 2) GTEST_SKIP() << "needs two ranks";
  for (bool same_size : {true, false}) {
    SCOPED_TRACE(same_size ? "experts of equal size" : "experts of different size");
    auto model = Experts(same_size).ptr();
    fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<torch::nn::LinearImpl>());
    try {
      (void)fsdp::call(model, at::randn({2, 4}), int64_t{r % 2});
      ADD_FAILURE() << "ranks running different units were not detected";
    } catch (const fsdp::Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kMismatch) << msg;
      EXPECT_NE(msg.find("ranks disagree at collective #"), std::string::npos) << msg;
      EXPECT_NE(msg.find("unit 'e0', forward"), std::string::npos) << msg;
      EXPECT_NE(msg.find("unit 'e1', forward"), std::string::npos) << msg;
      EXPECT_NE(msg.find(N / 2 == 1 ? "rank 1 differs from rank 0" : "differ from rank 0"), std::string::npos) << msg;
    }
    g->barrier()->wait();
  }
  // The group stays usable: every rank routing the same way trains.
  auto model = Experts(true).ptr();
  fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<torch::nn::LinearImpl>());
  F::mse_loss(fsdp::call(model, at::randn({2, 4}), int64_t{1}), at::zeros({2, 4})).backward();
}
