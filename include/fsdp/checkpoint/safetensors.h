// The safetensors format (Hugging Face's weight files): reading tensors, or the rows of dim 0 one
// rank holds, from one file or a checkpoint split over several with an index, and writing files
// tensor by tensor. See docs/checkpoints.md, "safetensors".
//
// A file is an 8-byte little-endian header length N, N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that follows the header)
// plus an optional "__metadata__" object of strings, then the data: every tensor C-contiguous,
// little-endian, the tensors back to back with no hole and no overlap. A split checkpoint is a
// directory with model.safetensors.index.json ({"metadata": {...}, "weight_map": {name: file}})
// and the files it names; a single one holds model.safetensors.
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::checkpoint {

/// One tensor of a safetensors file, as its header describes it.
struct SafetensorsEntry {
  std::string dtype;            ///< the file's name: "F32", "BF16", "F16", "I64", ...
  at::ScalarType scalar_type;   ///< the same as a libtorch dtype
  std::vector<int64_t> shape;   ///< dims, each >= 0; {} for a scalar
  int64_t data_begin = 0;       ///< absolute offset of its first byte in the file
  int64_t nbytes = 0;           ///< numel x element size
};

/// A safetensors file opened for reading; the whole header is validated on construction, so that
/// no read ever goes past the file or into another tensor's bytes.
///
/// Checks (each failure throws fsdp::Error naming the file and, where there is one, the tensor):
/// the header length fits the file and 100 MiB (kCorruptData); the header is one JSON object
/// without repeated names (kCorruptData); every entry has exactly dtype, shape and data_offsets,
/// a known dtype (F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL; others kUnsupported), a shape of
/// non-negative integers whose element count does not overflow, offsets with begin <= end inside
/// the data, and end - begin = numel x element size (kCorruptData); the tensors cover the data from
/// its first byte to its last, without hole or overlap (kCorruptData); "__metadata__" maps strings
/// to strings. The host must be little-endian (kUnsupported). kIo when the file cannot be opened.
/// Reads use pread(2); the object is safe to use from several threads.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const;
  /// Every tensor, by name.
  const std::map<std::string, SafetensorsEntry>& tensors() const { return tensors_; }
  /// The "__metadata__" object ({} when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The entry of `name`; throws fsdp::Error (kInvalidArgument) naming the file when absent.
  const SafetensorsEntry& entry(const std::string& name) const;
  /// The whole tensor `name` (its dtype and shape; a new CPU tensor).
  at::Tensor read(const std::string& name) const;
  /// Rows [row_begin, row_begin + rows) of dim 0 of tensor `name`: shape (rows, d1, ...), a new
  /// CPU tensor, reading only those bytes. Throws fsdp::Error (kInvalidArgument) for a scalar or a
  /// range outside dim 0.
  at::Tensor read_rows(const std::string& name, int64_t row_begin, int64_t rows) const;
  /// A fingerprint of the file's contents for comparing copies across ranks or hosts: FNV-1a 64
  /// of its size, its header and 64 bytes at each of 64 evenly spaced offsets of its data (a
  /// sample, not every byte: two files differing only between the samples look alike). Reads
  /// about 4 KiB. Not collective.
  uint64_t fingerprint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::map<std::string, SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// A Hugging Face checkpoint directory: model.safetensors, or model.safetensors.index.json and the
/// files its weight_map names. Opens and validates every file (SafetensorsFile) and checks that
/// the index names each tensor once, that every file it names exists and holds the tensors the
/// index puts there, and that no file holds a tensor the index does not name; each failure throws
/// fsdp::Error naming the index and the tensor or file (kCorruptData; kIo for a missing file). A
/// directory holding both model.safetensors and model.safetensors.index.json holds two checkpoints
/// whose readers disagree on which is meant: refused (kInvalidArgument).
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& dir);
  /// The files' fingerprints (SafetensorsFile::fingerprint) combined with their names, in order.
  uint64_t fingerprint() const;
  const std::string& dir() const { return dir_; }
  /// Every tensor's name, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// The file that holds `name`; throws fsdp::Error (kInvalidArgument) naming the checkpoint when
  /// absent.
  const SafetensorsFile& file_of(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const { return file_of(name).entry(name); }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

/// Writes a safetensors file tensor by tensor, so that a caller never holds more than the tensor
/// it appends: the header (every name, dtype and shape, in `specs` order, data in that order) is
/// written first, then append() copies each tensor's bytes in turn, and finish() fsyncs and renames
/// the temporary file to `path` (a crash never leaves a torn file at `path`). Throws fsdp::Error:
/// kInvalidArgument for a repeated name, an unsupported dtype, or an append out of order or of
/// another dtype or shape; kIo when the disk refuses (nothing is left at `path`). Not thread-safe.
class SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::string& path, std::vector<Spec> specs,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // removes the temporary file when finish() was not reached
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  /// The next tensor of `specs` (any layout: written C-contiguous).
  void append(const std::string& name, const at::Tensor& tensor);
  /// After the last append: makes the file durable and visible at `path`.
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Where one parameter of a model is stored in a safetensors checkpoint.
struct SafetensorsSource {
  std::string tensor;       ///< its name in the checkpoint
  bool transposed = false;  ///< stored as the transpose of the (2-D) parameter (GPT-2's Conv1D)
};

/// How import_safetensors maps a checkpoint onto a model.
struct SafetensorsImportOptions {
  /// The source of each parameter, by its fully qualified name from the root (as
  /// fsdp::sharded_parameters names it; a tied parameter once, under its first name). Unset: the
  /// same name, not transposed.
  std::function<SafetensorsSource(const std::string& param)> source_of;
  /// True for a checkpoint tensor the model has no parameter for and that is skipped (GPT-2's
  /// attention-mask buffers, the copy of a tied head). Any other tensor no parameter takes is an
  /// error. Unset: none.
  std::function<bool(const std::string& tensor)> ignore;
  /// True for a parameter of the model that the checkpoint does not hold and that keeps the value
  /// it has (adapters added over a pretrained base: LoRA's A and B, initialised before the import).
  /// Such a parameter is not looked up, and its unit must already hold values (built off the meta
  /// device, or fsdp::materialize'd first). Unset: none; every parameter must have a source.
  std::function<bool(const std::string& param)> leave;
};

/// What import_safetensors did, the same on every rank: parameter names (fully qualified from the
/// root, as fsdp::sharded_parameters names them), in the model's order.
struct SafetensorsImportReport {
  std::vector<std::string> filled;  ///< read from the checkpoint
  std::vector<std::string> left;    ///< left to their values (SafetensorsImportOptions::leave)
};

/// Loads a safetensors checkpoint directory (SafetensorsCheckpoint: model.safetensors, or the
/// files of model.safetensors.index.json) into the sharded model under root, straight into the
/// shards: each rank reads only the rows of dim 0 its shards hold (pread), and a transposed
/// source whole (one tensor at a time), so no rank ever holds the full model. Peak bytes beyond the
/// model state: this rank's rows of one tensor (a transposed source: that whole tensor, twice).
/// Floating-point tensors (F64, F32, F16, BF16) are converted to the parameter's dtype; integer
/// ones must match it.
///
/// Every rank opens the checkpoint and validates, before any row is written: every parameter has
/// a source tensor of the right shape (transposed: the reversed 2-D shape) and a convertible
/// dtype, every tensor of the checkpoint is taken by a parameter or ignored, no buffer of root is
/// still on the meta device, and no unit holds unreduced gradients. A failure throws fsdp::Error
/// on every rank (kInvalidArgument for the model's mismatch, kCorruptData / kIo / kUnsupported for
/// the files, as SafetensorsFile), naming the file or checkpoint and the parameter and tensor,
/// and nothing is written. Units built on the meta device (fully_shard after a meta build) get
/// their values from the file and need no fsdp::materialize; buffers are the module's own.
/// Afterwards every unit gathers its parameters afresh at its next forward.
/// Collective and blocking over `group` (every rank of the model's group calls it, in the same
/// order as its other collectives); the checkpoint must be readable by every rank (a shared file
/// system, or a copy per host), and the same on every rank: the ranks compare the fingerprints of
/// what they opened (SafetensorsCheckpoint::fingerprint, one all-gather) and refuse different copies
/// (kInvalidArgument naming the ranks). Parameters that options.leave names are not read (and no
/// tensor of the checkpoint may be their source: it would be unexpected, as above); their units
/// must hold values already, or kInvalidArgument names the parameter. Returns what was filled and
/// what was left.
SafetensorsImportReport import_safetensors(const std::string& dir, const std::shared_ptr<torch::nn::Module>& root,
                        const comm::ProcessGroupPtr& group, const SafetensorsImportOptions& options = {});

/// How export_safetensors names and lays out a model's parameters.
struct SafetensorsExportOptions {
  /// The name (and layout) of each parameter in the checkpoint, by its fully qualified name from
  /// the root; transposed writes the transpose of a 2-D parameter. Unset: the same name.
  std::function<SafetensorsSource(const std::string& param)> target_of;
  /// The dtype of every tensor written (e.g. at::kBFloat16 from fp32 master weights); unset: each
  /// parameter's own.
  std::optional<at::ScalarType> dtype;
  /// Split past this many bytes per file (model-0000k-of-0000n.safetensors and
  /// model.safetensors.index.json, as save_pretrained does; a tensor larger than it gets a file of
  /// its own); 0: one model.safetensors.
  int64_t max_file_bytes = 0;
  /// The weight files' names: STEM.safetensors, or STEM-0000k-of-0000n.safetensors and
  /// STEM.safetensors.index.json ("adapter_model": PEFT's adapter file).
  std::string file_stem = "model";
  /// The files' "__metadata__" ({"format": "pt"}: what transformers expects).
  std::map<std::string, std::string> metadata{{"format", "pt"}};
  /// Other small files rank 0 writes into the directory beside the weights (e.g. config.json),
  /// file name -> contents, each atomically.
  std::map<std::string, std::string> extra_files;
  /// True for a parameter that is not written (LoRA's adapters when their update is merged into
  /// the base weights by value_of). Unset: every parameter is written.
  std::function<bool(const std::string& param)> skip;
  /// The tensor written for parameter `param`, given its full tensor (the model's layout, before
  /// any transpose of target_of): e.g. a base weight with its adapter's update merged in. Called
  /// on rank 0 only, once per parameter written, in order; it must not communicate, and must return
  /// the same shape (kInvalidArgument otherwise). Unset: the tensor itself.
  std::function<at::Tensor(const std::string& param, const at::Tensor& full)> value_of;
};

/// Writes the model under root to the directory `dir` (created if missing) as a safetensors
/// checkpoint a Hugging Face loader reads: every parameter (a tied one once, under its first
/// name), full shape, named and laid out by options. Streamed: parameters are gathered one at a
/// time (fsdp::gather_full_tensor: collective over each unit's group) and rank 0 appends each to
/// its file at once, so no rank holds more than one full tensor beyond its shards. Every file
/// goes through a temporary and a rename; the index and extra files are written last, so a
/// failed export never leaves a loadable but partial checkpoint. Weight files of an earlier export
/// into `dir` that this one did not overwrite (model.safetensors, model-*-of-*.safetensors, the
/// index; of options.file_stem) are removed, as save_pretrained does; other files stay. Collective and blocking over
/// `group`: every rank calls it. Throws fsdp::Error on every rank when rank 0 cannot write (kIo,
/// naming the file) or a name repeats (kInvalidArgument).
void export_safetensors(const std::string& dir, const std::shared_ptr<torch::nn::Module>& root,
                        const comm::ProcessGroupPtr& group, const SafetensorsExportOptions& options = {});

/// The bytes of one element of a safetensors dtype name ("F32" -> 4); 0 for an unknown name.
int64_t safetensors_element_size(const std::string& dtype);
/// The safetensors name of a libtorch dtype (kFloat -> "F32"); throws fsdp::Error
/// (kInvalidArgument) for a dtype the format has no name for here.
std::string safetensors_dtype_name(at::ScalarType dtype);

}  // namespace fsdp::checkpoint
