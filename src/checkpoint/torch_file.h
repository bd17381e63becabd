// Reading a dict of tensors from a file that PyTorch's torch.save (or export_full) wrote
// (internal). libtorch 2.13's own reader (torch::pickle_load) turns a collections.OrderedDict
// into None, so a model.state_dict() fails inside it with an internal assert; this reader
// understands exactly the subset of pickle that torch.save emits for a state dict, and refuses
// anything else with one line. [Note: torch.save subset] in torch_file.cpp.
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "fsdp/common/check.h"

namespace fsdp::checkpoint {

/// The entries of the dict pickled in the zip file `path` (torch.save's default format since
/// PyTorch 1.6, or export_full), in file order: a plain dict or an OrderedDict (its _metadata
/// attribute is ignored) of str -> tensor, tensors rebuilt on CPU with their dtype, shape and
/// strides. Throws fsdp::Error with context `who`: kIo when the file cannot be read, kCorruptData
/// when it is not a zip archive of torch.save (e.g. a numpy .npz, a legacy non-zip torch.save, a
/// truncated file), its pickle is malformed, it holds something other than a dict of str ->
/// tensor (the message names the Python object or the key), or a tensor's storage is missing or
/// too small; kUnsupported for a big-endian file, a storage dtype this build does not know or a
/// file format version libtorch does not read.
/// The message is one line (no backtrace). Not collective.
std::vector<std::pair<std::string, at::Tensor>> read_torch_tensor_dict(const std::string& path,
                                                                       const ErrorContext& who);

}  // namespace fsdp::checkpoint
