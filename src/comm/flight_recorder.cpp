#include "fsdp/comm/flight_recorder.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>

namespace fsdp::comm {
namespace {

double unix_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// When this process loaded fsdp-cpp (static initialisation, before main): a dump says it, so that a
// reader can tell this job's dumps from an earlier job's left in the same directory.
const double g_process_started_unix_s = unix_now_s();

// Dumps of this process write one at a time: two groups of one rank (a hybrid job's shard and
// replica groups) that give up together would otherwise write and rename the same temporary.
std::mutex g_dump_mu;

}  // namespace

const char* to_string(OpState state) {
  switch (state) {
    case OpState::kQueued: return "queued";
    case OpState::kRunning: return "running";
    case OpState::kCompleted: return "completed";
    case OpState::kFailed: return "failed";
    case OpState::kTimedOut: return "timed out";
  }
  return "?";
}

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

uint64_t FlightRecorder::add(CollectiveRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(record));  // filling: ids 0, 1, ... land in slots 0, 1, ...
  } else {
    ring_[id % capacity_] = std::move(record);  // evicts the oldest record
  }
  return id;
}

CollectiveRecord* FlightRecorder::find(uint64_t id) {
  if (id >= next_id_ || next_id_ - id > ring_.size()) return nullptr;  // not issued, or evicted
  return &ring_[id % capacity_];
}

void FlightRecorder::mark_running(uint64_t id, double start_s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto* r = find(id)) {
    r->state = OpState::kRunning;
    r->start_s = start_s;
  }
}

void FlightRecorder::mark_done(uint64_t id, double end_s, OpState state, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto* r = find(id)) {
    r->state = state;
    r->end_s = end_s;
    r->error = error;
  }
}

std::vector<CollectiveRecord> FlightRecorder::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CollectiveRecord> out;
  out.reserve(ring_.size());
  for (uint64_t id = next_id_ - ring_.size(); id < next_id_; ++id) out.push_back(ring_[id % capacity_]);
  return out;
}

std::string FlightRecorder::dump(const std::string& dir, int rank, int world_size, const std::string& reason,
                                 std::string* error) const {
  std::lock_guard<std::mutex> lock(g_dump_mu);  // held until the temporary is renamed or removed
  std::string tmp;
  auto failed = [&](const std::string& why) {
    std::error_code ec;
    if (!tmp.empty()) std::filesystem::remove(tmp, ec);
    if (error) *error = why;
    return std::string();
  };
  try {
    nlohmann::json j;
    j["rank"] = rank;
    j["world_size"] = world_size;
    std::vector<std::string> reasons;
    {
      std::lock_guard<std::mutex> lock(mu_);
      dump_reasons_.push_back(reason);
      reasons = dump_reasons_;
    }
    j["reason"] = reasons.front();  // the first failure, which the later ones usually follow from
    j["reasons"] = reasons;
    j["time_s"] = now_s();
    j["process_started_unix_s"] = g_process_started_unix_s;
    j["written_unix_s"] = unix_now_s();
    j["records"] = nlohmann::json::array();
    for (const auto& r : records()) {
      j["records"].push_back({{"group", r.group}, {"seq", r.seq}, {"kind", to_string(r.kind)},
                              {"dtype", r.dtype}, {"numel", r.numel}, {"bytes", r.bytes},
                              {"unit", r.tag.unit}, {"phase", r.tag.phase},
                              {"forward_pass", r.tag.forward_pass}, {"issue_s", r.issue_s},
                              {"start_s", r.start_s}, {"end_s", r.end_s}, {"state", to_string(r.state)},
                              {"error", r.error}});
    }
    std::filesystem::create_directories(dir);
    char name[32];
    std::snprintf(name, sizeof(name), "rank-%05d.json", rank);
    const std::string path = (std::filesystem::path(dir) / name).string();
    tmp = path + ".tmp";
    {
      errno = 0;
      std::ofstream out(tmp, std::ios::trunc);
      if (out) out << j.dump(1) << "\n";
      if (out) out.close();
      if (!out) return failed("cannot write '" + path + "': " + (errno ? std::strerror(errno) : "write error"));
    }
    std::filesystem::rename(tmp, path);
    return path;
  } catch (const std::exception& e) {
    return failed(std::string("cannot write the flight recorder in '") + dir + "': " + e.what());
  } catch (...) {
    return failed("cannot write the flight recorder in '" + dir + "'");
  }
}

}  // namespace fsdp::comm
