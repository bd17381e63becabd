// fsdp-plan --calibrate: the steps of a calibration, in the order every rank runs them (each step
// is collective). What each step measures, and how: apps/plan/calibration/.
#include "plan/calibrate.h"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/accounting/memory.h"
#include "fsdp/common/cpu_info.h"
#include "fsdp/planner/memory.h"
#include "fsdp/planner/time_model.h"
#include "plan/calibration/beside_compute.h"
#include "plan/calibration/collective_timing.h"
#include "plan/calibration/machine.h"
#include "plan/calibration/matmul_rate.h"
#include "plan/calibration/rank_values.h"
#include "plan/calibration/step_update.h"
#include "plan/calibration/training_pass.h"
#include "plan/calibration/work_timer.h"

namespace apps::plan {
namespace fp = fsdp::planner;
using fsdp::comm::CollectiveKind;
using namespace calibration;

namespace {

const CollectiveKind kKinds[] = {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                                 CollectiveKind::kAllReduce};

// What one calibration measures on, shared by its steps.
struct Calibration {
  Calibration(const PlanFlags& f, fsdp::comm::ProcessGroup& w, std::ostream& l)
      : flags(f), world(w), log(l), in(resolve_inputs(f)), n(w.size()), root(w.rank() == 0) {}
  const PlanFlags& flags;
  fsdp::comm::ProcessGroup& world;
  std::ostream& log;
  fp::PlanInputs in;
  int64_t n = 1;         ///< world size
  bool root = false;     ///< rank 0: logs
  int64_t cores = 1;     ///< cores_available
  at::ScalarType step_dtype = at::kFloat;  ///< the step's precision
  std::string model_source, factor_source;  ///< the sources of the model rate and the factors
  std::unique_ptr<TrainingPass> step_pass;   ///< the step's precision: for the shared-core factors

  const fp::ModelSpec& model() const { return in.model; }
  int64_t rows() const { return in.step.micro_batch_size * in.step.seq_len; }
  bool has_module() const { return model().arch.kind != fp::BlockKind::kNone; }
};

// The machine: its name, ranks per node, memory per rank, and whether communication overlaps compute
// and compute oversubscribes the cores (cores_available: collective).
void describe_machine(Calibration& c, fp::DeviceProfile& p) {
  p.name = c.flags.name.empty() ? "calibrated" : c.flags.name;
  const fsdp::CpuInfo& cpu = fsdp::cpu_info();
  p.ranks_per_node = ranks_on_this_node(c.n);
  p.description = std::to_string(c.n) + " MPI ranks x " + std::to_string(c.flags.threads) +
                  " intra-op thread(s) on " + cpu.model + " (" + cpu.capability + ")";
  p.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE)) /
                   p.ranks_per_node;
  // A rank's communication thread hides its collectives only on a core of its own; compute threads
  // that need more cores than there are time-share them ([Note: timing together]).
  c.cores = cores_available(c.world);
  p.comm_overlaps_compute = p.ranks_per_node * (c.flags.threads + 1) <= c.cores;
  p.compute_oversubscribed = p.ranks_per_node * c.flags.threads > c.cores;
}

// The collectives' points, fits and links per kind ([Note: collective sizes]); none on one rank
// (profile.h has_collectives).
void measure_collectives(Calibration& c, fp::DeviceProfile& p) {
  const int64_t N = c.n;
  const std::vector<int64_t> sizes = collective_sizes(c.model(), c.in.step, N);
  fp::CollectiveLinks* links[] = {&p.all_gather, &p.reduce_scatter, &p.all_reduce};
  p.has_collectives = N >= 2;
  for (int k = 0; k < 3 && p.has_collectives; ++k) {
    std::vector<fp::CalibrationPoint> pts;
    for (int64_t bytes : sizes) {
      const int reps = bytes >= (4 << 20) ? 5 : 9;
      const std::vector<double> t = across_ranks(c.world, time_collective(c.world, kKinds[k], bytes, reps), /*min=*/false);
      const int64_t logical = std::max<int64_t>(N, bytes / 4 / N * N) * 4;
      pts.push_back({logical, median(t)});
    }
    fp::CalibrationFit fit = fp::fit_alpha_beta(pts);
    const fp::LinkProfile link = fp::link_from_fit(kKinds[k], fit, N);
    links[k]->intra_node = link;
    links[k]->inter_node = link;  // one node measured: no inter-node figure
    p.fits.push_back(fit);
    if (c.root) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), "%-15s alpha %.1f us, %.2f GB/s logical (ring link: %.2f us/step, %.2f GB/s)",
                    fsdp::comm::to_string(kKinds[k]), fit.alpha_s * 1e6,
                    fit.beta_s_per_byte > 0 ? 1e-9 / fit.beta_s_per_byte : 0.0, link.alpha_s * 1e6,
                    link.bandwidth_bytes_per_s * 1e-9);
      c.log << buf << std::endl;
    }
  }
  p.calibration_world_size = N;
  p.calibration_model = c.model().name;
  p.calibration_model_params = c.model().num_params();
  p.calibration_micro_batch_size = c.in.step.micro_batch_size;
  p.calibration_seq_len = c.in.step.seq_len;
}

// at::mm's fp32, bf16 and fp16 rates over the model's shapes.
void measure_matmul_rates(Calibration& c, fp::DeviceProfile& p) {
  const fp::ModelSpec& m = c.model();
  p.matmul_flops_per_s_fp32 = matmul_rate(m, c.rows(), at::kFloat, c.world);
  p.matmul_flops_per_s_bf16 = matmul_rate(m, c.rows(), at::kBFloat16, c.world);
  p.matmul_flops_per_s_fp16 = matmul_rate(m, c.rows(), at::kHalf, c.world);
  if (c.root) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "at::mm of %s's shapes, %lld rows: fp32 %.1f, bf16 %.1f, fp16 %.1f GFLOP/s per rank",
                  m.name.c_str(), static_cast<long long>(c.rows()), p.matmul_flops_per_s_fp32 * 1e-9,
                  p.matmul_flops_per_s_bf16 * 1e-9, p.matmul_flops_per_s_fp16 * 1e-9);
    c.log << buf << std::endl;
  }
}

// The model rates ([Note: model rate]): fp32 and bf16, fp16 only for an fp16 step; keeps the step
// precision's pass for the later steps. A parameter-count model has no module: its pass is made,
// no rate is measured.
void measure_model_rates(Calibration& c, fp::DeviceProfile& p, WorkTimer& timer) {
  const fp::ModelSpec& m = c.model();
  c.model_source = "model_flops_per_s: not measured (a parameter-count model has no module to run)";
  if (!c.has_module()) {
    c.step_pass = std::make_unique<TrainingPass>(m, c.in.step, c.step_dtype, p.ranks_per_node);
    return;
  }
  TrainingPass f32(m, c.in.step, at::kFloat, p.ranks_per_node);
  f32.sample(timer);
  p.model_flops_per_s_fp32 = model_rate(f32, c.world);
  const int64_t n_layer = f32.n_layer;
  if (c.step_dtype == at::kFloat) c.step_pass = std::make_unique<TrainingPass>(std::move(f32));
  {
    TrainingPass b16(m, c.in.step, at::kBFloat16, p.ranks_per_node);
    b16.sample(timer);
    p.model_flops_per_s_bf16 = model_rate(b16, c.world);
    if (c.step_dtype == at::kBFloat16) c.step_pass = std::make_unique<TrainingPass>(std::move(b16));
  }
  // fp16 only when asked for: CPUs without fp16 matmul units run it ~10x slower than bf16.
  if (c.step_dtype == at::kHalf) {
    c.step_pass = std::make_unique<TrainingPass>(m, c.in.step, at::kHalf, p.ranks_per_node);
    c.step_pass->sample(timer);
    p.model_flops_per_s_fp16 = model_rate(*c.step_pass, c.world);
  }
  c.model_source = "model_flops_per_s: a training forward + backward of " + m.name + " (" +
                   std::to_string(n_layer) + " of its " + std::to_string(m.arch.n_layer) + " blocks), " +
                   std::to_string(c.in.step.micro_batch_size) + " x " + std::to_string(c.in.step.seq_len) +
                   " tokens, cross-entropy loss; the planner's FLOPs of that module over the median seconds (5-25 "
                   "passes; the step's precision sampled again at the end of the calibration, the median over both), "
                   "slowest rank, all ranks at once; fp16 only with --mixed-precision fp16";
}

// The step update's points and seconds per element per optimizer ([Note: step update calibration]).
void measure_step_update(fp::DeviceProfile& p, WorkTimer& timer) {
  p.step_update_points_adamw = step_update_points(fp::OptimizerKind::kAdamW, timer);
  p.step_update_points_sgd_momentum = step_update_points(fp::OptimizerKind::kSgdMomentum, timer);
  p.step_update_points_sgd = step_update_points(fp::OptimizerKind::kSgd, timer);
  // Per element: the largest tensor's rate (beyond the caches), for sizes past the points.
  const auto per_elem = [](const std::vector<fp::UpdatePoint>& v) {
    return v.back().seconds / static_cast<double>(v.back().numel);
  };
  p.step_update_s_per_elem_adamw = per_elem(p.step_update_points_adamw);
  p.step_update_s_per_elem_sgd_momentum = per_elem(p.step_update_points_sgd_momentum);
  p.step_update_s_per_elem_sgd = per_elem(p.step_update_points_sgd);
}

// Where communication shares the cores: what each kind costs beside a training pass ([Note:
// collectives beside compute]), at the size of the model's largest reduce-scatter.
void measure_beside_compute(Calibration& c, fp::DeviceProfile& p, WorkTimer& timer) {
  c.factor_source = "shared_core_factor, duration_factor: 1, not measured (communication overlaps compute)";
  if (!p.has_collectives || p.comm_overlaps_compute) return;
  const int64_t N = c.n;
  const fp::ModelSpec& m = c.model();
  fp::CollectiveLinks* links[] = {&p.all_gather, &p.reduce_scatter, &p.all_reduce};
  std::string line = "beside a training pass, a collective costs", takes;
  int64_t largest = 0;
  for (const fp::UnitSpec& u : m.units) {
    largest = std::max(largest, fp::reduce_bytes_per_elem(c.in.step.precision) * fp::unit_numbers(u, N, 0).reduce_numel);
  }
  const int64_t logical = std::clamp<int64_t>(largest, int64_t{4} << 20, int64_t{64} << 20) / 4 / N * N * 4;
  for (int k = 0; k < 3; ++k) {
    const double op_s = fp::collective_time_s(p, kKinds[k], logical, N, /*crosses_nodes=*/false);
    const BesideCompute b = beside_compute(timer, kKinds[k], logical, op_s, *c.step_pass);
    links[k]->shared_core_factor = b.shared_core_factor;
    links[k]->duration_factor = b.duration_factor;
    char buf[80];
    std::snprintf(buf, sizeof(buf), "%s %s %.2fx", k ? "," : "", fsdp::comm::to_string(kKinds[k]), b.shared_core_factor);
    line += buf;
    std::snprintf(buf, sizeof(buf), "%s %s %.2fx", k ? "," : "", fsdp::comm::to_string(kKinds[k]), b.duration_factor);
    takes += buf;
  }
  line += " its time alone";
  if (p.compute_oversubscribed) line += "; beside computing it runs" + takes + " slower than alone";
  if (c.root) c.log << line << std::endl;
  c.factor_source = std::string("shared_core_factor: per kind, ") +
                    (p.compute_oversubscribed ? "at least 0.1 (compute oversubscribes the cores)" : "at least 1") +
                    ", the seconds fp32 collectives the size of the model's largest reduce-scatter (" +
                    std::to_string(logical) + " bytes, within 4 to 64 MiB; about half "
                    "a pass's time alone; all-gathers issued at the start of its forward, reductions of its backward) added to "
                    "a training forward + backward of " + m.name +
                    " running beside them (a parameter-count model: 1024 x 1024 matmuls), over their time alone; "
                    "the median of 5 pairs (pass alone, pass with collectives), slowest rank, all ranks at once" +
                    (p.compute_oversubscribed ? "; duration_factor: per kind, at least 1, the same collectives' seconds "
                                                "on the communication thread beside the pass over their time alone, "
                                                "median of the 5, slowest rank"
                                              : "; duration_factor: 1, not measured (compute fits the cores)");
}

// [Note: model rate twice] The machine's speed drifts over tens of seconds (a shared guest), and a
// calibration takes about that long: the step's precision is sampled again here, at its end, and
// its rate is the median over both windows.
void resample_step_rate(Calibration& c, fp::DeviceProfile& p, WorkTimer& timer) {
  if (!c.has_module()) return;
  c.step_pass->sample(timer);
  double& rate = c.step_dtype == at::kBFloat16 ? p.model_flops_per_s_bf16
                 : c.step_dtype == at::kHalf   ? p.model_flops_per_s_fp16
                                               : p.model_flops_per_s_fp32;
  rate = model_rate(*c.step_pass, c.world);
  if (c.root) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "training forward + backward of %s: fp32 %.1f, bf16 %.1f GFLOP/s per rank%s",
                  c.model().name.c_str(), p.model_flops_per_s_fp32 * 1e-9, p.model_flops_per_s_bf16 * 1e-9,
                  c.step_dtype == at::kHalf ? (", fp16 " + std::to_string(p.model_flops_per_s_fp16 * 1e-9)).c_str() : "");
    c.log << buf << std::endl;
  }
}

// Rank 0's last line: the step update, the copies and how communication meets compute.
void log_summary(const Calibration& c, const fp::DeviceProfile& p) {
  if (!c.root) return;
  char buf[420];
  std::snprintf(buf, sizeof(buf),
                "step update: adamw %.2f, sgd-momentum %.2f, sgd %.2f ns per element (16M-element tensors; "
                "adamw %.1f ns at 256k); tensor copies %.1f GB/s (read + written); communication %s compute "
                "(%lld ranks x (%d + 1) threads on %lld cores%s)",
                p.step_update_s_per_elem_adamw * 1e9, p.step_update_s_per_elem_sgd_momentum * 1e9,
                p.step_update_s_per_elem_sgd * 1e9,
                p.step_update_tensor_s(fp::OptimizerKind::kAdamW, int64_t{1} << 18) / (1 << 18) * 1e9,
                p.memory_copy_bytes_per_s * 1e-9,
                p.comm_overlaps_compute ? "overlaps" : "shares the cores of",
                static_cast<long long>(p.ranks_per_node), c.flags.threads, static_cast<long long>(c.cores),
                p.compute_oversubscribed ? "; compute oversubscribes them: passes and copies timed from barrier to barrier, the update to each "
                                           "rank's own end, mean over ranks" : "");
  c.log << buf << std::endl;
}

// Where each figure comes from (the profile's `sources`).
void write_sources(const Calibration& c, fp::DeviceProfile& p) {
  p.sources = {
      c.n >= 2 ? "measured by fsdp-plan --calibrate at N = " + std::to_string(c.n) + " over MPI (ProcessGroup): all-gather, "
                   "reduce-scatter, all-reduce of fp32 tensors of 4 KiB to 32 MiB and of " + c.model().name + "'s own message sizes "
                   "(up to 256 MiB), median of 5-9 runs, slowest rank: the time model interpolates these points "
                   "(calibration.fits); the links are t = alpha + beta x bytes fitted per kind, for other nodes; one node "
                   "measured, so inter_node repeats intra_node"
             : std::string("measured by fsdp-plan --calibrate on one rank: no collectives (this profile plans N = 1)"),
      "matmul rates: at::mm of " + c.model().name + "'s forward shapes with " + std::to_string(c.rows()) + " rows (micro-batch x "
          "sequence length), weighted by FLOPs, slowest rank, " + std::to_string(c.flags.threads) +
          " intra-op thread(s) per rank, all ranks at once",
      c.model_source,
      "step_update_points_numel_seconds: seconds per fp32 tensor of 1k to 16M elements (2^20 elements of "
          "such tensors at a time) for the 2-norm, clip scale, the optimizer's step and zero_grad, "
          "tensor by tensor, caches flushed before each run, all ranks at once, each rank's time to its own end, " +
          std::string(p.compute_oversubscribed ? "median of 9, mean over ranks (compute oversubscribes the cores); "
                                               : "median of 5, slowest rank; ") +
          "step_update_s_per_elem: the 16M-element tensor's seconds per element",
      "memory_copy_bytes_per_s: copy_ of a 16 MiB fp32 tensor into another, 4 at a time, caches flushed before each run, bytes "
          "read + written per second, median of 9, slowest rank, all ranks at once",
      "comm_overlaps_compute: ranks on this node x (intra-op threads + 1 communication thread) <= the cores "
          "the ranks may run on (the union of their affinity masks: " + std::to_string(c.cores) + "); compute_oversubscribed: ranks on this node x "
          "intra-op threads > those cores (then the passes, copies and step updates are timed from one barrier to the "
          "next on every rank, less an empty interval)",
      c.factor_source,
      "memory_bytes: physical memory / ranks on this node"};
}

}  // namespace

fp::DeviceProfile calibrate(const PlanFlags& flags, fsdp::comm::ProcessGroup& world, std::ostream& log) {
  at::set_num_threads(flags.threads);
  // As fsdp-train: the counting allocator, freed heap kept mapped (no page faults per step).
  fsdp::accounting::install_counting_allocator();
  fsdp::accounting::retain_freed_heap_memory();
  Calibration c(flags, world, log);
  c.step_dtype = c.in.step.precision == fp::Precision::kBf16   ? at::kBFloat16
                 : c.in.step.precision == fp::Precision::kFp16 ? at::kHalf
                                                               : at::kFloat;
  fp::DeviceProfile p;
  describe_machine(c, p);
  WorkTimer timer(world, p.compute_oversubscribed);
  measure_collectives(c, p);
  measure_matmul_rates(c, p);
  measure_model_rates(c, p, timer);
  p.memory_copy_bytes_per_s = memory_copy_rate(timer);
  measure_step_update(p, timer);
  measure_beside_compute(c, p, timer);
  resample_step_rate(c, p, timer);
  log_summary(c, p);
  write_sources(c, p);
  return p;
}

}  // namespace apps::plan
