// The manifest of a sharded checkpoint (internal): what manifest.json holds, its JSON form, and
// the directory rules (latest, listing, resolution). Schema: docs/checkpoints.md, "Manifest".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fsdp/common/check.h"

namespace fsdp::checkpoint {

/// The context of the manifest's and the directory functions' errors: they know no rank or
/// operation; the public entry points name themselves (resolve_checkpoint, verify_checkpoint),
/// save_sharded and load_sharded add theirs (agreement.h).
inline const ErrorContext kNoContext{};

constexpr const char* kFormat = "fsdp-cpp/sharded-checkpoint";
constexpr int kFormatVersion = 2;  ///< 2: manifest.json sealed by its CRC-32 (seal_manifest)
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kLatestFile = "latest";
constexpr const char* kTmpPrefix = ".tmp-";
constexpr const char* kTrashPrefix = ".trash-";
/// Shard file header: magic "FSDPSHRD", then u32 version, rank, world size, 0 (little-endian).
constexpr char kMagic[8] = {'F', 'S', 'D', 'P', 'S', 'H', 'R', 'D'};
constexpr int64_t kHeaderBytes = 24;

/// Rows [row_begin, row_begin + rows) of one tensor, stored contiguously in one rank file at byte
/// `offset`, checksummed in chunks of chunk_rows rows (the last chunk may be shorter).
struct ShardEntry {
  int rank = 0;
  int64_t offset = 0;
  int64_t row_begin = 0;
  int64_t rows = 0;
  int64_t chunk_rows = 1;
  std::vector<uint32_t> chunk_crc32;
};

/// One stored tensor. kind: "param" (name "model/<fqn>"), "optim" ("optim/<fqn>/<state>"),
/// "extra" ("extra/<key>", TrainState::tensors), "buffer" ("buffer/<fqn>").
struct TensorEntry {
  std::string kind;
  std::string dtype;            ///< "float32", "bfloat16", ... (see dtype_name)
  std::vector<int64_t> shape;   ///< global shape
  int64_t row_numel = 1;        ///< elements per dim-0 row (1 for a 0-dim tensor)
  std::vector<ShardEntry> shards;
};

struct FileEntry {
  int rank = 0;
  std::string path;  ///< relative to the checkpoint directory
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
};

/// One param group of the optimizer, keyed by its members (docs/checkpoints.md, "Param groups").
struct SavedGroup {
  std::vector<std::string> members;       ///< fqns of its parameters, in the group's order
  std::map<std::string, double> options;  ///< fsdp::optim::group_options(), every option
};

struct Manifest {
  std::string name;
  int64_t seq = 0;  ///< publication order within a directory
  int world_size = 1;
  std::string fingerprint;
  std::vector<ParamInfo> params;  ///< the model, in sharded_parameters order
  std::vector<FileEntry> files;
  std::map<std::string, TensorEntry> tensors;
  // optimizer
  std::string optimizer;  ///< "" (none), "adamw", "adam", "sgd"
  std::vector<double> group_lrs;  ///< per group, by position (every version writes it)
  /// Per group, its members and options; empty in checkpoints written before member names were
  /// saved, or whose optimizer holds a tensor that is not a sharded parameter of the model.
  std::vector<SavedGroup> groups;
  std::map<std::string, int64_t> optim_step;                    ///< fqn -> step, params with state
  std::map<std::string, std::vector<std::string>> optim_state;  ///< fqn -> stored state tensors
  // TrainState
  std::map<std::string, int64_t> ints;
  std::map<std::string, double> doubles;
  std::vector<std::string> extra_tensors;
};

/// The text of manifest.json: the sealed JSON of m (seal_manifest).
std::string manifest_to_json(const Manifest& m);
/// Throws fsdp::Error naming `path` when text is not a manifest of this format (kCorruptData:
/// "is malformed", "is not an fsdp-cpp sharded checkpoint manifest", a seal that is missing or
/// does not match) or version (kUnsupported).
Manifest manifest_from_json(const std::string& text, const std::string& path);

/// [Note: manifest seal] Every field of a manifest is read back and may change training (shapes,
/// offsets, optimizer options, counters), so the file is covered by a checksum like the shard
/// files: it starts with {"manifest_crc32": "0xXXXXXXXX", (kSealBytes bytes, 8 lower-case hex
/// digits), and the rest with a '{' in front (the body, a JSON object) has that CRC-32. The
/// file stays plain JSON. Returns the sealed text of `body` (a JSON object's text, starting with
/// '{'); throws fsdp::Error (kInvalidArgument) for another body.
std::string seal_manifest(const std::string& body);
constexpr size_t kSealBytes = 32;
/// The body of sealed manifest text (see seal_manifest). Throws fsdp::Error (kCorruptData) naming
/// `path` when the seal is missing or the body's CRC-32 differs from it (expected vs actual).
std::string unseal_manifest(const std::string& text, const std::string& path);
/// Reads and parses dir/manifest.json; throws fsdp::Error (missing: kCorruptData, "incomplete
/// checkpoint"; unreadable: kIo; as manifest_from_json).
Manifest read_manifest(const std::string& checkpoint_dir);

/// What one rank wrote: its file and its shards (name -> shard, dtype), exchanged as JSON.
struct RankReport {
  FileEntry file;
  std::vector<std::pair<std::string, ShardEntry>> shards;
  std::map<std::string, std::string> dtypes;
};
std::string report_to_json(const RankReport& r);
/// Throws fsdp::Error (kMismatch) when text is not a report of this build.
RankReport report_from_json(const std::string& text);

/// "rank-00003-of-00004.bin"
std::string rank_file_name(int rank, int world_size);
/// Model fingerprint: FNV-1a 64 of the sorted "name shape dtype" lines.
std::string fingerprint(const std::vector<ParamInfo>& params);
/// One line (" " first) naming how the checkpoint's params differ from the model's, by kind:
/// shape or dtype, missing from the checkpoint, not in the model; each with its count and at most
/// `max_names` names.
std::string describe_param_diff(const std::vector<ParamInfo>& saved,
                                const std::vector<ParamInfo>& model, size_t max_names = 3);

}  // namespace fsdp::checkpoint
