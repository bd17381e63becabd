#include "data/token_dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace apps::data {

namespace {
constexpr char kMagic[8] = {'F', 'S', 'D', 'P', 'T', 'O', 'K', '1'};

// On-disk header of a token cache, followed by num_tokens ids of bytes_per_token bytes each.
struct CacheHeader {
  char magic[8];
  uint32_t version;
  uint32_t bytes_per_token;  // 2 (uint16) or 4 (int32)
  uint64_t num_tokens;
  uint64_t source_size;
  int64_t source_mtime_ns;
  uint64_t tokenizer_hash;
};
static_assert(sizeof(CacheHeader) == 48, "cache header layout");

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

// A cache is derived data: one that does not match its source, its tokenizer, its own size or
// the vocabulary (ids in [0, vocab_size)) is a miss and gets rebuilt from the text.
bool read_cache(const std::string& path, const SourceInfo& src, uint64_t tok_hash,
                int64_t vocab_size, std::vector<int32_t>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  CacheHeader h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof(h))) return false;
  if (std::memcmp(h.magic, kMagic, 8) != 0 || h.version != 1 || h.source_size != src.size ||
      h.source_mtime_ns != src.mtime_ns || h.tokenizer_hash != tok_hash ||
      (h.bytes_per_token != 2 && h.bytes_per_token != 4)) {
    return false;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || h.num_tokens > (uint64_t(1) << 40) ||
      static_cast<uint64_t>(st.st_size) != sizeof(h) + h.bytes_per_token * h.num_tokens) {
    return false;  // truncated, extended or a corrupt count
  }
  out.resize(h.num_tokens);
  if (h.bytes_per_token == 4) {
    in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(4 * h.num_tokens));
  } else {
    std::vector<uint16_t> tmp(h.num_tokens);
    in.read(reinterpret_cast<char*>(tmp.data()), static_cast<std::streamsize>(2 * h.num_tokens));
    for (size_t i = 0; i < tmp.size(); ++i) out[i] = tmp[i];
  }
  if (!in) return false;
  for (int32_t id : out) {
    if (id < 0 || id >= vocab_size) return false;
  }
  return true;
}

void write_cache(const std::string& path, const SourceInfo& src, const Tokenizer& tok,
                 const std::vector<int32_t>& tokens) {
  CacheHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = 1;
  h.bytes_per_token = tok.vocab_size() <= 65536 ? 2 : 4;
  h.num_tokens = tokens.size();
  h.source_size = src.size;
  h.source_mtime_ns = src.mtime_ns;
  h.tokenizer_hash = tok.model_hash();
  std::string tmp_path = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("token dataset: cannot write '" + tmp_path + "'");
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    if (h.bytes_per_token == 4) {
      out.write(reinterpret_cast<const char*>(tokens.data()),
                static_cast<std::streamsize>(4 * tokens.size()));
    } else {
      std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
      out.write(reinterpret_cast<const char*>(narrow.data()),
                static_cast<std::streamsize>(2 * narrow.size()));
    }
    if (!out) throw std::runtime_error("token dataset: write failed for '" + tmp_path + "'");
  }
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    std::remove(tmp_path.c_str());
    throw std::runtime_error("token dataset: cannot rename '" + tmp_path + "' to '" + path + "'");
  }
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
                                         bool* built) {
  SourceInfo src = stat_source(text_path);
  std::string cache = cache_path(text_path, tokenizer);
  std::vector<int32_t> tokens;
  if (read_cache(cache, src, tokenizer.model_hash(), tokenizer.vocab_size(), tokens)) {
    if (built) *built = false;
    return TokenDataset(std::move(tokens));
  }
  std::ifstream in(text_path, std::ios::binary);
  if (!in) throw std::runtime_error("token dataset: cannot open '" + text_path + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  tokens = tokenizer.encode(text);
  write_cache(cache, src, tokenizer, tokens);
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
