// Reporting helpers of fsdp-train: learning-rate schedule, console progress, JSON-lines metrics and
// the Chrome trace. No libtorch here.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace apps::train {

/// Learning rate of optimizer step `step` (1-based): linear warmup lr*step/warmup over the first
/// `warmup` steps, then cosine decay from lr to min_lr at step `total`.
double lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_lr);

/// "12.3 MiB" style.
std::string human_bytes(double bytes);
/// "12.3k" style.
std::string human_count(double n);

/// Console output of rank 0: on a terminal, one progress line rewritten in place (\r); otherwise
/// one plain line per call. Other ranks print nothing.
class Console {
 public:
  Console(int rank, bool is_tty) : enabled_(rank == 0), tty_(is_tty) {}
  /// The progress line of a step (replaces the previous one on a terminal).
  void progress(const std::string& line);
  /// A line that stays (ends any progress line first).
  void line(const std::string& text);
  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  bool tty_;
  bool open_progress_ = false;
};

/// JSON-lines writer (one object per line, flushed). Disabled when path is empty or on rank != 0.
class JsonLines {
 public:
  JsonLines(const std::string& path, int rank);
  void write(const nlohmann::json& event);
  bool enabled() const { return out_.is_open(); }

 private:
  std::ofstream out_;
};

/// Chrome trace events of one rank ("X" complete events, microseconds since a common origin that
/// every rank takes right after a barrier). pid = rank; tid 0 = compute, tid 1 = communication.
class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  TraceRecorder(int rank, bool enabled) : rank_(rank), enabled_(enabled), origin_(Clock::now()) {}
  /// Sets the time origin (call right after a barrier on every rank).
  void reset_origin() { origin_ = Clock::now(); }
  double now_us() const;
  /// Adds an event [begin_us, begin_us + dur_us) on thread tid.
  void add(const std::string& name, const char* category, int tid, double begin_us, double dur_us,
           nlohmann::json args = nlohmann::json::object());
  bool enabled() const { return enabled_; }
  /// The events as a JSON array (process/thread name metadata included).
  std::string serialize() const;
  /// Writes {"traceEvents": [...all ranks' events...], "displayTimeUnit": "ms"} to path from the
  /// serialize() strings of every rank.
  static void write_merged(const std::string& path, const std::vector<std::string>& per_rank);

 private:
  int rank_;
  bool enabled_;
  Clock::time_point origin_;
  nlohmann::json events_ = nlohmann::json::array();
};

/// Times a scope into a TraceRecorder (tid 0 unless given).
class TraceScope {
 public:
  TraceScope(TraceRecorder& rec, std::string name, const char* category = "compute", int tid = 0)
      : rec_(rec), name_(std::move(name)), category_(category), tid_(tid), begin_(rec.now_us()) {}
  ~TraceScope() {
    if (rec_.enabled()) rec_.add(name_, category_, tid_, begin_, rec_.now_us() - begin_);
  }

 private:
  TraceRecorder& rec_;
  std::string name_;
  const char* category_;
  int tid_;
  double begin_;
};

}  // namespace apps::train
