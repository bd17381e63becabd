#include "plan/calibrate.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "fsdp/common/cpu_info.h"

namespace apps::plan {
namespace fp = fsdp::planner;
using fsdp::comm::CollectiveKind;
using fsdp::comm::now_s;

namespace {

// The slowest rank's value of every entry (a max all-reduce); `min` for rates.
std::vector<double> across_ranks(fsdp::comm::ProcessGroup& g, std::vector<double> v, bool min) {
  at::Tensor t = at::tensor(v, at::kDouble);
  if (min) t.neg_();
  g.all_reduce(t, fsdp::comm::ReduceOp::kMax)->wait();
  if (min) t.neg_();
  const double* p = t.data_ptr<double>();
  return std::vector<double>(p, p + v.size());
}

// Seconds of one collective of `bytes` logical bytes (fp32), measured `reps` times after a warm-up.
std::vector<double> time_collective(fsdp::comm::ProcessGroup& g, CollectiveKind kind, int64_t bytes, int reps) {
  const int64_t n = g.size(), elems = std::max<int64_t>(n, bytes / 4 / n * n);
  at::Tensor big = at::zeros({elems}, at::kFloat), small = at::zeros({elems / n}, at::kFloat);
  auto run = [&] {
    if (kind == CollectiveKind::kAllGather) g.all_gather_into_tensor(big, small)->wait();
    else if (kind == CollectiveKind::kReduceScatter) g.reduce_scatter_tensor(small, big)->wait();
    else g.all_reduce(big)->wait();
  };
  run();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    g.barrier()->wait();
    const double t0 = now_s();
    run();
    t.push_back(now_s() - t0);
  }
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

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

int64_t ranks_on_this_node(int64_t world) {
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::max(1, std::atoi(s));
  return world;
}

}  // namespace

fp::DeviceProfile calibrate(const PlanFlags& flags, fsdp::comm::ProcessGroup& world, std::ostream& log) {
  const int64_t N = world.size();
  if (N < 2) {
    throw UsageError("--calibrate measures collectives between ranks: run it under mpirun -n N with N >= 2");
  }
  at::set_num_threads(flags.threads);
  const bool root = world.rank() == 0;
  fp::PlanInputs in = resolve_inputs(flags);
  const fp::ModelSpec& m = in.model;
  const int64_t rows = in.step.micro_batch_size * in.step.seq_len;

  fp::DeviceProfile p;
  p.name = flags.name.empty() ? "calibrated" : flags.name;
  const fsdp::CpuInfo& cpu = fsdp::cpu_info();
  p.ranks_per_node = ranks_on_this_node(N);
  p.description = std::to_string(N) + " MPI ranks x " + std::to_string(flags.threads) + " intra-op thread(s) on " +
                  cpu.model + " (" + cpu.capability + ")";
  p.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) /
                   p.ranks_per_node;

  const std::vector<int64_t> sizes{4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20};
  const CollectiveKind kinds[] = {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce};
  fp::CollectiveLinks* links[] = {&p.all_gather, &p.reduce_scatter, &p.all_reduce};
  for (int k = 0; k < 3; ++k) {
    std::vector<fp::CalibrationPoint> pts;
    for (int64_t bytes : sizes) {
      const int reps = bytes >= (4 << 20) ? 5 : 9;
      const std::vector<double> t = across_ranks(world, time_collective(world, kinds[k], bytes, reps), /*min=*/false);
      const int64_t logical = std::max<int64_t>(N, bytes / 4 / N * N) * 4;
      pts.push_back({logical, median(t)});
    }
    fp::CalibrationFit fit = fp::fit_alpha_beta(pts);
    const fp::LinkProfile link = fp::link_from_fit(kinds[k], fit, N);
    links[k]->intra_node = link;
    links[k]->inter_node = link;  // one node measured: no inter-node figure
    p.fits.push_back(fit);
    if (root) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), "%-15s alpha %.1f us, %.2f GB/s logical (ring link: %.2f us/step, %.2f GB/s)",
                    fsdp::comm::to_string(kinds[k]), fit.alpha_s * 1e6,
                    fit.beta_s_per_byte > 0 ? 1e-9 / fit.beta_s_per_byte : 0.0, link.alpha_s * 1e6,
                    link.bandwidth_bytes_per_s * 1e-9);
      log << buf << std::endl;
    }
  }
  p.calibration_world_size = N;

  p.matmul_flops_per_s_fp32 = matmul_rate(m, rows, at::kFloat, world);
  p.matmul_flops_per_s_bf16 = matmul_rate(m, rows, at::kBFloat16, world);
  p.matmul_flops_per_s_fp16 = matmul_rate(m, rows, at::kHalf, world);
  if (root) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "at::mm of %s's shapes, %lld rows: fp32 %.1f, bf16 %.1f, fp16 %.1f GFLOP/s per rank",
                  m.name.c_str(), static_cast<long long>(rows), p.matmul_flops_per_s_fp32 * 1e-9,
                  p.matmul_flops_per_s_bf16 * 1e-9, p.matmul_flops_per_s_fp16 * 1e-9);
    log << buf << std::endl;
  }
  p.sources = {
      "measured by fsdp-plan --calibrate at N = " + std::to_string(N) + " over MPI (ProcessGroup): all-gather, "
          "reduce-scatter, all-reduce of fp32 tensors of 4 KiB to 16 MiB, median of 5-9 runs, slowest rank; "
          "t = alpha + beta x bytes fitted per kind; one node measured, so inter_node repeats intra_node",
      "matmul rates: at::mm of " + m.name + "'s forward shapes with " + std::to_string(rows) + " rows (micro-batch x "
          "sequence length), weighted by FLOPs, slowest rank, " + std::to_string(flags.threads) +
          " intra-op thread(s) per rank, all ranks at once",
      "memory_bytes: physical memory / ranks on this node"};
  return p;
}

}  // namespace apps::plan
