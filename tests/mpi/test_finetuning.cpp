// Tier `mpi`: what fine-tuning code does around the engine, each against a single-process
// reference for every strategy it concerns. Adapters: added before sharding over a frozen base they
// train as in one process with optimizer state and gradients for the adapter only, and survive a
// checkpoint; added (or a submodule replaced) after sharding they are an error on every rank, never
// silently untrained. Meta-device init keeps tied weights (bitwise the normal build's) and names a
// tensor the init did not write. buffer_dtype leaves autograd's saved buffers alone. A checkpoint
// with unreduced gradients pending is refused, naming the units.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "../common/meta_models.h"
#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "fsdp/accounting/memory.h"
#include "fsdp/runtime/model_state.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/runtime/state_dict.h"
#include "mpi_world.h"
#include "shared_dir.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;
using S = fsdp::ShardingStrategy;

namespace {

// --- adapters --------------------------------------------------------------------------------

// base(x) + lora_b(lora_a(x)) once an adapter is added (LoRA's low-rank update).
struct LoraLinearImpl : torch::nn::Module {
  LoraLinearImpl(int64_t in, int64_t out) : in(in), out(out) {
    base = register_module("base", torch::nn::Linear(in, out));
  }
  void add_adapter(int64_t rank) {
    lora_a = register_parameter("lora_a", torch::randn({rank, in}) * 0.1);
    lora_b = register_parameter("lora_b", torch::randn({out, rank}) * 0.1);
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = base(x);
    return lora_a.defined() ? y + at::linear(at::linear(x, lora_a), lora_b) : y;
  }
  int64_t in, out;
  torch::nn::Linear base{nullptr};
  at::Tensor lora_a, lora_b;
};
TORCH_MODULE(LoraLinear);

struct LoraNetImpl : torch::nn::Module {
  LoraNetImpl() {
    l1 = register_module("l1", LoraLinear(6, 16));
    l2 = register_module("l2", LoraLinear(16, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fsdp::call(l2, at::tanh(fsdp::call(l1, x))); }
  LoraLinear l1{nullptr}, l2{nullptr};
};
TORCH_MODULE(LoraNet);

fsdp::WrapPolicy lora_layers() {
  return [](const std::string& name, torch::nn::Module&) { return name == "l1" || name == "l2"; };
}

// A base model with adapters, its base frozen (the parameter-efficient fine-tuning set-up).
std::shared_ptr<LoraNetImpl> lora_model(uint64_t seed) {
  torch::manual_seed(seed);
  auto m = LoraNet().ptr();
  for (auto* l : {&m->l1, &m->l2}) {
    (*l)->add_adapter(2);
    (*l)->base->weight.requires_grad_(false);
    (*l)->base->bias.requires_grad_(false);
  }
  return m;
}

// One step of `model` on this rank's rows and of `ref` on the whole global batch of `step`, each
// with its optimizer; gradients and then parameters compared (collective over the world group).
void lora_parity_step(const std::shared_ptr<LoraNetImpl>& model, const std::shared_ptr<LoraNetImpl>& ref,
                      torch::optim::Optimizer& opt, torch::optim::Optimizer& ref_opt, int step,
                      const std::string& when) {
  const int N = world()->size(), r = world()->rank();
  auto [x, y] = regression_batch(step, N * 2, 6, 3);
  ref_opt.zero_grad();
  F::mse_loss(ref->forward(x), y).backward();
  opt.zero_grad();
  F::mse_loss(fsdp::call(model, x.narrow(0, r * 2, 2)), y.narrow(0, r * 2, 2)).backward();
  compare_with_reference(model, ref, /*grad=*/true, 1e-5, 1e-6, when);
  ref_opt.step();
  opt.step();
  compare_with_reference(model, ref, /*grad=*/false, 1e-5, 1e-6, when);
}

}  // namespace

// Adapters added before sharding over a frozen base: every step equals one process (losses through
// the gradients and parameters), the base never moves, and the rank holds optimizer state and
// gradients for its adapter rows only (Adam: 8 bytes, fp32 grad: 4 bytes per element). A sharded
// checkpoint taken mid-way restores the adapters bitwise.
TEST(FineTuning, FrozenBaseWithAdaptersTrainsAsOneProcess) {
  auto g = world();
  const int N = g->size();
  SharedDir dir("lora");
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    auto ref = lora_model(7);
    auto model = lora_model(7);
    fsdp::fully_shard_tree(model, g, lora_layers(), options_for(s, N));
    auto l1_base_weight = [&] {
      auto unit = fsdp::find_unit(model->l1.get());
      for (const auto& p : unit->params()) {
        if (p.fqn == "base.weight") return fsdp::gather_full_tensor(*unit, p);
      }
      return at::Tensor();
    };
    const at::Tensor base_before = l1_base_weight();
    ASSERT_TRUE(base_before.defined());
    torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(0.02).weight_decay(0.1));
    torch::optim::AdamW opt(fsdp::parameters(model), torch::optim::AdamWOptions(0.02).weight_decay(0.1));
    int64_t adapter_shard_numel = 0;
    for (const auto& sp : fsdp::sharded_parameters(model)) {
      if (sp.name.find("lora_") != std::string::npos) adapter_shard_numel += sp.tensor.numel();
      EXPECT_EQ(sp.tensor.requires_grad(), sp.name.find("lora_") != std::string::npos) << sp.name;
    }
    std::vector<std::pair<std::string, at::Tensor>> saved;
    const std::string ck = dir.sub(fsdp::to_string(s));
    for (int step = 0; step < 4; ++step) {
      const std::string when = "step " + std::to_string(step);
      lora_parity_step(model, ref, opt, ref_opt, step, when);
      const auto bytes = fsdp::accounting::model_state_bytes(model, &opt);
      EXPECT_EQ(bytes.optim_state_bytes, 8 * adapter_shard_numel) << when << ": optimizer state beyond the adapter";
      EXPECT_EQ(bytes.sharded_grad_bytes, 4 * adapter_shard_numel) << when << ": gradients beyond the adapter";
      if (step == 1) {
        fsdp::checkpoint::save_sharded(ck, model, &opt, {}, g);
        saved = fsdp::full_state_dict(model);
      }
    }
    EXPECT_TRUE(at::equal(l1_base_weight(), base_before)) << "the frozen base moved";
    fsdp::checkpoint::load_sharded(ck, model, &opt, nullptr, g);
    const auto loaded = fsdp::full_state_dict(model);
    ASSERT_EQ(loaded.size(), saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      EXPECT_EQ(loaded[i].first, saved[i].first);
      EXPECT_TRUE(at::equal(loaded[i].second, saved[i].second)) << "after load: " << saved[i].first;
    }
  }
}

// An adapter added to a sharded module, or a submodule replaced, is used in forward but was never
// sharded: the next forward throws on every rank, naming the parameters, the unit and the fix.
TEST(FineTuning, ParametersAddedAfterShardingAreAnError) {
  auto g = world();
  const int N = g->size();
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    torch::manual_seed(9);
    auto model = LoraNet().ptr();
    fsdp::fully_shard_tree(model, g, lora_layers(), options_for(s, N));
    (void)fsdp::call(model, at::randn({2, 6}));
    model->l1->add_adapter(2);
    try {
      (void)fsdp::call(model, at::randn({2, 6}));
      ADD_FAILURE() << "an adapter added after sharding was used untrained";
    } catch (const fsdp::Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument) << msg;
      EXPECT_NE(msg.find("unit 'l1'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("'lora_a', 'lora_b'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("registered after fully_shard"), std::string::npos) << msg;
      EXPECT_NE(msg.find("add the adapters and freeze the base"), std::string::npos) << msg;
    }
    for (const auto& u : fsdp::units_of(model)) EXPECT_EQ(u->training_state(), fsdp::TrainingState::kIdle);
    // A replaced submodule: the new one's parameters belong to no unit.
    torch::manual_seed(9);
    auto model2 = LoraNet().ptr();
    fsdp::fully_shard_tree(model2, g, lora_layers(), options_for(s, N));
    model2->replace_module("l2", LoraLinear(16, 3));
    try {
      (void)fsdp::call(model2, at::randn({2, 6}));
      ADD_FAILURE() << "a replaced submodule was used unsharded";
    } catch (const fsdp::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("unit 'root'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("'l2.base.weight'"), std::string::npos) << msg;
    }
  }
}

namespace {

// --- meta-device init: a tie across two modules, a table computed in the constructor ---------

// 1/10000^(2i/d): a table the constructor computes (on the meta device: no values).
at::Tensor inverse_frequencies(int64_t d, at::TensorOptions o) {
  return at::pow(10000.0, at::arange(0, d, 2, o.dtype(at::kFloat)) / static_cast<double>(d)).reciprocal();
}

struct RopeImpl : torch::nn::Module {
  RopeImpl(int64_t d, at::TensorOptions o) : d(d) {
    inv_freq = register_buffer("inv_freq", o.device().is_meta() ? at::empty({d / 2}, o) : inverse_frequencies(d, o));
  }
  int64_t d;
  at::Tensor inv_freq;
};
TORCH_MODULE(Rope);

// The head registers the embedding's weight as its own (a tie across two modules of one unit).
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const at::Tensor& w) { weight = register_parameter("weight", w); }
  at::Tensor weight;
};
TORCH_MODULE(TiedHead);

struct EmbedImpl : torch::nn::Module {
  EmbedImpl(int64_t v, int64_t d, at::TensorOptions o) { weight = register_parameter("weight", at::empty({v, d}, o)); }
  at::Tensor weight;
};
TORCH_MODULE(Embed);

struct TiedLMImpl : torch::nn::Module {
  explicit TiedLMImpl(at::TensorOptions o) {
    emb = register_module("emb", Embed(11, 6, o));
    body = register_module("body", DevLinear(6, 6, true, o));
    head = register_module("head", TiedHead(emb->weight));
    rope = register_module("rope", Rope(6, o));
  }
  Embed emb{nullptr};
  DevLinear body{nullptr};
  TiedHead head{nullptr};
  Rope rope{nullptr};
};
TORCH_MODULE(TiedLM);

// normal_ on every parameter a module registers; the head writes the tied weight or not; the rope
// table is computed again or not; body's bias is skipped when asked.
fsdp::ModuleInit lm_init(bool head_writes, bool recompute_rope, bool skip_bias = false) {
  return [=](const std::string& name, torch::nn::Module& m) {
    if (name == "rope" && recompute_rope) m.named_buffers(false)["inv_freq"].copy_(inverse_frequencies(6, {}));
    if (name == "head" && !head_writes) return;
    for (auto& p : m.named_parameters(false)) {
      if (!(skip_bias && name == "body" && p.key() == "bias")) torch::nn::init::normal_(p.value(), 0.0, 0.5);
    }
  };
}

// scale (own) and a module below it: an init writing both is refused.
struct NestImpl : torch::nn::Module {
  explicit NestImpl(at::TensorOptions o) {
    scale = register_parameter("scale", at::empty({4}, o));
    inner = register_module("inner", DevLinear(4, 4, false, o));
  }
  at::Tensor scale;
  DevLinear inner{nullptr};
};
TORCH_MODULE(Nest);

fsdp::WrapPolicy body_unit() {
  return [](const std::string& name, torch::nn::Module&) { return name == "body"; };
}

}  // namespace

// materialize gives the shards of a model built on the CPU, initialised, then sharded, bitwise,
// with the tie kept whether the head's init writes it or not, and the constructor's table
// computed again by init.
TEST(FineTuning, MetaInitKeepsTiesAndComputedBuffers) {
  auto g = world();
  const int N = g->size();
  for (auto s : {S::kFullShard, S::kNoShard, S::kHybridShard}) {
    for (bool head_writes : {false, true}) {
      SCOPED_TRACE(std::string(fsdp::to_string(s)) + (head_writes ? ", head init writes the tie" : ", head init skips it"));
      torch::manual_seed(11);
      auto normal = TiedLM(at::TensorOptions()).ptr();
      fsdp::init_parameters(*normal, lm_init(head_writes, true));
      fsdp::fully_shard_tree(normal, g, body_unit(), options_for(s, N));
      auto meta = TiedLM(at::TensorOptions().device(at::kMeta)).ptr();
      fsdp::fully_shard_tree(meta, g, body_unit(), options_for(s, N));
      torch::manual_seed(11);
      fsdp::materialize(meta, lm_init(head_writes, true));
      const auto want = fsdp::sharded_parameters(normal), got = fsdp::sharded_parameters(meta);
      ASSERT_EQ(want.size(), got.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i].name, want[i].name);
        EXPECT_TRUE(at::equal(got[i].tensor, want[i].tensor)) << got[i].name << ": " << err_summary(got[i].tensor, want[i].tensor);
      }
      EXPECT_TRUE(meta->head->weight.is_same(meta->emb->weight)) << "the tie was broken";
      EXPECT_TRUE(at::equal(meta->rope->inv_freq, normal->rope->inv_freq)) << "the computed table differs";
    }
  }
}

// A buffer built on the meta device that init does not compute, and a parameter it does not write,
// hold no values: materialize names them instead of training from uninitialised memory.
TEST(FineTuning, MetaInitNamesWhatInitDidNotWrite) {
  auto g = world();
  auto expect_named = [&](const fsdp::ModuleInit& init, const std::string& what) {
    auto meta = TiedLM(at::TensorOptions().device(at::kMeta)).ptr();
    fsdp::fully_shard_tree(meta, g, body_unit());
    try {
      fsdp::materialize(meta, init);
      ADD_FAILURE() << what << " was left unwritten silently";
    } catch (const fsdp::Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_NE(msg.find("meta device"), std::string::npos) << msg;
    }
  };
  expect_named(lm_init(true, /*recompute_rope=*/false), "buffer 'rope.inv_freq'");
  expect_named(lm_init(true, true, /*skip_bias=*/true), "parameter 'body.bias'");
  // An init that writes the parameters of the modules below its module (a recursive parameters())
  // draws the generator out of module order: named, not silently other values.
  auto meta = Nest(at::TensorOptions().device(at::kMeta)).ptr();
  fsdp::fully_shard_tree(meta, g, [](const std::string& n, torch::nn::Module&) { return n == "inner"; });
  try {
    fsdp::materialize(meta, [](const std::string&, torch::nn::Module& m) {
      for (auto& p : m.parameters(/*recurse=*/true)) torch::nn::init::normal_(p);
    });
    ADD_FAILURE() << "an init writing its children's parameters was accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("init for module '' wrote parameter 'inner.weight'"), std::string::npos)
        << e.what();
  }
}

// Freezing or unfreezing through the tensors the optimizer holds (fsdp::parameters) is followed as
// through the module's parameters: the same steps as one process that flips the same flags.
TEST(FineTuning, RequiresGradOnTheOptimizersTensorsIsFollowed) {
  auto g = world();
  const int N = g->size();
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    auto ref = lora_model(23);
    auto model = lora_model(23);
    fsdp::fully_shard_tree(model, g, lora_layers(), options_for(s, N));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.05));
    torch::optim::SGD opt(fsdp::parameters(model), torch::optim::SGDOptions(0.05));
    for (int step = 0; step < 4; ++step) {
      if (step == 1) {  // unfreeze l2's base weight, freeze l1's lora_b: on the shards only
        ref->l2->base->weight.requires_grad_(true);
        ref->l1->lora_b.requires_grad_(false);
        for (const auto& sp : fsdp::sharded_parameters(model)) {
          if (sp.name == "l2.base.weight") sp.tensor.requires_grad_(true);
          if (sp.name == "l1.lora_b") sp.tensor.requires_grad_(false);
        }
      }
      const std::string when = "step " + std::to_string(step);
      lora_parity_step(model, ref, opt, ref_opt, step, when);
    }
  }
}

namespace {

// --- buffer_dtype: a buffer kernel in F::linear and batch-norm statistics, saved for backward --

struct MixImpl : torch::nn::Module {
  MixImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    kernel = register_buffer("kernel", torch::randn({4, 4}) * 0.5);
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
  }
  at::Tensor forward(const at::Tensor& x) { return bn(at::linear(fc(x), kernel)); }
  torch::nn::Linear fc{nullptr};
  at::Tensor kernel;
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Mix);

struct BufNetImpl : torch::nn::Module {
  BufNetImpl() {
    mix = register_module("mix", Mix());
    out = register_module("out", torch::nn::Linear(4, 2));
  }
  at::Tensor forward(const at::Tensor& x) { return fsdp::call(out, at::tanh(fsdp::call(mix, x))); }
  Mix mix{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(BufNet);

}  // namespace

// Buffers computed with in buffer_dtype (here float64, as the params) used to be written back into
// the tensors autograd had saved ("modified by an inplace operation"). Every rank trains on the same
// batch, so batch-norm statistics are the global ones: parameters and running statistics equal a
// float64 model in one process, and the stored buffers stay float32.
TEST(FineTuning, BufferDtypeLeavesSavedBuffersAlone) {
  auto g = world();
  const int N = g->size();
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    torch::manual_seed(13);
    auto ref = BufNet().ptr();
    torch::manual_seed(13);
    auto model = BufNet().ptr();
    ref->to(at::kDouble);
    auto o = options_for(s, N);
    o.mixed_precision.param_dtype = at::kDouble;
    o.mixed_precision.buffer_dtype = at::kDouble;
    fsdp::fully_shard_tree(model, g, [](const std::string& n, torch::nn::Module&) { return n == "mix" || n == "out"; }, o);
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD opt(fsdp::parameters(model), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = regression_batch(step, 6, 4, 2);
      const std::string when = "step " + std::to_string(step);
      ref_opt.zero_grad();
      F::mse_loss(ref->forward(x.to(at::kDouble)), y.to(at::kDouble)).backward();
      opt.zero_grad();
      at::Tensor out = fsdp::call(model, x);
      ASSERT_NO_THROW(F::mse_loss(out, y.to(out.scalar_type())).backward()) << when;
      compare_with_reference(model, ref, /*grad=*/true, 1e-5, 1e-6, when);
      ref_opt.step();
      opt.step();
      for (const char* b : {"kernel", "bn.running_mean", "bn.running_var"}) {
        at::Tensor mine = model->mix->named_buffers()[b];
        EXPECT_EQ(mine.scalar_type(), at::kFloat) << when << " " << b << " is no longer stored as float32";
        expect_close(mine, ref->mix->named_buffers()[b].to(at::kFloat), 1e-5, 1e-6, when + " buffer " + b);
      }
    }
  }
}

fsdp::checkpoint::SaveOptions named(const std::string& name) {
  fsdp::checkpoint::SaveOptions o;
  o.name = name;
  return o;
}

// With set_requires_gradient_sync(false) mid-accumulation, the unreduced gradients are in no
// checkpoint: save and load refuse on every rank, naming the units, and write nothing; after the
// synced backward and the step the same save succeeds.
TEST(FineTuning, CheckpointWithUnreducedGradientsIsRefused) {
  auto g = world();
  const int N = g->size(), r = g->rank();
  SharedDir dir("pending");
  for (auto s : implemented_strategies()) {
    SCOPED_TRACE(fsdp::to_string(s));
    torch::manual_seed(19);
    auto model = MLP(6, 10, 3).ptr();
    fsdp::fully_shard_tree(model, g, fsdp::wrap_by_type<torch::nn::LinearImpl>(), options_for(s, N));
    torch::optim::SGD opt(fsdp::parameters(model), torch::optim::SGDOptions(0.1));
    const std::string ck = dir.sub(std::string(fsdp::to_string(s)));
    fsdp::checkpoint::save_sharded(ck, model, &opt, {}, g, named("before"));
    auto [x, y] = regression_batch(0, N * 2, 6, 3);
    fsdp::set_requires_gradient_sync(model, false);
    F::mse_loss(fsdp::call(model, x.narrow(0, r * 2, 2)), y.narrow(0, r * 2, 2)).backward();
    fsdp::set_requires_gradient_sync(model, true);
    for (bool save : {true, false}) {
      try {
        if (save) {
          fsdp::checkpoint::save_sharded(ck, model, &opt, {}, g, named("pending"));
        } else {
          fsdp::checkpoint::load_sharded(ck, model, &opt, nullptr, g);
        }
        ADD_FAILURE() << (save ? "save" : "load") << " with unreduced gradients was accepted";
      } catch (const fsdp::Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(e.kind(), fsdp::ErrorKind::kState) << msg;
        EXPECT_NE(msg.find("units 'fc1', 'fc2'"), std::string::npos) << msg;
        EXPECT_NE(msg.find("requires_gradient_sync(false)"), std::string::npos) << msg;
      }
    }
    EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(ck) / "pending"));
    F::mse_loss(fsdp::call(model, x.narrow(0, r * 2, 2)), y.narrow(0, r * 2, 2)).backward();
    opt.step();
    EXPECT_EQ(fsdp::checkpoint::save_sharded(ck, model, &opt, {}, g, named("after")), "after");
  }
}

// The loader of a fine-tune over a pretrained base: import_safetensors fills the parameters the file
// holds and leaves those options.leave names (the adapters) to their values, reporting both lists;
// without leave a parameter missing from the file is an error naming it; a left parameter of a
// unit built on the meta device (no values yet) is an error naming it and the fix. The export
// side: skip leaves parameters out of the file, and value_of's tensor is what is written (of the
// parameter's shape, or an error naming it).
TEST(FineTuning, ImportFillsTheBaseAndLeavesNamedParametersToTheirValues) {
  using namespace fsdp_test;
  auto g = world();
  const int N = g->size();
  SharedDir dir("import-leave");
  auto policy = [](const std::string& name, torch::nn::Module&) { return name.rfind('b', 0) == 0 && name.size() == 2; };
  auto build = [&](uint64_t seed, at::Device device) {
    torch::manual_seed(seed);
    auto m = DevNet(16, 8, 12, 2, at::TensorOptions().device(device)).ptr();
    if (!device.is_meta()) fsdp::init_parameters(*m, dev_net_init);
    fsdp::fully_shard_tree(m, g, policy, options_for(fsdp::ShardingStrategy::kFullShard, N));
    return m;
  };
  auto is_head = [](const std::string& p) { return p == "head.weight"; };
  auto src = build(1, at::kCPU);
  fsdp::checkpoint::SafetensorsExportOptions eo;
  eo.skip = is_head;
  eo.value_of = [](const std::string& p, const at::Tensor& full) { return p == "wte" ? full * 2 : full; };
  fsdp::checkpoint::export_safetensors(dir.sub("base"), src, g, eo);
  auto dst = build(2, at::kCPU);
  const auto before = fsdp::full_state_dict(dst);
  try {
    fsdp::checkpoint::import_safetensors(dir.sub("base"), dst, g);
    ADD_FAILURE() << "a parameter missing from the file was not refused";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'head.weight' (tensor 'head.weight') is missing from the checkpoint"),
              std::string::npos) << e.what();
  }
  fsdp::checkpoint::SafetensorsImportOptions io;
  io.leave = is_head;
  const auto report = fsdp::checkpoint::import_safetensors(dir.sub("base"), dst, g, io);
  const std::vector<std::string> filled{"wte", "b0.norm", "b0.fc1.weight", "b0.fc1.bias", "b0.fc2.weight",
                                        "b0.fc2.bias", "b1.norm", "b1.fc1.weight", "b1.fc1.bias", "b1.fc2.weight",
                                        "b1.fc2.bias"};
  EXPECT_EQ(report.filled, filled);
  EXPECT_EQ(report.left, std::vector<std::string>{"head.weight"});
  const auto want = fsdp::full_state_dict(src), got = fsdp::full_state_dict(dst);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string& name = got[i].first;
    const at::Tensor expect = name == "head.weight" ? before[i].second : name == "wte" ? want[i].second * 2 : want[i].second;
    EXPECT_TRUE(at::equal(got[i].second, expect)) << name << (name == "head.weight" ? " (left)" : " (filled)");
  }
  eo.value_of = [](const std::string&, const at::Tensor& full) { return full.t(); };
  try {
    fsdp::checkpoint::export_safetensors(dir.sub("bad"), src, g, eo);
    ADD_FAILURE() << "value_of's tensor of another shape was not refused";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("value_of gave parameter 'wte' the shape [8, 16], not its own [16, 8]"),
              std::string::npos) << e.what();
  }
  auto meta = build(3, at::kMeta);
  try {
    fsdp::checkpoint::import_safetensors(dir.sub("base"), meta, g, io);
    ADD_FAILURE() << "a left parameter without values was not refused";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'head.weight' is left to its value"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fsdp::materialize the model first"), std::string::npos) << e.what();
  }
}
