#include "plan/calibration/matmul_rate.h"

#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>

#include <map>
#include <utility>
#include <vector>

#include "plan/calibration/rank_values.h"

namespace apps::plan::calibration {
namespace fp = fsdp::planner;
using fsdp::comm::CollectiveKind;
using fsdp::comm::now_s;
namespace {

// The forward matmul shapes (out, in) of one block and the head, with how many of each the model has.
std::vector<std::pair<std::pair<int64_t, int64_t>, int64_t>> matmul_shapes(const fp::ModelSpec& m) {
  std::map<std::pair<int64_t, int64_t>, int64_t> count;
  const fp::Architecture& a = m.arch;
  if (a.kind == fp::BlockKind::kNone) {
    count[{1024, 1024}] = 1;
  } else {
    for (size_t u = 1; u < m.units.size(); ++u) {
      for (const auto& p : m.units[u].params) {
        if (p.shape.size() == 2) count[{p.shape[0], p.shape[1]}] += 1;
      }
    }
    count[{a.vocab_size, a.n_embd}] += 1;  // the head
  }
  return {count.begin(), count.end()};
}

}  // namespace

// FLOP/s of at::mm(x (rows, in), w (out, in)^T) over the shapes, weighted by their FLOPs in the model.
double matmul_rate(const fp::ModelSpec& m, int64_t rows, at::ScalarType dtype, fsdp::comm::ProcessGroup& g) {
  double flops = 0, seconds = 0;
  for (const auto& [shape, n] : matmul_shapes(m)) {
    const auto [out, in] = shape;
    at::Tensor x = at::randn({rows, in}).to(dtype), w = at::randn({out, in}).to(dtype);
    g.barrier()->wait();  // all ranks compute at once, as in training
    at::mm(x, w.t());
    double t = 0;
    int reps = 0;
    while ((t < 0.2 && reps < 20) || reps < 2) {
      const double t0 = now_s();
      at::mm(x, w.t());
      t += now_s() - t0;
      ++reps;
    }
    const double f = 2.0 * static_cast<double>(rows * in * out);
    flops += static_cast<double>(n) * f;
    seconds += static_cast<double>(n) * t / reps;
  }
  return across_ranks(g, {flops / seconds}, /*min=*/true)[0];
}

}  // namespace apps::plan::calibration
