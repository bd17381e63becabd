// The training job of fsdp-train: the GPT built identically on every rank and sharded with one
// FSDP unit per block, AdamW over this rank's shards, the step loop (micro-batches with gradient
// accumulation, loss scaling, clipping, the lr schedule), evaluation, checkpoints, the sample and
// the summary.
#pragma once

#include "fsdp/comm/process_group.h"
#include "train/train_config.h"

namespace apps::train {

/// Runs one fsdp-train job with config c: loads the corpus, builds and shards the model, resumes
/// or imports, trains steps start+1..c.steps (evaluating and saving as configured), then samples,
/// exports and writes the trace. Rank 0 prints and writes the metrics file. heap_retained is what
/// fsdp::accounting::retain_freed_heap_memory() returned (reported in the config event); the
/// counting allocator must be installed before.
///
/// Collective and blocking over group: every rank calls it with the same config. Throws
/// UsageError when a setting cannot be honoured and CheckpointError when a checkpoint operation
/// failed (both on every rank alike), anything else for a failure of this rank (its peers may then
/// be blocked in a collective).
void train(const TrainConfig& c, const fsdp::comm::ProcessGroupPtr& group, bool heap_retained);

}  // namespace apps::train
