// Sharded checkpoints: every rank writes its own rows, one manifest describes them, publication
// is atomic, and a checkpoint written by N ranks loads on any M ranks. See docs/checkpoints.md.
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::checkpoint {

/// Training state outside the model and the optimizer, saved with the checkpoint (replicated: rank
/// 0's values are written, every rank gets them back). Conventional keys, used by fsdp-train:
///   ints:    "step" (optimizer steps done), "lr_step" (schedule position), "sampler_pos"
///            (samples consumed), "growth_tracker" (fp16 loss scaler)
///   doubles: "grad_scale" (fp16 loss scaler)
///   tensors: "rng" (at::kByte, the CPU generator state: see cpu_rng_state())
/// Any other keys are kept as they are. Doubles round-trip exactly (17 significant digits);
/// tensors are stored raw (any dtype, any shape, copied to CPU).
struct TrainState {
  std::map<std::string, int64_t> ints;
  std::map<std::string, double> doubles;
  std::map<std::string, at::Tensor> tensors;
};

/// State of the default CPU generator (uint8 tensor) and its inverse, for TrainState::tensors.
at::Tensor cpu_rng_state();
void set_cpu_rng_state(const at::Tensor& state);

/// Test-only fault injection: simulates a crash inside save_sharded by throwing fsdp::Error
/// ("injected fault ...") at a chosen point, leaving on disk exactly what a killed process leaves
/// (a partial `.tmp-<name>` directory, or a published directory that `latest` does not name yet).
struct FaultInjection {
  enum class Stage {
    kNone,
    kWrite,           ///< on `rank`, once `after_bytes` bytes of shard data were written (mid-file)
    kBeforeManifest,  ///< rank 0, shard files complete, manifest not written
    kBeforeRename,    ///< rank 0, manifest written in .tmp-<name>, not renamed
    kBeforeLatest,    ///< rank 0, renamed to <name>, `latest` still names the previous checkpoint
  };
  Stage stage = Stage::kNone;
  int rank = 0;             ///< rank that fails for kWrite
  int64_t after_bytes = 0;  ///< for kWrite: bytes written on that rank (all its files) first
};

struct SaveOptions {
  /// Name of the checkpoint directory under `dir`. Empty: "step-%09d" of extra.ints["step"]
  /// (zero when absent).
  std::string name;
  /// After a successful publish, delete all but the newest keep_last_k complete checkpoints
  /// (0 keeps everything). The checkpoint just written is never deleted.
  int keep_last_k = 0;
  /// Rows are checksummed in chunks of about this many bytes, so that a load reading part of a
  /// shard verifies every byte it uses and reads at most one chunk beyond each end.
  int64_t chunk_bytes = int64_t(1) << 20;
  /// fsync files and directories (turn off only for tests on tmpfs).
  bool durable = true;
  FaultInjection fault;  ///< test only
};

struct LoadOptions {
  /// Restore the optimizer's per-parameter state and group learning rates when an optimizer is
  /// given. With false, the optimizer is left untouched.
  bool load_optimizer = true;
};

/// Saves a sharded checkpoint of `root` (every sharded parameter under it, see
/// fsdp::sharded_parameters), of `optimizer`'s state for those parameters, and of `extra`, as
/// `dir/<name>`, then points `dir/latest` at it. Returns the name.
///
/// Each rank writes only its own rows of each parameter and of the optimizer state that mirrors it
/// (AdamW/Adam: exp_avg, exp_avg_sq, max_exp_avg_sq if amsgrad, step; SGD: momentum_buffer); no rank
/// materialises a full tensor. Rank 0 writes manifest.json (global shapes, dtypes, which rows each
/// file holds, CRC-32 of every file and chunk, model fingerprint).
/// Atomicity: files go to `dir/.tmp-<name>`, are fsynced, rank 0 renames the directory to
/// `dir/<name>` and then rewrites `dir/latest` by rename; a crash at any point leaves the previous
/// checkpoint loadable and the torn one unused. Ranks must share the file system that holds `dir`.
///
/// Collective and blocking over `group`: all ranks call it with the same arguments, after the
/// optimizer step (no backward in flight). The root's units must be sharded over `group` (or over
/// a group of one rank: replicated). Errors (I/O, unsupported optimizer, a unit over another group)
/// throw fsdp::Error on every rank of the group, of the failing rank's kind (kIo, kUnsupported,
/// kInvalidArgument), naming the failing rank and file; the previous checkpoint stays valid.
/// optimizer may be null (model and extra only). Supported optimizers: those of
/// fsdp/optim/optimizer_state.h (torch::optim::AdamW, Adam, SGD); others throw kUnsupported.
std::string save_sharded(const std::string& dir, const std::shared_ptr<torch::nn::Module>& root,
                         torch::optim::Optimizer* optimizer, const TrainState& extra,
                         const comm::ProcessGroupPtr& group, const SaveOptions& options = {});

/// Loads a checkpoint into `root` (sharded over `group`, any world size), `optimizer` (built on
/// fsdp::parameters(root); may be null) and `extra` (may be null). `path` is a checkpoint directory,
/// or a directory holding checkpoints (then its `latest`, or, if `latest` is missing or names an
/// incomplete checkpoint, the complete one with the highest sequence number is used).
/// Returns the checkpoint directory loaded.
///
/// Each rank reads only the chunks of the rank files that overlap the dim-0 rows it owns at the
/// current world size. Everything is read into staging tensors and validated first on every rank
/// (manifest present, model fingerprint, names, shapes, dtypes, file sizes, CRC-32 of every chunk
/// used, optimizer type); the model, optimizer and extra are written only if every rank succeeded.
/// Otherwise fsdp::Error is thrown on every rank, of the failing rank's kind (kCorruptData for bad
/// files, kIo, kInvalidArgument for a model or optimizer that does not match, kMismatch for ranks
/// resolving different checkpoints), naming the rank, file, tensor, expected vs actual (the model
/// is untouched). Peak extra memory: this rank's shard of the model and optimizer state.
/// Collective and blocking over `group`.
std::string load_sharded(const std::string& path, const std::shared_ptr<torch::nn::Module>& root,
                         torch::optim::Optimizer* optimizer, TrainState* extra,
                         const comm::ProcessGroupPtr& group, const LoadOptions& options = {});

/// The checkpoint directory `path` designates (see load_sharded), or throws fsdp::Error naming
/// what is missing. Not collective; reads only manifests and `latest`.
std::string resolve_checkpoint(const std::string& path);

/// Complete checkpoints in `dir` (subdirectories with a readable manifest), oldest first (by the
/// manifest's sequence number). Not collective.
std::vector<std::string> list_checkpoints(const std::string& dir);

/// Re-reads every file of the checkpoint and checks sizes and whole-file CRC-32s against the
/// manifest; throws fsdp::Error naming the first bad file. Not collective.
void verify_checkpoint(const std::string& checkpoint_dir);

}  // namespace fsdp::checkpoint
