// Tier `mpi`: a step that throws leaves the model usable ([Note: failed steps]). User code failing
// inside a unit's forward, a backward hook (a NaN guard), the memory budget refusing an allocation
// in forward and in backward, the last micro-batch of an accumulation failing in backward: every
// unit is IDLE and resharded afterwards, no unsharded param or gradient is alive, the user's error
// reaches the loop as thrown, and the following steps equal a single-process run that never saw the
// failed batches, for every strategy. A rank that skips a batch alone, and ranks that route to
// different units of one type, are named by the collective check instead of pairing silently.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <functional>

#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "fsdp/accounting/budget.h"
#include "fsdp/accounting/memory.h"
#include "fsdp/common/activity.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
using S = fsdp::ShardingStrategy;

namespace {

constexpr int64_t kIn = 6, kHidden = 12, kOut = 3, kRows = 2;

// How a step fails (the same on every rank unless a test says otherwise).
enum class Failure {
  kNone,
  kUserCheckInUnit,  // TORCH_CHECK in unit 'mid''s forward, while unit 'fc1' is resharded
  kBackwardHook,     // a hook throws after fc3's gradients left, before mid's backward
  kOomInForward,     // the memory budget refuses the forward's first allocation
  kOomInBackward,    // the memory budget refuses an allocation of a backward hook
  kAccumulation,     // micro-batch 1 without sync is fine, micro-batch 2's backward throws
  kAccumulationForward,  // micro-batch 1 without sync is fine, micro-batch 2's forward throws
};

const char* name_of(Failure f) {
  switch (f) {
    case Failure::kNone: return "none";
    case Failure::kUserCheckInUnit: return "user check in a unit's forward";
    case Failure::kBackwardHook: return "backward hook";
    case Failure::kOomInForward: return "out of memory in forward";
    case Failure::kOomInBackward: return "out of memory in backward";
    case Failure::kAccumulation: return "accumulated micro-batch, then a failed backward";
    case Failure::kAccumulationForward: return "accumulated micro-batch, then a failed forward";
  }
  return "?";
}

// A unit whose forward checks its batch as user code does.
struct CheckedImpl : torch::nn::Module {
  CheckedImpl() { fc = register_module("fc", torch::nn::Linear(kHidden, kHidden)); }
  at::Tensor forward(at::Tensor x) {
    at::Tensor y = fc(x);
    // Words a user's check may use that ATen's own messages use too ("out of range", "at least").
    TORCH_CHECK(!reject, "bad batch: token id 50321 out of range [0, 8192); a sequence needs at least 2 tokens");
    return y;
  }
  torch::nn::Linear fc{nullptr};
  bool reject = false;
};
TORCH_MODULE(Checked);

// scale * fc3(tanh(mid(tanh(fc1(x))))): units fc1, mid, fc3, and the root owning `scale`.
struct LoopNetImpl : torch::nn::Module {
  LoopNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kIn, kHidden));
    mid = register_module("mid", Checked());
    fc3 = register_module("fc3", torch::nn::Linear(kHidden, kOut));
    scale = register_parameter("scale", torch::ones({kOut}));
  }
  at::Tensor forward(at::Tensor x) {
    at::Tensor h = fsdp::call(mid, at::tanh(fsdp::call(fc1, x)));
    if (failure == Failure::kBackwardHook) {
      h.register_hook([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("NaN guard: non-finite gradient"); });
    } else if (failure == Failure::kOomInBackward) {
      h.register_hook([](const at::Tensor& grad) {
        at::Tensor scratch = at::empty({int64_t{1} << 24});  // 64 MB: past the step's budget
        return grad;
      });
    }
    return fsdp::call(fc3, at::tanh(h)) * scale;
  }
  torch::nn::Linear fc1{nullptr}, fc3{nullptr};
  Checked mid{nullptr};
  at::Tensor scale;
  Failure failure = Failure::kNone;
};
TORCH_MODULE(LoopNet);

// Every unit IDLE and resharded, nothing unsharded alive, no activity marker left; resharded
// params hold empty tensors (shape [0]) as fully_shard.h says.
void expect_clean(const std::shared_ptr<torch::nn::Module>& model, const std::string& when) {
  for (const auto& u : fsdp::units_of(model)) {
    const std::string at = when + ", unit '" + u->name() + "'";
    EXPECT_EQ(u->training_state(), fsdp::TrainingState::kIdle) << at;
    EXPECT_EQ(u->sharded_state(), fsdp::ShardedState::kSharded) << at;
    EXPECT_EQ(u->unsharded_grad_bytes(), 0) << at << ": an unsharded gradient stayed alive";
    if (u->keeps_full_params()) continue;  // no_shard, zero1: full params are their state
    EXPECT_EQ(u->unsharded_param_bytes(), 0) << at << ": unsharded params stayed alive";
    for (const auto& p : u->params()) EXPECT_EQ(p.module_param.numel(), 0) << at << " " << p.fqn;
  }
  EXPECT_EQ(fsdp::current_activity().unit, nullptr) << when << ": an activity marker was left";
}

// fc1, mid and fc3 as units (mid's Linear inside mid's unit), the rest in the root.
fsdp::WrapPolicy top_level_units() {
  return [](const std::string& name, torch::nn::Module&) { return name == "fc1" || name == "mid" || name == "fc3"; };
}

// fn must throw fsdp::Error of kind kMismatch whose message holds every string of `want`.
void expect_mismatch(const std::function<void()>& fn, const std::string& if_not, const std::vector<std::string>& want) {
  try {
    fn();
    ADD_FAILURE() << if_not;
  } catch (const fsdp::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kMismatch) << msg;
    for (const auto& w : want) EXPECT_NE(msg.find(w), std::string::npos) << "want '" << w << "' in: " << msg;
  }
}

at::Tensor rank_loss(const std::shared_ptr<LoopNetImpl>& model, const at::Tensor& x, const at::Tensor& y, int r) {
  return F::mse_loss(fsdp::call(model, x.narrow(0, r * kRows, kRows)), y.narrow(0, r * kRows, kRows));
}

// Runs step `step` of the FSDP loop with failure f; returns true when it trained. Checks the
// exception each failure gives the loop.
bool run_step(const std::shared_ptr<LoopNetImpl>& model, torch::optim::Optimizer& opt, Failure f, int step,
              int r, int N) {
  auto [x, y] = regression_batch(step, N * kRows, kIn, kOut);
  opt.zero_grad();
  const std::string when = std::string("step ") + std::to_string(step) + " (" + name_of(f) + ")";
  try {
    if (f == Failure::kAccumulation || f == Failure::kAccumulationForward) {
      fsdp::set_requires_gradient_sync(model, false);
      (rank_loss(model, x, y, r) * 0.5).backward();
      fsdp::set_requires_gradient_sync(model, true);
      if (f == Failure::kAccumulation) model->failure = Failure::kBackwardHook;
      model->mid->reject = f == Failure::kAccumulationForward;
      (rank_loss(model, x, y, r) * 0.5).backward();
    } else {
      model->failure = f;
      model->mid->reject = f == Failure::kUserCheckInUnit;
      if (f == Failure::kOomInForward) fsdp::accounting::set_memory_budget(fsdp::accounting::current_bytes() + 1, r);
      if (f == Failure::kOomInBackward) {
        fsdp::accounting::set_memory_budget(fsdp::accounting::current_bytes() + (int64_t{32} << 20), r);
      }
      rank_loss(model, x, y, r).backward();
    }
    fsdp::accounting::clear_memory_budget();
    model->failure = Failure::kNone;
    EXPECT_EQ(f, Failure::kNone) << when << ": the step did not fail";
    opt.step();
    return true;
  } catch (const fsdp::OutOfMemory& e) {
    EXPECT_TRUE(f == Failure::kOomInForward || f == Failure::kOomInBackward) << when << ": " << e.what();
  } catch (const fsdp::Error& e) {
    ADD_FAILURE() << when << ": the failure became an fsdp::Error: " << e.what();
  } catch (const c10::Error& e) {
    EXPECT_TRUE(f == Failure::kUserCheckInUnit || f == Failure::kAccumulationForward) << when << ": " << e.what();
    EXPECT_EQ(std::string(e.what_without_backtrace()).rfind("bad batch: token id 50321", 0), 0u)
        << when << ": the user's message does not come first: " << e.what_without_backtrace();
  } catch (const std::exception& e) {
    EXPECT_TRUE(f == Failure::kBackwardHook || f == Failure::kAccumulation) << when << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("NaN guard"), std::string::npos) << when << ": " << e.what();
  }
  fsdp::accounting::clear_memory_budget();
  fsdp::set_requires_gradient_sync(model, true);
  model->failure = Failure::kNone;
  model->mid->reject = false;
  expect_clean(model, when);
  return false;
}

}  // namespace

// The loop catches, skips the batch (zero_grad at the top of every step) and goes on: parameters
// after every trained step, and gradients, equal a single-process run of the batches that trained.
TEST(FailedSteps, SkippedBatchesEqualARunThatNeverSawThem) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  const std::vector<Failure> plan{Failure::kNone,         Failure::kUserCheckInUnit, Failure::kNone,
                                  Failure::kBackwardHook, Failure::kOomInForward,    Failure::kNone,
                                  Failure::kOomInBackward, Failure::kAccumulation,   Failure::kNone,
                                  Failure::kAccumulationForward, Failure::kNone};
  fsdp::accounting::install_counting_allocator();
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    torch::manual_seed(17);
    auto ref = LoopNet().ptr();
    torch::manual_seed(17);
    auto model = LoopNet().ptr();
    fsdp::fully_shard_tree(model, g, top_level_units(), options_for(s, N));
    torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
    int trained = 0;
    for (int step = 0; step < static_cast<int>(plan.size()); ++step) {
      if (!run_step(model, opt, plan[step], step, r, N)) continue;
      auto [x, y] = regression_batch(step, N * kRows, kIn, kOut);
      ref_opt.zero_grad();
      F::mse_loss(ref->forward(x), y).backward();
      const std::string when = "step " + std::to_string(step);
      compare_with_reference(model, ref, /*grad=*/true, 1e-5, 1e-6, when);
      ref_opt.step();
      compare_with_reference(model, ref, /*grad=*/false, 1e-5, 1e-6, when);
      expect_clean(model, when);
      ++trained;
    }
    EXPECT_EQ(trained, 5);
  }
}

// no_shard issues no collective in forward, and its bucket all-reduces look alike from step to
// step: a rank whose forward failed alone and that went on to the next batch used to pair its
// all-reduces with its peers' previous step, silently. The training forward each collective
// belongs to is part of the collective check: every rank throws kMismatch naming both.
TEST(FailedSteps, RankSkippingABatchAloneIsNamedNotPaired) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  if (N < 2) GTEST_SKIP() << "needs two ranks";
  torch::manual_seed(3);
  auto model = LoopNet().ptr();
  fsdp::FullyShardOptions o = options_for(S::kNoShard, N);
  fsdp::fully_shard(model->fc1.ptr(), g, o);
  fsdp::fully_shard(model->mid.ptr(), g, o);
  fsdp::fully_shard(model->fc3.ptr(), g, o);
  fsdp::fully_shard(model, g, o);
  auto [x, y] = regression_batch(0, N * kRows, kIn, kOut);
  rank_loss(model, x, y, r).backward();  // training forward 1 on every rank
  if (r == N - 1) {
    model->mid->reject = true;  // this rank's forward 2 fails, and it goes on with its batch 3
    EXPECT_THROW(rank_loss(model, x, y, r), c10::Error);
    model->mid->reject = false;
  }
  expect_mismatch([&] { rank_loss(model, x, y, r).backward(); },
                  "a rank one training step ahead paired its gradient all-reduces with its peers'",
                  {"(forward pass 2)", "(forward pass 3)",
                   N == 2 ? "rank 1 differs from rank 0" : "rank " + std::to_string(N - 1)});
  expect_clean(model, "after the mismatch");
  g->barrier()->wait();  // the group is still in step
}

namespace {

// Two experts of one type and size under plain fully_shard (no wrap policy to name them).
struct MoEImpl : torch::nn::Module {
  MoEImpl() {
    e0 = register_module("e0", torch::nn::Linear(4, 4));
    e1 = register_module("e1", torch::nn::Linear(4, 4));
  }
  at::Tensor forward(at::Tensor x, int64_t expert) { return expert == 0 ? fsdp::call(e0, x) : fsdp::call(e1, x); }
  torch::nn::Linear e0{nullptr}, e1{nullptr};
};
TORCH_MODULE(MoE);

}  // namespace

// Plain fully_shard used to name a unit by its module's type (torch::nn::LinearImpl for both
// experts): with rank-dependent routing their collectives paired silently. Units are named by
// their paths in the model, and the check names both.
TEST(FailedSteps, UnitsOfOneTypeAreToldApartByTheirPaths) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  for (auto s : {S::kFullShard, S::kNoShard}) {
    SCOPED_TRACE(fsdp::to_string(s));
    auto model = MoE().ptr();
    fsdp::fully_shard(model->e0.ptr(), g, options_for(s, N));
    fsdp::fully_shard(model->e1.ptr(), g, options_for(s, N));
    fsdp::fully_shard(model, g, options_for(s, N));
    (void)fsdp::parameters(model);  // the root names its tree's units
    EXPECT_EQ(fsdp::find_unit(model->e0.get())->name(), "e0");
    EXPECT_EQ(fsdp::find_unit(model->e1.get())->name(), "e1");
    EXPECT_EQ(fsdp::find_unit(model.get())->name(), "root");
    if (N >= 2) {
      expect_mismatch(
          [&] { F::mse_loss(fsdp::call(model, at::randn({2, 4}), int64_t{r % 2}), at::zeros({2, 4})).backward(); },
          "ranks running different experts were paired", {"unit 'e0'", "unit 'e1'"});
      expect_clean(model, "after the mismatch");
      g->barrier()->wait();
    }
    // The same routing on every rank trains.
    F::mse_loss(fsdp::call(model, at::randn({2, 4}), int64_t{1}), at::zeros({2, 4})).backward();
    expect_clean(model, "after a step");
  }
}
