// The per-rank row file of a sharded checkpoint, "rank-RRRRR-of-NNNNN.bin" (internal): a 24-byte
// header, then the C-contiguous bytes of row ranges of tensors, one after the other, checksummed
// in chunks of rows. Format: docs/checkpoints.md, "Shard file". No process group here.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "fsdp/common/check.h"
#include "io.h"
#include "manifest.h"

namespace fsdp::checkpoint {

/// Writes one rank's file and reports what it holds (offsets, chunk CRCs, dtypes) for the
/// manifest. Every call may throw fsdp::Error (kIo from the file system, or the injected fault).
class RankFileWriter {
 public:
  /// Creates `path` and writes the header. chunk_bytes (> 0): rows per checksum chunk are
  /// max(1, chunk_bytes / row bytes). budget: see io::FileWriter (test-only fault injection).
  RankFileWriter(const std::string& path, int rank, int world_size, int64_t chunk_bytes,
                 std::function<size_t(size_t)> budget, ErrorContext where);

  /// Appends rows [row_begin, row_begin + rows) of tensor `name`; t holds exactly those rows (any
  /// device; copied to contiguous CPU memory first).
  void add(const std::string& name, const at::Tensor& t, int64_t row_begin, int64_t rows);

  /// Closes the file (fsync first if durable) and returns what it holds; file_name is its name
  /// relative to the checkpoint directory.
  RankReport finish(bool durable, const std::string& file_name);

 private:
  io::FileWriter w_;
  int rank_;
  int64_t chunk_bytes_;
  ErrorContext where_;
  RankReport report_;
};

/// Reads row ranges of the tensors of a checkpoint's rank files, opening each file once, on first
/// use, and verifying every byte it returns against the manifest's chunk CRCs.
class RankFileReader {
 public:
  /// dir: the checkpoint directory; m must outlive the reader. Errors carry `where`.
  RankFileReader(std::string dir, const Manifest& m, ErrorContext where);

  /// Rows [lo, lo + n) of tensor `name` (entry e) as a CPU tensor (n, e.row_numel) of e's dtype.
  /// Reads only the chunks of the pieces that overlap the range (at most one chunk beyond each
  /// end). Throws fsdp::Error: kCorruptData when the pieces do not tile [0, dim0), a file the
  /// manifest lists is missing ("cannot open"), its size or header differs from the manifest
  /// ("(truncated)"), or a chunk's CRC-32 differs ("checksum mismatch"); kIo when the file system
  /// refuses to open or read a file.
  at::Tensor read_rows(const std::string& name, const TensorEntry& e, int64_t lo, int64_t n);

  const ErrorContext& where() const { return where_; }

 private:
  const io::FileReader& file_of(int rank);

  std::string dir_;
  const Manifest& m_;
  ErrorContext where_;
  std::map<int, std::unique_ptr<io::FileReader>> open_;
};

}  // namespace fsdp::checkpoint
