#include "train/rank_agreement.h"

#include <cstdio>
#include <cstdlib>
#include <map>

#include "fsdp/common/check.h"
#include "fsdp/common/hash.h"
#include "train/errors.h"

namespace apps::train {
namespace {

// The shortest text that reads back as exactly v (0.9, not 0.90000000000000002).
std::string exact(double v) {
  char buf[32];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string text(const std::optional<std::string>& v) { return v ? *v : "(unset)"; }
std::string text(const std::optional<double>& v) { return v ? exact(*v) : "(unset)"; }

std::string identity(const data::TokenDataset& d) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%lld tokens, fnv1a %016llx", static_cast<long long>(d.size()),
                static_cast<unsigned long long>(fsdp::fnv1a64(d.data(), sizeof(int32_t) * d.size())));
  return buf;
}

// One setting per line, "flag\tvalue", newlines and tabs of values escaped.
std::string serialize(const std::vector<Setting>& settings) {
  std::string out;
  for (const auto& [flag, value] : settings) {
    out += flag + '\t';
    for (char ch : value) {
      if (ch == '\n') out += "\\n";
      else if (ch == '\t') out += "\\t";
      else if (ch == '\\') out += "\\\\";
      else out += ch;
    }
    out += '\n';
  }
  return out;
}

std::vector<Setting> parse(const std::string& s) {
  std::vector<Setting> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t end = s.find('\n', pos);
    const std::string line = s.substr(pos, end - pos);
    const size_t tab = line.find('\t');
    out.emplace_back(line.substr(0, tab), tab == std::string::npos ? "" : line.substr(tab + 1));
    pos = end == std::string::npos ? s.size() : end + 1;
  }
  return out;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::vector<std::string> items;
  for (int r : ranks) items.push_back(std::to_string(r));
  return (ranks.size() == 1 ? "rank " : "ranks ") + fsdp::join_first(items, 8);
}

}  // namespace

std::vector<Setting> shared_settings(const TrainConfig& c) {
  return {
      {"--dry-run", c.dry_run ? "true" : "false"},
      {"--model", c.model},
      {"--n-layer", std::to_string(c.n_layer)},
      {"--n-head", std::to_string(c.n_head)},
      {"--n-embd", std::to_string(c.n_embd)},
      {"--n-kv-head", std::to_string(c.n_kv_head)},
      {"--ffn-hidden", std::to_string(c.ffn_hidden)},
      {"--lora-rank", std::to_string(c.lora_rank)},
      {"--lora-alpha", exact(c.lora_alpha)},
      {"--lora-dropout", exact(c.lora_dropout)},
      {"--lora-target-modules", c.lora_target_modules},
      {"--data-dtype", c.data_dtype},
      {"--block-size", std::to_string(c.block_size)},
      {"--attention", c.attention},
      {"--meta-init", c.meta_init ? "true" : "false"},
      {"--vocab-size", std::to_string(c.vocab_size)},
      {"--strategy", c.strategy},
      {"--mixed-precision", c.mixed_precision},
      {"--forward-prefetch", c.forward_prefetch ? "true" : "false"},
      {"--hybrid-shard-group-size", text(c.hybrid_shard_group_size)},
      {"--bucket-cap-mb", text(c.bucket_cap_mb)},
      {"--all-gather-codec", c.all_gather_codec},
      {"--reshard-after-forward", text(c.reshard_after_forward)},
      {"--reduce-scatter-codec", c.reduce_scatter_codec},
      {"--host-aware-collectives", text(c.host_aware_collectives)},
      {"--activation-checkpointing", c.activation_checkpointing ? "true" : "false"},
      {"--global-batch-size", std::to_string(c.global_batch_size)},
      {"--micro-batch-size", std::to_string(c.micro_batch_size)},
      {"--seq-len", std::to_string(c.seq_len)},
      {"--steps", std::to_string(c.steps)},
      {"--lr", exact(c.lr)},
      {"--min-lr", exact(c.min_lr)},
      {"--warmup-steps", std::to_string(c.warmup_steps)},
      {"--weight-decay", exact(c.weight_decay)},
      {"--beta1", exact(c.beta1)},
      {"--beta2", exact(c.beta2)},
      {"--adamw-kernel", c.adamw_kernel},
      {"--grad-clip", exact(c.grad_clip)},
      {"--seed", std::to_string(c.seed)},
      {"--on-nonfinite", c.on_nonfinite},
      {"--on-output-error", c.on_output_error},
      {"--eval-every", std::to_string(c.eval_every)},
      {"--eval-batches", std::to_string(c.eval_batches)},
      {"--sample-tokens", std::to_string(c.sample_tokens)},
      {"--sample-temperature", exact(c.sample_temperature)},
      {"--sample-top-k", std::to_string(c.sample_top_k)},
      {"--sample-prompt", c.sample_prompt},
      {"--save", c.save},
      {"--save-every", std::to_string(c.save_every)},
      {"--keep", std::to_string(c.keep)},
      {"--resume", c.resume},
      {"--export", c.export_path},
      {"--import", c.import_path},
      {"--init-from-hf", c.init_from_hf},
      {"--export-hf", c.export_hf},
      {"--export-hf-dtype", c.export_hf_dtype},
      {"--export-adapter", c.export_adapter},
      {"--import-optimizer", c.import_optimizer_path},
  };
}

std::vector<Setting> data_settings(const data::TokenDataset& train, const data::TokenDataset& val) {
  return {{"--data (training tokens)", identity(train)}, {"--data (validation tokens)", identity(val)}};
}

void check_ranks_agree(const std::vector<Setting>& mine, fsdp::comm::ProcessGroup& group, const std::string& remedy) {
  if (group.size() == 1) return;
  const std::vector<std::string> all = fsdp::comm::all_gather_strings(group, serialize(mine));
  std::vector<std::vector<Setting>> per_rank;
  for (const auto& s : all) per_rank.push_back(parse(s));
  for (size_t i = 0; i < per_rank[0].size(); ++i) {
    std::map<std::string, std::vector<int>> holders;  // value -> ranks, in rank order
    std::vector<std::string> order;
    for (int r = 0; r < group.size(); ++r) {
      const std::string value = i < per_rank[r].size() ? per_rank[r][i].second : "(missing)";
      if (!holders.count(value)) order.push_back(value);
      holders[value].push_back(r);
    }
    if (order.size() == 1) continue;
    std::string msg = "ranks disagree on " + per_rank[0][i].first + ":";
    for (size_t k = 0; k < order.size(); ++k) {
      const std::string shown = order[k].size() > 80 ? order[k].substr(0, 77) + "..." : order[k];
      msg += (k ? "; " : " ") + ranks_text(holders[order[k]]) + " '" + shown + "'";
    }
    throw UsageError(msg + " (" + remedy + ")");
  }
}

}  // namespace apps::train
