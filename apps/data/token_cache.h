// The on-disk token cache of a text file: a 56-byte header (magic, version, bytes per id, count,
// the source's size and mtime, the tokenizer's hash, a checksum of the header and the ids)
// followed by the ids as
// uint16 (a vocabulary of at most 65536) or int32. No tokenizer needed to read or write one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace apps::data {

/// What a cache must match to be used: its text file (size, mtime in ns) and tokenizer (the model
/// file's fnv1a64 hash and vocabulary size; every id must lie in [0, vocab_size)).
struct TokenCacheKey {
  uint64_t source_size = 0;
  int64_t source_mtime_ns = 0;
  uint64_t tokenizer_hash = 0;
  int64_t vocab_size = 0;
};

/// Reads the cache at `path`. Returns "" and sets `out` when it matches `key`, its own size, its
/// checksum (fsdp::fnv1a64 of the header and the stored ids: every byte of the file) and the
/// vocabulary; else returns why not ("absent", "the text changed since", "its header or ids do
/// not match their checksum", ...)
/// and leaves `out` untouched. Every byte read back is checked; never throws for a file's content.
std::string read_token_cache(const std::string& path, const TokenCacheKey& key, std::vector<int32_t>& out);

/// Writes `tokens` (each in [0, key.vocab_size)) as the cache at `path`: to a temporary file
/// beside it, then renamed, so a concurrent reader never sees a partial file. Throws
/// std::runtime_error naming the temporary and errno when the disk refuses (a read-only or full
/// file system), leaving nothing behind.
void write_token_cache(const std::string& path, const TokenCacheKey& key, const std::vector<int32_t>& tokens);

}  // namespace apps::data
