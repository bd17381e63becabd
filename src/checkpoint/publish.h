// Publication of a sharded checkpoint on rank 0 (internal): the temporary directory, the atomic
// rename, `latest`, keep_last_k. Protocol: docs/checkpoints.md, "Atomicity protocol (save)".
// Not collective: save_sharded runs these on rank 0 inside its agreements.
#pragma once

#include <string>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/common/check.h"

namespace fsdp::checkpoint {

/// dir/.tmp-<name>: where a save writes before publishing.
std::string tmp_dir_of(const std::string& dir, const std::string& name);

/// Step 1: creates `dir` (and parents), deletes the leftovers of interrupted saves (.tmp-*,
/// .trash-*) and creates a fresh tmp_dir_of(dir, name). One writer per directory at a time.
/// Throws fsdp::Error (kIo, context `where`) when the file system refuses.
void prepare_save_dir(const std::string& dir, const std::string& name, const ErrorContext& where);

/// Steps 4-6, once tmp_dir_of(dir, name) holds every rank file and the manifest: renames it to
/// dir/<name> (an existing dir/<name> is first moved to .trash-<name>, then deleted), fsyncs
/// `dir` (if options.durable), replaces `latest` by rename, then with options.keep_last_k > 0
/// deletes (rename to .trash-*, then remove) the oldest complete checkpoints beyond k, never
/// <name>. Throws fsdp::Error: kIo when the file system refuses; the injected faults
/// kBeforeRename and kBeforeLatest of options.fault.
void publish(const std::string& dir, const std::string& name, const SaveOptions& options,
             const ErrorContext& where);

}  // namespace fsdp::checkpoint
