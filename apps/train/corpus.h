// The token streams of an fsdp-train run: the tokenizer model it names, the training and
// validation texts tokenized once (cached beside them), and the distributed samplers over them.
#pragma once

#include <memory>
#include <string>

#include "data/batch_sampler.h"
#include "data/token_dataset.h"
#include "data/tokenizer.h"
#include "fsdp/comm/process_group.h"
#include "train/reporting.h"
#include "train/train_config.h"

namespace apps::train {

/// The training and validation token streams.
struct Corpus {
  std::string train_path;  ///< text file of the training tokens
  std::string val_path;    ///< text file of the validation tokens; "" = the last 5% of train_path's
  std::shared_ptr<const data::TokenDataset> train, val;
};

/// The SentencePiece model to read text with: --tokenizer FILE when given, else
/// <data_dir>/spm_<vocab_size>.model. Not collective. Throws UsageError (naming the flag, or the
/// script that prepares data_dir's) when the file does not exist.
std::string tokenizer_path(const TrainConfig& c);

/// True when --data names token ids rather than text: a file ending in .bin, or a folder holding
/// train.bin and val.bin (and no train.txt), as nanoGPT's prepare scripts write them: little-endian
/// ids of any tokenizer, no header, uint16 or (--data-dtype uint32) uint32. Not collective (the same answer on every rank of
/// a shared file system). Throws UsageError when --data names no file or folder (checked first,
/// before a tokenizer is looked for).
bool pretokenized_data(const TrainConfig& c);

/// Loads the corpus that --data names: a folder holding train.txt and val.txt, or one text file
/// whose last 5% of tokens (counted after tokenization) are the validation split; "" means
/// <data_dir>/corpus. Texts are tokenized once and cached (data::TokenDataset::load_or_build):
/// rank 0 builds the caches first, printing a line per text it tokenized, then the other ranks
/// read them. Pre-tokenized data (pretokenized_data: train.bin and val.bin, or one .bin whose last
/// 5% of ids are the validation split) is read as it is, tokenizer null; every id must be below
/// vocab_size (the model's).
/// Collective and blocking over group (one barrier). Throws UsageError when the files are missing,
/// a .bin is not whole ids of --data-dtype or holds an id past the vocabulary (naming the file, the id and
/// its position), std::runtime_error on I/O errors.
Corpus load_corpus(const TrainConfig& c, const data::Tokenizer* tokenizer, int64_t vocab_size,
                   fsdp::comm::ProcessGroup& group, Console& console);

/// The sampler of this rank (global batches of --global-batch-size windows of --seq-len + 1
/// tokens, seeded with --seed) over tokens. Not collective. Throws UsageError naming `split`
/// ("training", "validation") when the sizes do not fit (same verdict on every rank).
data::DistributedBatchSampler make_sampler(std::shared_ptr<const data::TokenDataset> tokens,
                                           const TrainConfig& c, int rank, int world_size,
                                           const char* split);

}  // namespace apps::train
