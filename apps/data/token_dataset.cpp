#include "data/token_dataset.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "data/token_cache.h"

namespace apps::data {

namespace {
struct SourceInfo {
  uint64_t size;
  int64_t mtime_ns;
};

SourceInfo stat_source(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw std::runtime_error("token dataset: cannot stat '" + path + "': " + std::strerror(errno));
  }
  return {static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}
}  // namespace

std::string TokenDataset::cache_path(const std::string& text_path, const Tokenizer& tokenizer) {
  std::string stem = tokenizer.model_path();
  size_t slash = stem.find_last_of('/');
  if (slash != std::string::npos) stem = stem.substr(slash + 1);
  size_t dot = stem.find_last_of('.');
  if (dot != std::string::npos && dot > 0) stem = stem.substr(0, dot);
  return text_path + "." + stem + ".tok";
}

TokenDataset TokenDataset::load_or_build(const std::string& text_path, const Tokenizer& tokenizer,
                                         bool* built, std::string* why_built, std::string* cache_error) {
  const SourceInfo src = stat_source(text_path);
  // A cache is derived data: one that does not match its source, its tokenizer, its own size, its
  // ids' checksum or the vocabulary is a miss and gets rebuilt from the text.
  const TokenCacheKey key{src.size, src.mtime_ns, tokenizer.model_hash(), tokenizer.vocab_size()};
  std::string cache = cache_path(text_path, tokenizer);
  std::vector<int32_t> tokens;
  const std::string miss = read_token_cache(cache, key, tokens);
  if (miss.empty()) {
    if (built) *built = false;
    return TokenDataset(std::move(tokens));
  }
  if (why_built) *why_built = miss;
  std::ifstream in(text_path, std::ios::binary);
  if (!in) throw std::runtime_error("token dataset: cannot open '" + text_path + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  tokens = tokenizer.encode(text);
  try {
    write_token_cache(cache, key, tokens);
  } catch (const std::runtime_error& e) {
    // A cache is an optimisation: a read-only or full disk costs the next run the tokenization.
    if (!cache_error) throw;
    *cache_error = e.what();
  }
  if (built) *built = true;
  return TokenDataset(std::move(tokens));
}

TokenDataset TokenDataset::slice(int64_t begin, int64_t end) const {
  if (begin < 0 || end < begin || end > size()) {
    throw std::out_of_range("token dataset: slice [" + std::to_string(begin) + ", " +
                            std::to_string(end) + ") of " + std::to_string(size()) + " tokens");
  }
  return TokenDataset(std::vector<int32_t>(tokens_.begin() + begin, tokens_.begin() + end));
}

}  // namespace apps::data
