#include "plan/calibrate.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <sched.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fsdp/accounting/memory.h"
#include "fsdp/common/cpu_info.h"
#include "fsdp/optim/clip.h"
#include "fsdp/planner/memory.h"
#include "fsdp/planner/time_model.h"
#include "models/gpt.h"
#include "models/llama.h"

namespace apps::plan {
namespace fp = fsdp::planner;
using fsdp::comm::CollectiveKind;
using fsdp::comm::now_s;

namespace {

// Every entry all-reduced over the ranks by `op` (a double tensor). Blocking; collective.
std::vector<double> all_reduce_values(fsdp::comm::ProcessGroup& g, const std::vector<double>& v, fsdp::comm::ReduceOp op) {
  at::Tensor t = at::tensor(v, at::kDouble);
  g.all_reduce(t, op)->wait();
  const double* p = t.data_ptr<double>();
  return std::vector<double>(p, p + v.size());
}

// The slowest rank's value of every entry (a max all-reduce); `min` for rates.
std::vector<double> across_ranks(fsdp::comm::ProcessGroup& g, std::vector<double> v, bool min) {
  if (!min) return all_reduce_values(g, v, fsdp::comm::ReduceOp::kMax);
  for (double& x : v) x = -x;
  std::vector<double> r = all_reduce_values(g, v, fsdp::comm::ReduceOp::kMax);
  for (double& x : r) x = -x;
  return r;
}

// The mean over ranks of every entry (an average all-reduce).
std::vector<double> mean_across_ranks(fsdp::comm::ProcessGroup& g, const std::vector<double>& v) {
  return all_reduce_values(g, v, fsdp::comm::ReduceOp::kAvg);
}

// Issues one collective of `kind` over (world x S) `big` and (S) `small`, as the engine does: the
// reductions average (a sum, then a division on the communication thread). Non-blocking.
fsdp::comm::WorkPtr issue_collective(fsdp::comm::ProcessGroup& g, CollectiveKind kind, const at::Tensor& big,
                                     const at::Tensor& small) {
  constexpr fsdp::comm::ReduceOp kAvg = fsdp::comm::ReduceOp::kAvg;
  if (kind == CollectiveKind::kAllGather) return g.all_gather_into_tensor(big, small);
  if (kind == CollectiveKind::kReduceScatter) return g.reduce_scatter_tensor(small, big, kAvg);
  return g.all_reduce(big, kAvg);
}

// Seconds of one collective of `bytes` logical bytes (fp32), measured `reps` times after a warm-up.
std::vector<double> time_collective(fsdp::comm::ProcessGroup& g, CollectiveKind kind, int64_t bytes, int reps) {
  const int64_t n = g.size(), elems = std::max<int64_t>(n, bytes / 4 / n * n);
  at::Tensor big = at::zeros({elems}, at::kFloat), small = at::zeros({elems / n}, at::kFloat);
  auto run = [&] { issue_collective(g, kind, big, small)->wait(); };
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

// [Note: timing together] Seconds of a piece of compute-thread work (a training pass, copies, a
// step update), all ranks at once. Where the ranks' compute threads oversubscribe the cores
// (`together`), what one rank's clock says of its own work depends on which ranks the scheduler
// ran meanwhile (a 16 MiB copy timed per rank measured 6 to 20 GB/s in five calibrations of micro
// at N = 4 on 2 cores), while a step's collectives keep its ranks together: there the work runs
// from one barrier to the next on every rank and its seconds are that interval less an empty
// interval's (the median of 9). Elsewhere each rank times its own work. Work that no collective
// ends in a step (the step update: the next collective comes in the next forward or backward)
// is timed by seconds_to_own_end instead ([Note: step update calibration]). Blocking; collective
// when `together` (every rank calls it the same number of times).
class WorkTimer {
 public:
  WorkTimer(fsdp::comm::ProcessGroup& g, bool together) : g_(g), together_(together) {
    if (!together_) return;
    std::vector<double> empty;
    for (int r = 0; r < 9; ++r) empty.push_back(interval([] {}));
    barrier_s_ = median(empty);
  }
  double seconds(const std::function<void()>& work) {
    if (!together_) {
      const double t0 = now_s();
      work();
      return now_s() - t0;
    }
    return std::max(0.0, interval(work) - barrier_s_);
  }
  /// Seconds of `work` on this rank's clock from a start all ranks share (a barrier) to this
  /// rank's own end; a barrier after it (not timed) starts the next run together. Without
  /// `together`, as seconds().
  double seconds_to_own_end(const std::function<void()>& work) {
    if (!together_) return seconds(work);
    g_.barrier()->wait();
    const double t0 = now_s();
    work();
    const double d = now_s() - t0;
    g_.barrier()->wait();
    return d;
  }
  bool together() const { return together_; }
  fsdp::comm::ProcessGroup& group() const { return g_; }

 private:
  double interval(const std::function<void()>& work) {
    g_.barrier()->wait();
    const double t0 = now_s();
    work();
    g_.barrier()->wait();
    return now_s() - t0;
  }
  fsdp::comm::ProcessGroup& g_;
  bool together_;
  double barrier_s_ = 0.0;
};

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

// A module of the model's architecture (its layers cut to `n_layer`) and its vocabulary.
std::shared_ptr<torch::nn::Module> build_module(const fp::Architecture& a, int64_t n_layer) {
  if (a.kind == fp::BlockKind::kGpt) {
    apps::models::GPTConfig c;
    c.vocab_size = a.vocab_size;
    c.n_layer = n_layer;
    c.n_head = a.n_head;
    c.n_embd = a.n_embd;
    c.block_size = a.context;
    c.attention = a.attention;
    return apps::models::GPT(c).ptr();
  }
  apps::models::LlamaConfig c;
  c.vocab_size = a.vocab_size;
  c.n_layer = n_layer;
  c.n_head = a.n_head;
  c.n_kv_head = a.n_kv_head;
  c.d_model = a.n_embd;
  c.ffn = a.ffn_hidden;
  c.max_seq = a.context;
  return apps::models::Llama(c).ptr();
}

at::Tensor forward_logits(const std::shared_ptr<torch::nn::Module>& m, const fp::Architecture& a, const at::Tensor& idx) {
  if (a.kind == fp::BlockKind::kGpt) return std::static_pointer_cast<apps::models::GPTImpl>(m)->forward(idx);
  return std::static_pointer_cast<apps::models::LlamaImpl>(m)->forward(idx);
}

// A training forward + backward of the model's module (its blocks cut so that every rank's copy,
// its gradients and a working margin take at most half of this node's memory): random tokens of
// micro-batch x seq_len, the loss as fsdp-train computes it. A parameter-count model has no
// module: its pass is the three matmuls of a 1024 x 1024 layer's forward and backward over
// micro-batch x seq_len rows, 8 times (no FLOP rate is derived from it).
struct TrainingPass {
  std::shared_ptr<torch::nn::Module> module;
  at::Tensor idx, x, w;
  fp::Architecture arch;
  int64_t n_layer = 0;  ///< layers of the module
  double flops = 0.0;   ///< the planner's FLOPs of one pass (unit_flops of the root and the blocks)

  TrainingPass(const fp::ModelSpec& m, const fp::StepSetup& step, at::ScalarType dtype, int64_t ranks_on_node)
      : arch(m.arch) {
    if (arch.kind == fp::BlockKind::kNone) {
      x = at::randn({step.micro_batch_size * step.seq_len, 1024}).to(dtype);
      w = at::randn({1024, 1024}).to(dtype);
      return;
    }
    const double block_bytes = 16.0 * static_cast<double>(m.units.size() > 1 ? m.units[1].numel() : 0);
    const double root_bytes = 16.0 * static_cast<double>(m.units[0].numel());
    const double budget = 0.5 * static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                          static_cast<double>(sysconf(_SC_PAGESIZE)) / static_cast<double>(ranks_on_node);
    n_layer = arch.n_layer;
    while (n_layer > 1 && root_bytes + static_cast<double>(n_layer) * block_bytes > budget) --n_layer;
    module = build_module(arch, n_layer);
    module->to(dtype);
    idx = at::randint(arch.vocab_size, {step.micro_batch_size, step.seq_len}, at::kLong);
    flops = fp::unit_flops(m, 0, step).forward + fp::unit_flops(m, 0, step).backward +
            static_cast<double>(n_layer) * (fp::unit_flops(m, 1, step).forward + fp::unit_flops(m, 1, step).backward);
  }
  /// One forward + backward (blocking); `between` runs after the forward, before the backward.
  /// Returns the seconds of it all.
  double run(const std::function<void()>& between = {}) {
    const double t0 = now_s();
    if (!module) {
      for (int i = 0; i < 8; ++i) at::mm(x, w.t());
      if (between) between();
      for (int i = 0; i < 8; ++i) {
        at::mm(x, w);
        at::mm(x.t(), x);
      }
      return now_s() - t0;
    }
    for (auto& p : module->parameters()) p.mutable_grad() = at::Tensor();
    at::Tensor logits = forward_logits(module, arch, idx);
    at::Tensor loss =
        torch::nn::functional::cross_entropy(logits.reshape({-1, arch.vocab_size}).to(at::kFloat), idx.reshape({-1}));
    if (between) between();
    loss.backward();
    return now_s() - t0;
  }
  /// Times passes, all ranks at once after a warm-up pass (5 to 25 of them, about two seconds: a
  /// pass's time spreads by ~10% on a shared 2-core guest; the count agreed across ranks), by
  /// `timer` ([Note: timing together]), and keeps their seconds in `samples_s`. Blocking; every
  /// rank calls it at the same point.
  void sample(WorkTimer& timer) {
    fsdp::comm::ProcessGroup& g = timer.group();
    g.barrier()->wait();  // all ranks compute at once, as in training
    const double first_s = across_ranks(g, {run()}, /*min=*/false)[0];
    const int reps = static_cast<int>(std::clamp(std::ceil(2.0 / std::max(first_s, 1e-9)), 5.0, 25.0));
    for (int r = 0; r < reps; ++r) samples_s.push_back(timer.seconds([&] { run(); }));
  }
  std::vector<double> samples_s;  ///< seconds of each timed pass so far
};

// [Note: model rate] The FLOP rate a training forward + backward of the model reaches (TrainingPass),
// all ranks at once; FLOPs from the planner's unit_flops (root + blocks), so the time model divides
// the same count by this rate: the planner's FLOPs over the median of the pass's samples so far,
// the slowest rank's. The step's precision is sampled twice, at the start of the calibration and
// again at its end ([Note: model rate twice]).
double model_rate(TrainingPass& pass, fsdp::comm::ProcessGroup& g) {
  return across_ranks(g, {pass.flops / median(pass.samples_s)}, /*min=*/true)[0];
}

// [Note: collectives beside compute] What a collective costs a training step where communication
// shares the compute cores. Each rank's communication thread runs `count` collectives of `kind`
// (fp32, each the size of the model's largest reduce-scatter at this world size, within 4 to 64 MiB:
// a collective's speed and its cost to compute change with its size, and the model's messages are
// what a step sends; over a pool of up to 16 buffer pairs, at most ~256 MiB, used in turn) beside a
// training pass
// as the engine's run: all-gathers issued at the start of its forward, reduce-scatters and
// all-reduces at the start of its backward; all ranks at once. The wall time until both the pass
// and the collectives are done, minus the pass alone, is what the collectives added; over their
// time alone (`op_alone_s` each, from the measured points) it is the shared-core factor (profile.h
// CollectiveLinks::shared_core_factor). `count` makes the collectives' time alone about half of
// the pass (of its backward for the reductions), as in a step, so that the difference stands well
// above the pass's own spread. The pass alone and the pass with collectives alternate (the
// machine's speed drifts); the median of 5 such pairs' differences after a warm-up pair; the
// slowest rank's. Where compute oversubscribes the cores the same runs give the duration factor:
// the collectives' own seconds on their thread beside the pass over their time alone.
struct BesideCompute {
  double shared_core_factor = 1.0;  ///< seconds added to the pass per second alone
  double duration_factor = 1.0;     ///< seconds on the communication thread per second alone
};
BesideCompute beside_compute(WorkTimer& timer, CollectiveKind kind, int64_t logical_bytes, double op_alone_s,
                             TrainingPass& pass) {
  fsdp::comm::ProcessGroup& g = timer.group();
  const int64_t n = g.size(), elems = std::max<int64_t>(n, logical_bytes / 4 / n * n);
  g.barrier()->wait();
  pass.run();
  const double pass_s = across_ranks(g, {pass.run()}, /*min=*/false)[0];
  // The engine all-gathers from the start of forward on, and reduces during backward (two thirds
  // of the pass): the collectives start there and take about half of that time alone.
  const bool in_backward = kind != CollectiveKind::kAllGather;
  const double window_s = in_backward ? pass_s * 2.0 / 3.0 : pass_s;
  const int count = static_cast<int>(std::clamp(0.5 * window_s / std::max(op_alone_s, 1e-9), 2.0, 4096.0));
  // Up to 16 buffer pairs, at most ~256 MiB of them (the collectives run one after another on the
  // communication thread, so a pair may serve several).
  const int pool = static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / (4 * elems), 1, std::min(16, count)));
  std::vector<at::Tensor> big, small;
  for (int i = 0; i < pool; ++i) {
    big.push_back(at::zeros({elems}, at::kFloat));
    small.push_back(at::zeros({elems / n}, at::kFloat));
  }
  auto alone = [&] {
    g.barrier()->wait();
    return timer.seconds([&] { pass.run(); });
  };
  std::vector<double> durations;  // each beside-run's seconds of the collectives on their thread
  auto beside = [&] {
    g.barrier()->wait();
    std::vector<fsdp::comm::WorkPtr> works;
    const double s = timer.seconds([&] {
      auto issue = [&] {
        for (int i = 0; i < count; ++i) works.push_back(issue_collective(g, kind, big[i % pool], small[i % pool]));
      };
      if (!in_backward) issue();
      pass.run(in_backward ? std::function<void()>(issue) : std::function<void()>());
      for (auto& w : works) w->wait();
    });
    double busy_s = 0.0;
    for (auto& w : works) busy_s += w->duration_s();
    durations.push_back(busy_s);
    return s;
  };
  alone();
  beside();
  durations.clear();
  std::vector<double> added;
  for (int r = 0; r < 5; ++r) {
    const double a = alone();
    added.push_back(beside() - a);
  }
  // At least 1 where the compute threads fit the cores: the engine waits for every collective (an
  // all-gather before the unit's use, a reduce-scatter before the next one is issued), so what a
  // pass without such waits hides (a factor below 1) a step does not. Where they oversubscribe the
  // cores the factor is a collective's share of the cores beside compute (while a communication
  // thread waits for its peers, the other ranks' compute uses the core; reduce-scatters measured
  // 0.22-0.51 at N = 4 on 2 cores), and the replay adds the step's waits on its own ([Note:
  // time-shared cores]); at least kMinOversubscribedFactor there (smaller differences are within
  // the pass's spread).
  // The duration factor, where compute oversubscribes the cores (profile.h
  // CollectiveLinks::duration_factor): the collectives' seconds on their thread beside the pass
  // over their time alone, median of the 5 runs, slowest rank; at least 1 (beside compute a
  // collective does not run faster than alone; smaller values are within the spread).
  const std::vector<double> v = across_ranks(g, {median(added), median(durations)}, /*min=*/false);
  BesideCompute r;
  r.shared_core_factor = std::max(timer.together() ? fp::kMinOversubscribedFactor : 1.0, v[0] / (count * op_alone_s));
  if (timer.together()) r.duration_factor = std::clamp(v[1] / (count * op_alone_s), 1.0, 1000.0);
  return r;
}

// [Note: step update calibration] Seconds of the step update of one fp32 tensor by its size
// (profile.h step_update_points_*), for an optimizer: for each size, a set of tensors of that size
// (2^20 elements in all, at least one tensor) with gradients; as fsdp-train runs them after
// backward, tensor by tensor, the 2-norm (fsdp::sum_of_squares, as clip_grad_norm) and the clip scale (the
// gradients' own finite check runs only when the norm is not finite: not timed); then the
// optimizer's step and zero_grad (set to none). Before each timed run the caches are
// flushed (a 128 MiB buffer is written), as a step's forward and backward leave them; all ranks at
// once, median of 5 after a warm-up (9 where compute oversubscribes the cores); seconds per
// tensor = the run / the tensors. Each rank's own time, from a start all ranks share to its own
// end (WorkTimer::seconds_to_own_end): no collective ends a step's update, so each rank leaves it
// at its own pace. The slowest rank's where each rank computes on cores of its own; the mean over
// ranks where compute time-shares the cores ([Note: timing together]): there a rank that finishes
// later got less of the cores because the others got more, and what the step pays is the cores'
// total work, which the mean counts (the slowest of 4 noisy ranks over-counts it: micro's update
// at N = 4 on 2 cores was timed 10-17 ns per element from barrier to barrier, slowest rank, and
// took 8 in training).
std::vector<fp::UpdatePoint> step_update_points(fp::OptimizerKind kind, WorkTimer& timer) {
  fsdp::comm::ProcessGroup& g = timer.group();
  at::Tensor flush = at::empty({int64_t{1} << 25}, at::kFloat);
  std::vector<fp::UpdatePoint> points;
  std::vector<double> per_tensor_s;
  for (int log2 = 10; log2 <= 24; log2 += 2) {
    const int64_t E = int64_t{1} << log2, count = std::max<int64_t>(1, (int64_t{1} << 20) / E);
    std::vector<at::Tensor> params, grads;
    for (int64_t i = 0; i < count; ++i) {
      params.push_back(at::randn({E}).requires_grad_(true));
      grads.push_back(at::randn({E}));
    }
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (kind == fp::OptimizerKind::kAdamW) {
      opt = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-4));
    } else {
      opt = std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(1e-4).momentum(kind == fp::OptimizerKind::kSgdMomentum ? 0.9 : 0.0));
    }
    auto once = [&] {
      for (int64_t i = 0; i < count; ++i) params[i].mutable_grad() = grads[i].clone();
      flush.fill_(1.0f);
      return timer.seconds_to_own_end([&] {
        double squares = 0.0;  // as fsdp::clip_grad_norm sums them
        for (const auto& p : params) squares += fsdp::sum_of_squares(p.grad());
        const double norm = std::sqrt(squares);
        if (norm > 1.0) {
          for (const auto& p : params) p.grad().mul_(1.0 / norm);
        }
        opt->step();
        opt->zero_grad();
      });
    };
    g.barrier()->wait();
    once();
    std::vector<double> t;
    for (int r = 0; r < (timer.together() ? 9 : 5); ++r) t.push_back(once());
    points.push_back({E, 0.0});
    per_tensor_s.push_back(median(t) / static_cast<double>(count));
  }
  per_tensor_s = timer.together() ? mean_across_ranks(g, per_tensor_s) : across_ranks(g, per_tensor_s, /*min=*/false);
  for (size_t i = 0; i < points.size(); ++i) points[i].seconds = per_tensor_s[i];
  return points;
}

// Bytes read + written per second by at::Tensor::copy_ of a 16 MiB fp32 tensor into another (a
// unit's size: the engine copies a unit at a time), 4 at a time, caches flushed before each run
// (a 128 MiB buffer is written: a step's compute leaves them full of other data), all ranks at
// once, timed by `timer` ([Note: timing together]), median of 9 after a warm-up, the slowest rank.
double memory_copy_rate(WorkTimer& timer) {
  fsdp::comm::ProcessGroup& g = timer.group();
  const int64_t elems = int64_t{1} << 22;
  at::Tensor src = at::randn({elems}), dst = at::empty({elems}), flush = at::empty({int64_t{1} << 25});
  g.barrier()->wait();
  dst.copy_(src);
  // Four copies a run (there and back twice): long enough beside a barrier's own interval.
  constexpr int kCopies = 4;
  std::vector<double> t;
  for (int r = 0; r < 9; ++r) {
    flush.fill_(1.0f);
    t.push_back(timer.seconds([&] {
      for (int c = 0; c < kCopies; ++c) (c % 2 ? src.copy_(dst) : dst.copy_(src));
    }));
  }
  return across_ranks(g, {kCopies * 2.0 * 4.0 * static_cast<double>(elems) / median(t)}, /*min=*/true)[0];
}

// The cores the ranks may run on together: the union of every rank's affinity mask (mpirun binds
// each of two ranks to a core of its own by default: each rank's own mask then holds 1 core, the
// node's ranks 2). Collective: every rank calls it.
int64_t cores_available(fsdp::comm::ProcessGroup& g) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < online && c < CPU_SETSIZE; ++c) CPU_SET(c, &set);
  }
  at::Tensor mask = at::zeros({CPU_SETSIZE}, at::kFloat);  // (CPU_SETSIZE,): 1 where this rank may run
  float* m = mask.data_ptr<float>();
  for (int c = 0; c < CPU_SETSIZE; ++c) m[c] = CPU_ISSET(c, &set) ? 1.0f : 0.0f;
  g.all_reduce(mask, fsdp::comm::ReduceOp::kMax)->wait();
  return std::max<int64_t>(1, mask.sum().item<int64_t>());
}

int64_t ranks_on_this_node(int64_t world) {
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) return std::max(1, std::atoi(s));
  return world;
}

// [Note: collective sizes] The logical bytes the collectives are timed at: a grid (4 KiB to 32 MiB)
// and the model's own messages at this world size and the step's precision (each unit's all-gather
// and reduce-scatter, no_shard's buckets), up to kMaxCollectiveBytes.
// The time model interpolates between the points (time_model.h collective_time_s): a machine's
// collectives are not one line (Open MPI's reduce-scatter over 4 ranks on 2 cores ran 1.4 GB/s at
// 12 MiB and 0.5 GB/s at 16 MiB), so the sizes a step sends are measured, not extrapolated. A
// model message within 5% of a size already in the list is left out. Ascending.
std::vector<int64_t> collective_sizes(const fp::ModelSpec& m, const fp::StepSetup& step, int64_t n) {
  constexpr int64_t kMaxCollectiveBytes = int64_t{256} << 20;
  std::vector<int64_t> sizes{4 << 10, 64 << 10, 1 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20};
  const int64_t pb = fp::param_bytes_per_elem(step.precision), rb = fp::reduce_bytes_per_elem(step.precision);
  std::vector<int64_t> messages;
  for (const fp::UnitSpec& u : m.units) {
    const fp::UnitNumbers un = fp::unit_numbers(u, n, 0);
    messages.push_back(pb * un.gathered_numel);
    messages.push_back(rb * un.reduce_numel);
    for (int64_t b : fp::ddp_bucket_numels(u, step.bucket_cap_bytes, rb)) messages.push_back(rb * b);
  }
  // As timed: whole fp32 elements, a multiple of n of them (time_collective).
  const auto timed = [n](int64_t b) { return std::max<int64_t>(n, b / 4 / n * n) * 4; };
  for (int64_t& x : sizes) x = timed(x);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (int64_t m : messages) {
    if (m < (4 << 10) || m > kMaxCollectiveBytes) continue;
    const int64_t b = timed(m);
    const bool near = std::any_of(sizes.begin(), sizes.end(), [b](int64_t x) {
      return std::abs(static_cast<double>(b - x)) <= 0.05 * static_cast<double>(x);
    });
    if (!near) sizes.push_back(b);
  }
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

}  // namespace

fp::DeviceProfile calibrate(const PlanFlags& flags, fsdp::comm::ProcessGroup& world, std::ostream& log) {
  const int64_t N = world.size();
  at::set_num_threads(flags.threads);
  // As fsdp-train: the counting allocator, freed heap kept mapped (no page faults per step).
  fsdp::accounting::install_counting_allocator();
  fsdp::accounting::retain_freed_heap_memory();
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
  // A rank's communication thread hides its collectives only on a core of its own; compute threads
  // that need more cores than there are time-share them ([Note: timing together]).
  const int64_t cores = cores_available(world);
  p.comm_overlaps_compute = p.ranks_per_node * (flags.threads + 1) <= cores;
  p.compute_oversubscribed = p.ranks_per_node * flags.threads > cores;
  WorkTimer timer(world, p.compute_oversubscribed);

  const std::vector<int64_t> sizes = collective_sizes(m, in.step, N);
  const CollectiveKind kinds[] = {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce};
  fp::CollectiveLinks* links[] = {&p.all_gather, &p.reduce_scatter, &p.all_reduce};
  // One rank measures no collective: its profile plans N = 1 only (profile.h has_collectives).
  p.has_collectives = N >= 2;
  for (int k = 0; k < 3 && p.has_collectives; ++k) {
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
  p.calibration_model = m.name;
  p.calibration_model_params = m.num_params();
  p.calibration_micro_batch_size = in.step.micro_batch_size;
  p.calibration_seq_len = in.step.seq_len;

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
  std::string model_source = "model_flops_per_s: not measured (a parameter-count model has no module to run)";
  const at::ScalarType step_dtype = in.step.precision == fp::Precision::kBf16   ? at::kBFloat16
                                    : in.step.precision == fp::Precision::kFp16 ? at::kHalf
                                                                                : at::kFloat;
  std::unique_ptr<TrainingPass> step_pass;  // the step's precision: for the shared-core factors
  if (m.arch.kind == fp::BlockKind::kNone) {
    step_pass = std::make_unique<TrainingPass>(m, in.step, step_dtype, p.ranks_per_node);
  } else {
    TrainingPass f32(m, in.step, at::kFloat, p.ranks_per_node);
    f32.sample(timer);
    p.model_flops_per_s_fp32 = model_rate(f32, world);
    const int64_t n_layer = f32.n_layer;
    if (step_dtype == at::kFloat) step_pass = std::make_unique<TrainingPass>(std::move(f32));
    {
      TrainingPass b16(m, in.step, at::kBFloat16, p.ranks_per_node);
      b16.sample(timer);
      p.model_flops_per_s_bf16 = model_rate(b16, world);
      if (step_dtype == at::kBFloat16) step_pass = std::make_unique<TrainingPass>(std::move(b16));
    }
    // fp16 only when asked for: CPUs without fp16 matmul units run it ~10x slower than bf16.
    const bool fp16 = step_dtype == at::kHalf;
    if (fp16) {
      step_pass = std::make_unique<TrainingPass>(m, in.step, at::kHalf, p.ranks_per_node);
      step_pass->sample(timer);
      p.model_flops_per_s_fp16 = model_rate(*step_pass, world);
    }
    model_source = "model_flops_per_s: a training forward + backward of " + m.name + " (" +
                   std::to_string(n_layer) + " of its " + std::to_string(m.arch.n_layer) + " blocks), " +
                   std::to_string(in.step.micro_batch_size) + " x " + std::to_string(in.step.seq_len) +
                   " tokens, cross-entropy loss; the planner's FLOPs of that module over the median seconds (5-25 "
                   "passes; the step's precision sampled again at the end of the calibration, the median over both), "
                   "slowest rank, all ranks at once; fp16 only with --mixed-precision fp16";
  }
  p.memory_copy_bytes_per_s = memory_copy_rate(timer);
  // Per element: the largest tensor's rate (beyond the caches), for sizes past the points.
  p.step_update_points_adamw = step_update_points(fp::OptimizerKind::kAdamW, timer);
  p.step_update_points_sgd_momentum = step_update_points(fp::OptimizerKind::kSgdMomentum, timer);
  p.step_update_points_sgd = step_update_points(fp::OptimizerKind::kSgd, timer);
  const auto per_elem = [](const std::vector<fp::UpdatePoint>& v) {
    return v.back().seconds / static_cast<double>(v.back().numel);
  };
  p.step_update_s_per_elem_adamw = per_elem(p.step_update_points_adamw);
  p.step_update_s_per_elem_sgd_momentum = per_elem(p.step_update_points_sgd_momentum);
  p.step_update_s_per_elem_sgd = per_elem(p.step_update_points_sgd);
  // Where communication shares the cores: what each kind costs beside a training pass.
  std::string factor_source = "shared_core_factor, duration_factor: 1, not measured (communication overlaps compute)";
  if (p.has_collectives && !p.comm_overlaps_compute) {
    std::string line = "beside a training pass, a collective costs", takes;
    // At the size of the model's largest reduce-scatter ([Note: collectives beside compute]).
    int64_t largest = 0;
    for (const fp::UnitSpec& u : m.units) {
      largest = std::max(largest, fp::reduce_bytes_per_elem(in.step.precision) * fp::unit_numbers(u, N, 0).reduce_numel);
    }
    const int64_t logical = std::clamp<int64_t>(largest, int64_t{4} << 20, int64_t{64} << 20) / 4 / N * N * 4;
    for (int k = 0; k < 3; ++k) {
      const double op_s = fp::collective_time_s(p, kinds[k], logical, N, /*crosses_nodes=*/false);
      const BesideCompute b = beside_compute(timer, kinds[k], logical, op_s, *step_pass);
      links[k]->shared_core_factor = b.shared_core_factor;
      links[k]->duration_factor = b.duration_factor;
      char buf[80];
      std::snprintf(buf, sizeof(buf), "%s %s %.2fx", k ? "," : "", fsdp::comm::to_string(kinds[k]), b.shared_core_factor);
      line += buf;
      std::snprintf(buf, sizeof(buf), "%s %s %.2fx", k ? "," : "", fsdp::comm::to_string(kinds[k]), b.duration_factor);
      takes += buf;
    }
    line += " its time alone";
    if (p.compute_oversubscribed) line += "; beside computing it runs" + takes + " slower than alone";
    if (root) log << line << std::endl;
    factor_source = std::string("shared_core_factor: per kind, ") +
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
  if (m.arch.kind != fp::BlockKind::kNone) {
    step_pass->sample(timer);
    double& rate = step_dtype == at::kBFloat16 ? p.model_flops_per_s_bf16
                   : step_dtype == at::kHalf   ? p.model_flops_per_s_fp16
                                               : p.model_flops_per_s_fp32;
    rate = model_rate(*step_pass, world);
    if (root) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), "training forward + backward of %s: fp32 %.1f, bf16 %.1f GFLOP/s per rank%s",
                    m.name.c_str(), p.model_flops_per_s_fp32 * 1e-9, p.model_flops_per_s_bf16 * 1e-9,
                    step_dtype == at::kHalf ? (", fp16 " + std::to_string(p.model_flops_per_s_fp16 * 1e-9)).c_str() : "");
      log << buf << std::endl;
    }
  }
  if (root) {
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
                  static_cast<long long>(p.ranks_per_node), flags.threads, static_cast<long long>(cores),
                  p.compute_oversubscribed ? "; compute oversubscribes them: passes and copies timed from barrier to barrier, the update to each "
                                             "rank's own end, mean over ranks" : "");
    log << buf << std::endl;
  }
  p.sources = {
      N >= 2 ? "measured by fsdp-plan --calibrate at N = " + std::to_string(N) + " over MPI (ProcessGroup): all-gather, "
                   "reduce-scatter, all-reduce of fp32 tensors of 4 KiB to 32 MiB and of " + m.name + "'s own message sizes "
                   "(up to 256 MiB), median of 5-9 runs, slowest rank: the time model interpolates these points "
                   "(calibration.fits); the links are t = alpha + beta x bytes fitted per kind, for other nodes; one node "
                   "measured, so inter_node repeats intra_node"
             : std::string("measured by fsdp-plan --calibrate on one rank: no collectives (this profile plans N = 1)"),
      "matmul rates: at::mm of " + m.name + "'s forward shapes with " + std::to_string(rows) + " rows (micro-batch x "
          "sequence length), weighted by FLOPs, slowest rank, " + std::to_string(flags.threads) +
          " intra-op thread(s) per rank, all ranks at once",
      model_source,
      "step_update_points_numel_seconds: seconds per fp32 tensor of 1k to 16M elements (2^20 elements of "
          "such tensors at a time) for the 2-norm, clip scale, the optimizer's step and zero_grad, "
          "tensor by tensor, caches flushed before each run, all ranks at once, each rank's time to its own end, " +
          std::string(p.compute_oversubscribed ? "median of 9, mean over ranks (compute oversubscribes the cores); "
                                               : "median of 5, slowest rank; ") +
          "step_update_s_per_elem: the 16M-element tensor's seconds per element",
      "memory_copy_bytes_per_s: copy_ of a 16 MiB fp32 tensor into another, 4 at a time, caches flushed before each run, bytes "
          "read + written per second, median of 9, slowest rank, all ranks at once",
      "comm_overlaps_compute: ranks on this node x (intra-op threads + 1 communication thread) <= the cores "
          "the ranks may run on (the union of their affinity masks: " + std::to_string(cores) + "); compute_oversubscribed: ranks on this node x "
          "intra-op threads > those cores (then the passes, copies and step updates are timed from one barrier to the "
          "next on every rank, less an empty interval)",
      factor_source,
      "memory_bytes: physical memory / ranks on this node"};
  return p;
}

}  // namespace apps::plan
