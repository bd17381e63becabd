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

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
/// fsdp::Error naming the index and the tensor or file (kCorruptData; kIo for a missing file).
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& dir);
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

/// The bytes of one element of a safetensors dtype name ("F32" -> 4); 0 for an unknown name.
int64_t safetensors_element_size(const std::string& dtype);
/// The safetensors name of a libtorch dtype (kFloat -> "F32"); throws fsdp::Error
/// (kInvalidArgument) for a dtype the format has no name for here.
std::string safetensors_dtype_name(at::ScalarType dtype);

}  // namespace fsdp::checkpoint
