#include "io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fsdp/common/check.h"

namespace fsdp::checkpoint::io {

namespace {

// Slicing-by-8 tables for the reflected polynomial 0xEDB88320.
struct CrcTables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  CrcTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};
const CrcTables& tables() {
  static const CrcTables tabs;
  return tabs;
}

std::string errno_text() { return std::strerror(errno); }

// File primitives know no rank or operation: callers' agreements add them
// ([Note: error agreement] in agreement.h).
const ErrorContext kNoContext{};

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
  const auto& t = tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (bytes >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;  // little-endian hosts (checked in docs/checkpoints.md: files are host-endian)
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    bytes -= 8;
  }
  while (bytes--) c = t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

std::string hex64(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

FileWriter::FileWriter(std::string path, std::function<size_t(size_t)> budget)
    : path_(std::move(path)), budget_(std::move(budget)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FSDP_CHECK(fd_ >= 0, ErrorKind::kIo, kNoContext, "cannot create '", path_, "': ", errno_text());
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t bytes) {
  FSDP_CHECK(fd_ >= 0, ErrorKind::kState, kNoContext, "write to closed file '", path_, "'");
  const size_t allowed = budget_ ? std::min(budget_(bytes), bytes) : bytes;
  const char* p = static_cast<const char*>(data);
  size_t left = allowed;
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    FSDP_CHECK(n > 0, ErrorKind::kIo, kNoContext, "write to '", path_, "' failed after ", bytes_ + (allowed - left),
               " bytes: ", errno_text());
    p += n;
    left -= static_cast<size_t>(n);
  }
  FSDP_CHECK(allowed == bytes, ErrorKind::kIo, kNoContext, "injected fault: simulated crash after writing ",
             bytes_ + static_cast<int64_t>(allowed), " bytes of '", path_, "'");
  crc_ = crc32_update(crc_, data, bytes);
  bytes_ += static_cast<int64_t>(bytes);
}

void FileWriter::close(bool durable) {
  if (fd_ < 0) return;
  if (durable) FSDP_CHECK(::fsync(fd_) == 0, ErrorKind::kIo, kNoContext, "fsync of '", path_, "' failed: ", errno_text());
  int rc = ::close(fd_);
  fd_ = -1;
  FSDP_CHECK(rc == 0, ErrorKind::kIo, kNoContext, "close of '", path_, "' failed: ", errno_text());
}

FileReader::FileReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK(fd_ >= 0, ErrorKind::kIo, kNoContext, "cannot open '", path_, "': ", errno_text());
  struct stat st {};
  FSDP_CHECK(::fstat(fd_, &st) == 0, ErrorKind::kIo, kNoContext, "cannot stat '", path_, "': ", errno_text());
  size_ = static_cast<int64_t>(st.st_size);
}

FileReader::~FileReader() {
  if (fd_ >= 0) ::close(fd_);
}

void FileReader::read_at(int64_t offset, void* out, size_t bytes) const {
  char* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    FSDP_CHECK(n >= 0, ErrorKind::kIo, kNoContext, "read of '", path_, "' at byte ", offset + done, " failed: ", errno_text());
    FSDP_CHECK(n > 0, ErrorKind::kCorruptData, kNoContext, "file '", path_, "' is truncated: wanted bytes [", offset, ", ",
               offset + static_cast<int64_t>(bytes), "), the file has ", size_, " bytes");
    done += static_cast<size_t>(n);
  }
}

std::string read_file(const std::string& path) {
  FileReader r(path);
  std::string s(static_cast<size_t>(r.size()), '\0');
  if (!s.empty()) r.read_at(0, s.data(), s.size());
  return s;
}

void write_file(const std::string& path, const std::string& contents, bool durable) {
  FileWriter w(path);
  w.write(contents.data(), contents.size());
  w.close(durable);
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  FSDP_CHECK(fd >= 0, ErrorKind::kIo, kNoContext, "cannot open directory '", dir, "': ", errno_text());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  FSDP_CHECK(rc == 0 || err == EINVAL, ErrorKind::kIo, kNoContext, "fsync of directory '", dir, "' failed: ",
             std::strerror(err));
}

void atomic_write_file(const std::string& path, const std::string& contents, bool durable) {
  const std::string tmp = path + ".tmp";
  write_file(tmp, contents, durable);
  FSDP_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, ErrorKind::kIo, kNoContext, "rename '", tmp, "' -> '", path,
             "' failed: ", errno_text());
  if (durable) {
    auto slash = path.find_last_of('/');
    fsync_dir(slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash));
  }
}

}  // namespace fsdp::checkpoint::io
