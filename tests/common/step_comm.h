// Collectives of one step, from two CommStats snapshots (shared by the engine and strategy tests).
#pragma once

#include "fsdp/comm/comm_stats.h"

namespace fsdp_test {

/// Calls and logical bytes per kind between two snapshots of the same CommStats.
struct StepComm {
  int64_t ag_calls, ag_bytes, rs_calls, rs_bytes, ar_calls, ar_bytes;
};

inline StepComm delta(const fsdp::comm::CommStats::Snapshot& a, const fsdp::comm::CommStats::Snapshot& b) {
  using fsdp::comm::CollectiveKind;
  auto d = [&](CollectiveKind c, bool bytes) {
    const int k = static_cast<int>(c);
    return bytes ? b[k].bytes - a[k].bytes : b[k].calls - a[k].calls;
  };
  return {d(CollectiveKind::kAllGather, false), d(CollectiveKind::kAllGather, true),
          d(CollectiveKind::kReduceScatter, false), d(CollectiveKind::kReduceScatter, true),
          d(CollectiveKind::kAllReduce, false), d(CollectiveKind::kAllReduce, true)};
}

}  // namespace fsdp_test
