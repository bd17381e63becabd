#include "all_to_all_reductions.h"

#include <ATen/ATen.h>

namespace fsdp::comm::detail {

bool is_low_precision(c10::ScalarType dtype) { return dtype == at::kBFloat16 || dtype == at::kHalf; }

// [Note: all-to-all reductions] A reduce-scatter sends each block in its own dtype to the rank that
// owns it (one all-to-all: the (N-1)/N x input bytes of a ring reduce-scatter), and the owner
// reduces the N blocks in rank order. bfloat16/float16 blocks are added in float32 and rounded once:
// widening before the collective would double the bytes on the wire, reducing in bf16 would round
// N-1 times. Gloo has no reduce-scatter of one block per rank; Open MPI's non-blocking one (libnbc)
// reduces the whole input on rank 0 and scatters the blocks from there, which sends rank 0 N x
// the bytes and all of the arithmetic while the other ranks wait (docs/BENCHMARKS.md, "The
// reduce-scatter over MPI": at N = 2, twice this route's time for a 16 MiB float32 input; gpt2's
// reduce-scatters busy 1.04 s a step against 0.71). One route also gives MPI and Gloo the same
// order of addition, so the same run gives the same bits under either launcher.
void reduce_scatter_by_all_to_all(BlockingBackend& backend, const at::Tensor& output, const at::Tensor& input,
                                  ReduceOp op) {
  at::NoGradGuard no_grad;
  const int size = backend.size();
  const int64_t n = output.numel();
  at::Tensor blocks = at::empty({size * n}, input.options());
  backend.all_to_all(blocks, input);
  const at::Tensor parts = blocks.view({size, n});  // row q: rank q's block for me
  const bool widen = is_low_precision(input.scalar_type());
  // acc = parts[0] op parts[1] op ... in rank order: written straight into the output when no
  // widening is needed (no copy of parts[0] first); bf16/fp16 parts are read as they are by the
  // float32 accumulator, which the kernel's type promotion widens them to exactly (no widened copy
  // per part). The first two bf16 parts are not combined with each other directly: their common
  // dtype would be bf16, and the sum would round there. Same operations, same rounding as before.
  at::Tensor acc = widen ? at::empty({n}, input.options().dtype(at::kFloat)) : output.view(-1);
  const auto combine = [&](const at::Tensor& a, const at::Tensor& b) {
    switch (op) {
      case ReduceOp::kMax: at::maximum_out(acc, a, b); break;
      case ReduceOp::kMin: at::minimum_out(acc, a, b); break;
      default: at::add_out(acc, a, b); break;
    }
  };
  int q = 1;
  if (widen || size == 1) {
    acc.copy_(parts[0]);
  } else {
    combine(parts[0], parts[1]);
    q = 2;
  }
  for (; q < size; ++q) combine(acc, parts[q]);
  if (op == ReduceOp::kAvg) acc.div_(size);
  if (widen) output.view(-1).copy_(acc);
}

// All-reduce = the reduce-scatter above over blocks padded to a multiple of the group size, then an
// all-gather of the rounded blocks: every rank ends with bitwise the same values.
void all_reduce_low_precision(BlockingBackend& backend, const at::Tensor& tensor, ReduceOp op) {
  at::NoGradGuard no_grad;
  const int size = backend.size();
  const int64_t m = tensor.numel();
  const int64_t c = (m + size - 1) / size;
  at::Tensor padded = at::zeros({size * c}, tensor.options());
  padded.narrow(0, 0, m).copy_(tensor.view(-1));
  at::Tensor mine = at::empty({c}, tensor.options());
  reduce_scatter_by_all_to_all(backend, mine, padded, op);
  backend.all_gather(padded, mine);
  tensor.view(-1).copy_(padded.narrow(0, 0, m));
}

void reduce_with(BlockingBackend& backend, const at::Tensor& result, ReduceOp op,
                 const std::function<void(ReduceOp)>& run) {
  run(op == ReduceOp::kAvg ? ReduceOp::kSum : op);
  if (op != ReduceOp::kAvg) return;
  if (at::isIntegralType(result.scalar_type(), /*includeBool=*/false)) {
    result.div_(backend.size(), "floor");
  } else {
    result.div_(backend.size());
  }
}

}  // namespace fsdp::comm::detail
