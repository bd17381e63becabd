// A non-cryptographic 64-bit hash for fingerprints and content checks (model fingerprints in
// checkpoint manifests, unit names in the collective check, token caches, token streams compared
// across ranks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fsdp {

/// FNV-1a, 64 bits, over `bytes` bytes at `data`; `seed` continues an earlier hash. The offset
/// basis is the one this project has always used, 1469598103934665603 (one digit short of the
/// published 14695981039346656037): saved fingerprints and token caches depend on it, so it
/// stays. The same value on every host. Not collective; O(bytes).
uint64_t fnv1a64(const void* data, size_t bytes, uint64_t seed = 1469598103934665603ull);
/// fnv1a64 of the string's bytes.
inline uint64_t fnv1a64(const std::string& s) { return fnv1a64(s.data(), s.size()); }

}  // namespace fsdp
