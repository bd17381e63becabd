// A byte count as people read it ("600.0 MB", "1.5 GiB"): one formatter for every message, report
// and table of the library and its programs.
#pragma once

#include <string>

namespace fsdp {

/// The units a byte count is written in. Each caller keeps the spelling its users (and tests) know.
enum class ByteUnits {
  kDecimal,         ///< powers of 1000: B, KB, MB, GB, TB (memory budgets, fsdp-train's preflight)
  kDecimalLowerK,   ///< powers of 1000: B, kB, MB, GB, TB, PB (the planner's tables and notes)
  kBinary,          ///< powers of 1024: B, KiB, MiB, GiB, TiB (fsdp-train's step reports)
};

/// `bytes` in the largest unit of `units` whose value stays >= 1 in magnitude (or the largest
/// unit there is): whole bytes as "999 B", larger units with one decimal, "600.0 MB". Negative
/// counts keep their sign.
std::string format_byte_count(double bytes, ByteUnits units);

}  // namespace fsdp
