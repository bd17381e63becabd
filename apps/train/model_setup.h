// What fsdp-train builds before its first step, resolved from its TrainConfig: the batch geometry,
// the model's family and shape, the FSDP options of the block and root units, the check that every rank
// initialised the same parameters, and AdamW over this rank's shards.
#pragma once

#include <torch/optim/adamw.h>

#include <cstdint>
#include <memory>

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/options.h"
#include "models/lora.h"
#include "models/model_config.h"
#include "train/train_config.h"

namespace apps::train {

/// How a step's global batch of G sequences is cut on N ranks.
struct BatchGeometry {
  int64_t rows = 0;   ///< sequences per rank per step, G / N
  int64_t micro = 0;  ///< sequences per forward (--micro-batch-size; 0 there means rows)
  int64_t accum = 0;  ///< micro-batches per optimizer step, rows / micro
};

/// The geometry of c on world_size ranks. Not collective. Throws UsageError (the same on every
/// rank) when G is not divisible by world_size or micro does not divide the rows per rank.
BatchGeometry resolve_batch(const TrainConfig& c, int world_size);

/// The --model preset (GPT or Llama; vocab_size: the tokenizer's, or --vocab-size for
/// pre-tokenized data) with the flags' overrides (--n-layer, --n-head, --n-embd, --block-size;
/// Llama also --n-kv-head, --ffn-hidden); with --init-from-hf, the family and shape of its
/// config.json (GPT2LMHeadModel or LlamaForCausalLM), whose vocabulary must be vocab_size when
/// tokenizer_vocab (text read through the tokenizer; pre-tokenized ids are checked against the
/// model's vocabulary as they are read). Throws UsageError when the heads do not divide the width
/// (or, for Llama, the kv heads the heads), --n-kv-head / --ffn-hidden are given for a GPT,
/// --seq-len exceeds the context, or the config.json is unreadable, refused (naming the field) or
/// of another vocabulary.
models::ModelConfig resolve_model(const TrainConfig& c, int64_t vocab_size, bool tokenizer_vocab = true);

/// The options of every block unit: strategy, mixed precision (param and reduce dtype bf16/fp16),
/// forward prefetch, hybrid shard group size ("host": group.host_of_ranks()' ranks per host),
/// bucket size in bytes. Not collective. Throws UsageError (the same on every rank) for a strategy
/// the library does not know, or for "host" when the hosts hold different numbers of ranks or
/// non-consecutive ranks.
fsdp::FullyShardOptions resolve_fsdp_options(const TrainConfig& c, const fsdp::comm::ProcessGroup& group);

/// Intra-op threads for --threads c.threads: c.threads itself, or for 0 (auto) the number of CPUs
/// in this process's affinity mask (at least 1). Not collective.
int resolve_threads(const TrainConfig& c);

/// The root unit's options (embeddings, final norm, head): the blocks' options, with
/// fp32 outputs under mixed precision so that the logits and the loss are fp32.
fsdp::FullyShardOptions root_options_of(const fsdp::FullyShardOptions& blocks);

/// Fails unless every rank built bitwise-identical initial parameters (same seed, same build):
/// each rank's checksums (sum and sum of |p| over all parameters) are all-gathered and compared
/// with rank 0's. Call before sharding. Collective and blocking over group (one all-gather).
/// Throws std::runtime_error on every rank, naming the first rank that differs with rank 0's
/// checksums (expected) and its own (actual), and every rank that differs.
void check_identical_init(const torch::nn::Module& model, fsdp::comm::ProcessGroup& group);

/// The LoRA settings of c's --lora-* flags (rank 0: none): --lora-target-modules split at commas
/// (fsdp::planner::split_lora_targets),
/// blanks around each name dropped. Not collective. Throws UsageError for an empty name in the list.
models::LoraConfig lora_config_of(const TrainConfig& c);

/// AdamW (--lr, --beta1, --beta2, eps 1e-8) over this rank's shards of the sharded model's trainable
/// parameters (requires_grad: the adapters alone in a LoRA fine-tune), in two
/// groups: --weight-decay on the Linear weight matrices (Llama's untied lm_head included), none on
/// biases, norm weights and the embedding tables (models::is_embedding_param). --adamw-kernel
/// fused (the default) gives an fsdp::optim::FusedAdamW, libtorch a torch::optim::AdamW. Not collective.
std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::shared_ptr<torch::nn::Module>& model,
                                                    const models::ModelConfig& model_config, const TrainConfig& c);

}  // namespace apps::train
