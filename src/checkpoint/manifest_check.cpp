// [Note: manifest validation]
// A manifest is input from disk: an edited or damaged one must be refused with a message, never
// make a reader divide by zero (chunk_rows 0), skip a checksum (chunk_rows < 0), read outside a
// file, or copy rows nobody wrote. Rules checked here, in order:
//   1. header: world_size in [1, kMaxWorldSize], seq >= 0, a name, an optimizer type this build knows;
//   2. files: exactly one per rank 0..world_size-1, named rank_file_name(rank, world_size), at
//      least the header's bytes;
//   3. tensors: the name's prefix matches the kind ("model/" param, "optim/" optim, "extra/"
//      extra, "buffer/" buffer), a known dtype, dims >= 0 whose product fits int64, row_numel =
//      the product of dims 1.., shards of ranks < world_size with offset >= header, rows >= 0,
//      chunk_rows >= 1, ceil(rows / chunk_rows) chunk CRCs, bytes [offset, offset + rows x row
//      bytes) inside that rank's file, and the shards sorted by row_begin tiling [0, dim 0);
//   4. params: unique names, their fingerprint the manifest's, each with a "model/" tensor of the
//      same shape and dtype, and every "model/" tensor a param;
//   5. optimizer: group learning rates finite and >= 0; per parameter with state a step >= 0 (at
//      most kMaxStep), a known parameter, and a tensor "optim/<fqn>/<name>" of the parameter's
//      shape for each state name; every "optim/" tensor listed;
//   6. TrainState: a tensor "extra/<key>" for each key listed, and every "extra/" tensor listed.
// Values of TrainState ints and doubles are the caller's convention (fsdp-train checks its own).
#include "manifest_check.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "dtypes.h"
#include "fsdp/common/check.h"
#include "fsdp/shard/layout.h"

namespace fsdp::checkpoint {

namespace {

constexpr int kMaxWorldSize = 1 << 20;
constexpr int64_t kMaxStep = int64_t(1) << 53;  // beyond any real run; exact in a double

const ErrorContext kNoCheckContext{};

// Throws kCorruptData "manifest '<path>' is invalid: <what>" unless ok.
template <typename... Args>
void require(bool ok, const std::string& path, const Args&... what) {
  if (!ok) {
    throw Error(ErrorKind::kCorruptData, kNoCheckContext,
                str_cat("manifest '", path, "' is invalid: ", what...));
  }
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// dtype name -> bytes per element (throws kCorruptData for an unknown name).
int64_t element_bytes(const std::string& dtype, const std::string& path, const std::string& tn) {
  try {
    return static_cast<int64_t>(c10::elementSize(dtype_from(dtype, kNoCheckContext)));
  } catch (const Error&) {
    require(false, path, "tensor '", tn, "' has unknown dtype '", dtype, "'");
  }
  return 0;
}

// Product of dims 1.. of a validated shape (dims >= 0, numel fits int64).
int64_t checked_row_numel(const std::vector<int64_t>& shape, const std::string& path,
                          const std::string& tn) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    require(d >= 0, path, "tensor '", tn, "' has shape ", shard::shape_to_string(shape),
            " (a negative dimension)");
    require(!__builtin_mul_overflow(numel, d, &numel), path, "tensor '", tn, "' has shape ",
            shard::shape_to_string(shape), " (more than 2^63 elements)");
  }
  return row_shape(shape)[1];
}

void check_files(const Manifest& m, const std::string& path) {
  require(static_cast<int64_t>(m.files.size()) == m.world_size, path,
          expected_actual("files (one per rank)", m.world_size, m.files.size()));
  std::set<int> seen;
  for (const auto& f : m.files) {
    require(f.rank >= 0 && f.rank < m.world_size && seen.insert(f.rank).second, path, "file '",
            f.path, "' has rank ", f.rank, " (expected a distinct rank in [0, ", m.world_size, "))");
    require(f.path == rank_file_name(f.rank, m.world_size), path,
            expected_actual(str_cat("file name of rank ", f.rank), rank_file_name(f.rank, m.world_size),
                            str_cat("'", f.path, "'")));
    require(f.bytes >= kHeaderBytes, path, "file '", f.path, "' has ", f.bytes,
            " bytes (expected at least the ", kHeaderBytes, "-byte header)");
  }
}

void check_tensor(const std::string& tn, const TensorEntry& t, const Manifest& m,
                  const std::string& path) {
  static const std::vector<std::pair<std::string, std::string>> kKinds = {
      {"param", "model/"}, {"optim", "optim/"}, {"extra", "extra/"}, {"buffer", "buffer/"}};
  bool kind_ok = false;
  for (const auto& [kind, prefix] : kKinds) kind_ok = kind_ok || (t.kind == kind && starts_with(tn, prefix));
  require(kind_ok, path, "tensor '", tn, "' has kind '", t.kind,
          "' (expected param for model/, optim for optim/, extra for extra/, buffer for buffer/)");
  const int64_t elem = element_bytes(t.dtype, path, tn);
  const int64_t row_numel = checked_row_numel(t.shape, path, tn);
  require(t.row_numel == row_numel, path, "tensor '", tn, "': ",
          expected_actual(str_cat("row_numel of shape ", shard::shape_to_string(t.shape)), row_numel,
                          t.row_numel));
  int64_t row_bytes = 0;
  require(!__builtin_mul_overflow(row_numel, elem, &row_bytes), path, "tensor '", tn,
          "' has rows of more than 2^63 bytes");
  std::vector<const ShardEntry*> pieces;
  for (const auto& s : t.shards) {
    const std::string who = str_cat("tensor '", tn, "', shard of rank ", s.rank, ": ");
    require(s.rank >= 0 && s.rank < m.world_size, path, who,
            expected_actual("rank", str_cat("in [0, ", m.world_size, ")"), s.rank));
    require(s.rows >= 0, path, who, expected_actual("rows", ">= 0", s.rows));
    require(s.chunk_rows >= 1, path, who, expected_actual("chunk_rows", ">= 1", s.chunk_rows));
    require(s.offset >= kHeaderBytes, path, who,
            expected_actual("offset", str_cat(">= ", kHeaderBytes, " (the header)"), s.offset));
    const int64_t chunks = s.rows / s.chunk_rows + (s.rows % s.chunk_rows != 0);
    require(static_cast<int64_t>(s.chunk_crc32.size()) == chunks, path, who,
            expected_actual(str_cat("chunk checksums for ", s.rows, " rows of ", s.chunk_rows),
                            chunks, s.chunk_crc32.size()));
    const FileEntry* file = &m.files.front();  // check_files: every rank has exactly one
    for (const auto& e : m.files) {
      if (e.rank == s.rank) file = &e;
    }
    int64_t bytes = 0, end = 0;
    require(!__builtin_mul_overflow(s.rows, row_bytes, &bytes) &&
                !__builtin_add_overflow(s.offset, bytes, &end) && end <= file->bytes,
            path, who, "bytes [", s.offset, ", ", s.offset, " + ", s.rows, " x ", row_bytes,
            ") lie outside its file '", file->path, "' of ", file->bytes, " bytes");
    pieces.push_back(&s);
  }
  std::sort(pieces.begin(), pieces.end(),
            [](auto* a, auto* b) { return a->row_begin < b->row_begin; });
  const int64_t dim0 = row_shape(t.shape)[0];
  int64_t next = 0;
  for (auto* s : pieces) {
    require(s->row_begin == next, path, "tensor '", tn, "': shards leave rows [", next, ", ",
            s->row_begin, ") uncovered or overlapping");
    next = s->row_begin + s->rows;  // no overflow: row_begin == next <= dim0, rows x bytes fit
  }
  require(next == dim0, path, "tensor '", tn, "': ",
          expected_actual("rows covered by its shards", dim0, next));
}

void check_params(const Manifest& m, const std::string& path) {
  std::set<std::string> names;
  for (const auto& p : m.params) {
    require(!p.name.empty() && names.insert(p.name).second, path, "parameter name '", p.name,
            "' is empty or repeated");
    auto it = m.tensors.find("model/" + p.name);
    require(it != m.tensors.end(), path, "parameter '", p.name, "' has no tensor 'model/", p.name, "'");
    require(it->second.shape == p.shape && it->second.dtype == p.dtype, path, "parameter '", p.name,
            "' is ", shard::shape_to_string(p.shape), " ", p.dtype, ", its tensor is ",
            shard::shape_to_string(it->second.shape), " ", it->second.dtype);
  }
  require(m.fingerprint == fingerprint(m.params), path,
          expected_actual("fingerprint of the parameters listed", fingerprint(m.params), m.fingerprint));
  for (const auto& [tn, t] : m.tensors) {
    if (starts_with(tn, "model/")) {
      require(names.count(tn.substr(6)) != 0, path, "tensor '", tn, "' is not a listed parameter");
    }
  }
}

void check_optimizer(const Manifest& m, const std::string& path) {
  static const std::set<std::string> kTypes = {"", "adamw", "adam", "sgd"};
  require(kTypes.count(m.optimizer) != 0, path, "unknown optimizer type '", m.optimizer, "'");
  require(!m.optimizer.empty() || (m.group_lrs.empty() && m.optim_step.empty()), path,
          "optimizer state without an optimizer type");
  for (size_t g = 0; g < m.group_lrs.size(); ++g) {
    require(std::isfinite(m.group_lrs[g]) && m.group_lrs[g] >= 0, path, "param group ", g, ": ",
            expected_actual("learning rate", "finite and >= 0", m.group_lrs[g]));
  }
  std::set<std::string> listed;
  for (const auto& entry : m.optim_step) {
    const std::string& fqn = entry.first;  // not a structured binding: C++17 lambdas cannot capture one
    const int64_t step = entry.second;
    require(step >= 0 && step <= kMaxStep, path, "optimizer state of '", fqn, "': ",
            expected_actual("step", str_cat("in [0, ", kMaxStep, "]"), step));
    auto p = std::find_if(m.params.begin(), m.params.end(), [&](auto& x) { return x.name == fqn; });
    require(p != m.params.end(), path, "optimizer state of '", fqn, "', which is not a parameter");
    auto names = m.optim_state.find(fqn);
    require(names != m.optim_state.end(), path, "optimizer state of '", fqn, "' lists no tensors");
    for (const auto& sn : names->second) {
      const std::string tn = "optim/" + fqn + "/" + sn;
      auto it = m.tensors.find(tn);
      require(it != m.tensors.end() && it->second.shape == p->shape, path, "optimizer tensor '", tn,
              "' is missing or not of its parameter's shape ", shard::shape_to_string(p->shape));
      listed.insert(tn);
    }
  }
  require(m.optim_state.size() == m.optim_step.size(), path,
          expected_actual("optimizer state entries with a step", m.optim_state.size(), m.optim_step.size()));
  for (const auto& [tn, t] : m.tensors) {
    if (starts_with(tn, "optim/")) require(listed.count(tn) != 0, path, "tensor '", tn, "' belongs to no optimizer state");
  }
}

void check_train_state(const Manifest& m, const std::string& path) {
  std::set<std::string> keys(m.extra_tensors.begin(), m.extra_tensors.end());
  require(keys.size() == m.extra_tensors.size(), path, "train_state tensors are repeated");
  for (const auto& k : keys) {
    require(m.tensors.count("extra/" + k) != 0, path, "train_state tensor '", k,
            "' has no tensor 'extra/", k, "'");
  }
  for (const auto& [tn, t] : m.tensors) {
    if (starts_with(tn, "extra/")) {
      require(keys.count(tn.substr(6)) != 0, path, "tensor '", tn, "' is not a listed train_state tensor");
    }
  }
}

}  // namespace

void validate_manifest(const Manifest& m, const std::string& path) {
  require(m.world_size >= 1 && m.world_size <= kMaxWorldSize, path,
          expected_actual("world_size", str_cat("in [1, ", kMaxWorldSize, "]"), m.world_size));
  require(m.seq >= 0, path, expected_actual("seq", ">= 0", m.seq));
  require(!m.name.empty(), path, "the checkpoint has no name");
  check_files(m, path);
  for (const auto& [tn, t] : m.tensors) check_tensor(tn, t, m, path);
  check_params(m, path);
  check_optimizer(m, path);
  check_train_state(m, path);
}

}  // namespace fsdp::checkpoint
