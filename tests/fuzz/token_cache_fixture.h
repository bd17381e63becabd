// The token cache the fuzz_token_cache target reads: its key and ids (the seed that
// fuzz_make_seeds writes holds exactly these).
#pragma once

#include <cstdint>
#include <vector>

#include "data/token_cache.h"

namespace fsdp_fuzz {

/// A text of 123456 bytes and an mtime, and a tokenizer (its hash) whose vocabulary fits uint16
/// ids (wide = false) or needs int32 ids (wide = true).
inline apps::data::TokenCacheKey token_cache_key(bool wide) {
  // Two tokenizers: a model file's hash identifies its vocabulary.
  return {123456, 1700000000123456789, wide ? 0x5eed5eed00070000ULL : 0x5eed5eed00008192ULL, wide ? 70000 : 8192};
}

/// 300 ids in [0, vocab): i * 7919 mod vocab.
inline std::vector<int32_t> token_cache_ids(bool wide) {
  const int64_t vocab = token_cache_key(wide).vocab_size;
  std::vector<int32_t> ids(300);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 7919) % vocab);
  return ids;
}

}  // namespace fsdp_fuzz
