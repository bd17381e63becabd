// Corpus loading (corpus.h): the folder or file --data names, tokenized by rank 0 first.
#include "train/corpus.h"

#include <algorithm>

#include <sys/stat.h>

#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <utility>

#include "train/errors.h"

namespace apps::train {
namespace {

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The ids of a .bin file (little-endian uint16 as nanoGPT writes them, or uint32 for a vocabulary
// past 65536: --data-dtype), each checked against the vocabulary.
data::TokenDataset read_ids(const std::string& path, const std::string& dtype, int64_t vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("--data: cannot open '" + path + "'");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t width = dtype == "uint32" ? 4 : 2;
  if (bytes.size() % width != 0) {
    throw UsageError("--data: '" + path + "' holds " + std::to_string(bytes.size()) + " bytes, not a whole number of " +
                     dtype + " token ids (--data-dtype)");
  }
  std::vector<int32_t> ids(bytes.size() / width);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint64_t id = 0;
    for (size_t b = 0; b < width; ++b) id |= uint64_t{static_cast<unsigned char>(bytes[width * i + b])} << (8 * b);
    if (id >= static_cast<uint64_t>(vocab_size)) {
      throw UsageError("--data: '" + path + "' holds token id " + std::to_string(id) + " at position " +
                       std::to_string(i) + ", past the model's vocabulary of " + std::to_string(vocab_size) +
                       " (ids of another tokenizer, or another --data-dtype?)");
    }
    ids[i] = static_cast<int32_t>(id);
  }
  // uint32 ids read as uint16 (no --data-dtype uint32): every other id is the high half, 0.
  if (width == 2 && ids.size() >= 64) {
    bool odd_zero = true, even_nonzero = false;
    for (size_t i = 0; i < std::min<size_t>(ids.size(), 4096); ++i) {
      if (i % 2 == 1 && ids[i] != 0) odd_zero = false;
      if (i % 2 == 0 && ids[i] != 0) even_nonzero = true;
    }
    if (odd_zero && even_nonzero) {
      throw UsageError("--data: '" + path + "' read as uint16 has 0 at every odd position: uint32 ids? "
                       "(give --data-dtype uint32)");
    }
  }
  return data::TokenDataset(std::move(ids));
}

}  // namespace

bool pretokenized_data(const TrainConfig& c) {
  if (c.data.empty()) return false;
  // Before anything reads a tokenizer for it: a mistyped path is that, not a missing tokenizer.
  if (!is_file(c.data) && !is_dir(c.data)) throw UsageError("--data: no file or folder at '" + c.data + "'");
  if (is_file(c.data)) return ends_with(c.data, ".bin");
  return is_dir(c.data) && is_file(c.data + "/train.bin") && !is_file(c.data + "/train.txt");
}

std::string tokenizer_path(const TrainConfig& c) {
  if (!c.tokenizer.empty()) {
    if (!is_file(c.tokenizer)) throw UsageError("--tokenizer: no file at '" + c.tokenizer + "'");
    return c.tokenizer;
  }
  const std::string path = c.data_dir + "/spm_" + std::to_string(c.vocab_size) + ".model";
  if (!is_file(path)) {
    throw UsageError("no tokenizer at " + path + ": run scripts/prepare_data.sh " + c.data_dir +
                     " " + std::to_string(c.vocab_size));
  }
  return path;
}

Corpus load_corpus(const TrainConfig& c, const data::Tokenizer* tok, int64_t vocab_size,
                   fsdp::comm::ProcessGroup& group, Console& console) {
  Corpus corpus;
  std::string src = c.data.empty() ? c.data_dir + "/corpus" : c.data;
  if (pretokenized_data(c)) {
    corpus.train_path = is_dir(src) ? src + "/train.bin" : src;
    corpus.val_path = is_dir(src) ? src + "/val.bin" : "";
    if (!corpus.val_path.empty() && !is_file(corpus.val_path)) {
      throw UsageError("--data: folder '" + src + "' has train.bin but no val.bin");
    }
    data::TokenDataset train = read_ids(corpus.train_path, c.data_dtype, vocab_size);
    if (corpus.val_path.empty()) {
      const int64_t cut = train.size() - train.size() / 20;
      corpus.val = std::make_shared<const data::TokenDataset>(train.slice(cut, train.size()));
      corpus.train = std::make_shared<const data::TokenDataset>(train.slice(0, cut));
    } else {
      corpus.train = std::make_shared<const data::TokenDataset>(std::move(train));
      corpus.val = std::make_shared<const data::TokenDataset>(read_ids(corpus.val_path, c.data_dtype, vocab_size));
    }
    return corpus;
  }
  if (tok == nullptr) throw UsageError("--data: text needs a tokenizer");
  if (is_dir(src)) {
    corpus.train_path = src + "/train.txt";
    corpus.val_path = src + "/val.txt";
    for (const auto& p : {corpus.train_path, corpus.val_path}) {
      if (!is_file(p)) {
        throw UsageError(
            "--data: folder '" + src + "' has no " + p.substr(src.size() + 1) +
            (c.data.empty() ? " (run scripts/prepare_data.sh " + c.data_dir + ")" : ""));
      }
    }
  } else if (is_file(src)) {
    corpus.train_path = src;
  } else {
    throw UsageError("--data: '" + src + "' is neither a file nor a folder" +
                     (c.data.empty() ? " (run scripts/prepare_data.sh " + c.data_dir + ")" : ""));
  }
  auto load = [&](const std::string& path) {
    bool built = false;
    std::string why, cache_error;
    auto t0 = Clock::now();
    auto d = data::TokenDataset::load_or_build(path, *tok, &built, &why, &cache_error);
    if (built) {
      const std::string cache = data::TokenDataset::cache_path(path, *tok);
      console.line("tokenized " + path + ": " + human_count(static_cast<double>(d.size())) + " tokens in " +
                   std::to_string(seconds_since(t0)).substr(0, 4) + " s (" +
                   (cache_error.empty() ? "cached as " + cache : "not cached: " + cache_error) +
                   (why == "absent" ? ")" : "; the cache there was not used: " + why + ")"));
    }
    return d;
  };
  // Rank 0 tokenizes and writes the caches; the others read them after the barrier.
  auto load_all = [&] {
    data::TokenDataset train = load(corpus.train_path);
    if (corpus.val_path.empty()) {
      int64_t cut = train.size() - train.size() / 20;
      corpus.val = std::make_shared<const data::TokenDataset>(train.slice(cut, train.size()));
      corpus.train = std::make_shared<const data::TokenDataset>(train.slice(0, cut));
    } else {
      corpus.train = std::make_shared<const data::TokenDataset>(std::move(train));
      corpus.val = std::make_shared<const data::TokenDataset>(load(corpus.val_path));
    }
  };
  if (group.rank() == 0) load_all();
  group.barrier()->wait();
  if (group.rank() != 0) load_all();
  return corpus;
}

data::DistributedBatchSampler make_sampler(std::shared_ptr<const data::TokenDataset> tokens,
                                           const TrainConfig& c, int rank, int world_size,
                                           const char* split) {
  // The sampler checks sizes the same way on every rank: a rejection is a usage error (clean exit
  // on all ranks), not a crash.
  try {
    return data::DistributedBatchSampler(std::move(tokens), c.global_batch_size, c.seq_len, rank,
                                         world_size, c.seed);
  } catch (const std::exception& e) {
    throw UsageError(std::string(split) + " data: " + e.what());
  }
}

}  // namespace apps::train
