// Reductions built on a backend's all_to_all and all_gather (internal): the reduce-scatter of the
// MPI and Gloo backends, bfloat16/float16 reductions in float32 ([Note: all-to-all reductions]),
// and kAvg as a sum followed by a division. Run on the communication thread, blocking, with
// validated arguments.
#pragma once

#include <ATen/Tensor.h>

#include <functional>

#include "fsdp/comm/backend.h"

namespace fsdp::comm::detail {

/// True for bfloat16 and float16.
bool is_low_precision(c10::ScalarType dtype);

/// output (n) = reduce over ranks of input[rank*n : (rank+1)*n] (input: size() * n elements): one
/// all_to_all of the blocks in their own dtype, then the size() blocks of this rank's shard
/// reduced in rank order 0, 1, ..., so every run and every rank sums in the same order. A
/// bfloat16/float16 input is reduced in float32 and rounded once into output (any ReduceOp; kAvg
/// divides in float32); any other dtype is reduced in its own (kSum, kMax or kMin). Holds one
/// input-sized buffer of received blocks (and a float32 shard for bfloat16/float16) while it runs.
/// Blocks; throws what the backend's all_to_all throws.
void reduce_scatter_by_all_to_all(BlockingBackend& backend, const at::Tensor& output, const at::Tensor& input,
                                  ReduceOp op);

/// tensor = reduce over ranks, in place, bitwise the same on every rank, for a bfloat16/float16
/// tensor: the reduce-scatter above over blocks padded to a multiple of the group size, then an
/// all_gather of the rounded blocks.
void all_reduce_low_precision(BlockingBackend& backend, const at::Tensor& tensor, ReduceOp op);

/// Runs `run` with kSum for kAvg (else with `op`), then divides `result` by the group size when op
/// is kAvg (floor division for integer dtypes): the backend never sees kAvg.
void reduce_with(BlockingBackend& backend, const at::Tensor& result, ReduceOp op,
                 const std::function<void(ReduceOp)>& run);

}  // namespace fsdp::comm::detail
