// libFuzzer target: the bytes are a token cache (apps/data/token_cache.h) of the fixture's key,
// read once as a cache of uint16 ids and once as one of int32 ids. The reader must never throw or
// crash, and when it accepts the file, the ids must be exactly the fixture's: a cache that
// differs from what was written in any byte that matters is a miss (then rebuilt from the text).
// Seeds: the two valid caches fuzz_make_seeds writes.
#include <cstdio>
#include <fstream>
#include <string>

#include "fuzz_fixture.h"
#include "token_cache_fixture.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = fsdp_fuzz::private_dir("token-cache") + "/train.txt.spm.tok";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  for (bool wide : {false, true}) {
    std::vector<int32_t> ids{-1};
    const std::string miss = apps::data::read_token_cache(path, fsdp_fuzz::token_cache_key(wide), ids);
    if (miss.empty() && ids != fsdp_fuzz::token_cache_ids(wide)) {
      std::fprintf(stderr, "a token cache with other ids was accepted (%zu ids)\n", ids.size());
      __builtin_trap();
    }
    if (!miss.empty() && ids != std::vector<int32_t>{-1}) {
      std::fprintf(stderr, "a missed token cache changed the output (%s)\n", miss.c_str());
      __builtin_trap();
    }
  }
  return 0;
}
