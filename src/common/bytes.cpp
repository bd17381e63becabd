#include "fsdp/common/bytes.h"

#include <cmath>
#include <cstdio>

namespace fsdp {

std::string format_byte_count(double bytes, ByteUnits units) {
  static const char* const kDecimal[] = {"B", "KB", "MB", "GB", "TB"};
  static const char* const kDecimalLowerK[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  static const char* const kBinary[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  const char* const* names = units == ByteUnits::kBinary          ? kBinary
                             : units == ByteUnits::kDecimalLowerK ? kDecimalLowerK
                                                                  : kDecimal;
  const int largest = units == ByteUnits::kDecimalLowerK ? 5 : 4;
  const double base = units == ByteUnits::kBinary ? 1024.0 : 1000.0;
  double v = bytes;
  int u = 0;
  while (std::fabs(v) >= base && u < largest) {
    v /= base;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, names[u]);
  return buf;
}

}  // namespace fsdp
