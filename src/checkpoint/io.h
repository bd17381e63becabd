// File primitives of the checkpoint subsystem (internal): CRC-32, durable writes (write + fsync of
// file and directory), positioned reads, atomic small-file replace. No tensors, no process group.
// See docs/checkpoints.md. Failures throw fsdp::Error of kind kIo (kCorruptData for a file shorter
// than a read needs) naming the path and the errno text, without rank or operation: callers add
// them ([Note: error agreement] in agreement.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fsdp::checkpoint::io {

/// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320): the same value as zlib.crc32 /
/// Python's zlib.crc32. crc32_update(0, ...) starts a new checksum; chain calls to extend it.
uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes);


/// "0x" + 16 lowercase hex digits.
std::string hex64(uint64_t v);

/// Appends bytes to a new file and keeps its running CRC-32 and size. Throws fsdp::Error (kIo) on
/// any failure. `budget(bytes_about_to_be_written)`, when set, returns how many of them may be
/// written: fewer writes that many and throws fsdp::Error (kIo, "injected fault ...": the test-only
/// crash simulation of SaveOptions::fault).
class FileWriter {
 public:
  FileWriter(std::string path, std::function<size_t(size_t)> budget = {});
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t bytes);
  /// fsync(2) the file (if durable) and close it.
  void close(bool durable);
  int64_t bytes() const { return bytes_; }
  uint32_t crc32() const { return crc_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::function<size_t(size_t)> budget_;
  int fd_ = -1;
  int64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

/// A read-only file opened for positioned reads.
class FileReader {
 public:
  /// Throws fsdp::Error (kIo, "cannot open '<path>'") when the file cannot be opened.
  explicit FileReader(std::string path);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  int64_t size() const { return size_; }
  /// Reads exactly `bytes` at `offset`; throws fsdp::Error (kCorruptData) past the end of the file.
  void read_at(int64_t offset, void* out, size_t bytes) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

/// Whole file as a string; throws fsdp::Error (kIo) if missing or unreadable.
std::string read_file(const std::string& path);

/// Writes `contents` to path via path + ".tmp" and rename(2), fsyncing the file and its directory
/// (if durable): readers see the old or the new contents, never a mix.
void atomic_write_file(const std::string& path, const std::string& contents, bool durable);

/// Writes a new file (no rename), fsyncs it if durable.
void write_file(const std::string& path, const std::string& contents, bool durable);

/// fsync(2) on a directory, making renames and creations inside it durable.
void fsync_dir(const std::string& dir);

}  // namespace fsdp::checkpoint::io
