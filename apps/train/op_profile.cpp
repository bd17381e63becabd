#include "train/op_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <unordered_map>

namespace apps::train {
namespace {

namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

impl::ProfilerConfig config() {
  return impl::ProfilerConfig(impl::ProfilerState::KINETO, /*report_input_shapes=*/true,
                              /*profile_memory=*/false);
}
const std::set<impl::ActivityType> kActivities{impl::ActivityType::CPU};

struct Span {
  uint64_t begin_ns, end_ns;
  size_t op;  // index into the totals
};

}  // namespace

void OpProfiler::start() {
  if (active_) throw std::runtime_error("the operator profiler is already running");
  prof::prepareProfiler(config(), kActivities);
  prof::enableProfiler(config(), kActivities);
  active_ = true;
}

std::vector<OpTotals> OpProfiler::stop(const std::string& trace_path) {
  if (!active_) return {};
  active_ = false;
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  if (!trace_path.empty()) result->save(trace_path);
  // Self time: per thread, an operator's duration minus that of the operators nested in it.
  std::vector<OpTotals> totals;
  std::unordered_map<std::string, size_t> index;
  std::map<uint64_t, std::vector<Span>> by_thread;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CPU || e.endNs() < e.startNs()) continue;
    auto [it, fresh] = index.emplace(e.name(), totals.size());
    if (fresh) totals.push_back(OpTotals{e.name()});
    by_thread[e.startThreadId()].push_back(Span{e.startNs(), e.endNs(), it->second});
  }
  for (auto& [tid, spans] : by_thread) {
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.begin_ns != b.begin_ns ? a.begin_ns < b.begin_ns : a.end_ns > b.end_ns;
    });
    std::vector<std::pair<const Span*, uint64_t>> open;  // span, nested ns
    auto close_until = [&](uint64_t t) {
      while (!open.empty() && open.back().first->end_ns <= t) {
        auto [s, nested] = open.back();
        open.pop_back();
        const uint64_t dur = s->end_ns - s->begin_ns;
        OpTotals& o = totals[s->op];
        o.calls += 1;
        o.total_s += dur * 1e-9;
        o.self_s += (dur > nested ? dur - nested : 0) * 1e-9;
        if (!open.empty()) open.back().second += dur;
      }
    };
    for (const Span& s : spans) {
      close_until(s.begin_ns);
      open.emplace_back(&s, 0);
    }
    close_until(UINT64_MAX);
  }
  std::sort(totals.begin(), totals.end(),
            [](const OpTotals& a, const OpTotals& b) { return a.self_s > b.self_s; });
  return totals;
}

std::string format_op_table(const std::vector<OpTotals>& ops, double window_s, size_t rows) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-44s %8s %10s %7s %10s\n", "operator", "calls", "self ms",
                "self %", "total ms");
  out += buf;
  for (size_t i = 0; i < ops.size() && i < rows; ++i) {
    const auto& o = ops[i];
    std::snprintf(buf, sizeof(buf), "%-44.44s %8lld %10.1f %6.1f%% %10.1f\n", o.name.c_str(),
                  static_cast<long long>(o.calls), o.self_s * 1e3,
                  window_s > 0 ? 100.0 * o.self_s / window_s : 0.0, o.total_s * 1e3);
    out += buf;
  }
  return out;
}

}  // namespace apps::train
