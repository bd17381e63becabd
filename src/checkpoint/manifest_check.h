// Validation of a parsed manifest (internal): a manifest is input from disk, so every field is
// checked before any reader uses it. [Note: manifest validation] in manifest_check.cpp lists the
// rules; docs/checkpoints.md, "Manifest", the schema.
#pragma once

#include <string>

#include "manifest.h"

namespace fsdp::checkpoint {

/// Checks `m` (as parsed from `path`) on its own, without touching any other file: ranges of
/// every number (world size, seq, ranks, offsets, rows, chunk_rows, shapes, optimizer steps,
/// learning rates), known names (kinds, dtypes, optimizer type), and consistency between fields
/// (params vs fingerprint vs "model/" tensors, shape vs row_numel, shards tiling dim 0, chunk
/// checksums vs rows / chunk_rows, byte ranges inside the file sizes the manifest lists, one file
/// per rank named as rank_file_name says, optimizer state vs its tensors, TrainState tensors).
/// The actual file sizes are checked when a file is opened (RankFileReader).
/// Throws fsdp::Error (kCorruptData, no rank or op in the context) naming `path`, the field and
/// expected vs actual: "manifest '<path>' is invalid: ...". Not collective; does no I/O.
void validate_manifest(const Manifest& m, const std::string& path);

}  // namespace fsdp::checkpoint
