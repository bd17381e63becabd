// fsdp-train --dry-run: one rank of an N-rank job laid out and accounted by the real engine in this
// process (meta tensors, a simulated group; fsdp::dry_run), printed by kind. No data, no MPI job.
#pragma once

#include <string>

#include "fsdp/runtime/dry_run.h"
#include "train/train_config.h"

namespace apps::train {

/// What --dry-run reports.
struct DryRunReport {
  std::string model;       ///< preset name
  int world_size = 0;
  int rank = 0;
  fsdp::DryRunResult result;
};

/// Runs the dry run c describes: the --model preset built on the meta device (GPT presets at the
/// public GPT-2 vocabulary of 50257 tokens for gpt2*, --vocab-size for nano and micro; Llama-2
/// presets at 32000), wrapped as fsdp-train wraps it (one unit per block plus the root, the
/// --strategy / --mixed-precision / prefetch / hybrid settings), then one step of --micro-batch-size
/// (default: global batch / world size) sequences of --seq-len tokens and one AdamW step.
/// Not collective. Throws UsageError for settings the run cannot honour (the same checks as
/// training: divisibility, context length) and fsdp::Error from the engine.
DryRunReport run_dry_run(const TrainConfig& c);

/// The report as text: one line of context, then one line per kind (MiB and exact bytes).
std::string format_dry_run(const DryRunReport& r, const TrainConfig& c);

}  // namespace apps::train
