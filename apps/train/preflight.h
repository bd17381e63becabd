// Checks before step 1 of what fsdp-train will need at its end: every output path can be written
// (a probe file in its directory) and has room (std::filesystem::space against the expected
// bytes), and the settings that need the tokenizer (the sample prompt, --sample-top-k) are valid.
// An error that would otherwise surface only after all the training is a usage error now.
#pragma once

#include <cstdint>

#include "fsdp/comm/process_group.h"
#include "train/train_config.h"

namespace apps::train {

/// What the checks need to know beyond the flags.
struct PreflightFacts {
  int64_t vocab_size = 0;        ///< tokenizer vocabulary, tokens
  int64_t prompt_tokens = 0;     ///< --sample-prompt encoded, tokens
  int64_t checkpoint_bytes = 0;  ///< one checkpoint of the whole model, all ranks' files together
  int64_t export_bytes = 0;      ///< the --export file
  /// Bytes this rank needs at least to build the model: the whole fp32 model (every rank builds it
  /// in full), or with --meta-init the model state of its shards (16 bytes per parameter / N).
  int64_t build_bytes = 0;
};

/// Model state bytes of a checkpoint or an export of `num_params` fp32 parameters (AdamW: param,
/// exp_avg, exp_avg_sq in a checkpoint; the params alone in an export), with a margin for the
/// headers, buffers and the RNG state.
int64_t checkpoint_bytes_of(int64_t num_params);
int64_t export_bytes_of(int64_t num_params);

/// The model's build bytes (facts.build_bytes) within this machine's memory and the memory
/// budget (a size from the flags is refused before anything of that size is allocated);
/// --save DIR (created by rank 0 if missing; every rank writes and removes a probe file there;
/// free space >= facts.checkpoint_bytes), --export, --metrics, --trace (their directory exists and
/// takes a probe file on rank 0; --export's has room for facts.export_bytes), --profile (the same on
/// every rank, which writes its own file), the flight recorder's directory of group's options (a
/// directory, or creatable by every rank; not created here), an --sample-prompt that encodes to no token while
/// --sample-tokens > 0, and --sample-top-k above the vocabulary.
/// Collective and blocking over group (one all-gather of the verdicts), every rank with the same
/// config. Throws UsageError on every rank naming the flag, the path, the rank and why.
void preflight(const TrainConfig& c, const PreflightFacts& facts, fsdp::comm::ProcessGroup& group);

}  // namespace apps::train
