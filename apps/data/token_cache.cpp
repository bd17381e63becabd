// The token cache file (token_cache.h).
#include "data/token_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "fsdp/common/hash.h"

namespace apps::data {

namespace {
constexpr char kMagic[8] = {'F', 'S', 'D', 'P', 'T', 'O', 'K', '1'};
constexpr uint32_t kVersion = 3;  // 2: a checksum of the ids; 3: of the header and the ids

// On-disk header of a token cache, followed by num_tokens ids of bytes_per_token bytes each.
struct CacheHeader {
  char magic[8];
  uint32_t version;
  uint32_t bytes_per_token;  // 2 (uint16) or 4 (int32)
  uint64_t num_tokens;
  uint64_t source_size;
  int64_t source_mtime_ns;
  uint64_t tokenizer_hash;
  uint64_t checksum;  // fsdp::fnv1a64 of this header (checksum 0) followed by the stored ids' bytes
};
static_assert(sizeof(CacheHeader) == 56, "cache header layout");

// What `checksum` must hold for header `h` and the ids' bytes.
uint64_t checksum_of(CacheHeader h, const std::string& ids) {
  h.checksum = 0;
  return fsdp::fnv1a64(ids.data(), ids.size(), fsdp::fnv1a64(&h, sizeof(h)));
}
}  // namespace

std::string read_token_cache(const std::string& path, const TokenCacheKey& key, std::vector<int32_t>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "absent";
  CacheHeader h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof(h)) || std::memcmp(h.magic, kMagic, 8) != 0 ||
      h.version != kVersion || (h.bytes_per_token != 2 && h.bytes_per_token != 4)) {
    return "its header is of another version or damaged";
  }
  if (h.source_size != key.source_size || h.source_mtime_ns != key.source_mtime_ns) return "the text changed since";
  if (h.tokenizer_hash != key.tokenizer_hash) return "it was made with another tokenizer";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || h.num_tokens > (uint64_t(1) << 40) ||
      static_cast<uint64_t>(st.st_size) != sizeof(h) + h.bytes_per_token * h.num_tokens) {
    return "its size does not match its header (truncated or extended)";
  }
  std::string ids(h.bytes_per_token * h.num_tokens, '\0');
  if (!in.read(ids.data(), static_cast<std::streamsize>(ids.size()))) return "it could not be read";
  if (checksum_of(h, ids) != h.checksum) return "its header or ids do not match their checksum";
  std::vector<int32_t> tokens(h.num_tokens);
  for (uint64_t i = 0; i < h.num_tokens; ++i) {
    if (h.bytes_per_token == 4) {
      int32_t v;
      std::memcpy(&v, ids.data() + 4 * i, 4);
      tokens[i] = v;
    } else {
      uint16_t v;
      std::memcpy(&v, ids.data() + 2 * i, 2);
      tokens[i] = v;
    }
    if (tokens[i] < 0 || tokens[i] >= key.vocab_size) return "it holds an id past the vocabulary";
  }
  out = std::move(tokens);
  return "";
}

void write_token_cache(const std::string& path, const TokenCacheKey& key, const std::vector<int32_t>& tokens) {
  CacheHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.bytes_per_token = key.vocab_size <= 65536 ? 2 : 4;
  h.num_tokens = tokens.size();
  h.source_size = key.source_size;
  h.source_mtime_ns = key.source_mtime_ns;
  h.tokenizer_hash = key.tokenizer_hash;
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
    h.checksum = checksum_of(h, ids);
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    out.write(ids.data(), static_cast<std::streamsize>(ids.size()));
    if (out) out.close();
    if (!out) fail("write");
  }
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) fail("rename to '" + path + "'");
}

}  // namespace apps::data
