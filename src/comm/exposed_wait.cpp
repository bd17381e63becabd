// Exposed communication (exposed_wait.h).
#include "fsdp/comm/exposed_wait.h"

#include <cstring>
#include <mutex>

#include "fsdp/common/activity.h"

namespace fsdp::comm {
namespace {

struct WaitRecord {
  std::mutex mu;
  std::array<double, kWaitPhaseCount> seconds{};
  bool record_events = false;
  std::vector<WaitEvent> events;
};

WaitRecord& record() {
  static WaitRecord r;
  return r;
}

constexpr size_t kMaxKeptEvents = 1000000;

// CommunicationThreadScopes alive on this thread.
thread_local int t_communication_scopes = 0;

bool starts_with(const char* s, const char* prefix) { return std::strncmp(s, prefix, std::strlen(prefix)) == 0; }

}  // namespace

const char* to_string(WaitPhase phase) {
  switch (phase) {
    case WaitPhase::kForward: return "forward";
    case WaitPhase::kBackward: return "backward";
    case WaitPhase::kEndOfBackward: return "end_of_backward";
    case WaitPhase::kOptimizer: return "optimizer";
    case WaitPhase::kOther: return "other";
  }
  return "other";
}

WaitPhase wait_phase_of(const char* p) {
  if (p == nullptr) return WaitPhase::kOther;
  if (starts_with(p, "forward")) return WaitPhase::kForward;
  if (starts_with(p, "end of backward")) return WaitPhase::kEndOfBackward;
  if (starts_with(p, "backward") || starts_with(p, "post-backward")) return WaitPhase::kBackward;
  if (starts_with(p, "optimizer")) return WaitPhase::kOptimizer;
  return WaitPhase::kOther;
}

std::array<double, kWaitPhaseCount> exposed_wait_s() {
  WaitRecord& r = record();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.seconds;
}

void set_record_wait_events(bool on) {
  WaitRecord& r = record();
  std::lock_guard<std::mutex> lock(r.mu);
  r.record_events = on;
  if (!on) r.events.clear();
}

std::vector<WaitEvent> take_wait_events() {
  WaitRecord& r = record();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<WaitEvent> out;
  out.swap(r.events);
  return out;
}

CommunicationThreadScope::CommunicationThreadScope() { ++t_communication_scopes; }
CommunicationThreadScope::~CommunicationThreadScope() { --t_communication_scopes; }

void record_blocking_wait(double start_s, double end_s) {
  if (t_communication_scopes > 0) return;
  const WaitPhase phase = wait_phase_of(current_activity().phase);
  WaitRecord& r = record();
  std::lock_guard<std::mutex> lock(r.mu);
  r.seconds[static_cast<int>(phase)] += end_s - start_s;
  if (r.record_events && r.events.size() < kMaxKeptEvents) r.events.push_back({phase, start_s, end_s});
}

}  // namespace fsdp::comm
