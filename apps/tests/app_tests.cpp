// Tests of the apps' building blocks: sampler invariance across world sizes, tokenizer round trip,
// GPT shapes, weight tying and loss at initialisation.
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <thread>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <unistd.h>

#include "data/batch_sampler.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "fsdp/comm/threaded_backend.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/dry_run.h"
#include "fsdp/runtime/materialize.h"
#include "models/gpt.h"
#include "models/llama.h"

namespace {

using apps::data::DistributedBatchSampler;
using apps::data::TokenDataset;

std::shared_ptr<const TokenDataset> counting_dataset(int64_t n) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(i % 30011);
  return std::make_shared<const TokenDataset>(std::move(t));
}

TEST(Sampler, GlobalBatchIdenticalForWorldSizes1_2_4) {
  auto data = counting_dataset(5000);
  const int64_t G = 8, T = 16;
  for (int64_t step : {0, 1, 7, 40, 41, 100}) {  // 5000/16-1 = 311 windows: several epochs
    DistributedBatchSampler one(data, G, T, 0, 1, 1234);
    at::Tensor ref = one.train_batch(step);
    ASSERT_EQ(ref.sizes(), (at::IntArrayRef{G, T + 1}));
    for (int n : {2, 4}) {
      std::vector<at::Tensor> parts;
      for (int r = 0; r < n; ++r) {
        DistributedBatchSampler s(data, G, T, r, n, 1234);
        parts.push_back(s.train_batch(step));
        EXPECT_EQ(parts.back().size(0), G / n);
      }
      EXPECT_TRUE(at::cat(parts).equal(ref)) << "step " << step << " world size " << n;
      std::vector<at::Tensor> eval_parts;
      for (int r = 0; r < n; ++r) {
        eval_parts.push_back(DistributedBatchSampler(data, G, T, r, n, 1234).eval_batch(step));
      }
      EXPECT_TRUE(at::cat(eval_parts).equal(one.eval_batch(step))) << "eval batch " << step;
    }
  }
}

TEST(Sampler, WindowsAreContiguousAndEpochIsAPermutation) {
  auto data = counting_dataset(1000);
  const int64_t G = 4, T = 10;
  DistributedBatchSampler s(data, G, T, 0, 1, 7);
  ASSERT_EQ(s.train_windows(), 1000 / 10 - 1);
  std::vector<int64_t> seen;
  for (int64_t step = 0; step * G < s.train_windows(); ++step) {
    at::Tensor b = s.train_batch(step);
    for (int64_t i = 0; i < G; ++i) {
      for (int64_t t = 1; t <= T; ++t) ASSERT_EQ(b[i][t].item<int64_t>(), b[i][t - 1].item<int64_t>() + 1);
    }
    for (int64_t o : s.global_train_offsets(step)) seen.push_back(o);
  }
  seen.resize(s.train_windows());
  std::sort(seen.begin(), seen.end());
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_EQ(seen[i] - seen[i - 1], T) << "window " << i;
  DistributedBatchSampler other_seed(data, G, T, 0, 1, 8);
  EXPECT_FALSE(other_seed.train_batch(0).equal(s.train_batch(0)));
}

TEST(Sampler, RejectsIndivisibleGlobalBatch) {
  auto data = counting_dataset(1000);
  try {
    DistributedBatchSampler s(data, 6, 8, 0, 4, 1);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by the world size 4"), std::string::npos)
        << e.what();
  }
}

class TokenizerTest : public ::testing::Test {
 protected:
  // Trains a small SentencePiece BPE model once (a fraction of a second) so the test is hermetic.
  static void SetUpTestSuite() {
    dir_ = "/tmp/fsdp_app_tests_" + std::to_string(::getpid());
    std::string cmd = "mkdir -p " + dir_;
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    std::ofstream out(dir_ + "/text.txt");
    const char* lines[] = {"In the beginning God created the heaven and the earth.",
                           "It is a truth universally acknowledged, that a single man in possession",
                           "of a good fortune, must be in want of a wife.",
                           "And the evening and the morning were the first day.",
                           "Emma Woodhouse, handsome, clever, and rich, with a comfortable home"};
    for (int rep = 0; rep < 20; ++rep) {
      for (const char* l : lines) out << l << "\n";
    }
    out.close();
    auto status = sentencepiece::SentencePieceTrainer::Train(
        "--input=" + dir_ + "/text.txt --model_prefix=" + dir_ +
        "/spm --vocab_size=120 --model_type=bpe --user_defined_symbols=<|endoftext|>,<n> "
        "--minloglevel=2");
    ASSERT_TRUE(status.ok()) << status.ToString();
  }
  static void TearDownTestSuite() {
    std::string cmd = "rm -rf " + dir_;
    (void)std::system(cmd.c_str());
  }
  static std::string dir_;
};
std::string TokenizerTest::dir_;

TEST_F(TokenizerTest, RoundTripKeepsNewlines) {
  apps::data::Tokenizer tok(dir_ + "/spm.model");
  EXPECT_EQ(tok.vocab_size(), 120);
  EXPECT_GE(tok.newline_id(), 0);
  EXPECT_GE(tok.eos_id(), 0);
  std::string text = "And the earth was good.\nEmma said, a wife,\n<|endoftext|>\nIn the end";
  auto ids = tok.encode(text);
  for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
  EXPECT_EQ(tok.decode(ids), text);
}

// A byte-fallback model without the "<n>" symbol, as Llama-2's tokenizer.model is: newlines are
// the newline byte's piece.
TEST_F(TokenizerTest, ByteFallbackModelKeepsNewlinesAsTheirBytePiece) {
  auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + dir_ + "/text.txt --model_prefix=" + dir_ +
      "/bytes --vocab_size=400 --model_type=bpe --byte_fallback=true --minloglevel=2");
  ASSERT_TRUE(status.ok()) << status.ToString();
  apps::data::Tokenizer tok(dir_ + "/bytes.model");
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(dir_ + "/bytes.model").ok());
  EXPECT_EQ(tok.newline_id(), sp.PieceToId("<0x0A>"));
  EXPECT_EQ(tok.eos_id(), -1);
  const std::string text = "And the earth was good.\nEmma said, a wife,\n\nIn the end";
  const auto ids = tok.encode(text);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.newline_id()), 3);
  EXPECT_EQ(tok.decode(ids), text);
}

TEST_F(TokenizerTest, DatasetCacheIsReused) {
  apps::data::Tokenizer tok(dir_ + "/spm.model");
  bool built = false;
  auto first = TokenDataset::load_or_build(dir_ + "/text.txt", tok, &built);
  EXPECT_TRUE(built);
  auto second = TokenDataset::load_or_build(dir_ + "/text.txt", tok, &built);
  EXPECT_FALSE(built);
  EXPECT_EQ(first.tokens(), second.tokens());
  EXPECT_GT(first.size(), 100);
}

apps::models::GPTConfig tiny_config() {
  apps::models::GPTConfig c = apps::models::gpt_preset("nano", 512);
  c.n_layer = 2;
  c.n_embd = 64;
  c.block_size = 32;
  return c;
}

TEST(GPT, ForwardShapeAndTiedHead) {
  torch::manual_seed(0);
  apps::models::GPT model(tiny_config());
  at::Tensor idx = at::randint(0, 512, {3, 20}, at::kLong);
  at::Tensor logits = model->forward(idx);
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{3, 20, 512}));
  EXPECT_EQ(model->lm_head_weight().data_ptr(), model->wte->weight.data_ptr());
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();
  EXPECT_EQ(numel, tiny_config().num_params());  // no separate head matrix
  auto named = model->named_parameters();
  EXPECT_TRUE(named.contains("h.0.attn.c_attn.weight"));
  EXPECT_TRUE(named.contains("h.1.mlp.c_proj.bias"));
  // The head's gradient lands on wte: a token never used as input still gets a gradient.
  at::Tensor inputs = at::zeros({1, 4}, at::kLong);
  at::Tensor targets = at::ones({1, 4}, at::kLong);
  apps::models::gpt_loss(model->forward(inputs), targets).backward();
  EXPECT_GT(model->wte->weight.grad()[1].abs().sum().item<double>(), 0.0);
}

TEST(GPT, LossAtInitIsNearLogVocab) {
  torch::manual_seed(1);
  auto cfg = tiny_config();
  apps::models::GPT model(cfg);
  at::Tensor idx = at::randint(0, cfg.vocab_size, {4, 32}, at::kLong);
  at::Tensor tgt = at::randint(0, cfg.vocab_size, {4, 32}, at::kLong);
  double loss = apps::models::gpt_loss(model->forward(idx), tgt).item<double>();
  EXPECT_NEAR(loss, std::log(static_cast<double>(cfg.vocab_size)), 0.3);
}

TEST(GPT, PresetsAndGenerate) {
  EXPECT_EQ(apps::models::gpt_preset("gpt2", 50257).num_params(), 124439808);
  EXPECT_THROW(apps::models::gpt_preset("gpt5", 100), std::invalid_argument);
  torch::manual_seed(2);
  apps::models::GPT model(tiny_config());
  auto a = model->generate({1, 2, 3}, 40, 1.0, 10, 99);  // 43 > block_size: context is cropped
  auto b = model->generate({1, 2, 3}, 40, 1.0, 10, 99);
  EXPECT_EQ(a.size(), 40u);
  EXPECT_EQ(a, b);
}

// The blocks as FSDP units over 2 in-process ranks: logits and samples equal the unsharded model's.
TEST(GPT, ShardedForwardAndGenerateMatchUnsharded) {
  auto cfg = tiny_config();
  torch::manual_seed(5);
  apps::models::GPT reference(cfg);
  std::vector<apps::models::GPT> models;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(5);
    models.emplace_back(cfg);
  }
  at::Tensor idx = at::randint(0, cfg.vocab_size, {2, 16}, at::kLong);
  at::Tensor expected = reference->forward(idx);
  auto expected_sample = reference->generate({4, 5, 6}, 8, 1.0, 5, 11);
  auto groups = fsdp::comm::threaded_world(2);
  std::vector<at::Tensor> logits(2);
  std::vector<std::vector<int64_t>> samples(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        fsdp::fully_shard_tree(models[r].ptr(), groups[r],
                               fsdp::wrap_by_type<apps::models::BlockImpl>());
        {
          at::NoGradGuard no_grad;
          logits[r] = fsdp::call(models[r], idx);
        }
        samples[r] = models[r]->generate({4, 5, 6}, 8, 1.0, 5, 11);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    double err = (logits[r] - expected).abs().max().item<double>();
    EXPECT_LT(err, 1e-5) << "rank " << r << " logits max abs error " << err;
    EXPECT_EQ(samples[r], expected_sample) << "rank " << r;
  }
}

// --meta-init's rule on the GPT: built on the meta device, sharded over 2 in-process ranks, then
// materialised with gpt_init under the same seed, every rank's shards are bitwise those of the
// CPU build sharded the same way.
TEST(GPT, MetaInitShardsEqualTheCpuBuild) {
  auto cfg = tiny_config();
  std::vector<apps::models::GPT> normal, deferred;
  for (int r = 0; r < 2; ++r) {
    torch::manual_seed(5);
    normal.emplace_back(cfg);
    deferred.emplace_back(cfg, at::kMeta);
  }
  for (const auto& p : deferred[0]->parameters()) ASSERT_TRUE(p.is_meta());
  auto groups = fsdp::comm::threaded_world(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        fsdp::fully_shard_tree(normal[r].ptr(), groups[r], fsdp::wrap_by_type<apps::models::BlockImpl>());
        fsdp::fully_shard_tree(deferred[r].ptr(), groups[r], fsdp::wrap_by_type<apps::models::BlockImpl>());
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    torch::manual_seed(5);  // one rank at a time: the global generator is shared by the threads
    fsdp::materialize(deferred[r].ptr(), apps::models::gpt_init(cfg));
    auto a = fsdp::sharded_parameters(normal[r].ptr()), b = fsdp::sharded_parameters(deferred[r].ptr());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(at::equal(a[i].tensor, b[i].tensor)) << "rank " << r << " " << a[i].name;
    }
  }
}

// The public shapes, built on the meta device: parameter counts of the Llama-2 releases.
TEST(Llama, PresetsHaveThePublicParameterCounts) {
  EXPECT_EQ(apps::models::llama_preset("llama2-7b").num_params(), 6738415616);
  EXPECT_EQ(apps::models::llama_preset("llama2-13b").num_params(), 13015864320);
  EXPECT_EQ(apps::models::llama_preset("llama2-70b").num_params(), 68976648192);
  EXPECT_EQ(apps::models::gpt_preset("gpt2-xl", apps::models::kGpt2VocabSize).num_params(), 1557611200);
  apps::models::Llama m(apps::models::llama_preset("llama2-70b"), at::kMeta);
  int64_t n = 0;
  for (const auto& p : m->parameters()) {
    EXPECT_TRUE(p.is_meta());
    n += p.numel();
  }
  EXPECT_EQ(n, 68976648192);
  torch::manual_seed(0);
  apps::models::Llama tiny(apps::models::llama_preset("llama-tiny"));
  at::Tensor logits = tiny->forward(at::randint(0, 8192, {2, 9}, at::kLong));
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{2, 9, 8192}));
  EXPECT_TRUE(logits.isfinite().all().item<bool>());
}

// A dry run of rank 0 of llama2-70b at N = 1024 under full_shard: AdamW holds 8 bytes per real
// element of the rank's rows, the grads 4, and the padded rows at least 4P/N.
TEST(DryRun, Llama70bAt1024Ranks) {
  const auto cfg = apps::models::llama_preset("llama2-70b");
  fsdp::DryRunSpec spec;
  spec.world_size = 1024;
  spec.build = [&] { return std::static_pointer_cast<torch::nn::Module>(apps::models::Llama(cfg, at::kMeta).ptr()); };
  spec.shard = [](const std::shared_ptr<torch::nn::Module>& m, fsdp::comm::ProcessGroupPtr g) {
    fsdp::fully_shard_tree(m, g, fsdp::wrap_by_type<apps::models::LlamaBlockImpl>());
  };
  spec.loss = [&](const std::shared_ptr<torch::nn::Module>& m) {
    at::Tensor idx = at::empty({1, 8}, at::TensorOptions().dtype(at::kLong).device(at::kMeta));
    auto net = std::dynamic_pointer_cast<apps::models::LlamaImpl>(m);
    return fsdp::call(net, idx).sum();
  };
  spec.make_optimizer = [](std::vector<at::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-3));
  };
  const auto r = fsdp::dry_run(spec);
  EXPECT_EQ(r.param_numel, 68976648192);
  EXPECT_EQ(r.units, 81);
  EXPECT_EQ(r.bytes.optim_state_bytes, 2 * r.bytes.grad_bytes);
  EXPECT_GE(r.bytes.param_bytes, 4 * 68976648192 / 1024);
  EXPECT_GE(r.bytes.param_bytes, r.bytes.grad_bytes);
  EXPECT_EQ(r.bytes.master_weight_bytes, 0);
  EXPECT_GT(r.bytes.peak_unsharded_param_bytes, 0);
}

}  // namespace
