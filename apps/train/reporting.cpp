#include "train/reporting.h"

#include <cmath>
#include <iostream>
#include <stdexcept>

namespace apps::train {

double lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_lr) {
  if (warmup > 0 && step <= warmup) return lr * static_cast<double>(step) / warmup;
  if (total <= warmup) return lr;
  double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  progress = std::min(1.0, std::max(0.0, progress));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof(buf), "%.2fG", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof(buf), "%.2fM", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof(buf), "%.1fk", n / 1e3);
  else std::snprintf(buf, sizeof(buf), "%.0f", n);
  return buf;
}

void Console::progress(const std::string& text) {
  if (!enabled_) return;
  if (tty_) {
    std::cout << "\r\033[K" << text << std::flush;
    open_progress_ = true;
  } else {
    std::cout << text << std::endl;
  }
}

void Console::line(const std::string& text) {
  if (!enabled_) return;
  if (open_progress_) {
    std::cout << "\n";
    open_progress_ = false;
  }
  std::cout << text << std::endl;
}

JsonLines::JsonLines(const std::string& path, int rank) {
  if (path.empty() || rank != 0) return;
  out_.open(path, std::ios::trunc);
  if (!out_) throw std::runtime_error("cannot open metrics file '" + path + "' for writing");
}

void JsonLines::write(const nlohmann::json& event) {
  if (!out_.is_open()) return;
  out_ << event.dump() << "\n";
  out_.flush();
}

double TraceRecorder::now_us() const {
  return std::chrono::duration<double, std::micro>(Clock::now() - origin_).count();
}

void TraceRecorder::add(const std::string& name, const char* category, int tid, double begin_us,
                        double dur_us, nlohmann::json args) {
  if (!enabled_) return;
  events_.push_back({{"name", name},
                     {"cat", category},
                     {"ph", "X"},
                     {"pid", rank_},
                     {"tid", tid},
                     {"ts", begin_us},
                     {"dur", dur_us},
                     {"args", std::move(args)}});
}

std::string TraceRecorder::serialize() const {
  nlohmann::json all = nlohmann::json::array();
  auto meta = [&](const char* what, int tid, const std::string& value) {
    all.push_back({{"name", what}, {"ph", "M"}, {"pid", rank_}, {"tid", tid},
                   {"args", {{"name", value}}}});
  };
  meta("process_name", 0, "rank " + std::to_string(rank_));
  meta("thread_name", 0, "compute");
  meta("thread_name", 1, "communication (one event per collective)");
  for (const auto& e : events_) all.push_back(e);
  return all.dump();
}

void TraceRecorder::write_merged(const std::string& path, const std::vector<std::string>& per_rank) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& s : per_rank) {
    for (auto& e : nlohmann::json::parse(s)) events.push_back(std::move(e));
  }
  std::ofstream out(path, std::ios::trunc);
  if (!out) throw std::runtime_error("cannot open trace file '" + path + "' for writing");
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
}

}  // namespace apps::train
