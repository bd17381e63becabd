// Tests of the apps' building blocks: sampler invariance across world sizes, tokenizer round trip,
// GPT shapes, weight tying and loss at initialisation.
#include <ATen/ops/cat.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>
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
#include "models/gpt.h"

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

}  // namespace
