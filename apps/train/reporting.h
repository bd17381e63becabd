// Reporting of fsdp-train: learning-rate schedule, console output, the JSON-lines metrics (config,
// step and end events, with the measurement rules they follow) and the Chrome trace. libtorch only
// through fsdp's process group (the reporting collectives and the trace gathering).
//
// [Note: measurement rules]
// The JSON-lines fields of a step event ("step", written by rank 0) are measured so:
//   * "comm" is this rank's CommStats delta over the training part of the step only (forwards,
//     backwards, grad clipping, optimizer step): a snapshot is taken right before the first
//     micro-batch and right after optimizer.step() (trainer.cpp). The app's own collectives for the
//     reported loss and memory (reduce_step_report, after the second snapshot), evaluation and
//     checkpointing are excluded exactly. The training part includes the non-finite check's
//     all-reduce of N int64 (nonfinite.h), one per step (a second only on a non-finite norm).
//   * "mem" values are the MAX over ranks. param/grad/optim/unsharded/resident bytes are
//     fsdp::accounting::model_state_bytes after optimizer.step() (before zero_grad); peak_bytes is
//     the counting allocator's peak over the training part of the step (reset at its start);
//     activation_bytes is, for the micro-batch that holds most, the counting allocator's bytes when
//     its backward starts (the logits freed, the loss computed) less those before its forward,
//     both less the unsharded params alive then (fsdp::accounting::model_state_bytes: the root a
//     forward leaves gathered, shard_grad_op's blocks, no_shard's casts): what autograd saved for
//     backward, plus the scalar loss.
//   * "loss" is the mean over the global batch (all-reduce kAvg of each rank's local mean).
//   * step_time_s / tokens_per_s cover the training part; tokens = global batch * seq len.
//   * --trace: every rank records its events; at the end they are gathered to rank 0 over the
//     process group (write_trace) and rank 0 writes one file. Compute events (tid 0) are timed per
//     micro-batch forward / backward and per optimizer step. tid 1 holds one event per collective
//     of the world group as it ran on its communication thread (CollectiveTrace), so overlap of
//     communication with compute is visible.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "fsdp/comm/exposed_wait.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/common/cpu_info.h"
#include "train/train_config.h"

namespace apps::train {

using Clock = std::chrono::steady_clock;

/// Seconds on Clock since t.
double seconds_since(Clock::time_point t);

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
/// Every write is checked: the first that fails (a full disk) is reported once on stderr, naming
/// the file, the event and errno, the file is cut back to its last whole line (no half-written
/// JSON left), and the writer stops there. What the run does then is the
/// caller's (failed(); --on-output-error): stop_after_failure only words the warning.
/// append: the events go after what the file holds (a resumed run, so that an elastic restart
/// keeps the history of the attempts before it; a step written twice is read as its last
/// record), else the file starts empty.
class JsonLines {
 public:
  JsonLines(const std::string& path, int rank, bool stop_after_failure = false, bool append = false);
  void write(const nlohmann::json& event);
  bool enabled() const { return out_.is_open(); }
  /// True once a write failed.
  bool failed() const { return failed_; }

 private:
  std::string path_;
  std::ofstream out_;
  int64_t events_ = 0;
  int64_t good_bytes_ = 0;  // the file's size after the last event written whole
  bool failed_ = false;
  bool stop_after_failure_ = false;
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
  /// serialize() strings of every rank, checked to its close. Returns "" when written, else why
  /// not (errno's text; the partial file is removed).
  static std::string write_merged(const std::string& path, const std::vector<std::string>& per_rank);

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

// ---- Events of the metrics file ----------------------------------------------------------------

/// What a run knows once it is set up, beyond its TrainConfig: reported by the config event and
/// the start-up lines.
struct RunFacts {
  // The model as built (preset and overrides, or --init-from-hf's config.json).
  std::string model;   ///< the preset's name, or "<architecture> from <dir>" with --init-from-hf
  std::string family;  ///< "gpt" or "llama"
  int64_t n_layer = 0, n_head = 0, n_kv_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;
  std::string attention;
  int64_t num_params = 0;
  std::vector<std::string> lora_layers;  ///< the layers with a LoRA adapter (--lora-rank)
  int64_t lora_trainable = 0;            ///< the adapters' parameters, the only trainable ones
  // Data.
  std::string tokenizer_path;
  std::string train_path, val_path;  ///< val_path "": the last 5% of train_path's tokens
  int64_t train_tokens = 0, val_tokens = 0;
  // Parallelism and batch.
  std::string backend;
  int world_size = 1;
  std::vector<int> host_of_ranks;  ///< ProcessGroup::host_of_ranks of the world group
  int threads = 1;                 ///< intra-op threads per rank, --threads resolved
  std::string strategy;
  bool forward_prefetch = false;
  int hybrid_shard_group_size = 0;
  int reshard_after_forward_group_size = 0;  ///< 0: off
  int collective_host_size = 0;  ///< host-aware collectives' ranks per host; 0: off (or nothing to do)
  int64_t bucket_cap_bytes = 0;
  bool root_output_fp32 = false;  ///< the root unit returns fp32 logits (mixed precision)
  int64_t micro_batch_size = 0, accumulation_steps = 0;
  bool heap_retained = false;  ///< fsdp::accounting::retain_freed_heap_memory()
  // Checkpoints.
  std::string resumed_from;  ///< the checkpoint directory loaded ("" when not resumed)
  int64_t start_step = 0;
  double load_s = 0.0, import_s = 0.0;
};

/// The {"event":"config"} object: every resolved setting of c, the facts f and the CPU (model,
/// libtorch capability, bf16/fp16 matmul units).
nlohmann::json config_event(const TrainConfig& c, const RunFacts& f, const fsdp::CpuInfo& cpu);

/// The start-up lines: a warning when --mixed-precision has no matmul units on this CPU (naming the
/// CPU and the bf16/fp16 matmul's time against fp32, measured now: tens of ms), where the
/// run resumed from, what it imported, and one line naming the model, ranks, strategy, data and
/// batch.
void print_start(Console& console, const TrainConfig& c, const RunFacts& f,
                 const fsdp::CpuInfo& cpu);

/// This rank's CommStats delta between two snapshots ("comm" of a step event): {kind}_bytes,
/// {kind}_calls, {kind}_busy_s, {kind}_intra_host_bytes and {kind}_inter_host_bytes for
/// all_gather, reduce_scatter, all_reduce, broadcast, barrier, and intra_host_bytes /
/// inter_host_bytes summed over them (the host split of [Note: host traffic] in comm_stats.h).
nlohmann::json comm_delta(const fsdp::comm::CommStats::Snapshot& before,
                          const fsdp::comm::CommStats::Snapshot& after);

/// This rank's exposed communication between two fsdp::comm::exposed_wait_s() snapshots: seconds
/// its threads were blocked waiting for a collective, by phase ({"forward", "backward",
/// "end_of_backward", "optimizer", "other", "total"}; "exposed_s" of a step event's "comm").
nlohmann::json exposed_delta(const std::array<double, fsdp::comm::kWaitPhaseCount>& before,
                             const std::array<double, fsdp::comm::kWaitPhaseCount>& after);

/// Model-state bytes of a step ("mem" of a step event): one rank's, or the MAX over ranks.
struct StepMemory {
  int64_t param_shard_bytes = 0;      ///< sharded params incl. padding rows
  int64_t grad_shard_bytes = 0;       ///< sharded grads
  int64_t optim_state_bytes = 0;      ///< AdamW state
  int64_t unsharded_param_bytes = 0;  ///< unsharded params resident (zero1: its full params)
  int64_t resident_bytes = 0;         ///< all of the above plus unsharded grads alive
  int64_t peak_bytes = 0;             ///< counting allocator's peak of the training part
  int64_t activation_bytes = 0;       ///< saved for backward by one micro-batch's forward and loss
};

/// The numbers every rank reports alike for a step ([Note: measurement rules]).
struct StepTotals {
  double loss = 0.0;  ///< mean over the global batch
  StepMemory mem;     ///< MAX over ranks
};

/// Averages the ranks' local losses and takes the MAX of their memory. Collective and blocking
/// over group: two all-reduces (kAvg, then kMax), issued after the step's measured part.
StepTotals reduce_step_report(double local_loss, const StepMemory& local,
                              fsdp::comm::ProcessGroup& group);

/// One optimizer step as reported.
struct StepRecord {
  int64_t step = 0;         ///< 1-based
  int64_t total_steps = 0;  ///< --steps
  StepTotals totals;
  double lr = 0.0;
  double grad_norm = 0.0;  ///< global norm before clipping
  int64_t tokens = 0;      ///< tokens of the global batch
  double step_time_s = 0.0;
  nlohmann::json comm;  ///< comm_delta of the training part
  bool loss_scaling = false;      ///< fp16: report loss_scale and optimizer_stepped
  double loss_scale = 1.0;        ///< the scale this step's backward used
  bool optimizer_stepped = true;  ///< false: inf/NaN gradients, step skipped
};

/// The {"event":"step"} object of r.
nlohmann::json step_event(const StepRecord& r);
/// The console progress line of r ("step 3/20 | loss ... | mem/rank: state ..., peak ...").
std::string step_line(const StepRecord& r);

/// A run's summary.
struct RunTotals {
  int64_t steps = 0, start_step = 0;
  double first_train_loss = 0.0, final_train_loss = 0.0, final_val_loss = 0.0;
  double total_time_s = 0.0;  ///< from the start of the step loop to the end of --export
  double train_time_s = 0.0;  ///< sum of the steps' step_time_s
  double mean_tokens_per_s = 0.0;
};

/// The {"event":"end"} object of t.
nlohmann::json end_event(const RunTotals& t);
/// The console line of t ("done: train loss a -> b, val loss c, ...").
std::string done_line(const RunTotals& t);

// ---- Trace --------------------------------------------------------------------------------------

/// The collectives of one process group as Chrome-trace events (tid 1) of a TraceRecorder, timed as
/// they ran on the group's communication thread (fsdp::comm::CommStats events, on the
/// fsdp::comm::now_s() clock, shifted to the trace origin). Nothing when the trace is disabled.
class CollectiveTrace {
 public:
  /// Resets trace's origin to now and, when the trace is enabled, starts recording the group's
  /// collectives (dropping those recorded before). Call right after a barrier on every rank.
  CollectiveTrace(TraceRecorder& trace, fsdp::comm::ProcessGroupPtr group);
  /// Moves the collectives recorded since the last call into the trace. Not collective.
  void flush();

 private:
  TraceRecorder& trace_;
  fsdp::comm::ProcessGroupPtr group_;
  double origin_s_;
};

/// Gathers every rank's trace (fsdp::comm::all_gather_strings of TraceRecorder::serialize) and
/// writes them to path on rank 0 (TraceRecorder::write_merged). Collective and blocking over group.
/// Returns, on rank 0, "" when written, else why not ("" on the other ranks).
std::string write_trace(const TraceRecorder& trace, const std::string& path,
                        fsdp::comm::ProcessGroup& group);

}  // namespace apps::train
