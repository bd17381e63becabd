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
#include "fsdp/runtime/strategy_traits.h"
#include "fsdp/optim/fused_adamw.h"
#include "fsdp/planner/model_spec.h"
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

models::ModelConfig resolve_model(const TrainConfig& c, int64_t vocab_size, bool tokenizer_vocab) {
  if (!c.init_from_hf.empty()) {
    const std::string path = (std::filesystem::path(c.init_from_hf) / "config.json").string();
    models::ModelConfig m;
    try {
      std::ifstream in(path);
      if (!in) throw std::invalid_argument("cannot be read");
      m = models::model_config_from_hf(nlohmann::json::parse(in));
    } catch (const std::exception& e) {
      throw UsageError("--init-from-hf: '" + path + "': " + e.what());
    }
    if (tokenizer_vocab && m.vocab_size() != vocab_size) {
      throw UsageError("--init-from-hf '" + c.init_from_hf + "': the model's vocabulary is " +
                       std::to_string(m.vocab_size()) + " tokens, the tokenizer's " + std::to_string(vocab_size) +
                       " (give the model's own SentencePiece tokenizer with --tokenizer FILE, or its ids "
                       "pre-tokenized: --data FILE.bin or a folder of train.bin and val.bin, as nanoGPT "
                       "writes them)");
    }
    m.set_attention(c.attention);
    if (c.seq_len > m.context()) {
      throw UsageError("--seq-len " + std::to_string(c.seq_len) + " exceeds the model's context of " +
                       std::to_string(m.context()) + " tokens (" +
                       (m.is_llama() ? "max_position_embeddings" : "n_positions") + " in '" + path + "')");
    }
    return m;
  }
  models::ModelConfig m = models::model_preset(c.model, vocab_size);
  if (m.is_llama()) {
    models::LlamaConfig& l = m.llama();
    if (c.n_layer > 0) l.n_layer = c.n_layer;
    if (c.n_head > 0) l.n_head = c.n_head;
    if (c.n_kv_head > 0) l.n_kv_head = c.n_kv_head;
    if (c.n_embd > 0) l.d_model = c.n_embd;
    if (c.ffn_hidden > 0) l.ffn = c.ffn_hidden;
    if (c.block_size > 0) l.max_seq = c.block_size;
    if (l.d_model % l.n_head != 0 || (l.d_model / l.n_head) % 2 != 0) {
      throw UsageError("--n-embd " + std::to_string(l.d_model) + " must split into --n-head " + std::to_string(l.n_head) +
                       " heads of even size (rotary positions rotate pairs of channels)");
    }
    if (l.n_head % l.n_kv_head != 0) {
      throw UsageError("--n-kv-head " + std::to_string(l.n_kv_head) + " must divide --n-head " + std::to_string(l.n_head) +
                       " (each key/value head serves n_head / n_kv_head query heads)");
    }
  } else {
    if (c.n_kv_head > 0 || c.ffn_hidden > 0) {
      throw UsageError(std::string(c.n_kv_head > 0 ? "--n-kv-head" : "--ffn-hidden") +
                       " applies to the Llama models (llama-tiny, llama2-*) only, not " + c.model +
                       " (a GPT has one key/value head per query head and an MLP of 4 x --n-embd)");
    }
    models::GPTConfig& g = m.gpt();
    if (c.n_layer > 0) g.n_layer = c.n_layer;
    if (c.n_head > 0) g.n_head = c.n_head;
    if (c.n_embd > 0) g.n_embd = c.n_embd;
    if (c.block_size > 0) g.block_size = c.block_size;
    if (g.n_embd % g.n_head != 0) {
      throw UsageError("--n-embd " + std::to_string(g.n_embd) + " is not divisible by --n-head " +
                       std::to_string(g.n_head));
    }
  }
  m.set_attention(c.attention);
  if (c.seq_len > m.context()) {
    throw UsageError("--seq-len " + std::to_string(c.seq_len) + " exceeds the model's context of " +
                     std::to_string(m.context()) + " tokens (raise --block-size)");
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

namespace {

// A number of consecutive ranks of the shard group (`shard` ranks) given to `flag` as a number or
// "host" (the launcher's ranks per host); "host" where the shard group lies inside one host is the
// shard group itself, which both options treat as off. Throws UsageError unless it divides `shard`.
int ranks_in_shard_group(const std::string& flag, const std::string& v, const fsdp::comm::ProcessGroup& group,
                         int shard) {
  int g = 0;
  if (v == "host") {
    try {
      g = fsdp::comm::uniform_ranks_per_host(group);
    } catch (const fsdp::Error& e) {
      throw UsageError(flag + " host: " + e.what());
    }
    g = std::min(g, shard);  // a shard group inside one host: nothing to do (fsdp-plan's rule)
  } else {
    g = std::stoi(v);  // ranks_or_host checked it: a non-negative integer
  }
  if (g == 0) return 0;  // "0", "00": off
  if (shard % g != 0) {
    throw UsageError(flag + " " + v + (v == "host" ? " (" + std::to_string(g) + " ranks per host)" : "") +
                     " must divide the shard group size " + std::to_string(shard));
  }
  return g;
}

}  // namespace

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
  o.all_gather_codec = fsdp::parse_wire_codec(c.all_gather_codec);
  if (o.all_gather_codec != fsdp::WireCodec::kNone && !fsdp::traits_of(o.strategy).gathers_params) {
    throw UsageError("--all-gather-codec " + c.all_gather_codec +
                     " applies to strategies that all-gather params, not " + c.strategy +
                     " (every rank keeps every param)");
  }
  const int shard = o.hybrid_shard_group_size > 0 ? o.hybrid_shard_group_size : group.size();
  // 0 (in any spelling): off, e.g. over an environment default.
  auto set = [](const std::optional<std::string>& v) { return v && (*v == "host" || std::stoi(*v) != 0); };
  if (set(c.reshard_after_forward)) {
    if (!fsdp::traits_of(o.strategy).reshard_after_forward) {
      throw UsageError("--reshard-after-forward " + *c.reshard_after_forward +
                       " applies to --strategy full_shard or hybrid_shard, not " + c.strategy +
                       " (it keeps each unit's params from forward to backward)");
    }
    o.reshard_after_forward_group_size = ranks_in_shard_group("--reshard-after-forward", *c.reshard_after_forward, group, shard);
  }
  o.reduce_scatter_codec = fsdp::parse_wire_codec(c.reduce_scatter_codec);
  const bool reduce_scatters = fsdp::traits_of(o.strategy).grad_sync == fsdp::GradSync::kReduceScatter;
  if (o.reduce_scatter_codec != fsdp::WireCodec::kNone && !reduce_scatters) {
    throw UsageError("--reduce-scatter-codec " + c.reduce_scatter_codec +
                     " applies to strategies that reduce-scatter gradients, not " + c.strategy +
                     " (it all-reduces them in buckets)");
  }
  if (set(c.host_aware_collectives)) {
    if (!reduce_scatters) {
      throw UsageError("--host-aware-collectives " + *c.host_aware_collectives +
                       " applies to strategies that all-gather params and reduce-scatter gradients, not " +
                       c.strategy);
    }
    o.collective_host_size = ranks_in_shard_group("--host-aware-collectives", *c.host_aware_collectives, group, shard);
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

void check_identical_init(const torch::nn::Module& model, fsdp::comm::ProcessGroup& group) {
  double sum = 0.0, abs_sum = 0.0;
  for (const auto& p : model.parameters()) {
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

models::LoraConfig lora_config_of(const TrainConfig& c) {
  models::LoraConfig l;
  l.rank = c.lora_rank;
  l.alpha = c.lora_alpha;
  l.dropout = c.lora_dropout;
  try {
    l.target_modules = fsdp::planner::split_lora_targets(c.lora_target_modules);
  } catch (const fsdp::Error& e) {
    throw UsageError("--lora-target-modules: " + e.message());
  }
  return l;
}

std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::shared_ptr<torch::nn::Module>& model,
                                                    const models::ModelConfig& model_config, const TrainConfig& c) {
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& sp : fsdp::sharded_parameters(model)) {
    if (!sp.tensor.requires_grad()) continue;  // frozen (a LoRA base): no gradient, no optimizer state
    const bool embedding = models::is_embedding_param(model_config, sp.name);
    (sp.tensor.dim() >= 2 && !embedding ? decay : no_decay).push_back(sp.tensor);
  }
  auto adamw = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(1e-8).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, adamw(c.weight_decay));
  groups.emplace_back(no_decay, adamw(0.0));
  if (c.adamw_kernel == "fused") {
    return std::make_unique<fsdp::optim::FusedAdamW>(std::move(groups), torch::optim::AdamWOptions(c.lr));
  }
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(c.lr));
}

}  // namespace apps::train
