// Reductions the group builds on its backend's primitives (internal): bfloat16/float16 reductions
// in float32 ([Note: low-precision reductions]) and kAvg as a sum followed by a division. Run on
// the communication thread, blocking, with validated arguments.
#pragma once

#include <ATen/Tensor.h>

#include <functional>

#include "fsdp/comm/backend.h"

namespace fsdp::comm::detail {

/// True for bfloat16 and float16.
bool is_low_precision(c10::ScalarType dtype);

/// output (n) = reduce over ranks of input[rank*n : (rank+1)*n], for a bfloat16/float16 input:
/// one all_to_all of the blocks in their own dtype, then the N blocks of this rank's shard added
/// in float32 in rank order, rounded once into output. Any ReduceOp (kAvg divides in float32).
void reduce_scatter_low_precision(BlockingBackend& backend, const at::Tensor& output, const at::Tensor& input,
                                  ReduceOp op);

/// tensor = reduce over ranks, in place, bitwise the same on every rank: the reduce-scatter above
/// over blocks padded to a multiple of the group size, then an all_gather of the rounded blocks.
void all_reduce_low_precision(BlockingBackend& backend, const at::Tensor& tensor, ReduceOp op);

/// Runs `run` with kSum for kAvg (else with `op`), then divides `result` by the group size when op
/// is kAvg (floor division for integer dtypes): the backend never sees kAvg.
void reduce_with(BlockingBackend& backend, const at::Tensor& result, ReduceOp op,
                 const std::function<void(ReduceOp)>& run);

}  // namespace fsdp::comm::detail
