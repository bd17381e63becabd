#include "fsdp/comm/comm_stats.h"

#include <chrono>

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

void CommStats::record_issue(CollectiveKind kind, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& e = entries_[static_cast<int>(kind)];
  e.calls += 1;
  e.bytes += bytes;
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
