#include "fsdp/common/check.h"
#include "fsdp/common/hash.h"

#include <c10/util/Exception.h>

namespace fsdp {

std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid argument";
    case ErrorKind::kMismatch: return "mismatch across ranks";
    case ErrorKind::kState: return "illegal call order";
    case ErrorKind::kCollective: return "collective failed";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kOutOfMemory: return "out of memory";
    case ErrorKind::kCorruptData: return "corrupt data";
    case ErrorKind::kIo: return "I/O error";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kStepAbandoned: return "step abandoned";
  }
  return "?";
}

uint64_t fnv1a64(const void* data, size_t bytes, uint64_t seed) {
  uint64_t h = seed;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string join_first(const std::vector<std::string>& items, size_t shown) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < shown; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > shown) out += str_cat(" and ", items.size() - shown, " more");
  return out;
}

std::string error_prefix(const ErrorContext& where) {
  std::string s = where.rank >= 0 ? "[fsdp rank " + std::to_string(where.rank) + "]" : "[fsdp]";
  if (!where.unit.empty()) s += " unit '" + where.unit + "'";
  if (!where.op.empty()) s += " " + where.op;
  return s + ": ";
}

Error::Error(ErrorKind kind, ErrorContext where, const std::string& message)
    : std::runtime_error(error_prefix(where) + message),
      kind_(kind),
      where_(std::move(where)),
      message_(message) {}

}  // namespace fsdp
