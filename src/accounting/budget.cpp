// fsdp::OutOfMemory and the byte-size text helpers of the memory budget (the check itself is in
// counting_allocator.cpp, [Note: memory budget]).
#include "fsdp/accounting/budget.h"

#include "fsdp/common/bytes.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace fsdp {
namespace {

std::string refusal_message(int64_t requested, int64_t in_use, int64_t budget) {
  return str_cat("memory budget of ", accounting::format_bytes(budget), " exceeded: ",
                 expected_actual("bytes in use after allocating " + std::to_string(requested),
                                 str_cat("at most ", budget), in_use + requested),
                 " (", accounting::format_bytes(in_use), " in use, ", accounting::format_bytes(requested),
                 " asked)");
}

}  // namespace

OutOfMemory::OutOfMemory(ErrorContext where, int64_t requested_bytes, int64_t in_use_bytes, int64_t budget_bytes)
    : Error(ErrorKind::kOutOfMemory, std::move(where), refusal_message(requested_bytes, in_use_bytes, budget_bytes)),
      requested_bytes_(requested_bytes),
      in_use_bytes_(in_use_bytes),
      budget_bytes_(budget_bytes) {}

namespace accounting {

int64_t parse_bytes(const std::string& text) {
  const ErrorContext where{-1, "", "parse_bytes"};
  const char* begin = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  FSDP_CHECK(end != begin && std::isfinite(value) && value >= 0, ErrorKind::kInvalidArgument, where,
             expected_actual("byte size", "a number >= 0 with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)",
                             "'" + text + "'"));
  std::string unit;
  for (const char* c = end; *c; ++c) {
    if (!std::isspace(static_cast<unsigned char>(*c))) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
  }
  struct Unit {
    const char* name;
    double scale;
  };
  static const Unit kUnits[] = {{"", 1.0},      {"b", 1.0},         {"kb", 1e3},           {"mb", 1e6},
                                {"gb", 1e9},    {"tb", 1e12},       {"kib", 1024.0},       {"mib", 1048576.0},
                                {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& u : kUnits) {
    if (unit == u.name) return static_cast<int64_t>(std::llround(value * u.scale));
  }
  throw Error(ErrorKind::kInvalidArgument, where,
              expected_actual("unit of byte size '" + text + "'", "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB",
                              "'" + unit + "'"));
}

std::string format_bytes(int64_t bytes) {
  return format_byte_count(static_cast<double>(bytes), ByteUnits::kDecimal);
}

}  // namespace accounting
}  // namespace fsdp
