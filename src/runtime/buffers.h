// Buffers of an FSDP tree (internal): running statistics and other non-parameter state, which DDP
// keeps equal across ranks by broadcasting them, and which mixed precision computes with in
// another dtype without changing what is stored. docs/architecture.md, "[Note: buffers]".
#pragma once

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::detail {

/// The buffers of `module`'s subtree that no nested unit owns (the ones a unit computes with).
std::vector<at::Tensor> unit_buffers(torch::nn::Module& module);

/// Overwrites every buffer of `root`'s whole tree with rank 0's values: one broadcast per dtype
/// of the buffers packed together, none when there are no buffers. Collective and blocking over
/// `group`. tag: the root's (its forward pass and sync epoch; phase "buffers").
void broadcast_buffers(torch::nn::Module& root, comm::ProcessGroup& group, const comm::OpTag& tag);

/// A unit's floating-point buffers, computed with in `dtype` while the stored buffers keep their
/// own dtype ([Note: buffers] in buffers.cpp): begin() points each buffer object at a cast copy,
/// sync_back() writes the copy's values (running statistics updated during forward) into the
/// stored tensor, restore() points the buffer objects back at the stored tensors. The cast copies
/// stay in place from the forward to the end of its backward, because autograd may have saved the
/// buffer objects (an op that saves its operand for backward).
class BufferCast {
 public:
  /// No-op while active (a unit used again before its backward ended computes with the same copy).
  void begin(const std::vector<at::Tensor>& buffers, c10::ScalarType dtype);
  void sync_back();
  void restore();
  bool active() const { return !saved_.empty(); }

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> saved_;  // (buffer object, its stored data)
};

/// The first module of `module`'s subtree (no nested unit) that keeps running statistics
/// (a buffer named running_mean or running_var: BatchNorm, InstanceNorm with tracking), as
/// "qualified.name (TypeName)", or nullopt.
std::optional<std::string> find_running_stats_module(torch::nn::Module& module);

/// True when `m` itself (not its children) keeps running statistics: a buffer named running_mean
/// or running_var. fully_shard_tree makes such modules fp32 units of their own under a
/// low-precision policy (FSDP's rule for batch norm: their input stays low precision, their
/// weights and statistics fp32).
bool keeps_running_stats(const torch::nn::Module& m);

}  // namespace fsdp::detail
