// Tier `mpi`: deferred (meta-device) initialisation and dry runs. Shards materialised from a meta
// model are bitwise those of a model initialised normally then sharded, for every strategy, and
// stay so through a training step; the memory peak of materialize stays below the full model;
// a dry run's bytes equal the engine's own accounting of the same step run for real.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include "../common/meta_models.h"
#include "../common/scenario_util.h"
#include "fsdp/accounting/memory.h"
#include "fsdp/runtime/dry_run.h"
#include "mpi_world.h"

using namespace fsdp_test;

namespace {

constexpr int64_t kVocab = 37, kDim = 10, kHidden = 26, kLayers = 3, kRows = 2, kCtx = 5;

std::shared_ptr<DevNetImpl> build(at::Device device, int64_t vocab = kVocab, int64_t d = kDim,
                                  int64_t hidden = kHidden, int64_t layers = kLayers) {
  return DevNet(vocab, d, hidden, layers, at::TensorOptions().device(device)).ptr();
}

void shard(const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr g,
           const fsdp::FullyShardOptions& o) {
  fsdp::fully_shard_tree(m, g, fsdp::wrap_by_type<DevBlockImpl>(), o);
}

// One training step's loss: cross entropy of the model on a fixed batch on `device`.
at::Tensor step_loss(const std::shared_ptr<torch::nn::Module>& m, at::Device device) {
  auto net = std::dynamic_pointer_cast<DevNetImpl>(m);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
  at::Tensor tok = at::randint(0, kVocab, {kRows, kCtx + 1}, gen).to(device);
  at::Tensor logits = fsdp::call(net, tok.narrow(1, 0, kCtx).contiguous());
  return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}),
                                              tok.narrow(1, 1, kCtx).reshape({-1}));
}

std::unique_ptr<torch::optim::Optimizer> make_adamw(std::vector<at::Tensor> p) {
  return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
}

void expect_same_shards(const std::shared_ptr<torch::nn::Module>& a, const std::shared_ptr<torch::nn::Module>& b,
                        const std::string& when) {
  auto pa = fsdp::sharded_parameters(a), pb = fsdp::sharded_parameters(b);
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_EQ(pa[i].name, pb[i].name);
    const at::Tensor& x = pa[i].tensor;
    const at::Tensor& y = pb[i].tensor;
    ASSERT_EQ(x.sizes(), y.sizes()) << pa[i].name;
    EXPECT_TRUE(at::equal(x, y)) << when << ": shard of '" << pa[i].name << "' differs, max abs diff "
                                 << (x.numel() ? (x - y).abs().max().item<double>() : 0.0);
  }
}

}  // namespace

// Every strategy: a model built on the meta device, sharded, then materialised holds bitwise the
// shards of the same model initialised normally (same seed) and then sharded; after one forward,
// backward and AdamW step the losses and shards are still bitwise equal.
TEST(MetaInit, ShardsAndOneStepEqualNormalInitEveryStrategy) {
  auto g = world();
  for (auto strategy : implemented_strategies()) {
    SCOPED_TRACE("strategy " + fsdp::to_string(strategy));
    const auto options = options_for(strategy, g->size());
    torch::manual_seed(7);
    auto normal = build(at::kCPU);
    fsdp::init_parameters(*normal, dev_net_init);
    shard(normal, g, options);

    torch::manual_seed(7);
    auto deferred = build(at::kMeta);
    shard(deferred, g, options);
    EXPECT_THROW(step_loss(deferred, at::kCPU), fsdp::Error);  // not materialised yet
    const fsdp::MaterializeResult r = fsdp::materialize(deferred, dev_net_init);
    EXPECT_EQ(r.modules, 1 + kLayers * 3 + 1);  // root, each block and its two linears, head
    EXPECT_EQ(r.peak_full_bytes, kVocab * kDim * 4);  // the largest module's own params: wte or head
    expect_same_shards(normal, deferred, "after materialize");

    at::Tensor la = step_loss(normal, at::kCPU), lb = step_loss(deferred, at::kCPU);
    EXPECT_TRUE(at::equal(la, lb)) << la.item<double>() << " vs " << lb.item<double>();
    la.backward();
    lb.backward();
    auto oa = make_adamw(fsdp::parameters(normal)), ob = make_adamw(fsdp::parameters(deferred));
    oa->step();
    ob->step();
    expect_same_shards(normal, deferred, "after one AdamW step");
  }
}

// No rank holds the full model: from before building to the end of materialize, the counting
// allocator's peak stays within this rank's shards plus the largest unit's full params (the
// unsharded buffer fully_shard allocates and frees per unit), and below the full model's bytes.
TEST(MetaInit, PeakStaysBelowTheFullModel) {
  auto g = world();
  constexpr int64_t vocab = 512, d = 64, hidden = 256, layers = 8;
  const int64_t block_bytes = (d + d * hidden + hidden + hidden * d + d) * 4;
  const int64_t root_bytes = 2 * vocab * d * 4;
  const int64_t full_bytes = root_bytes + layers * block_bytes;
  fsdp::accounting::reset_peak_bytes();
  const int64_t base = fsdp::accounting::current_bytes();
  torch::manual_seed(3);
  auto m = build(at::kMeta, vocab, d, hidden, layers);
  EXPECT_EQ(fsdp::accounting::current_bytes(), base);  // a meta model holds no memory
  shard(m, g, {});
  int64_t shards = 0;
  for (const auto& u : fsdp::units_of(m)) shards += u->sharded_param_bytes();
  fsdp::materialize(m, dev_net_init);
  const int64_t peak = fsdp::accounting::peak_bytes() - base;
  const int64_t slack = 64 * 1024;  // the consistency checks' descriptions
  EXPECT_LE(peak, shards + std::max(root_bytes, block_bytes) + slack)
      << "shards " << shards << ", largest unit " << std::max(root_bytes, block_bytes);
  if (g->size() > 1) EXPECT_LT(peak, full_bytes) << "full model " << full_bytes;
}

// no_shard reduces each unit's bucket from its parameters' AccumulateGrad hooks, during backward,
// in fp32 (the module params alias the rows) and with bf16 params (cast copies, empty between
// steps), whether the model was initialised normally or materialised from the meta device (whose
// fp32 full tensors replace a bf16 param's AccumulateGrad node): when the first block's fc1
// gradient is computed, the buckets of the blocks after it are on the wire. [Note: reducer hooks]
TEST(MetaInit, NoShardBucketsGoOutDuringBackward) {
  auto g = world();
  for (bool meta : {false, true}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(meta ? "meta init" : "normal init") + (bf16 ? ", bf16" : ", fp32"));
      auto options = options_for(fsdp::ShardingStrategy::kNoShard, g->size());
      if (bf16) options.mixed_precision.param_dtype = at::kBFloat16;
      torch::manual_seed(7);
      auto net = build(meta ? at::kMeta : at::kCPU);
      if (!meta) fsdp::init_parameters(*net, dev_net_init);
      shard(net, g, options);
      if (meta) fsdp::materialize(net, dev_net_init);
      const auto all_reduces = [&] {
        return g->stats().snapshot()[static_cast<int>(fsdp::comm::CollectiveKind::kAllReduce)].calls;
      };
      const int64_t start = all_reduces();
      int64_t issued = -1;
      net->blocks[0]->fc1->weight.register_hook([&](const at::Tensor&) { issued = all_reduces() - start; });
      step_loss(net, at::kCPU).backward();
      EXPECT_EQ(issued, kLayers - 1) << "buckets issued when b0.fc1's gradient was computed";
      EXPECT_EQ(all_reduces() - start, kLayers + 1);  // one bucket per unit
    }
  }
}

// A dry run of this rank on a simulated group of the same size reports exactly what the engine
// holds and sends for the same step run for real (forward, backward, AdamW step), for every
// strategy, in fp32 and with bf16 params (fp32 master weights): the bytes by kind of its own
// accounting; the counting allocator's bytes the real model keeps after the step (the same total);
// and the collectives of the step by kind (calls and logical bytes, CommStats).
TEST(DryRun, BytesEqualTheRealEngineAccounting) {
  auto g = world();
  for (bool bf16 : {false, true}) {
    for (auto strategy : implemented_strategies()) {
      SCOPED_TRACE("strategy " + fsdp::to_string(strategy) + (bf16 ? " bf16" : " fp32"));
      auto options = options_for(strategy, g->size());
      if (bf16) options.mixed_precision.param_dtype = at::kBFloat16;
      const int64_t base = fsdp::accounting::current_bytes();
      torch::manual_seed(5);
      auto real = build(at::kCPU);
      fsdp::init_parameters(*real, dev_net_init);
      shard(real, g, options);
      const fsdp::comm::CommStats::Snapshot before = g->stats().snapshot();
      step_loss(real, at::kCPU).backward();
      auto opt = make_adamw(fsdp::parameters(real));
      opt->step();
      const fsdp::comm::CommStats::Snapshot after = g->stats().snapshot();
      const int64_t held = fsdp::accounting::current_bytes() - base;
      const fsdp::RankStateBytes want = fsdp::rank_state_bytes(real, opt.get());

      fsdp::DryRunSpec spec;
      spec.world_size = g->size();
      spec.rank = g->rank();
      spec.build = [] { return std::static_pointer_cast<torch::nn::Module>(build(at::kMeta)); };
      spec.shard = [&](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr sg) {
        shard(m, sg, options);
      };
      spec.loss = [](const std::shared_ptr<torch::nn::Module>& m) { return step_loss(m, at::kMeta); };
      spec.make_optimizer = make_adamw;
      const fsdp::DryRunResult dry = fsdp::dry_run(spec);
      EXPECT_EQ(dry.bytes.param_bytes, want.param_bytes);
      EXPECT_EQ(dry.bytes.master_weight_bytes, want.master_weight_bytes);
      EXPECT_EQ(dry.bytes.grad_bytes, want.grad_bytes);
      EXPECT_EQ(dry.bytes.optim_state_bytes, want.optim_state_bytes);
      EXPECT_EQ(dry.bytes.peak_unsharded_param_bytes, want.peak_unsharded_param_bytes);
      // What the real model holds after the step, measured: its state, nothing unsharded left.
      EXPECT_EQ(dry.bytes.total_bytes() - dry.bytes.peak_unsharded_param_bytes, held)
          << "counting allocator: bytes held after the step";
      int64_t real_calls = 0;
      for (int k = 0; k < fsdp::comm::kNumCollectiveKinds; ++k) {
        const auto kind = fsdp::comm::to_string(static_cast<fsdp::comm::CollectiveKind>(k));
        EXPECT_EQ(dry.step_comm[k].calls, after[k].calls - before[k].calls) << kind << " calls";
        EXPECT_EQ(dry.step_comm[k].bytes, after[k].bytes - before[k].bytes) << kind << " logical bytes";
        real_calls += after[k].calls - before[k].calls;
      }
      EXPECT_EQ(dry.collectives, real_calls);
      EXPECT_EQ(dry.units, kLayers + 1);
      EXPECT_GT(want.optim_state_bytes, 0);
      EXPECT_EQ(want.master_weight_bytes > 0, bf16 || strategy == fsdp::ShardingStrategy::kZero1);
    }
  }
}
