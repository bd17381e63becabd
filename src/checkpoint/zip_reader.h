// Reading the zip archives that torch.save writes (internal): the central directory, then each
// record's bytes through its local header. torch.save stores every record uncompressed, and this
// reader reads stored records only (a compressed one is an error that says so). It replaces
// libtorch's PyTorchStreamReader, which ends the process on some malformed archives (a fatal
// CAFFE_ENFORCE) and leaks its zip state whenever its constructor throws (docs/testing.md,
// "Findings"). Not thread-safe; not collective.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fsdp/common/check.h"

namespace fsdp::checkpoint {

class ZipArchive {
 public:
  /// Reads the directory of the archive `bytes` (zip64 records included). Throws fsdp::Error
  /// (kCorruptData, context `who`) "<what>: <why>" when there is no end-of-directory record, the
  /// directory does not lie inside the bytes, or two records have the same name.
  ZipArchive(std::string bytes, ErrorContext who, std::string what);

  /// The record names, in directory order.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  /// The bytes of record `name`, checked against the record's CRC-32 in the directory. Throws
  /// fsdp::Error (kCorruptData) "<what>: ..." when it is missing, compressed, encrypted, its local
  /// header or data is not inside the archive, its bytes do not match its CRC-32 (naming both), or
  /// it carries no CRC-32 (a CRC of 0 over bytes whose CRC is not 0: written with
  /// torch.serialization.set_crc32_options(False); libtorch's reader checks none, this one every
  /// byte it returns).
  std::string read(const std::string& name) const;

 private:
  struct Entry {
    uint64_t flags = 0, method = 0, comp_bytes = 0, bytes = 0, local_offset = 0;
    uint32_t crc32 = 0;
  };
  [[noreturn]] void fail(const std::string& why) const;
  void read_directory();

  std::string bytes_;
  ErrorContext who_;
  std::string what_;
  std::vector<std::string> names_;
  std::map<std::string, Entry> entries_;
};

}  // namespace fsdp::checkpoint
