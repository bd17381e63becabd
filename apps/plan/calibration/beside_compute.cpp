#include "plan/calibration/beside_compute.h"

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "fsdp/planner/profile.h"
#include "plan/calibration/collective_timing.h"
#include "plan/calibration/rank_values.h"

namespace apps::plan::calibration {
namespace fp = fsdp::planner;
using fsdp::comm::CollectiveKind;
using fsdp::comm::now_s;

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

}  // namespace apps::plan::calibration
