// A checkpoint directory: its complete checkpoints, which one a path names (`latest`, or the
// newest), and a checkpoint's files verified against their checksums (docs/checkpoints.md).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/check.h"
#include "io.h"
#include "manifest.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;

namespace {

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}
bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}


// Runs fn; an fsdp::Error thrown without an operation gets `op` (kind and message kept).
template <typename Fn>
auto in_op(const char* op, Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    if (!e.where().op.empty() || e.where().rank >= 0) throw;
    throw Error(e.kind(), ErrorContext{-1, e.where().unit, op}, e.message());
  }
}

// True when `dir` holds a rank's shard file (rank-*): the writing of a checkpoint reached it.
bool has_rank_files(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind("rank-", 0) == 0) return true;
  }
  return false;
}

// The complete checkpoints of `dir`, oldest first (by seq); subdirectories that hold a
// manifest.json that does not validate, and published ones (not a save's temporary directory)
// that hold shard files but no manifest.json, go to *bad with the reason, when bad is given.
std::vector<std::string> scan_checkpoints(const std::string& dir,
                                          std::vector<std::pair<std::string, std::string>>* bad) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.' || !is_dir(e.path())) continue;
    const fs::path mpath = e.path() / kManifestFile;
    if (!path_exists(mpath)) {
      // A save writes into a temporary directory and publishes it by a rename after its manifest
      // is written and fsynced: a published directory of shards without one is damage.
      if (bad && name.rfind(kTmpPrefix, 0) != 0 && has_rank_files(e.path())) {
        bad->emplace_back(e.path().string(), str_cat("shard files but no ", kManifestFile));
      }
      continue;
    }
    try {
      Manifest m = manifest_from_json(io::read_file(mpath.string()), mpath.string());
      found.emplace_back(m.seq, e.path().string());
    } catch (const Error& err) {
      if (bad) bad->emplace_back(e.path().string(), err.message());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  if (bad) std::sort(bad->begin(), bad->end());
  return out;
}


}  // namespace

std::vector<std::string> list_checkpoints(const std::string& dir) {
  return scan_checkpoints(dir, nullptr);
}

std::string resolve_checkpoint(const std::string& path) {
  return in_op("resolve_checkpoint", [&] {
    FSDP_CHECK(is_dir(path), ErrorKind::kInvalidArgument, kNoContext, "checkpoint path '", path,
               "' does not exist or is not a directory");
    const fs::path p(path);
    if (path_exists(p / kManifestFile)) {
      read_manifest(path);  // throws if malformed
      return path;
    }
    const std::string base = p.filename().string();
    FSDP_CHECK(!has_rank_files(p) && base.rfind(kTmpPrefix, 0) != 0, ErrorKind::kCorruptData,
               kNoContext, "'", path, "' is an incomplete checkpoint: it has no ", kManifestFile,
               " (the save that wrote it was interrupted before publishing)");
    // [Note: no silent fallback] A published checkpoint always has a valid manifest (it is
    // written and fsynced before the rename), so a bad one is damage, not an interrupted save:
    // resolving refuses instead of quietly loading an older checkpoint, and names both.
    std::vector<std::pair<std::string, std::string>> bad;  // (directory, why)
    const std::vector<std::string> good = scan_checkpoints(path, &bad);
    const std::string older =
        good.empty() ? std::string(" (no other complete checkpoint in '" + path + "')")
                     : str_cat("; to resume from an older checkpoint, name it explicitly, e.g. '",
                               good.back(), "'");
    if (path_exists(p / kLatestFile)) {
      std::string name = io::read_file((p / kLatestFile).string());
      while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
      const fs::path cand = p / name;
      FSDP_CHECK(!name.empty() && name.find('/') == std::string::npos && name[0] != '.',
                 ErrorKind::kCorruptData, kNoContext, "'", (p / kLatestFile).string(),
                 "' holds '", name, "', not the name of a checkpoint in '", path, "'", older);
      FSDP_CHECK(is_dir(cand), ErrorKind::kCorruptData, kNoContext, "'", (p / kLatestFile).string(),
                 "' names '", name, "', which does not exist", older);
      // `latest` is written after the checkpoint it names was published: not an interrupted save.
      FSDP_CHECK(path_exists(cand / kManifestFile), ErrorKind::kCorruptData, kNoContext, "the latest checkpoint '",
                 cand.string(), "' cannot be loaded: shard files but no ", kManifestFile, older);
      try {
        read_manifest(cand.string());
      } catch (const Error& e) {
        throw Error(ErrorKind::kCorruptData, kNoContext,
                    str_cat("the latest checkpoint '", cand.string(), "' cannot be loaded: ",
                            e.message(), older));
      }
      return cand.string();
    }
    // No `latest` (a crash after the first publication, before `latest` was written): the
    // highest seq, provided that no checkpoint of the directory is damaged.
    FSDP_CHECK(bad.empty(), ErrorKind::kCorruptData, kNoContext, "checkpoint '",
               bad.empty() ? "" : bad.front().first, "' in '", path,
               "' (which has no 'latest') cannot be loaded: ", bad.empty() ? "" : bad.front().second,
               older);
    FSDP_CHECK(!good.empty(), ErrorKind::kInvalidArgument, kNoContext,
               "no complete checkpoint in '", path, "' (no 'latest' file)");
    return good.back();
  });
}

void verify_checkpoint(const std::string& checkpoint_dir) {
  in_op("verify_checkpoint", [&] {
    Manifest m = read_manifest(checkpoint_dir);
    // One read buffer for every file, no larger than the largest (most files are small), not zeroed.
    int64_t largest = 0;
    for (const auto& f : m.files) largest = std::max(largest, f.bytes);
    const size_t buf_bytes = static_cast<size_t>(std::clamp<int64_t>(largest, 1, int64_t(1) << 22));
    std::unique_ptr<char[]> buf(new char[buf_bytes]);
    for (const auto& f : m.files) {
      const std::string path = (fs::path(checkpoint_dir) / f.path).string();
      io::FileReader r(path);
      FSDP_CHECK(r.size() == f.bytes, ErrorKind::kCorruptData, kNoContext, "checkpoint file '",
                 path, "' (rank ", f.rank, ") has ", r.size(), " bytes, the manifest says ", f.bytes,
                 r.size() < f.bytes ? " (truncated)" : "");
      uint32_t crc = 0;
      for (int64_t off = 0; off < f.bytes;) {
        size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(buf_bytes), f.bytes - off));
        r.read_at(off, buf.get(), n);
        crc = io::crc32_update(crc, buf.get(), n);
        off += static_cast<int64_t>(n);
      }
      char want[11], got[11];
      std::snprintf(want, sizeof(want), "0x%08x", f.crc32);
      std::snprintf(got, sizeof(got), "0x%08x", crc);
      FSDP_CHECK(crc == f.crc32, ErrorKind::kCorruptData, kNoContext, "checkpoint file '", path,
                 "' (rank ", f.rank, "): CRC-32 mismatch, manifest ", want, ", file ", got,
                 " (corrupted)");
    }
  });
}


}  // namespace fsdp::checkpoint
