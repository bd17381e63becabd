// Tier `mpi`: a step that throws leaves the model usable ([Note: failed steps]). User code failing
// inside a unit's forward, a backward hook (a NaN guard), the memory budget refusing an allocation
// in forward and in backward, the last micro-batch of an accumulation failing in backward: every
// unit is IDLE and resharded afterwards, no unsharded param or gradient is alive, the user's error
// reaches the loop as thrown, and the following steps equal a single-process run that never saw the
// failed batches, for every strategy. Ranks that fail at different points of one step, or one rank
// alone, all skip it ([Note: abandoned steps]); a rank that finished the step another abandoned,
// and ranks that route to different units of one type, are named instead of pairing silently.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <functional>
#include <optional>

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
  // Each rank fails at its own point of the step (the collectives issued differ between ranks):
  kRankDependentForward,   // rank r % 3: 0 in the root after fc1, 1 in mid's check, 2 after fc3
  kRankDependentBackward,  // even ranks: the hook after fc3's gradients; odd: after mid's backward
  kRankDependentOom,       // rank 0's budget refuses its forward, the others' a backward hook's
  kOneRankAlone,           // only the last rank's forward fails (mid's check)
  // Between forward and backward (the loss), where no FSDP hook runs:
  kLossEveryRank,           // every rank's loss throws: nothing to settle
  kLossOneRank,             // the last rank's loss throws; its next forward settles the peers' backward
  kLossOneRankAbandoned,    // the same, and the loop calls fsdp::abandon_step in its catch
  kOneRankBackward,         // only the last rank's backward hook throws (after fc3's gradients left)
  kMixedPoints,             // r % 4: 0 mid's check, 1 fine, 2 the loss (+ abandon_step), 3 the root after fc3
  kAccumulationOneRank,     // micro-batch 1 (no sync) fails in backward on the last rank only
  kOneRankInputGradHook,    // the last rank's hook on the input's gradient: after its last reduction
};

bool fails_in_loss(Failure f, int r, int N) {
  return f == Failure::kLossEveryRank || ((f == Failure::kLossOneRank || f == Failure::kLossOneRankAbandoned) && r == N - 1) ||
         (f == Failure::kMixedPoints && r % 4 == 2);
}

// The step fails at a point that depends on the rank: a peer's failure may reach a rank first.
bool rank_dependent(Failure f) {
  return f == Failure::kRankDependentForward || f == Failure::kRankDependentBackward ||
         f == Failure::kRankDependentOom || f == Failure::kOneRankAlone || f == Failure::kLossOneRank ||
         f == Failure::kLossOneRankAbandoned || f == Failure::kOneRankBackward || f == Failure::kMixedPoints ||
         f == Failure::kAccumulationOneRank || f == Failure::kOneRankInputGradHook;
}

const char* name_of(Failure f) {
  switch (f) {
    case Failure::kNone: return "none";
    case Failure::kUserCheckInUnit: return "user check in a unit's forward";
    case Failure::kBackwardHook: return "backward hook";
    case Failure::kOomInForward: return "out of memory in forward";
    case Failure::kOomInBackward: return "out of memory in backward";
    case Failure::kAccumulation: return "accumulated micro-batch, then a failed backward";
    case Failure::kAccumulationForward: return "accumulated micro-batch, then a failed forward";
    case Failure::kRankDependentForward: return "forward failing at a rank-dependent point";
    case Failure::kRankDependentBackward: return "backward failing at a rank-dependent point";
    case Failure::kRankDependentOom: return "budget refusing at a rank-dependent point";
    case Failure::kOneRankAlone: return "one rank's forward failing alone";
    case Failure::kLossEveryRank: return "every rank's loss failing";
    case Failure::kLossOneRank: return "one rank's loss failing";
    case Failure::kLossOneRankAbandoned: return "one rank's loss failing, then fsdp::abandon_step";
    case Failure::kOneRankBackward: return "one rank's backward failing alone";
    case Failure::kMixedPoints: return "forward, loss and root failing on different ranks";
    case Failure::kAccumulationOneRank: return "one rank's no-sync micro-batch failing in backward";
    case Failure::kOneRankInputGradHook: return "one rank's hook on the input's gradient failing";
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
    at::Tensor a = at::tanh(fsdp::call(fc1, x));
    if (throw_after_fc1) throw std::runtime_error("bad batch: rejected after fc1");
    if (hook_after_mid) {
      a.register_hook([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("NaN guard: non-finite gradient"); });
    }
    at::Tensor h = fsdp::call(mid, a);
    if (failure == Failure::kBackwardHook) {
      h.register_hook([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("NaN guard: non-finite gradient"); });
    } else if (failure == Failure::kOomInBackward) {
      h.register_hook([](const at::Tensor& grad) {
        at::Tensor scratch = at::empty({int64_t{1} << 24});  // 64 MB: past the step's budget
        return grad;
      });
    }
    at::Tensor out = fsdp::call(fc3, at::tanh(h)) * scale;
    if (throw_after_fc3) throw std::runtime_error("bad batch: rejected after fc3");
    return out;
  }
  torch::nn::Linear fc1{nullptr}, fc3{nullptr};
  Checked mid{nullptr};
  at::Tensor scale;
  Failure failure = Failure::kNone;
  bool throw_after_fc1 = false, throw_after_fc3 = false, hook_after_mid = false;
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
    if (f == Failure::kOneRankInputGradHook) {
      at::Tensor xin = x.narrow(0, r * kRows, kRows).clone().requires_grad_(true);
      if (r == N - 1) {
        xin.register_hook([](const at::Tensor&) -> at::Tensor { throw std::runtime_error("NaN guard: non-finite input gradient"); });
      }
      F::mse_loss(fsdp::call(model, xin), y.narrow(0, r * kRows, kRows)).backward();
    } else if (f == Failure::kAccumulationOneRank) {
      fsdp::set_requires_gradient_sync(model, false);
      if (r == N - 1) model->failure = Failure::kBackwardHook;
      (rank_loss(model, x, y, r) * 0.5).backward();
      model->failure = Failure::kNone;
      fsdp::set_requires_gradient_sync(model, true);
      (rank_loss(model, x, y, r) * 0.5).backward();
    } else if (f == Failure::kAccumulation || f == Failure::kAccumulationForward) {
      fsdp::set_requires_gradient_sync(model, false);
      (rank_loss(model, x, y, r) * 0.5).backward();
      fsdp::set_requires_gradient_sync(model, true);
      if (f == Failure::kAccumulation) model->failure = Failure::kBackwardHook;
      model->mid->reject = f == Failure::kAccumulationForward;
      (rank_loss(model, x, y, r) * 0.5).backward();
    } else if (f == Failure::kMixedPoints) {
      model->mid->reject = r % 4 == 0;
      model->throw_after_fc3 = r % 4 == 3;
      at::Tensor loss = rank_loss(model, x, y, r);
      if (fails_in_loss(f, r, N)) throw std::runtime_error("bad batch: rejected in the loss");
      loss.backward();
    } else if (f == Failure::kLossEveryRank || f == Failure::kLossOneRank || f == Failure::kLossOneRankAbandoned) {
      at::Tensor loss = rank_loss(model, x, y, r);
      if (fails_in_loss(f, r, N)) throw std::runtime_error("bad batch: rejected in the loss");
      loss.backward();
    } else if (rank_dependent(f)) {
      if (f == Failure::kRankDependentForward) {
        model->throw_after_fc1 = r % 3 == 0;
        model->mid->reject = r % 3 == 1;
        model->throw_after_fc3 = r % 3 == 2;
      } else if (f == Failure::kOneRankBackward) {
        model->failure = r == N - 1 ? Failure::kBackwardHook : Failure::kNone;
      } else if (f == Failure::kRankDependentBackward) {
        model->failure = r % 2 == 0 ? Failure::kBackwardHook : Failure::kNone;
        model->hook_after_mid = r % 2 == 1;
      } else if (f == Failure::kRankDependentOom) {
        model->failure = r == 0 ? Failure::kNone : Failure::kOomInBackward;
        fsdp::accounting::set_memory_budget(fsdp::accounting::current_bytes() + (r == 0 ? 1 : int64_t{32} << 20), r);
      } else {
        model->mid->reject = r == N - 1;
      }
      rank_loss(model, x, y, r).backward();
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
    EXPECT_TRUE(f == Failure::kOomInForward || f == Failure::kOomInBackward || f == Failure::kRankDependentOom)
        << when << ": " << e.what();
  } catch (const fsdp::Error& e) {
    // A peer's failure met this rank's collective first: named, with the peer's reason.
    const std::string msg = e.what();
    if (rank_dependent(f) && N > 1 && e.kind() == fsdp::ErrorKind::kStepAbandoned) {
      EXPECT_NE(msg.find("abandoned forward pass"), std::string::npos) << when << ": " << msg;
      EXPECT_TRUE(msg.find("its step failed: ") != std::string::npos ||
                  msg.find("it ran that forward and no backward") != std::string::npos)
          << when << ": " << msg;
    } else {
      ADD_FAILURE() << when << ": the failure became an fsdp::Error: " << msg;
    }
  } catch (const c10::Error& e) {
    EXPECT_TRUE(f == Failure::kUserCheckInUnit || f == Failure::kAccumulationForward ||
                (rank_dependent(f) && model->mid->reject))
        << when << ": " << e.what();
    EXPECT_TRUE(f != Failure::kOneRankAlone || r == N - 1) << when << ": a rank whose batch was fine failed with "
                                                            << e.what();
    EXPECT_EQ(std::string(e.what_without_backtrace()).rfind("bad batch: token id 50321", 0), 0u)
        << when << ": the user's message does not come first: " << e.what_without_backtrace();
  } catch (const std::exception& e) {
    EXPECT_TRUE(f == Failure::kBackwardHook || f == Failure::kAccumulation || f == Failure::kRankDependentForward ||
                f == Failure::kRankDependentBackward || f == Failure::kOneRankBackward || f == Failure::kMixedPoints ||
                f == Failure::kAccumulationOneRank || f == Failure::kOneRankInputGradHook || fails_in_loss(f, r, N))
        << when << ": " << e.what();
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("NaN guard") != std::string::npos || msg.find("bad batch: rejected ") != std::string::npos)
        << when << ": " << msg;
  }
  if (fails_in_loss(f, r, N)) {
    // No FSDP hook saw this failure: the tree still awaits the backward (the root's params stay
    // gathered) until the next forward abandons the pass, or the loop does at once. When a peer
    // was in that backward, the pass is dropped on every rank, and the tree is clean.
    if (f != Failure::kLossOneRankAbandoned && f != Failure::kMixedPoints) return false;
    fsdp::abandon_step(model);
    if (N == 1) return false;
  }
  fsdp::accounting::clear_memory_budget();
  fsdp::set_requires_gradient_sync(model, true);
  model->failure = Failure::kNone;
  model->mid->reject = false;
  model->throw_after_fc1 = model->throw_after_fc3 = model->hook_after_mid = false;
  expect_clean(model, when);
  return false;
}


// The loop catches, skips the batch (zero_grad at the top of every step) and goes on: parameters
// after every trained step, and gradients, equal a single-process run of the batches that trained.
void expect_skipped_batches_never_seen(const std::vector<Failure>& plan) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  const auto expected = static_cast<int>(std::count(plan.begin(), plan.end(), Failure::kNone));
  fsdp::accounting::install_counting_allocator();
  // Every strategy, full_shard resharded after forward to pairs of ranks, and full_shard with
  // host-aware collectives over pairs (the backward's gathers and the collectives' stages on groups
  // of their own, which a failed step must put back too).
  std::vector<std::pair<std::string, fsdp::FullyShardOptions>> configs;
  for (auto s : implemented_strategies()) configs.emplace_back(fsdp::to_string(s), options_for(s, N));
  if (N == 4) {
    auto o = options_for(fsdp::ShardingStrategy::kFullShard, N);
    o.reshard_after_forward_group_size = 2;
    configs.emplace_back("full_shard, node-local reshard to 2", o);
    // Host-aware collectives over pairs: two chained stages per collective, on two more groups a
    // failed step must settle as well.
    o = options_for(fsdp::ShardingStrategy::kFullShard, N);
    o.collective_host_size = 2;
    configs.emplace_back("full_shard, host-aware collectives over pairs", o);
  }
  for (const auto& [name, options] : configs) {
    SCOPED_TRACE(name);
    torch::manual_seed(17);
    auto ref = LoopNet().ptr();
    torch::manual_seed(17);
    auto model = LoopNet().ptr();
    fsdp::fully_shard_tree(model, g, top_level_units(), options);
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
    EXPECT_EQ(trained, expected);
  }
}

}  // namespace

TEST(FailedSteps, SkippedBatchesEqualARunThatNeverSawThem) {
  expect_skipped_batches_never_seen({Failure::kNone, Failure::kUserCheckInUnit, Failure::kNone, Failure::kBackwardHook,
                                     Failure::kOomInForward, Failure::kNone, Failure::kOomInBackward,
                                     Failure::kAccumulation, Failure::kNone, Failure::kAccumulationForward,
                                     Failure::kNone});
}

// Ranks whose step fails at different points have issued different numbers of its collectives,
// and a rank whose batch is fine would wait in a collective its failed peer never issues: every
// rank skips the step, the peers that had not failed by themselves with kStepAbandoned naming the
// rank, and the following steps equal a run that never saw the batch. Also when the failure is
// between forward and backward (the loss), where no FSDP hook sees it: on every rank, on one
// (settled by its next forward, or at once by fsdp::abandon_step).
TEST(FailedSteps, RanksFailingAtDifferentPointsAllSkipTheStep) {
  expect_skipped_batches_never_seen({Failure::kNone, Failure::kRankDependentForward, Failure::kNone,
                                     Failure::kRankDependentBackward, Failure::kOneRankAlone, Failure::kNone,
                                     Failure::kRankDependentOom, Failure::kRankDependentForward, Failure::kNone,
                                     Failure::kLossOneRank, Failure::kNone, Failure::kLossOneRankAbandoned,
                                     Failure::kLossEveryRank, Failure::kNone, Failure::kOneRankBackward,
                                     Failure::kMixedPoints, Failure::kNone, Failure::kAccumulationOneRank, Failure::kNone,
                                     Failure::kOneRankInputGradHook, Failure::kNone});
}

// A rank whose step fails after its peers have finished it (they are at a collective of no step,
// or of the next one) cannot be paired back: one rank applied the step the other skipped. Every
// rank gets kMismatch naming both sides, and the group refuses every later collective with that
// reason instead of training on shards that disagree. On a group of its own: this test leaves it
// unusable.
TEST(FailedSteps, RankThatFinishedTheStepAnotherAbandonedIsNamed) {
  auto world_group = world();
  const int N = world_group->size(), r = world_group->rank();
  if (N < 2) GTEST_SKIP() << "needs two ranks";
  auto g = world_group->split(0, r);
  torch::manual_seed(3);
  auto model = LoopNet().ptr();
  fsdp::fully_shard_tree(model, g, top_level_units(), options_for(S::kNoShard, N));
  auto [x, y] = regression_batch(0, N * kRows, kIn, kOut);
  rank_loss(model, x, y, r).backward();  // training forward 1 on every rank
  if (r == N - 1) {
    model->mid->reject = true;  // no_shard's forward issues no collective: the peers are past the step
    EXPECT_THROW(rank_loss(model, x, y, r), c10::Error);
    model->mid->reject = false;
  } else {
    expect_mismatch([&] { g->barrier()->wait(); }, "a collective of no step paired with an abandoned step",
                    {"ranks left a step at different points", "rank " + std::to_string(N - 1) + " issued nothing more of "
                     "forward pass 2 (its step failed: bad batch: token id 50321", "restore the last checkpoint"});
  }
  expect_clean(model, "after the abandoned step");
  EXPECT_NE(g->diverged().find("ranks left a step at different points"), std::string::npos) << g->diverged();
  expect_mismatch([&] { rank_loss(model, x, y, r).backward(); }, "a diverged group ran a step",
                  {"refuses every collective", "ranks left a step at different points"});
  world_group->barrier()->wait();  // other groups are untouched
}

// An evaluation that fails on one rank after its peers finished it (no collective left in it
// for the markers to meet) cannot be recovered: the peers are past it, at their next step. Under
// torch::NoGradGuard the failed pass is an evaluation: named at the peers' next collective (every
// rank, kMismatch "ranks left a step at different points"). With grad enabled and no backward
// anywhere, whether the peers went on with their batch cannot be told: named too, with the remedy.
// Never a silent pairing of different batches. Each case on a group of its own.
TEST(FailedSteps, EvaluationFailingOnOneRankAfterItsPeersFinishedIsNamed) {
  auto world_group = world();
  const int N = world_group->size(), r = world_group->rank();
  if (N < 2) GTEST_SKIP() << "needs two ranks";
  for (bool with_grad : {false, true}) {
    SCOPED_TRACE(with_grad ? "evaluation with grad enabled" : "evaluation under NoGradGuard");
    auto g = world_group->split(0, r);
    torch::manual_seed(3);
    auto model = LoopNet().ptr();
    fsdp::fully_shard_tree(model, g, top_level_units(), options_for(S::kFullShard, N));
    auto [x, y] = regression_batch(0, N * kRows, kIn, kOut);
    rank_loss(model, x, y, r).backward();  // a training step on every rank
    {
      std::optional<at::NoGradGuard> no_grad;
      if (!with_grad) no_grad.emplace();
      if (r == 0) model->throw_after_fc3 = true;  // after the last unit: the peers finish the pass
      try {
        (void)rank_loss(model, x, y, r);
        EXPECT_NE(r, 0) << "rank 0's evaluation did not fail";
      } catch (const std::runtime_error& e) {
        EXPECT_EQ(r, 0) << e.what();
      }
      model->throw_after_fc3 = false;
    }
    // The next training step: every rank is refused, naming what happened.
    const std::vector<std::string> named =
        with_grad ? std::vector<std::string>{"rank 0 failed forward pass", "skipped the batch cannot be told",
                                             "fsdp::abandon_step(model)", "torch::NoGradGuard"}
                  : std::vector<std::string>{"ranks left a step at different points",
                                             "rank 0 issued nothing more of forward pass"};
    expect_mismatch([&] { rank_loss(model, x, y, r).backward(); }, "ranks at different batches paired", named);
    world_group->barrier()->wait();
  }
}

// A loop that abandons its step (fsdp::abandon_step after a failure in the loss) and then runs
// that step's backward anyway would pair its reductions with its peers' next batch: the backward
// is refused on this rank before it queues anything (kState), and the next step trains.
TEST(FailedSteps, BackwardOfAnAbandonedPassIsRefused) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  torch::manual_seed(3);
  auto model = LoopNet().ptr();
  fsdp::fully_shard_tree(model, g, top_level_units(), options_for(S::kFullShard, N));
  auto [x, y] = regression_batch(0, N * kRows, kIn, kOut);
  at::Tensor loss = rank_loss(model, x, y, r);
  fsdp::abandon_step(model);  // every rank: the step failed in its loss
  try {
    loss.backward();
    ADD_FAILURE() << "the backward of an abandoned pass ran";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.kind(), fsdp::ErrorKind::kState) << e.what();
    EXPECT_NE(std::string(e.what()).find("which this rank abandoned"), std::string::npos) << e.what();
  }
  expect_clean(model, "after the refused backward");
  rank_loss(model, x, y, r).backward();  // the next step trains
  expect_clean(model, "after the next step");
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
