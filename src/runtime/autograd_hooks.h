// Autograd functions that run FSDP's backward hooks (internal). See docs/architecture.md,
// "[Note: backward hooks]".
#pragma once

#include <ATen/Tensor.h>

#include <vector>

namespace fsdp {
class FSDPUnit;

/// Returns inputs unchanged (as autograd identities); the gradient reaching them runs
/// unit.post_backward() first. Only floating tensors that require grad are routed through it.
/// The graph holds the unit weakly: a unit destroyed before the backward reaches this point makes
/// that backward throw fsdp::Error (kState) naming the unit, instead of touching freed memory.
std::vector<at::Tensor> register_post_backward(FSDPUnit& unit, std::vector<at::Tensor> inputs);

/// Returns outputs unchanged; the first gradient reaching them runs unit.pre_backward(index).
/// Same lifetime rule as register_post_backward.
std::vector<at::Tensor> register_pre_backward(FSDPUnit& unit, int64_t forward_index,
                                              std::vector<at::Tensor> outputs);
}  // namespace fsdp
