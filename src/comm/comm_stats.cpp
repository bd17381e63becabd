#include "fsdp/comm/comm_stats.h"

#include <chrono>

#include "fsdp/common/check.h"

namespace fsdp::comm {

const char* to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kAllToAll: return "all_to_all";
  }
  return "?";
}

double now_s() {
  static const auto epoch = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch).count();
}

HostSplit split_by_host(CollectiveKind kind, int64_t bytes, int group_size, int ranks_on_host) {
  FSDP_CHECK(group_size >= 1 && ranks_on_host >= 1 && ranks_on_host <= group_size && bytes >= 0,
             ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "split_by_host"}),
             "expected 1 <= ranks_on_host <= group_size and bytes >= 0, got ranks_on_host ",
             ranks_on_host, ", group_size ", group_size, ", bytes ", bytes);
  if (group_size == 1 || kind == CollectiveKind::kBarrier) return {};
  const int64_t n = group_size;
  const int64_t factor = kind == CollectiveKind::kAllReduce ? 2 : 1;
  // V = factor * S * (N-1) / N; intra = V (m-1)/(N-1) = factor * S (m-1) / N.
  HostSplit s;
  s.intra_host_bytes = factor * bytes * (ranks_on_host - 1) / n;
  s.inter_host_bytes = factor * bytes * (n - ranks_on_host) / n;
  return s;
}

void CommStats::record_issue(CollectiveKind kind, int64_t bytes, HostSplit split) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& e = entries_[static_cast<int>(kind)];
  e.calls += 1;
  e.bytes += bytes;
  e.intra_host_bytes += split.intra_host_bytes;
  e.inter_host_bytes += split.inter_host_bytes;
}

void CommStats::record_time(CollectiveKind kind, double start_s, double end_s, int64_t bytes,
                            int64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[static_cast<int>(kind)].busy_s += end_s - start_s;
  if (record_events_) events_.push_back(Event{kind, bytes, start_s, end_s, seq});
}

CommStats::Snapshot CommStats::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

void CommStats::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_ = Snapshot{};
}

void CommStats::set_record_events(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  record_events_ = on;
}

std::vector<CommStats::Event> CommStats::take_events() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Event> out;
  out.swap(events_);
  return out;
}

}  // namespace fsdp::comm
