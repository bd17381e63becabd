// Tier `mpi`: the optimizer-state adapter (fsdp/optim/optimizer_state.h) over sharded parameters,
// and the kind and originating rank of checkpoint errors re-raised on every rank. Runs at any N.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/rmsprop.h>

#include <chrono>
#include <filesystem>

#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "fsdp/accounting/memory.h"
#include "fsdp/runtime/model_state.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/optim/optimizer_state.h"
#include "mpi_world.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
namespace fs = std::filesystem;
namespace optim = fsdp::optim;
using fsdp::ErrorKind;

namespace {

using OptFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

std::shared_ptr<MLPImpl> sharded_mlp(uint64_t seed) {
  torch::manual_seed(seed);
  auto m = MLP(6, 10, 3).ptr();
  fsdp::fully_shard(m->fc1.ptr(), world());
  fsdp::fully_shard(m->fc2.ptr(), world());
  fsdp::fully_shard(m, world());
  return m;
}

void train_step(const std::shared_ptr<MLPImpl>& m, torch::optim::Optimizer& opt, int step) {
  auto g = world();
  auto [x, y] = regression_batch(step, g->size() * 2, 6, 3);
  opt.zero_grad();
  F::mse_loss(fsdp::call(m, x.narrow(0, g->rank() * 2, 2)), y.narrow(0, g->rank() * 2, 2)).backward();
  opt.step();
}

std::vector<std::pair<std::string, OptFactory>> optimizers() {
  auto amsgrad = [](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  };
  return {{"adamw", adamw(1e-2, 0.1)}, {"adamw amsgrad", amsgrad}, {"adam", adam(1e-2)},
          {"sgd", sgd(0.1, 0.9)}};
}

/// An fsdp::Error thrown by fn (kind and what()), or nullopt.
std::optional<std::pair<ErrorKind, std::string>> refusal_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const fsdp::Error& e) {
    return std::make_pair(e.kind(), std::string(e.what()));
  }
  return std::nullopt;
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

/// A fresh directory path shared by every rank of the world (rank 0 removes it at the end).
struct SharedDir {
  SharedDir() {
    at::Tensor token = at::tensor(
        {static_cast<int64_t>(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007)},
        at::kLong);
    world()->broadcast(token, 0)->wait();
    path = (fs::temp_directory_path() / ("fsdp-optstate-" + std::to_string(token.item<int64_t>()))).string();
  }
  ~SharedDir() {
    world()->barrier()->wait();
    std::error_code ec;
    if (world()->rank() == 0) fs::remove_all(path, ec);
  }
  std::string path;
};

}  // namespace

// Every optimizer's state read per sharded parameter and written into a fresh optimizer (on a
// copy of the model) comes back exactly, and the next step is then bit for bit the same.
TEST(OptimizerState, RoundTripPerParameter) {
  for (const auto& [oname, make_opt] : optimizers()) {
    SCOPED_TRACE(oname);
    auto a = sharded_mlp(11), b = sharded_mlp(11);
    auto opt_a = make_opt(fsdp::parameters(a)), opt_b = make_opt(fsdp::parameters(b));
    for (int s = 0; s < 2; ++s) train_step(a, *opt_a, s);
    const auto pa = fsdp::sharded_parameters(a), pb = fsdp::sharded_parameters(b);
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      SCOPED_TRACE(pa[i].name);
      {
        at::NoGradGuard no_grad;
        pb[i].tensor.copy_(pa[i].tensor);
      }
      EXPECT_FALSE(optim::get_param_state(*opt_b, pb[i].tensor).has_value()) << "b never stepped";
      auto st = optim::get_param_state(*opt_a, pa[i].tensor);
      if (!st) {  // a rank past the end of dim 0 may hold no state
        EXPECT_EQ(pa[i].tensor.numel(), 0);
        continue;
      }
      const auto names = optim::state_tensor_names(*opt_a, pa[i].tensor);
      ASSERT_EQ(st->tensors.size(), names.size());
      for (size_t k = 0; k < names.size(); ++k) {
        EXPECT_EQ(st->tensors[k].name, names[k]);
        EXPECT_EQ(st->tensors[k].tensor.sizes(), pa[i].tensor.sizes()) << names[k];
      }
      EXPECT_EQ(st->step, oname == "sgd" ? 0 : 2);
      optim::ParamState copy{st->step, {}};
      for (const auto& t : st->tensors) copy.tensors.push_back({t.name, t.tensor.clone()});
      optim::set_param_state(*opt_b, pb[i].tensor, copy);
      auto back = optim::get_param_state(*opt_b, pb[i].tensor);
      ASSERT_TRUE(back.has_value());
      EXPECT_EQ(back->step, st->step);
      ASSERT_EQ(back->tensors.size(), st->tensors.size());
      for (size_t k = 0; k < st->tensors.size(); ++k) {
        EXPECT_EQ(back->tensors[k].name, st->tensors[k].name);
        EXPECT_TRUE(at::equal(back->tensors[k].tensor, st->tensors[k].tensor))
            << st->tensors[k].name << ": " << err_summary(back->tensors[k].tensor, st->tensors[k].tensor);
      }
    }
    train_step(a, *opt_a, 2);
    train_step(b, *opt_b, 2);
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(at::equal(pa[i].tensor, pb[i].tensor))
          << pa[i].name << " after a step from the copied state: " << err_summary(pb[i].tensor, pa[i].tensor);
    }
    // clear: the parameter has no state any more
    optim::clear_param_state(*opt_b, pb[0].tensor);
    EXPECT_FALSE(optim::get_param_state(*opt_b, pb[0].tensor).has_value());
  }
}

// state_bytes is the sum of the state tensors' bytes, and accounting reports the same number.
TEST(OptimizerState, StateBytesIsTheSumOfItsTensors) {
  for (const auto& [oname, make_opt] : optimizers()) {
    SCOPED_TRACE(oname);
    auto m = sharded_mlp(12);
    auto opt = make_opt(fsdp::parameters(m));
    EXPECT_EQ(optim::state_bytes(*opt), 0) << "before any step";
    train_step(m, *opt, 0);
    int64_t sum = 0, real_numel = 0;
    for (const auto& sp : fsdp::sharded_parameters(m)) {
      auto st = optim::get_param_state(*opt, sp.tensor);
      if (!st) {  // a rank past the end of dim 0 may hold no state
        EXPECT_EQ(sp.tensor.numel(), 0) << sp.name;
        continue;
      }
      for (const auto& t : st->tensors) sum += static_cast<int64_t>(t.tensor.nbytes());
      EXPECT_EQ(st->bytes(), static_cast<int64_t>(st->tensors.size() * sp.tensor.nbytes())) << sp.name;
      real_numel += sp.tensor.numel();
    }
    const int64_t per_elem = oname == "sgd" ? 4 : (oname == "adamw amsgrad" ? 12 : 8);
    EXPECT_EQ(sum, per_elem * real_numel);
    EXPECT_EQ(optim::state_bytes(*opt), sum);
    EXPECT_EQ(fsdp::accounting::optimizer_state_bytes(*opt), sum);
  }
}

// Param-group options read and written by name; lr is the group's lr.
TEST(OptimizerState, GroupOptionsByName) {
  auto m = sharded_mlp(13);
  torch::optim::AdamW adamw(fsdp::parameters(m), torch::optim::AdamWOptions(0.25).betas({0.8, 0.9}));
  auto o = optim::group_options(adamw, 0);
  EXPECT_EQ(o.at("lr"), 0.25);
  EXPECT_EQ(o.at("beta1"), 0.8);
  EXPECT_EQ(o.at("beta2"), 0.9);
  EXPECT_EQ(o.at("amsgrad"), 0.0);
  optim::set_group_options(adamw, 0, {{"lr", 0.125}, {"amsgrad", 1.0}});
  EXPECT_EQ(adamw.param_groups()[0].options().get_lr(), 0.125);
  EXPECT_EQ(optim::group_options(adamw, 0).at("beta1"), 0.8) << "options not named keep their values";
  EXPECT_EQ(optim::state_tensor_names(adamw, fsdp::parameters(m)[0]).back(), "max_exp_avg_sq");
  EXPECT_EQ(optim::param_group_index(adamw, fsdp::parameters(m)[0]), std::optional<size_t>(0));
  EXPECT_FALSE(optim::param_group_index(adamw, at::zeros({2})).has_value());

  auto bad = refusal_of([&] { optim::set_group_options(adamw, 0, {{"lr", 1.0}, {"momentum", 0.5}}); });
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->first, ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(bad->second, "'momentum'") && contains(bad->second, "beta1")) << bad->second;
  EXPECT_EQ(adamw.param_groups()[0].options().get_lr(), 0.125) << "a rejected call changes nothing";
  bad = refusal_of([&] { optim::group_options(adamw, 3); });
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->first, ErrorKind::kInvalidArgument);

  torch::optim::SGD sgd(fsdp::parameters(m), torch::optim::SGDOptions(0.5).momentum(0.9).nesterov(true));
  auto s = optim::group_options(sgd, 0);
  EXPECT_EQ(s.at("momentum"), 0.9);
  EXPECT_EQ(s.at("nesterov"), 1.0);
  optim::set_group_options(sgd, 0, {{"momentum", 0.5}});
  EXPECT_EQ(optim::group_options(sgd, 0).at("momentum"), 0.5);
}

// set_param_state checks the state against the optimizer's options and the parameter's shape.
TEST(OptimizerState, SetStateRejectsWrongTensors) {
  auto m = sharded_mlp(14);
  torch::optim::Adam opt(fsdp::parameters(m), torch::optim::AdamOptions(1e-2));
  train_step(m, opt, 0);
  const at::Tensor p = fsdp::sharded_parameters(m)[0].tensor;  // fc1.weight, rows of (10, 6)
  const auto before = optim::get_param_state(opt, p);
  ASSERT_TRUE(before.has_value());

  optim::ParamState missing{3, {{"exp_avg", at::zeros_like(p)}}};
  auto e = refusal_of([&] { optim::set_param_state(opt, p, missing); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->first, ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(e->second, "expected {exp_avg, exp_avg_sq}, got {exp_avg}")) << e->second;

  optim::ParamState wrong_shape{3, {{"exp_avg", at::zeros({p.size(0) + 1, 6})}, {"exp_avg_sq", at::zeros_like(p)}}};
  e = refusal_of([&] { optim::set_param_state(opt, p, wrong_shape); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->first, ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(e->second, "shape of state tensor 'exp_avg'")) << e->second;

  const auto after = optim::get_param_state(opt, p);
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->step, before->step) << "a rejected call leaves the state";
  EXPECT_TRUE(after->find("exp_avg").is_same(before->find("exp_avg")));
}

// An optimizer type the adapter does not know is rejected by every entry point, naming the
// supported ones; through save_sharded every rank gets kUnsupported.
TEST(OptimizerState, UnknownOptimizerIsRejected) {
  auto m = sharded_mlp(15);
  torch::optim::RMSprop opt(fsdp::parameters(m), torch::optim::RMSpropOptions(1e-2));
  const at::Tensor p = fsdp::parameters(m)[0];
  std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"optimizer_kind", [&] { optim::optimizer_kind(opt); }},
      {"get_param_state", [&] { optim::get_param_state(opt, p); }},
      {"state_tensor_names", [&] { optim::state_tensor_names(opt, p); }},
      {"state_bytes", [&] { optim::state_bytes(opt); }},
      {"group_options", [&] { optim::group_options(opt, 0); }},
      {"optimizer_state_bytes", [&] { fsdp::accounting::optimizer_state_bytes(opt); }},
      {"model_state_bytes", [&] { fsdp::accounting::model_state_bytes(m, &opt); }},
  };
  for (const auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    auto e = refusal_of(call);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->first, ErrorKind::kUnsupported);
    for (const char* want : {"torch::optim::RMSprop", "supported: torch::optim::AdamW, "
                             "torch::optim::Adam, torch::optim::SGD"}) {
      EXPECT_TRUE(contains(e->second, want)) << "want '" << want << "' in: " << e->second;
    }
  }
  SharedDir dir;
  auto e = refusal_of([&] { fsdp::checkpoint::save_sharded(dir.path, m, &opt, {}, world()); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->first, ErrorKind::kUnsupported);
  EXPECT_TRUE(contains(e->second, "torch::optim::AdamW")) << e->second;
}

// [Note: error agreement]: an error raised on one rank reaches every rank with its kind, and every
// rank's message names the rank where it happened.
TEST(OptimizerState, CheckpointErrorsKeepKindAndOriginatingRank) {
  auto g = world();
  const int last = g->size() - 1;
  SharedDir dir;
  auto m = sharded_mlp(16);
  auto opt = sgd(0.1, 0.9)(fsdp::parameters(m));
  train_step(m, *opt, 0);
  const std::string origin = "[fsdp rank " + std::to_string(last) + "]";

  // A save whose last rank fails mid-file (a file-system error that knows no rank).
  fsdp::checkpoint::SaveOptions bad;
  bad.fault.stage = fsdp::checkpoint::FaultInjection::Stage::kWrite;
  bad.fault.rank = last;
  bad.fault.after_bytes = 4;
  auto e = refusal_of([&] { fsdp::checkpoint::save_sharded(dir.path, m, opt.get(), {}, g, bad); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->first, ErrorKind::kIo);
  EXPECT_TRUE(contains(e->second, origin + " save_sharded") && contains(e->second, "injected fault"))
      << e->second;
  if (g->rank() != last) EXPECT_TRUE(contains(e->second, "failed on rank " + std::to_string(last))) << e->second;
  if (g->rank() == last) EXPECT_EQ(e->second.rfind(origin, 0), 0u) << e->second;

  // A load whose last rank finds its own file truncated (corrupt data on disk).
  const std::string name = fsdp::checkpoint::save_sharded(dir.path, m, opt.get(), {}, g);
  char file[64];
  std::snprintf(file, sizeof(file), "rank-%05d-of-%05d.bin", last, g->size());
  const fs::path victim = fs::path(dir.path) / name / file;
  if (g->rank() == 0) fs::resize_file(victim, fs::file_size(victim) - 5);
  g->barrier()->wait();
  auto fresh = sharded_mlp(17);
  e = refusal_of([&] { fsdp::checkpoint::load_sharded(dir.path, fresh, nullptr, nullptr, g); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->first, ErrorKind::kCorruptData);
  EXPECT_TRUE(contains(e->second, origin + " load_sharded") && contains(e->second, "truncated") &&
              contains(e->second, file))
      << e->second;
}
