#include "low_precision.h"

#include <ATen/ATen.h>

namespace fsdp::comm::detail {

bool is_low_precision(c10::ScalarType dtype) { return dtype == at::kBFloat16 || dtype == at::kHalf; }

// [Note: low-precision reductions] A bf16/fp16 reduce-scatter sends each block in its own dtype to
// the rank that owns it (one all-to-all: the (N-1)/N x input bytes of a ring reduce-scatter), and
// the owner adds the N blocks in float32 in rank order, rounding once. Widening to float32 before
// the collective would double the bytes on the wire; reducing in bf16 would round N-1 times.
void reduce_scatter_low_precision(BlockingBackend& backend, const at::Tensor& output, const at::Tensor& input,
                                  ReduceOp op) {
  at::NoGradGuard no_grad;
  const int size = backend.size();
  const int64_t n = output.numel();
  at::Tensor blocks = at::empty({size * n}, input.options());
  backend.all_to_all(blocks, input);
  at::Tensor parts = blocks.view({size, n}).to(at::kFloat);  // row q: rank q's block for me
  at::Tensor acc = parts[0].clone();
  for (int q = 1; q < size; ++q) {
    switch (op) {
      case ReduceOp::kMax: at::maximum_out(acc, acc, parts[q]); break;
      case ReduceOp::kMin: at::minimum_out(acc, acc, parts[q]); break;
      default: acc.add_(parts[q]); break;
    }
  }
  if (op == ReduceOp::kAvg) acc.div_(size);
  output.view(-1).copy_(acc);
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
  reduce_scatter_low_precision(backend, mine, padded, op);
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
