#include "rank_file.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "dtypes.h"

namespace fsdp::checkpoint {

namespace {

std::string crc_hex(uint32_t crc) {
  char buf[11];
  std::snprintf(buf, sizeof(buf), "0x%08x", crc);
  return buf;
}

}  // namespace

// ---- writing ------------------------------------------------------------------------------------

RankFileWriter::RankFileWriter(const std::string& path, int rank, int world_size,
                               int64_t chunk_bytes, std::function<size_t(size_t)> budget,
                               ErrorContext where)
    : w_(path, std::move(budget)), rank_(rank), chunk_bytes_(chunk_bytes), where_(std::move(where)) {
  const uint32_t hdr[4] = {static_cast<uint32_t>(kFormatVersion), static_cast<uint32_t>(rank),
                           static_cast<uint32_t>(world_size), 0};
  w_.write(kMagic, sizeof(kMagic));
  w_.write(hdr, sizeof(hdr));
}

void RankFileWriter::add(const std::string& name, const at::Tensor& t, int64_t row_begin,
                         int64_t rows) {
  at::Tensor c = t.detach().to(at::kCPU).contiguous();
  const int64_t row_bytes = rows > 0 ? static_cast<int64_t>(c.nbytes()) / rows : 0;
  ShardEntry s;
  s.rank = rank_;
  s.offset = w_.bytes();
  s.row_begin = row_begin;
  s.rows = rows;
  s.chunk_rows = std::max<int64_t>(1, row_bytes > 0 ? chunk_bytes_ / row_bytes : 1);
  const std::string dtype = dtype_name(c.scalar_type(), where_);
  const char* p = static_cast<const char*>(c.data_ptr());
  for (int64_t r0 = 0; r0 < rows; r0 += s.chunk_rows) {
    const size_t n = static_cast<size_t>(std::min(s.chunk_rows, rows - r0) * row_bytes);
    s.chunk_crc32.push_back(io::crc32_update(0, p + r0 * row_bytes, n));
    w_.write(p + r0 * row_bytes, n);
  }
  report_.shards.emplace_back(name, std::move(s));
  report_.dtypes[name] = dtype;
}

RankReport RankFileWriter::finish(bool durable, const std::string& file_name) {
  w_.close(durable);
  report_.file = {rank_, file_name, w_.bytes(), w_.crc32()};
  return report_;
}

// ---- reading ------------------------------------------------------------------------------------

RankFileReader::RankFileReader(std::string dir, const Manifest& m, ErrorContext where)
    : dir_(std::move(dir)), m_(m), where_(std::move(where)) {}

const io::FileReader& RankFileReader::file_of(int rank) {
  auto it = open_.find(rank);
  if (it != open_.end()) return *it->second;
  const FileEntry* fe = nullptr;
  for (const auto& f : m_.files) {
    if (f.rank == rank) fe = &f;
  }
  FSDP_CHECK(fe, ErrorKind::kCorruptData, where_, "the manifest lists no file for rank ", rank);
  const std::string path = (std::filesystem::path(dir_) / fe->path).string();
  std::error_code ec;
  FSDP_CHECK(std::filesystem::exists(path, ec), ErrorKind::kCorruptData, where_, "cannot open '",
             path, "': the manifest lists it, the checkpoint directory does not hold it");
  auto r = std::make_unique<io::FileReader>(path);  // kIo when the file system refuses
  FSDP_CHECK(r->size() == fe->bytes, ErrorKind::kCorruptData, where_, "file '", path, "' has ",
             r->size(), " bytes, the manifest says ", fe->bytes,
             r->size() < fe->bytes ? " (truncated)" : " (extra bytes)");
  char hdr[kHeaderBytes];
  r->read_at(0, hdr, sizeof(hdr));
  uint32_t fields[4];
  std::memcpy(fields, hdr + 8, sizeof(fields));
  FSDP_CHECK(std::memcmp(hdr, kMagic, 8) == 0 && fields[0] == static_cast<uint32_t>(kFormatVersion) &&
                 fields[1] == static_cast<uint32_t>(rank) &&
                 fields[2] == static_cast<uint32_t>(m_.world_size) && fields[3] == 0,
             ErrorKind::kCorruptData, where_, "file '", path, "' has a bad header (not rank ", rank,
             " of ", m_.world_size, "'s version-", kFormatVersion,
             " shard file of this checkpoint: version ", fields[0], ", rank ", fields[1], " of ",
             fields[2], ")");
  return *open_.emplace(rank, std::move(r)).first->second;
}

at::Tensor RankFileReader::read_rows(const std::string& name, const TensorEntry& e, int64_t lo,
                                     int64_t n) {
  const c10::ScalarType dt = dtype_from(e.dtype, where_);
  const auto dims = row_shape(e.shape);
  int64_t row_bytes = 0;
  FSDP_CHECK(e.row_numel == dims[1] &&
                 !__builtin_mul_overflow(e.row_numel, int64_t(c10::elementSize(dt)), &row_bytes),
             ErrorKind::kCorruptData, where_, "tensor '", name, "': ",
             expected_actual("row_numel", dims[1], e.row_numel));
  // coverage: the pieces sorted by row_begin must tile [0, dim0)
  std::vector<const ShardEntry*> shards;
  for (const auto& s : e.shards) shards.push_back(&s);
  std::sort(shards.begin(), shards.end(),
            [](auto* a, auto* b) { return a->row_begin < b->row_begin; });
  const int64_t dim0 = dims[0];
  int64_t next = 0;
  for (auto* s : shards) {
    FSDP_CHECK(s->row_begin == next, ErrorKind::kCorruptData, where_, "tensor '", name,
               "': shards leave rows [", next, ", ", s->row_begin, ") uncovered or overlapping");
    // Found by tests/fuzz/fuzz_manifest: chunk_rows 0 divided by zero below.
    FSDP_CHECK(s->rows >= 0 && s->rows <= dim0 - next && s->chunk_rows >= 1, ErrorKind::kCorruptData,
               where_, "tensor '", name, "': a shard of ", s->rows, " rows in chunks of ",
               s->chunk_rows, " at row ", s->row_begin, " of ", dim0);
    next = s->row_begin + s->rows;
  }
  FSDP_CHECK(next == dim0, ErrorKind::kCorruptData, where_, "tensor '", name, "': shards cover ",
             next, " of ", dim0, " rows");
  FSDP_CHECK(lo >= 0 && n >= 0 && n <= dim0 - lo, ErrorKind::kInvalidArgument, where_, "tensor '",
             name, "': rows [", lo, ", ", lo, " + ", n, ") of ", dim0);
  // Every piece read must lie inside its file (whose size file_of checks) before anything is
  // allocated: the output is then bounded by the files' sizes, not by the manifest's shape
  // (fuzz_manifest: a dim 0 of 2^40 allocated 8 TiB).
  for (auto* s : shards) {
    if (std::max(lo, s->row_begin) >= std::min(lo + n, s->row_begin + s->rows)) continue;
    const int64_t file_bytes = file_of(s->rank).size();
    int64_t piece_bytes = 0;
    FSDP_CHECK(s->offset >= kHeaderBytes && !__builtin_mul_overflow(s->rows, row_bytes, &piece_bytes) &&
                   piece_bytes <= file_bytes - s->offset,
               ErrorKind::kCorruptData, where_, "tensor '", name, "': the piece of rank ", s->rank,
               " (", s->rows, " rows of ", row_bytes, " bytes at byte ", s->offset,
               ") is not inside its file of ", file_bytes, " bytes");
  }
  at::Tensor out = at::empty({n, e.row_numel}, at::TensorOptions().dtype(dt));
  char* dst = static_cast<char*>(out.data_ptr());
  std::vector<char> buf;
  for (auto* s : shards) {
    const int64_t ov_lo = std::max(lo, s->row_begin);
    const int64_t ov_hi = std::min(lo + n, s->row_begin + s->rows);
    if (ov_lo >= ov_hi) continue;
    const int64_t c0 = (ov_lo - s->row_begin) / s->chunk_rows;
    const int64_t c1 = (ov_hi - 1 - s->row_begin) / s->chunk_rows;
    FSDP_CHECK(c1 < static_cast<int64_t>(s->chunk_crc32.size()), ErrorKind::kCorruptData, where_,
               "tensor '", name, "': ",
               expected_actual("chunk checksums in the manifest", str_cat("at least ", c1 + 1),
                               s->chunk_crc32.size()));
    const auto& file = file_of(s->rank);
    for (int64_t c = c0; c <= c1; ++c) {
      const int64_t c_lo = s->row_begin + c * s->chunk_rows;
      const int64_t c_rows = std::min(s->chunk_rows, s->row_begin + s->rows - c_lo);
      const int64_t off = s->offset + c * s->chunk_rows * row_bytes;
      buf.resize(static_cast<size_t>(c_rows * row_bytes));
      file.read_at(off, buf.data(), buf.size());
      const uint32_t crc = io::crc32_update(0, buf.data(), buf.size());
      FSDP_CHECK(crc == s->chunk_crc32[c], ErrorKind::kCorruptData, where_,
                 "checksum mismatch in '", file.path(), "' (tensor '", name, "', rows [", c_lo,
                 ", ", c_lo + c_rows, "), bytes [", off, ", ", off + c_rows * row_bytes,
                 ")): manifest CRC-32 ", crc_hex(s->chunk_crc32[c]), ", data ", crc_hex(crc),
                 " (corrupted file)");
      const int64_t a = std::max(ov_lo, c_lo), b = std::min(ov_hi, c_lo + c_rows);
      if (a < b) {
        std::memcpy(dst + (a - lo) * row_bytes, buf.data() + (a - c_lo) * row_bytes,
                    static_cast<size_t>((b - a) * row_bytes));
      }
    }
  }
  return out;
}

}  // namespace fsdp::checkpoint
