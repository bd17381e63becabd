// fsdp-train's set-up pieces (model_setup.h).
#include "train/model_setup.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fsdp/common/check.h"
#include "fsdp/runtime/fully_shard.h"
#include "models/gpt_hf.h"
#include "train/errors.h"

namespace apps::train {

BatchGeometry resolve_batch(const TrainConfig& c, int world_size) {
  if (c.global_batch_size % world_size != 0) {
    throw UsageError("--global-batch-size " + std::to_string(c.global_batch_size) +
                     " is not divisible by the world size " + std::to_string(world_size));
  }
  BatchGeometry b;
  b.rows = c.global_batch_size / world_size;
  b.micro = c.micro_batch_size == 0 ? b.rows : c.micro_batch_size;
  if (b.rows % b.micro != 0) {
    throw UsageError("--micro-batch-size " + std::to_string(b.micro) + " does not divide the " +
                     std::to_string(b.rows) + " sequences per rank (--global-batch-size " +
                     std::to_string(c.global_batch_size) + " / " + std::to_string(world_size) +
                     " ranks)");
  }
  b.accum = b.rows / b.micro;
  return b;
}

models::GPTConfig resolve_model(const TrainConfig& c, int64_t vocab_size, bool tokenizer_vocab) {
  if (!c.init_from_hf.empty()) {
    const std::string path = (std::filesystem::path(c.init_from_hf) / "config.json").string();
    models::GPTConfig m;
    try {
      std::ifstream in(path);
      if (!in) throw std::invalid_argument("cannot be read");
      m = models::gpt_config_from_hf(nlohmann::json::parse(in));
    } catch (const std::exception& e) {
      throw UsageError("--init-from-hf: '" + path + "': " + e.what());
    }
    if (tokenizer_vocab && m.vocab_size != vocab_size) {
      throw UsageError("--init-from-hf '" + c.init_from_hf + "': the model's vocabulary is " +
                       std::to_string(m.vocab_size) + " tokens, the tokenizer's " + std::to_string(vocab_size) +
                       " (fsdp-train reads text through its SentencePiece tokenizer: give a model trained with "
                       "another tokenizer its own ids, pre-tokenized: --data FILE.bin or a folder of train.bin "
                       "and val.bin, uint16 ids as nanoGPT writes them)");
    }
    m.attention = c.attention;
    if (c.seq_len > m.block_size) {
      throw UsageError("--seq-len " + std::to_string(c.seq_len) + " exceeds the model's context of " +
                       std::to_string(m.block_size) + " tokens (n_positions in '" + path + "')");
    }
    return m;
  }
  models::GPTConfig m = models::gpt_preset(c.model, vocab_size);
  if (c.n_layer > 0) m.n_layer = c.n_layer;
  if (c.n_head > 0) m.n_head = c.n_head;
  if (c.n_embd > 0) m.n_embd = c.n_embd;
  if (c.block_size > 0) m.block_size = c.block_size;
  m.attention = c.attention;
  if (m.n_embd % m.n_head != 0) {
    throw UsageError("--n-embd " + std::to_string(m.n_embd) + " is not divisible by --n-head " +
                     std::to_string(m.n_head));
  }
  if (c.seq_len > m.block_size) {
    throw UsageError("--seq-len " + std::to_string(c.seq_len) + " exceeds the model's context of " +
                     std::to_string(m.block_size) + " tokens (raise --block-size)");
  }
  return m;
}

int resolve_threads(const TrainConfig& c) {
  if (c.threads > 0) return c.threads;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    throw std::runtime_error(std::string("--threads auto: sched_getaffinity failed: ") + std::strerror(errno));
  }
  return std::max(1, CPU_COUNT(&set));
}

fsdp::FullyShardOptions resolve_fsdp_options(const TrainConfig& c, const fsdp::comm::ProcessGroup& group) {
  fsdp::FullyShardOptions o;
  try {
    o.strategy = fsdp::parse_sharding_strategy(c.strategy);
  } catch (const fsdp::Error& e) {
    throw UsageError("--strategy: " + e.message());
  }
  if (c.mixed_precision == "bf16" || c.mixed_precision == "fp16") {
    auto dt = c.mixed_precision == "bf16" ? at::kBFloat16 : at::kHalf;
    o.mixed_precision.param_dtype = dt;
    o.mixed_precision.reduce_dtype = dt;
  }
  o.forward_prefetch = c.forward_prefetch;
  // Settings of one strategy: given with another they would be ignored, so they are rejected.
  if (c.hybrid_shard_group_size) {
    if (o.strategy != fsdp::ShardingStrategy::kHybridShard) {
      throw UsageError("--hybrid-shard-group-size applies to --strategy hybrid_shard only, not " + c.strategy);
    }
    if (*c.hybrid_shard_group_size == "host") {
      try {
        o.hybrid_shard_group_size = fsdp::comm::uniform_ranks_per_host(group);
      } catch (const fsdp::Error& e) {
        throw UsageError(std::string("--hybrid-shard-group-size host: ") + e.what());
      }
    } else {
      o.hybrid_shard_group_size = std::stoi(*c.hybrid_shard_group_size);
    }
  }
  if (c.bucket_cap_mb) {
    if (o.strategy != fsdp::ShardingStrategy::kNoShard) {
      throw UsageError("--bucket-cap-mb applies to --strategy no_shard only, not " + c.strategy);
    }
    o.bucket_cap_bytes = static_cast<int64_t>(*c.bucket_cap_mb * 1024 * 1024);
  }
  return o;
}

fsdp::FullyShardOptions root_options_of(const fsdp::FullyShardOptions& blocks) {
  fsdp::FullyShardOptions o = blocks;
  if (blocks.mixed_precision.param_dtype) o.mixed_precision.output_dtype = at::kFloat;
  return o;
}

void check_identical_init(models::GPT& model, fsdp::comm::ProcessGroup& group) {
  double sum = 0.0, abs_sum = 0.0;
  for (const auto& p : model->parameters()) {
    sum += p.sum().item<double>();
    abs_sum += p.abs().sum().item<double>();
  }
  const int n = group.size();
  at::Tensor mine = at::tensor(std::vector<double>{sum, abs_sum}, at::kDouble);  // (2,)
  at::Tensor all = at::empty({n, 2}, at::kDouble);  // (N, 2): rank r's (sum, abs_sum)
  group.all_gather_into_tensor(all, mine)->wait();
  const double* cs = all.data_ptr<double>();
  std::vector<int> differ;
  for (int r = 1; r < n; ++r) {
    if (cs[2 * r] != cs[0] || cs[2 * r + 1] != cs[1]) differ.push_back(r);
  }
  if (differ.empty()) return;
  auto checksums = [&](int r) {
    char buf[96];  // every digit: checksums may differ in the last bit
    std::snprintf(buf, sizeof(buf), "(%.17g, %.17g)", cs[2 * r], cs[2 * r + 1]);
    return std::string(buf);
  };
  std::string ranks;
  for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  throw std::runtime_error(
      "initial parameters differ across ranks (same --seed and build on every rank?): " +
      fsdp::expected_actual("rank " + std::to_string(differ.front()) +
                                "'s parameter checksums (sum, sum of |p|)",
                            checksums(0) + " as on rank 0", checksums(differ.front())) +
      "; ranks that differ from rank 0: " + ranks);
}

std::unique_ptr<torch::optim::AdamW> make_optimizer(const models::GPT& model,
                                                    const TrainConfig& c) {
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& sp : fsdp::sharded_parameters(model.ptr())) {
    bool embedding = sp.name.rfind("wte.", 0) == 0 || sp.name.rfind("wpe.", 0) == 0;
    (sp.tensor.dim() >= 2 && !embedding ? decay : no_decay).push_back(sp.tensor);
  }
  auto adamw = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(1e-8).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, adamw(c.weight_decay));
  groups.emplace_back(no_decay, adamw(0.0));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(c.lr));
}

}  // namespace apps::train
