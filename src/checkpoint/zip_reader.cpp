#include "zip_reader.h"

#include <cstdio>
#include <utility>

#include "io.h"

namespace fsdp::checkpoint {

namespace {

constexpr uint64_t kSaturated32 = 0xffffffff;  // a 32-bit field whose value is in the zip64 extra

// Little-endian n-byte integer at b[at..at+n); the caller has checked the bounds.
uint64_t le(const std::string& b, uint64_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

// Whether b[at..at+n) lies inside b (no overflow for any at, n).
bool inside(const std::string& b, uint64_t at, uint64_t n) { return at <= b.size() && n <= b.size() - at; }

}  // namespace

ZipArchive::ZipArchive(std::string bytes, ErrorContext who, std::string what)
    : bytes_(std::move(bytes)), who_(std::move(who)), what_(std::move(what)) {
  read_directory();
}

void ZipArchive::fail(const std::string& why) const {
  throw Error(ErrorKind::kCorruptData, who_, what_ + ": " + why);
}

void ZipArchive::read_directory() {
  const std::string& b = bytes_;
  constexpr uint64_t kEocd = 22, kLocator = 20, kZip64Eocd = 56, kCentral = 46;
  if (b.size() < kEocd) fail("too short for a zip archive");
  uint64_t e = b.size() - kEocd;  // the end-of-directory record: the last one, as unzip finds it
  while (b.compare(e, 4, "PK\x05\x06") != 0) {
    if (e == 0 || b.size() - e > kEocd + 65535) fail("no zip end-of-directory record (truncated?)");
    --e;
  }
  uint64_t entries = le(b, e + 10, 2), offset = le(b, e + 16, 4);
  // A zip64 locator just before it points to the zip64 record, whose counts replace these.
  if (e >= kLocator && b.compare(e - kLocator, 4, "PK\x06\x07") == 0) {
    const uint64_t z = le(b, e - kLocator + 8, 8);
    if (!inside(b, z, kZip64Eocd) || b.compare(z, 4, "PK\x06\x06") != 0) fail("a bad zip64 directory");
    entries = le(b, z + 32, 8);
    offset = le(b, z + 48, 8);
  }
  for (uint64_t i = 0, at = offset; i < entries; ++i) {
    if (!inside(b, at, kCentral) || b.compare(at, 4, "PK\x01\x02") != 0) fail("a bad zip directory");
    const uint64_t n = le(b, at + 28, 2), x = le(b, at + 30, 2), c = le(b, at + 32, 2);
    if (!inside(b, at + kCentral, n + x)) fail("a bad zip directory");
    Entry entry;
    entry.flags = le(b, at + 8, 2);
    entry.method = le(b, at + 10, 2);
    entry.crc32 = static_cast<uint32_t>(le(b, at + 16, 4));
    entry.comp_bytes = le(b, at + 20, 4);
    entry.bytes = le(b, at + 24, 4);
    entry.local_offset = le(b, at + 42, 4);
    // Zip64 extended information (header 1): 8-byte values of the saturated fields, in this order.
    const uint64_t extra_end = at + kCentral + n + x;
    for (uint64_t p = at + kCentral + n; p + 4 <= extra_end;) {
      const uint64_t id = le(b, p, 2), len = le(b, p + 2, 2);
      if (p + 4 + len > extra_end) fail("a bad zip directory");
      if (id == 1) {
        uint64_t q = p + 4;
        for (uint64_t* field : {&entry.bytes, &entry.comp_bytes, &entry.local_offset}) {
          if (*field != kSaturated32) continue;
          if (q + 8 > p + 4 + len) fail("a bad zip64 directory entry");
          *field = le(b, q, 8);
          q += 8;
        }
      }
      p += 4 + len;
    }
    std::string name = b.substr(at + kCentral, n);
    if (!entries_.emplace(name, entry).second) fail("two of its records are named '" + name + "'");
    names_.push_back(std::move(name));
    at += kCentral + n + x + c;
  }
}

std::string ZipArchive::read(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail("the archive has no record '" + name + "'");
  const Entry& z = it->second;
  const std::string& b = bytes_;
  if (z.flags & (1 | 32 | 64)) fail("record '" + name + "' is encrypted or patched");
  if (z.method != 0 || z.comp_bytes != z.bytes) {
    fail("record '" + name + "' is compressed (torch.save stores every record)");
  }
  const uint64_t at = z.local_offset;
  if (!inside(b, at, 30) || b.compare(at, 4, "PK\x03\x04") != 0) fail("record '" + name + "' has no local header");
  const uint64_t begin = at + 30 + le(b, at + 26, 2) + le(b, at + 28, 2);
  if (!inside(b, begin, z.bytes)) fail("record '" + name + "' extends past the end of the archive");
  std::string data = b.substr(begin, z.bytes);
  const uint32_t crc = io::crc32_update(0, data.data(), data.size());
  if (crc != z.crc32) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "the directory's CRC-32 0x%08x, the bytes' 0x%08x", z.crc32, crc);
    fail(z.crc32 == 0 ? "record '" + name + "' carries no CRC-32 (saved with torch.serialization."
                        "set_crc32_options(False)): save it with CRCs, the default, to read it"
                      : "record '" + name + "' does not match its CRC-32 (damaged): " + buf);
  }
  return data;
}

}  // namespace fsdp::checkpoint
