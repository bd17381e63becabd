// Full (unsharded) export and import: one file PyTorch's torch.load reads directly.
// See docs/checkpoints.md, "Full export".
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>

#include "fsdp/comm/process_group.h"

namespace fsdp::checkpoint {

/// Writes every sharded parameter under root (fully qualified name -> full tensor, shape as the
/// module declares it, original dtype, CPU) and every buffer to `path` as a pickled
/// Dict[str, Tensor] in PyTorch's zip format: Python reads it with `torch.load(path)`
/// (weights_only=True works), C++ with torch::pickle_load. Tied parameters appear once, under
/// their first name (as in fsdp::sharded_parameters).
///
/// Collective and blocking over `group` (and over the units' groups): parameters are gathered one
/// at a time with fsdp::gather_full_tensor; rank 0 keeps them and writes the file via a temporary
/// file, fsync and rename (a crash never leaves a torn file at `path`). Peak memory: rank 0 holds
/// the full parameters (the whole model) while writing; the other ranks one full parameter.
/// Throws fsdp::Error on every rank if rank 0 cannot write the file.
void export_full(const std::string& path, const std::shared_ptr<torch::nn::Module>& root,
                 const comm::ProcessGroupPtr& group);

/// Loads a file written by export_full, or by Python's `torch.save(dict_of_tensors, path)`, into the
/// sharded model under root: each rank copies its own rows (fsdp::load_full_state_dict).
/// Every rank reads the whole file (peak memory: the full model per rank; a shared file system
/// is assumed). Names, shapes and dtypes are validated on every rank before any parameter is
/// written; missing or unexpected names, a shape or dtype mismatch, or an unreadable file throw
/// fsdp::Error on every rank naming the rank, the file and the tensor. Collective over `group`.
void import_full(const std::string& path, const std::shared_ptr<torch::nn::Module>& root,
                 const comm::ProcessGroupPtr& group);

}  // namespace fsdp::checkpoint
