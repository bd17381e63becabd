// Tier `mpi`: optimizer param groups keyed by their members in sharded checkpoints, and the import
// of a plain single-process libtorch run's optimizer state (fsdp::checkpoint::import_optimizer).
// Every training check runs against a single-process reference in lockstep (losses, gradients and
// parameters), for every strategy, at any N.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/serialize.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "checkpoint/manifest.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/export.h"
#include "fsdp/checkpoint/import_optimizer.h"
#include "fsdp/optim/optimizer_state.h"
#include "mpi_world.h"
#include "shared_dir.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
namespace fs = std::filesystem;
namespace ckpt = fsdp::checkpoint;
namespace optim = fsdp::optim;
using fsdp::ErrorKind;

namespace {

constexpr int64_t kVocab = 37, kDim = 16, kHeads = 2, kLayers = 2, kCtx = 8;
constexpr int64_t kGlobalBatch = 12;  // divisible by every world size 1..4
constexpr int kSaveAt = 3, kSteps = 6;
// Per-step tolerances against the single-process reference (fp32).
constexpr double kLossTol = 1e-6, kRtol = 1e-5, kAtol = 1e-6;

std::shared_ptr<TinyTransformerImpl> make_transformer(uint64_t seed, int64_t layers = kLayers) {
  torch::manual_seed(seed);
  return TinyTransformer(kVocab, kDim, kHeads, layers, kCtx).ptr();
}

std::shared_ptr<TinyTransformerImpl> sharded_transformer(uint64_t seed, fsdp::ShardingStrategy s,
                                                         int64_t layers = kLayers) {
  auto m = make_transformer(seed, layers);
  fsdp::fully_shard_tree(m, world(), fsdp::wrap_by_type<TinyBlockImpl>(),
                         options_for(s, world()->size()));
  return m;
}

std::pair<at::Tensor, at::Tensor> token_batch(int step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(700 + step);
  at::Tensor tok = at::randint(0, kVocab, {kGlobalBatch, kCtx + 1}, gen);
  return {tok.narrow(1, 0, kCtx).contiguous(), tok.narrow(1, 1, kCtx).contiguous()};
}

at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& y) {
  return F::cross_entropy(logits.reshape({-1, kVocab}), y.reshape({-1}));
}

/// Forward and backward of the single-process model on the whole global batch; returns the loss.
double plain_backward(const std::shared_ptr<TinyTransformerImpl>& m, torch::optim::Optimizer& opt,
                      int step) {
  auto [x, y] = token_batch(step);
  opt.zero_grad();
  at::Tensor loss = lm_loss(m->forward(x), y);
  loss.backward();
  return loss.item<double>();
}

/// Forward and backward of the sharded model on this rank's slice; returns the global mean loss.
double sharded_backward(const std::shared_ptr<TinyTransformerImpl>& m, torch::optim::Optimizer& opt,
                        int step) {
  auto g = world();
  auto [x, y] = token_batch(step);
  const int64_t rows = kGlobalBatch / g->size();
  opt.zero_grad();
  at::Tensor loss = lm_loss(fsdp::call(m, x.narrow(0, g->rank() * rows, rows)),
                            y.narrow(0, g->rank() * rows, rows));
  loss.backward();
  at::Tensor global = loss.detach().clone().reshape({1});
  g->all_reduce(global, fsdp::comm::ReduceOp::kAvg)->wait();
  return global.item<double>();
}

/// The parameters of a model by name in the model's named_parameters() order (tied ones once):
/// a plain model's own, or a sharded model's shards (fsdp::sharded_parameters, reordered).
using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;
NamedParams plain_params(const std::shared_ptr<torch::nn::Module>& m) {
  NamedParams out;
  for (const auto& kv : m->named_parameters()) out.emplace_back(kv.key(), kv.value());
  return out;
}
NamedParams unit_order_params(const std::shared_ptr<torch::nn::Module>& m) {
  NamedParams out;
  for (const auto& sp : fsdp::sharded_parameters(m)) out.emplace_back(sp.name, sp.tensor);
  return out;
}
NamedParams sharded_params(const std::shared_ptr<torch::nn::Module>& m) {
  std::map<std::string, at::Tensor> shard;
  for (const auto& sp : fsdp::sharded_parameters(m)) shard[sp.name] = sp.tensor;
  NamedParams out;
  for (const auto& kv : m->named_parameters()) out.emplace_back(kv.key(), shard.at(kv.key()));
  return out;
}

/// The decay / no-decay split of fsdp-train: 2-D weights but the embeddings decay.
bool decays(const std::string& name, const at::Tensor& shard_or_param, int64_t global_dim) {
  return global_dim >= 2 && name != "wte" && name != "wpe";
}

/// Hyperparameters of the two groups; `wrong` ones (for an optimizer about to be loaded) differ in
/// every option. AdamW learning rates (SGD takes 100 times them): small enough that Adam's
/// normalisation keeps the rounding differences of a sharded sum within the tolerances.
struct Hyper {
  double lr_decay, lr_no_decay, wd;
  static Hyper right() { return {1e-3, 3e-4, 0.1}; }
  static Hyper wrong() { return {0.5, 0.25, 0.7}; }
};

enum class Layout { kOneGroup, kDecayFirst, kNoDecayFirst };

/// An optimizer of `kind` ("adamw", "adam" or "sgd") over `params` (named_parameters order) in `layout`.
/// Group options differ between the groups in every option the kind has.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& kind, const NamedParams& params,
                                                        Layout layout, const Hyper& h,
                                                        const std::map<std::string, int64_t>& dims) {
  std::vector<at::Tensor> decay, no_decay, all;
  for (const auto& [name, t] : params) {
    (decays(name, t, dims.at(name)) ? decay : no_decay).push_back(t);
    all.push_back(t);
  }
  const bool wrong = h.lr_decay != Hyper::right().lr_decay;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto add = [&](std::vector<at::Tensor> p, bool is_decay) {
    const double lr = is_decay ? h.lr_decay : h.lr_no_decay;
    if (kind == "adamw") {
      auto o = torch::optim::AdamWOptions(lr)
                   .weight_decay(is_decay ? h.wd : 0.0)
                   .betas(is_decay ? std::make_tuple(0.9, 0.95) : std::make_tuple(0.8, 0.99))
                   .eps(is_decay ? 1e-8 : 1e-7)
                   .amsgrad(!is_decay && !wrong);
      groups.emplace_back(std::move(p), std::make_unique<torch::optim::AdamWOptions>(o));
    } else if (kind == "adam") {  // L2 weight decay (added to the gradient), as torch::optim::Adam
      auto o = torch::optim::AdamOptions(lr)
                   .weight_decay(is_decay ? h.wd : 0.0)
                   .betas(is_decay ? std::make_tuple(0.9, 0.95) : std::make_tuple(0.8, 0.99))
                   .eps(is_decay ? 1e-8 : 1e-7)
                   .amsgrad(!is_decay && !wrong);
      groups.emplace_back(std::move(p), std::make_unique<torch::optim::AdamOptions>(o));
    } else {
      auto o = torch::optim::SGDOptions(lr * 100)
                   .momentum(is_decay ? 0.9 : (wrong ? 0.1 : 0.5))
                   .weight_decay(is_decay ? h.wd : 0.0)
                   .nesterov(!is_decay && !wrong)
                   .dampening(is_decay && !wrong ? 0.1 : 0.0);
      groups.emplace_back(std::move(p), std::make_unique<torch::optim::SGDOptions>(o));
    }
  };
  switch (layout) {
    case Layout::kOneGroup: add(all, true); break;
    case Layout::kDecayFirst: add(decay, true), add(no_decay, false); break;
    case Layout::kNoDecayFirst: add(no_decay, false), add(decay, true); break;
  }
  // libtorch (2.x) lets a group inherit the optimizer's defaults for every option left at its
  // constructor default (lr 1e-3 included): each group's options are set again after construction
  // so that they are exactly the ones above.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> wanted;
  for (const auto& g : groups) wanted.push_back(g.options().clone());
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (kind == "adamw") {
    opt = std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(0.9));
  } else if (kind == "adam") {
    opt = std::make_unique<torch::optim::Adam>(std::move(groups), torch::optim::AdamOptions(0.9));
  } else {
    opt = std::make_unique<torch::optim::SGD>(std::move(groups), torch::optim::SGDOptions(0.9));
  }
  for (size_t g = 0; g < wanted.size(); ++g) opt->param_groups()[g].set_options(std::move(wanted[g]));
  return opt;
}

std::map<std::string, int64_t> global_dims(const std::shared_ptr<torch::nn::Module>& plain) {
  std::map<std::string, int64_t> out;
  for (const auto& kv : plain->named_parameters()) out[kv.key()] = kv.value().dim();
  return out;
}

/// Names of the decay-group members in named_parameters order (for messages and param_names).
std::vector<std::string> names_in_layout(const std::shared_ptr<torch::nn::Module>& plain, Layout layout) {
  std::vector<std::string> decay, no_decay, all;
  for (const auto& kv : plain->named_parameters()) {
    (decays(kv.key(), kv.value(), kv.value().dim()) ? decay : no_decay).push_back(kv.key());
    all.push_back(kv.key());
  }
  if (layout == Layout::kOneGroup) return all;
  auto first = layout == Layout::kDecayFirst ? decay : no_decay;
  const auto& second = layout == Layout::kDecayFirst ? no_decay : decay;
  first.insert(first.end(), second.begin(), second.end());
  return first;
}

/// The options of the group holding `param`.
optim::GroupOptions options_of(const torch::optim::Optimizer& opt, const at::Tensor& param) {
  return optim::group_options(opt, *optim::param_group_index(opt, param));
}

/// Every group of `loaded` (over the sharded params) has the options of the reference's group
/// holding the same parameter.
void expect_group_options(const torch::optim::Optimizer& loaded, const NamedParams& loaded_params,
                          const torch::optim::Optimizer& ref, const NamedParams& ref_params) {
  ASSERT_EQ(loaded_params.size(), ref_params.size());
  for (size_t i = 0; i < loaded_params.size(); ++i) {
    EXPECT_EQ(options_of(loaded, loaded_params[i].second), options_of(ref, ref_params[i].second))
        << "options of the group holding " << loaded_params[i].first;
  }
}

/// Steps [from, to) of the reference and of each sharded (model, optimizer) in lockstep: per-step
/// loss and gradients of every sharded model against the reference, final parameters too.
/// Sharded models after the first must give the first one's losses bit for bit.
void train_in_lockstep(const std::shared_ptr<TinyTransformerImpl>& ref, torch::optim::Optimizer& ref_opt,
                       const std::vector<std::pair<std::shared_ptr<TinyTransformerImpl>,
                                                   torch::optim::Optimizer*>>& sharded,
                       int from, int to, const std::string& what) {
  for (int s = from; s < to; ++s) {
    const double want = plain_backward(ref, ref_opt, s);
    double first = 0.0;
    for (size_t k = 0; k < sharded.size(); ++k) {
      const std::string when = what + " [" + std::to_string(k) + "] step " + std::to_string(s);
      const double got = sharded_backward(sharded[k].first, *sharded[k].second, s);
      EXPECT_NEAR(got, want, kLossTol) << "loss, " << when;
      if (k == 0) first = got;
      else EXPECT_EQ(got, first) << "loss, " << when << ", against the first sharded run (bitwise)";
      compare_with_reference(sharded[k].first, ref, /*grad=*/true, kRtol, kAtol, when);
    }
    ref_opt.step();
    for (const auto& [m, opt] : sharded) opt->step();
  }
  for (const auto& [m, opt] : sharded) {
    compare_with_reference(m, ref, /*grad=*/false, kRtol, kAtol, what + " after step " + std::to_string(to - 1));
  }
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

/// Expects fn to throw fsdp::Error of `kind` whose message holds every string of `want`.
void expect_error(const std::function<void()>& fn, ErrorKind kind, const std::vector<std::string>& want,
                  const std::string& what) {
  auto e = refusal_of(fn);
  ASSERT_TRUE(e.has_value()) << what << ": no error on rank " << world()->rank();
  EXPECT_EQ(static_cast<int>(e->first), static_cast<int>(kind)) << what << ": " << e->second;
  for (const auto& w : want) EXPECT_TRUE(contains(e->second, w)) << what << ": want '" << w << "' in: " << e->second;
}

/// A snapshot of an optimizer: group options and every state tensor (cloned), to prove that a
/// rejected call wrote nothing.
struct OptimizerSnapshot {
  std::vector<optim::GroupOptions> groups;
  std::vector<std::optional<optim::ParamState>> states;
  OptimizerSnapshot(const torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params) {
    for (size_t g = 0; g < opt.param_groups().size(); ++g) groups.push_back(optim::group_options(opt, g));
    for (const auto& p : params) {
      auto st = optim::get_param_state(opt, p);
      if (st) {
        for (auto& t : st->tensors) t.tensor = t.tensor.clone();
      }
      states.push_back(std::move(st));
    }
  }
  void expect_same(const torch::optim::Optimizer& opt, const std::vector<at::Tensor>& params,
                   const std::string& what) const {
    OptimizerSnapshot now(opt, params);
    EXPECT_EQ(now.groups, groups) << what << ": group options changed";
    ASSERT_EQ(now.states.size(), states.size());
    for (size_t i = 0; i < states.size(); ++i) {
      ASSERT_EQ(now.states[i].has_value(), states[i].has_value()) << what << ": state of param " << i;
      if (!states[i]) continue;
      EXPECT_EQ(now.states[i]->step, states[i]->step) << what;
      ASSERT_EQ(now.states[i]->tensors.size(), states[i]->tensors.size()) << what;
      for (size_t k = 0; k < states[i]->tensors.size(); ++k) {
        EXPECT_TRUE(at::equal(now.states[i]->tensors[k].tensor, states[i]->tensors[k].tensor))
            << what << ": state " << states[i]->tensors[k].name << " of param " << i << " changed";
      }
    }
  }
};

std::string read_text(const std::string& path) {
  std::stringstream ss;
  ss << std::ifstream(path).rdbuf();
  return ss.str();
}

/// The manifest as a build from before member names were saved wrote it: without the optional
/// "groups" of the optimizer section, sealed (rank 0 rewrites it; a barrier follows).
void strip_group_members(const std::string& checkpoint_dir) {
  if (world()->rank() == 0) {
    const std::string path = (fs::path(checkpoint_dir) / "manifest.json").string();
    std::string text = fsdp::checkpoint::unseal_manifest(read_text(path), path);  // the body
    const size_t key = text.find("\"groups\":");
    ASSERT_NE(key, std::string::npos) << "a new manifest has optimizer.groups";
    size_t i = text.find('[', key), depth = 0;
    for (; i < text.size(); ++i) {
      if (text[i] == '[') ++depth;
      if (text[i] == ']' && --depth == 0) break;
    }
    size_t end = i + 1;
    while (end < text.size() && (text[end] == ',' || text[end] == ' ' || text[end] == '\n')) ++end;
    text.erase(key, end - key);
    ASSERT_EQ(text.find("\"groups\":"), std::string::npos);
    std::ofstream(path, std::ios::trunc) << fsdp::checkpoint::seal_manifest(text);  // as that build sealed it
  }
  world()->barrier()->wait();
}

/// Rank 0 writes the plain run's weights (a full state dict, torch::pickle_save of name -> tensor)
/// and its optimizer (torch::save(optimizer, path)); a barrier follows.
void save_plain_run(const std::shared_ptr<torch::nn::Module>& plain, torch::optim::Optimizer& opt,
                    const std::string& weights, const std::string& optimizer_file) {
  if (world()->rank() == 0) {
    c10::Dict<std::string, at::Tensor> d;
    for (const auto& kv : plain->named_parameters()) d.insert(kv.key(), kv.value().detach().clone());
    auto bytes = torch::pickle_save(c10::IValue(d));
    std::ofstream(weights, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    torch::save(opt, optimizer_file);
  }
  world()->barrier()->wait();
}

const std::vector<std::string> kKinds = {"adamw", "sgd"};

}  // namespace

// A checkpoint of an optimizer with two param groups (decay / no-decay: different lr, weight
// decay and every other option), loaded into an optimizer that lists the groups in the other order
// with wrong options: each group gets its own options back and training continues exactly like
// the uninterrupted single-process run and like the FSDP run that saved. Every strategy, AdamW
// (amsgrad in one group) and SGD (momentum, nesterov in one group).
TEST(OptimizerGroups, GroupsAreRestoredByMembersNotPosition) {
  auto g = world();
  SharedDir dir("groups-members");
  for (const auto s : implemented_strategies()) {
    for (const auto& kind : kKinds) {
      const std::string what = std::string(fsdp::to_string(s)) + " " + kind;
      SCOPED_TRACE(what);
      auto ref = make_transformer(31);
      const auto dims = global_dims(ref);
      auto ref_opt = make_optimizer(kind, plain_params(ref), Layout::kDecayFirst, Hyper::right(), dims);
      auto saver = sharded_transformer(31, s);
      auto saver_opt = make_optimizer(kind, sharded_params(saver), Layout::kDecayFirst, Hyper::right(), dims);
      train_in_lockstep(ref, *ref_opt, {{saver, saver_opt.get()}}, 0, kSaveAt, what + " before the save");
      const std::string d = dir.sub(what.substr(0, what.find(' ')) + "-" + kind);
      ckpt::save_sharded(d, saver, saver_opt.get(), {}, g);

      auto loaded = sharded_transformer(77, s);
      auto loaded_opt = make_optimizer(kind, sharded_params(loaded), Layout::kNoDecayFirst, Hyper::wrong(), dims);
      ckpt::load_sharded(d, loaded, loaded_opt.get(), nullptr, g);
      expect_group_options(*loaded_opt, sharded_params(loaded), *ref_opt, plain_params(ref));
      train_in_lockstep(ref, *ref_opt, {{saver, saver_opt.get()}, {loaded, loaded_opt.get()}}, kSaveAt,
                        kSteps, what + " after the load");
      g->barrier()->wait();
    }
  }
}

// Groups whose members are split differently, or another number of groups, are rejected on every
// rank with a message naming the groups (a few member names each), expected vs actual; the model
// and the optimizer are untouched.
TEST(OptimizerGroups, MismatchedGroupsAreRejected) {
  auto g = world();
  SharedDir dir("groups-mismatch");
  for (const auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    auto ref = make_transformer(41);
    const auto dims = global_dims(ref);
    auto saver = sharded_transformer(41, s);
    auto saver_opt = make_optimizer("adamw", sharded_params(saver), Layout::kDecayFirst, Hyper::right(), dims);
    sharded_backward(saver, *saver_opt, 0);
    saver_opt->step();
    const std::string d = dir.sub(fsdp::to_string(s));
    ckpt::save_sharded(d, saver, saver_opt.get(), {}, g);

    auto target = sharded_transformer(42, s);
    const auto params = fsdp::parameters(target);
    const auto before = fsdp::full_state_dict(target);
    auto check_untouched = [&](const torch::optim::Optimizer& opt, const OptimizerSnapshot& snap,
                               const std::string& what) {
      snap.expect_same(opt, params, what);
      const auto after = fsdp::full_state_dict(target);
      for (size_t i = 0; i < before.size(); ++i) {
        EXPECT_TRUE(at::equal(after[i].second, before[i].second)) << what << ": " << before[i].first;
      }
    };

    // ln_f.weight moved from the no-decay group into the decay group.
    {
      std::vector<at::Tensor> decay, no_decay;
      for (const auto& [name, t] : sharded_params(target)) {
        (decays(name, t, dims.at(name)) || name == "ln_f.weight" ? decay : no_decay).push_back(t);
      }
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(0.5));
      groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(0.5));
      torch::optim::AdamW opt(std::move(groups), torch::optim::AdamWOptions(0.5));
      const OptimizerSnapshot snap(opt, params);
      expect_error([&] { ckpt::load_sharded(d, target, &opt, nullptr, g); }, ErrorKind::kInvalidArgument,
                   {"load_sharded", "param groups do not match those of the checkpoint",
                    "members of the optimizer's param group 0: expected those of a group of the checkpoint: 0 {",
                    "h0.qkv.weight", "wte", "got {wte, wpe, h0.ln1.weight, ...", "which also holds ln_f.weight"},
                   "members split differently");
      check_untouched(opt, snap, "after a rejected load (split differently)");
    }
    // One group holding everything.
    {
      torch::optim::AdamW opt(params, torch::optim::AdamWOptions(0.5));
      const OptimizerSnapshot snap(opt, params);
      expect_error([&] { ckpt::load_sharded(d, target, &opt, nullptr, g); }, ErrorKind::kInvalidArgument,
                   {"param groups do not match those of the checkpoint",
                    "param groups: expected 2 as in the checkpoint: 0 {", "1 {wte, wpe, ", "got 1: 0 {"},
                   "another number of groups");
      check_untouched(opt, snap, "after a rejected load (one group)");
    }
    g->barrier()->wait();
  }
}

// A checkpoint written before member names were saved (its manifest has no optimizer "groups")
// still loads, by position as before: the learning rates of the groups at the same positions, the
// other options left as the optimizer has them; training then continues exactly.
TEST(OptimizerGroups, CheckpointWithoutMembersLoadsByPosition) {
  auto g = world();
  SharedDir dir("groups-legacy");
  for (const auto s : implemented_strategies()) {
    const std::string what = fsdp::to_string(s);
    SCOPED_TRACE(what);
    auto ref = make_transformer(51);
    const auto dims = global_dims(ref);
    auto ref_opt = make_optimizer("adamw", plain_params(ref), Layout::kDecayFirst, Hyper::right(), dims);
    auto saver = sharded_transformer(51, s);
    auto saver_opt = make_optimizer("adamw", sharded_params(saver), Layout::kDecayFirst, Hyper::right(), dims);
    train_in_lockstep(ref, *ref_opt, {{saver, saver_opt.get()}}, 0, kSaveAt, what + " before the save");
    const std::string d = dir.sub(what);
    const std::string name = ckpt::save_sharded(d, saver, saver_opt.get(), {}, g);
    strip_group_members(fs::path(d) / name);

    auto loaded = sharded_transformer(78, s);
    Hyper lr_only_wrong = Hyper::right();
    lr_only_wrong.lr_decay = 0.5, lr_only_wrong.lr_no_decay = 0.25;
    auto loaded_opt = make_optimizer("adamw", sharded_params(loaded), Layout::kDecayFirst, Hyper::right(), dims);
    optim::set_group_options(*loaded_opt, 0, {{"lr", lr_only_wrong.lr_decay}});
    optim::set_group_options(*loaded_opt, 1, {{"lr", lr_only_wrong.lr_no_decay}});
    ckpt::load_sharded(d, loaded, loaded_opt.get(), nullptr, g);
    expect_group_options(*loaded_opt, sharded_params(loaded), *ref_opt, plain_params(ref));
    train_in_lockstep(ref, *ref_opt, {{saver, saver_opt.get()}, {loaded, loaded_opt.get()}}, kSaveAt, kSteps,
                      what + " after loading a checkpoint without members");

    // Positional, as before: groups listed in the other order take each other's learning rates.
    auto swapped = sharded_transformer(79, s);
    auto swapped_opt = make_optimizer("adamw", sharded_params(swapped), Layout::kNoDecayFirst, Hyper::right(), dims);
    ckpt::load_sharded(d, swapped, swapped_opt.get(), nullptr, g);
    EXPECT_EQ(optim::group_options(*swapped_opt, 0).at("lr"), Hyper::right().lr_decay)
        << "a checkpoint without members restores learning rates by position";
    EXPECT_EQ(optim::group_options(*swapped_opt, 1).at("lr"), Hyper::right().lr_no_decay);
    g->barrier()->wait();
  }
}

// The optimizer state of a plain single-process libtorch run (torch::save(optimizer, path)),
// imported with its weights into a sharded model at N ranks, continues exactly like the plain run:
// per-step losses, gradients and the final parameters, for every strategy, AdamW and SGD with
// momentum (and Adam with two groups), with one param group (names from the model's order) and with two groups listed in the
// other order by the sharded optimizer (names given, as optimizer_param_names computes them).
TEST(OptimizerGroups, ImportPlainRunContinuesExactly) {
  SharedDir dir("groups-import");
  for (const auto s : implemented_strategies()) {
    for (const std::string kind : {"adamw", "sgd", "adam"}) {
      for (const Layout plain_layout : {Layout::kOneGroup, Layout::kDecayFirst}) {
        const bool two = plain_layout == Layout::kDecayFirst;
        if (kind == "adam" && !two) continue;  // Adam: the two-group case only (it reads as AdamW)
        const std::string what =
            std::string(fsdp::to_string(s)) + " " + kind + (two ? " two groups" : " one group");
        SCOPED_TRACE(what);
        // The plain run: K steps on the whole batch, the same on every rank, then saved.
        auto plain = make_transformer(61);
        const auto dims = global_dims(plain);
        auto plain_opt = make_optimizer(kind, plain_params(plain), plain_layout, Hyper::right(), dims);
        for (int step = 0; step < kSaveAt; ++step) {
          plain_backward(plain, *plain_opt, step);
          plain_opt->step();
        }
        const std::string weights = dir.sub("weights.pt"), optimizer_file = dir.sub("optimizer.pt");
        save_plain_run(plain, *plain_opt, weights, optimizer_file);

        auto m = sharded_transformer(88, s);
        std::vector<std::string> names_plain, names_sharded;
        for (const auto& kv : plain->named_parameters()) names_plain.push_back(kv.key());
        for (const auto& kv : sharded_params(m)) names_sharded.push_back(kv.first);
        ASSERT_EQ(names_sharded, names_plain) << "the plain model's named_parameters() names and order";
        std::vector<std::string> names_by_unit;
        for (const auto& kv : unit_order_params(m)) names_by_unit.push_back(kv.first);
        EXPECT_NE(names_by_unit, names_plain) << "fsdp::sharded_parameters goes unit by unit";
        auto opt = make_optimizer(kind, sharded_params(m), two ? Layout::kNoDecayFirst : Layout::kOneGroup,
                                  Hyper::wrong(), dims);
        ckpt::ImportOptimizerOptions io;
        if (two) {
          // Built unit by unit (fsdp::sharded_parameters order), as a sharded program would.
          auto like_plain = make_optimizer(kind, unit_order_params(m), plain_layout, Hyper::right(), dims);
          io.param_names = ckpt::optimizer_param_names(m, *like_plain);
          ASSERT_EQ(io.param_names, names_in_layout(plain, plain_layout));
        }
        ckpt::import_full(weights, m, world());
        ckpt::import_optimizer(optimizer_file, m, *opt, world(), io);
        expect_group_options(*opt, sharded_params(m), *plain_opt, plain_params(plain));
        train_in_lockstep(plain, *plain_opt, {{m, opt.get()}}, kSaveAt, kSteps, what + " after the import");
        world()->barrier()->wait();
      }
    }
  }
}

// Import errors name the file and the parameter or group, arrive on every rank, and nothing is
// written: a missing file, a file that is no optimizer archive (a weights file, a saved module),
// another optimizer type, a model with other parameters, a shape that differs (names in the
// wrong order), param groups that do not match.
TEST(OptimizerGroups, ImportErrorsWriteNothing) {
  auto g = world();
  SharedDir dir("groups-import-errors");
  const std::string rank_tag = "[fsdp rank " + std::to_string(g->rank()) + "]";
  auto plain = make_transformer(71);
  const auto dims = global_dims(plain);
  auto plain_adamw = make_optimizer("adamw", plain_params(plain), Layout::kOneGroup, Hyper::right(), dims);
  plain_backward(plain, *plain_adamw, 0);
  plain_adamw->step();
  const std::string weights = dir.sub("weights.pt"), adamw_file = dir.sub("adamw.pt");
  save_plain_run(plain, *plain_adamw, weights, adamw_file);
  auto plain_sgd = make_optimizer("sgd", plain_params(plain), Layout::kOneGroup, Hyper::right(), dims);
  plain_backward(plain, *plain_sgd, 0);
  plain_sgd->step();
  const std::string sgd_file = dir.sub("sgd.pt"), two_groups_file = dir.sub("two-groups.pt");
  const std::string module_file = dir.sub("module.pt"), deeper_file = dir.sub("deeper.pt");
  auto two = make_optimizer("adamw", plain_params(plain), Layout::kDecayFirst, Hyper::right(), dims);
  auto deeper = make_transformer(72, kLayers + 1);
  auto deeper_opt = make_optimizer("adamw", plain_params(deeper), Layout::kOneGroup, Hyper::right(),
                                   global_dims(deeper));
  if (g->rank() == 0) {
    torch::save(*plain_sgd, sgd_file);
    torch::save(*two, two_groups_file);
    torch::save(std::static_pointer_cast<torch::nn::Module>(plain), module_file);
    torch::save(*deeper_opt, deeper_file);
  }
  g->barrier()->wait();

  auto m = sharded_transformer(73, fsdp::ShardingStrategy::kFullShard);
  const auto params = fsdp::parameters(m);
  auto opt = make_optimizer("adamw", sharded_params(m), Layout::kOneGroup, Hyper::wrong(), dims);
  sharded_backward(m, *opt, 1);
  opt->step();  // state to keep
  const OptimizerSnapshot snap(*opt, params);
  auto import = [&](const std::string& file, ckpt::ImportOptimizerOptions io = {}) {
    return [&, file, io] { ckpt::import_optimizer(file, m, *opt, g, io); };
  };
  const std::string missing = dir.sub("no-such-file.pt");
  expect_error(import(missing), ErrorKind::kIo, {rank_tag, "import_optimizer '" + missing + "'", "no-such-file.pt"},
               "missing file");
  expect_error(import(weights), ErrorKind::kCorruptData,
               {rank_tag, "import_optimizer '" + weights + "'", "not a libtorch archive"}, "a weights file");
  expect_error(import(module_file), ErrorKind::kCorruptData,
               {rank_tag, module_file, "not a torch::optim optimizer archive"}, "a saved module");
  expect_error(import(sgd_file), ErrorKind::kInvalidArgument,
               {rank_tag, sgd_file, "expected torch::optim::AdamW, got torch::optim::SGD"}, "another optimizer type");
  expect_error(import(deeper_file), ErrorKind::kInvalidArgument,
               {rank_tag, deeper_file, "parameters held by the optimizer in the file (group 0: 37): expected 26"},
               "a model with another number of parameters");
  ckpt::ImportOptimizerOptions swapped;
  swapped.param_names = names_in_layout(plain, Layout::kOneGroup);
  std::swap(swapped.param_names[0], swapped.param_names[1]);  // wte [37, 16] <-> wpe [8, 16]
  expect_error(import(adamw_file, swapped), ErrorKind::kInvalidArgument,
               {rank_tag, adamw_file, "parameter 'wpe' (parameter 0 of the optimizer in the file): state "
                "'exp_avg' is [37, 16] Float in the file, the model's parameter is [8, 16] Float"},
               "a shape that differs");
  expect_error(import(two_groups_file), ErrorKind::kInvalidArgument,
               {rank_tag, two_groups_file, "param groups do not match those of the file",
                "param groups: expected 2 as in the file"},
               "groups that do not match");
  ckpt::ImportOptimizerOptions unknown;
  unknown.param_names = {"wte", "h9.fc.weight"};
  expect_error(import(adamw_file, unknown), ErrorKind::kInvalidArgument,
               {rank_tag, "'h9.fc.weight', which is not a sharded parameter of the model"}, "an unknown name");
  snap.expect_same(*opt, params, "after the rejected imports");
}
