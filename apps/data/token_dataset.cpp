#include "data/token_dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "fsdp/common/hash.h"

namespace apps::data {

namespace {
constexpr char kMagic[8] = {'F', 'S', 'D', 'P', 'T', 'O', 'K', '1'};
constexpr uint32_t kVersion = 2;  // 2: ids_hash

// On-disk header of a token cache, followed by num_tokens ids of bytes_per_token bytes each.
struct CacheHeader {
  char magic[8];
  uint32_t version;
  uint32_t bytes_per_token;  // 2 (uint16) or 4 (int32)
  uint64_t num_tokens;
  uint64_t source_size;
  int64_t source_mtime_ns;
  uint64_t tokenizer_hash;
  uint64_t ids_hash;  // fsdp::fnv1a64 of the stored ids' bytes, as stored
};
static_assert(sizeof(CacheHeader) == 56, "cache header layout");

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

// A cache is derived data: one that does not match its source, its tokenizer, its own size, its
// ids' checksum or the vocabulary (ids in [0, vocab_size)) is a miss and gets rebuilt from the
// text. Returns "" on a hit, else why it missed ("absent" when there is no cache yet).
std::string read_cache(const std::string& path, const SourceInfo& src, uint64_t tok_hash,
                       int64_t vocab_size, std::vector<int32_t>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "absent";
  CacheHeader h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof(h)) || std::memcmp(h.magic, kMagic, 8) != 0 ||
      h.version != kVersion || (h.bytes_per_token != 2 && h.bytes_per_token != 4)) {
    return "its header is of another version or damaged";
  }
  if (h.source_size != src.size || h.source_mtime_ns != src.mtime_ns) return "the text changed since";
  if (h.tokenizer_hash != tok_hash) return "it was made with another tokenizer";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || h.num_tokens > (uint64_t(1) << 40) ||
      static_cast<uint64_t>(st.st_size) != sizeof(h) + h.bytes_per_token * h.num_tokens) {
    return "its size does not match its header (truncated or extended)";
  }
  std::string ids(h.bytes_per_token * h.num_tokens, '\0');
  if (!in.read(ids.data(), static_cast<std::streamsize>(ids.size()))) return "it could not be read";
  if (fsdp::fnv1a64(ids.data(), ids.size()) != h.ids_hash) return "its ids do not match their checksum (ids_hash)";
  out.resize(h.num_tokens);
  for (uint64_t i = 0; i < h.num_tokens; ++i) {
    if (h.bytes_per_token == 4) {
      int32_t v;
      std::memcpy(&v, ids.data() + 4 * i, 4);
      out[i] = v;
    } else {
      uint16_t v;
      std::memcpy(&v, ids.data() + 2 * i, 2);
      out[i] = v;
    }
    if (out[i] < 0 || out[i] >= vocab_size) return "it holds an id past the vocabulary";
  }
  return "";
}

void write_cache(const std::string& path, const SourceInfo& src, const Tokenizer& tok,
                 const std::vector<int32_t>& tokens) {
  CacheHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.bytes_per_token = tok.vocab_size() <= 65536 ? 2 : 4;
  h.num_tokens = tokens.size();
  h.source_size = src.size;
  h.source_mtime_ns = src.mtime_ns;
  h.tokenizer_hash = tok.model_hash();
  std::string tmp_path = path + ".tmp." + std::to_string(::getpid());
  auto fail = [&](const std::string& what) {
    const std::string why = errno ? std::strerror(errno) : "write error";
    std::remove(tmp_path.c_str());  // nothing half-written is left behind
    throw std::runtime_error("cannot " + what + " '" + tmp_path + "': " + why);
  };
  {
    errno = 0;
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    if (!out) fail("create");
    std::string ids(h.bytes_per_token * tokens.size(), '\0');
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (h.bytes_per_token == 4) {
        std::memcpy(ids.data() + 4 * i, &tokens[i], 4);
      } else {
        const uint16_t v = static_cast<uint16_t>(tokens[i]);
        std::memcpy(ids.data() + 2 * i, &v, 2);
      }
    }
    h.ids_hash = fsdp::fnv1a64(ids.data(), ids.size());
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    out.write(ids.data(), static_cast<std::streamsize>(ids.size()));
    if (out) out.close();
    if (!out) fail("write");
  }
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) fail("rename to '" + path + "'");
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
  SourceInfo src = stat_source(text_path);
  std::string cache = cache_path(text_path, tokenizer);
  std::vector<int32_t> tokens;
  const std::string miss = read_cache(cache, src, tokenizer.model_hash(), tokenizer.vocab_size(), tokens);
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
    write_cache(cache, src, tokenizer, tokens);
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
