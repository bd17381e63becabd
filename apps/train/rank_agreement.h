// The settings every rank of an fsdp-train job must share, compared across the ranks before step 1
// (a wrong hostfile, a per-node config file or a stale environment launches ranks with different
// flags; a collective pairs their steps anyway, or waits for the timeout).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/token_dataset.h"
#include "fsdp/comm/process_group.h"
#include "train/train_config.h"

namespace apps::train {

/// One setting as the ranks compare it: its flag ("--lr") and its value as text (numbers exact:
/// a double as the shortest text that reads back as it).
using Setting = std::pair<std::string, std::string>;

/// The settings of `c` that must agree across ranks: the model's shape, the data and tokenizer
/// (by name here; by content: data_settings), the optimizer and its schedule, the batch geometry,
/// the strategy and precision, the seed, evaluation and sampling (collective under FSDP), and the
/// checkpoint paths. Per-rank settings (--threads, --memory-budget, output paths of one rank,
/// --collective-timeout) are not in it. Not collective.
std::vector<Setting> shared_settings(const TrainConfig& c);

/// The identity of the token streams a run trains and validates on: token count and a 64-bit
/// FNV-1a of the ids, of each split ("--data (training tokens)", "--data (validation tokens)").
/// Not collective; O(tokens).
std::vector<Setting> data_settings(const data::TokenDataset& train, const data::TokenDataset& val);

/// Compares `mine` with every rank's (one all-gather of the texts). Collective and blocking over
/// group: every rank calls it at the same point. Throws UsageError on every rank alike when a
/// setting differs: one line naming the first such setting, each distinct value and the ranks
/// that hold it, and `remedy`.
void check_ranks_agree(const std::vector<Setting>& mine, fsdp::comm::ProcessGroup& group, const std::string& remedy);

}  // namespace apps::train
