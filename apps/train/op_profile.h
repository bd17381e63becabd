// fsdp-train --profile: libtorch's operator profiler (the engine behind torch.profiler) over a
// window of steps, written as a Chrome trace plus a table of operators by self time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace apps::train {

/// One operator name's totals over the profiled window (one rank, the calling thread and any
/// other thread libtorch recorded). Times in seconds; self time excludes nested operators.
struct OpTotals {
  std::string name;
  int64_t calls = 0;
  double self_s = 0.0;
  double total_s = 0.0;
};

/// Records libtorch operators (CPU activity) between start() and stop(). Not collective; one per
/// process. Throws std::runtime_error when the profiler cannot start (another one is active).
class OpProfiler {
 public:
  /// Starts recording. Blocks briefly (profiler set-up).
  void start();
  /// Stops, writes the Chrome trace to trace_path (when not empty) and returns the operators by
  /// descending self time.
  std::vector<OpTotals> stop(const std::string& trace_path);
  bool active() const { return active_; }

 private:
  bool active_ = false;
};

/// The top `rows` operators as a fixed-width text table, with each one's share of `window_s`.
std::string format_op_table(const std::vector<OpTotals>& ops, double window_s, size_t rows);

}  // namespace apps::train
