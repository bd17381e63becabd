// fsdp-train's reporting (reporting.h): schedule, console, metrics events, trace.
#include "train/reporting.h"

#include "fsdp/common/bytes.h"
#include "fsdp/planner/plan.h"

#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <utility>

namespace apps::train {

using nlohmann::json;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double lr_at(int64_t step, int64_t total, int64_t warmup, double lr, double min_lr) {
  if (warmup > 0 && step <= warmup) return lr * static_cast<double>(step) / warmup;
  if (total <= warmup) return lr;
  double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  progress = std::min(1.0, std::max(0.0, progress));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

std::string human_bytes(double bytes) { return fsdp::format_byte_count(bytes, fsdp::ByteUnits::kBinary); }

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

JsonLines::JsonLines(const std::string& path, int rank, bool stop_after_failure, bool append)
    : path_(path), stop_after_failure_(stop_after_failure) {
  if (path.empty() || rank != 0) return;
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) throw std::runtime_error("cannot open metrics file '" + path + "' for writing");
  if (append) {  // a failed write cuts the file back to here at the earliest, never into the history
    struct stat st {};
    good_bytes_ = ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
  }
}

void JsonLines::write(const nlohmann::json& event) {
  if (!out_.is_open() || failed_) return;
  errno = 0;
  out_ << event.dump() << "\n";
  out_.flush();
  ++events_;
  if (out_) {
    good_bytes_ = static_cast<int64_t>(out_.tellp());
    return;
  }
  const int err = errno;
  // No half-written line is left: the file ends after the last event written whole.
  out_.close();
  if (::truncate(path_.c_str(), static_cast<off_t>(good_bytes_)) != 0) {
    // nothing more to do: the warning below names the first failure
  }
  errno = err;
  failed_ = true;
  std::fprintf(stderr, "fsdp-train: warning: --metrics '%s': writing event %lld (\"%s\") failed: %s; %s\n",
               path_.c_str(), static_cast<long long>(events_), event.value("event", std::string("?")).c_str(),
               errno ? std::strerror(errno) : "write error",
               stop_after_failure_ ? "the run stops after this step (--on-output-error stop)"
                                   : "the metrics stop there, training goes on (--on-output-error warn)");
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
  meta("thread_name", 2, "compute waiting for a collective (exposed communication)");
  for (const auto& e : events_) all.push_back(e);
  return all.dump();
}

std::string TraceRecorder::write_merged(const std::string& path, const std::vector<std::string>& per_rank) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& s : per_rank) {
    for (auto& e : nlohmann::json::parse(s)) events.push_back(std::move(e));
  }
  errno = 0;  // before the open: a read-only file system refuses it (EROFS)
  std::ofstream out(path, std::ios::trunc);
  if (out) out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  if (out) out.close();
  if (out) return "";
  const std::string why = errno ? std::strerror(errno) : "write error";
  std::error_code ec;
  std::filesystem::remove(path, ec);  // no partial trace left behind
  return why;
}

json config_event(const TrainConfig& c, const RunFacts& f, const fsdp::CpuInfo& cpu) {
  json e = {
      {"event", "config"},
      {"model", f.model}, {"family", f.family},
      {"n_layer", f.n_layer}, {"n_head", f.n_head}, {"n_kv_head", f.n_kv_head}, {"n_embd", f.n_embd},
      {"block_size", f.block_size}, {"vocab_size", f.vocab_size}, {"attention", f.attention},
      {"data", f.train_path}, {"val_data", f.val_path.empty() ? "last 5% of data" : f.val_path},
      {"data_dir", c.data_dir}, {"tokenizer", f.tokenizer_path},
      {"train_tokens", f.train_tokens}, {"val_tokens", f.val_tokens},
      {"strategy", f.strategy}, {"mixed_precision", c.mixed_precision},
      {"threads", f.threads},
      {"global_batch_size", c.global_batch_size}, {"micro_batch_size", f.micro_batch_size},
      {"accumulation_steps", f.accumulation_steps}, {"seq_len", c.seq_len},
      {"tokens_per_step", c.global_batch_size * c.seq_len},
      {"steps", c.steps}, {"lr", c.lr}, {"min_lr", c.min_lr}, {"warmup_steps", c.warmup_steps},
      {"weight_decay", c.weight_decay}, {"beta1", c.beta1}, {"beta2", c.beta2}, {"adamw_kernel", c.adamw_kernel},
      {"grad_clip", c.grad_clip}, {"seed", c.seed},
      {"eval_every", c.eval_every}, {"eval_batches", c.eval_batches},
      {"sample_tokens", c.sample_tokens}, {"sample_prompt", c.sample_prompt},
      {"sample_temperature", c.sample_temperature}, {"sample_top_k", c.sample_top_k}, {"on_nonfinite", c.on_nonfinite}, {"on_output_error", c.on_output_error}, {"init_from_hf", c.init_from_hf}, {"export_hf", c.export_hf},
      {"progress", c.progress}, {"metrics", c.metrics}, {"trace", c.trace},
      {"config_file", c.config_file}, {"backend", f.backend},
      {"forward_prefetch", f.forward_prefetch},
      {"hybrid_shard_group_size", f.hybrid_shard_group_size},
      {"bucket_cap_bytes", f.bucket_cap_bytes},
      {"all_gather_codec", c.all_gather_codec},
      {"reshard_after_forward_group_size", f.reshard_after_forward_group_size},
      {"reduce_scatter_codec", c.reduce_scatter_codec},
      {"collective_host_size", f.collective_host_size},
      {"activation_checkpointing", c.activation_checkpointing}, {"meta_init", c.meta_init},
      {"memory_budget_bytes", c.memory_budget_bytes},
      {"root_output_dtype", f.root_output_fp32 ? "fp32" : "unchanged"},
      {"save", c.save}, {"save_every", c.save_every}, {"keep", c.keep},
      {"resume", c.resume}, {"resume_asked", c.resume_asked}, {"resumed_from", f.resumed_from}, {"start_step", f.start_step},
      {"load_s", f.load_s}, {"export", c.export_path}, {"import", c.import_path},
      {"import_s", f.import_s},
      {"world_size", f.world_size}, {"host_of_ranks", f.host_of_ranks},
      {"num_hosts", f.host_of_ranks.empty() ? 0 : 1 + *std::max_element(f.host_of_ranks.begin(), f.host_of_ranks.end())},
      {"num_params", f.num_params},
      {"heap_retained", f.heap_retained}};
  if (c.lora_rank > 0) {
    e["lora"] = {{"rank", c.lora_rank}, {"alpha", c.lora_alpha}, {"dropout", c.lora_dropout},
                 {"layers", f.lora_layers}, {"trainable_params", f.lora_trainable}, {"export_adapter", c.export_adapter}};
  }
  e["cpu"] = {{"model", cpu.model},
              {"capability", cpu.capability},
              {"avx512_bf16", cpu.avx512_bf16}, {"amx_bf16", cpu.amx_bf16},
              {"avx512_fp16", cpu.avx512_fp16}, {"amx_fp16", cpu.amx_fp16},
              {"bf16_accelerated", cpu.bf16_accelerated()},
              {"fp16_accelerated", cpu.fp16_accelerated()}};
  return e;
}

void print_start(Console& console, const TrainConfig& c, const RunFacts& f,
                 const fsdp::CpuInfo& cpu) {
  if (console.enabled() && ((c.mixed_precision == "bf16" && !cpu.bf16_accelerated()) ||
                            (c.mixed_precision == "fp16" && !cpu.fp16_accelerated()))) {
    const bool bf = c.mixed_precision == "bf16";
    const double ratio = fsdp::matmul_time_ratio_vs_fp32(bf ? at::kBFloat16 : at::kHalf);
    char times[32];
    std::snprintf(times, sizeof(times), "%.3gx", ratio);
    console.line("warning: --mixed-precision " + c.mixed_precision + " on " + cpu.model + " (libtorch " +
                 cpu.capability + ", no " + (bf ? "avx512_bf16 or amx_bf16" : "avx512_fp16 or amx_fp16") +
                 " units that libtorch uses): " + (bf ? "a " : "an ") + c.mixed_precision + " matmul took " + times +
                 " the time of an fp32 one here, so steps will be slower than with fp32 (memory and "
                 "communication still halve); CPUs with " +
                 (bf ? "AMX (Intel Xeon 4th generation and later) or AVX512-BF16 (AMD Zen 4 and later)"
                     : "AVX512-FP16 (Intel Xeon 4th generation and later)") +
                 " run it faster than fp32 (docs/BENCHMARKS.md)");
  }
  if (!f.resumed_from.empty()) {
    console.line("resumed from " + f.resumed_from + " at step " + std::to_string(f.start_step) +
                 " (" + std::to_string(f.load_s).substr(0, 5) + " s)");
  }
  if (!c.import_path.empty()) {
    console.line("imported weights from " + c.import_path + " (" +
                 std::to_string(f.import_s).substr(0, 5) + " s)");
  }
  console.line("fsdp-train: " + f.model + " (" + human_count(static_cast<double>(f.num_params)) +
               " params, " + std::to_string(f.n_layer) + " FSDP block units + root) on " +
               std::to_string(f.world_size) + " rank(s) over " + f.backend + ", " + f.strategy + ", " +
               c.mixed_precision + "; " + human_count(static_cast<double>(f.train_tokens)) +
               " train / " + human_count(static_cast<double>(f.val_tokens)) +
               " val tokens; batch " + std::to_string(c.global_batch_size) + " x " +
               std::to_string(c.seq_len) + " tokens, " + std::to_string(f.accumulation_steps) +
               " micro-batch(es) of " + std::to_string(f.micro_batch_size) + " per rank; cpu: " +
               cpu.summary());
  if (c.lora_rank > 0) {
    char share[32];
    std::snprintf(share, sizeof(share), "%.3g%%", 100.0 * static_cast<double>(f.lora_trainable) /
                                                      static_cast<double>(std::max<int64_t>(1, f.num_params + f.lora_trainable)));
    std::string alpha = std::to_string(c.lora_alpha);
    alpha.erase(alpha.find_last_not_of('0') + 1);
    if (!alpha.empty() && alpha.back() == '.') alpha.pop_back();
    console.line("LoRA: rank " + std::to_string(c.lora_rank) + ", alpha " + alpha + ", adapters on " +
                 std::to_string(f.lora_layers.size()) + (f.lora_layers.size() == 1 ? " layer; " : " layers; ") + fsdp::planner::format_count(f.lora_trainable) +
                 " trainable params (" + share + "), the base frozen");
  }
}

json exposed_delta(const std::array<double, fsdp::comm::kWaitPhaseCount>& before,
                   const std::array<double, fsdp::comm::kWaitPhaseCount>& after) {
  json j = json::object();
  double total = 0.0;
  for (int p = 0; p < fsdp::comm::kWaitPhaseCount; ++p) {
    j[fsdp::comm::to_string(static_cast<fsdp::comm::WaitPhase>(p))] = after[p] - before[p];
    total += after[p] - before[p];
  }
  j["total"] = total;
  return j;
}

json comm_delta(const fsdp::comm::CommStats::Snapshot& before,
                const fsdp::comm::CommStats::Snapshot& after) {
  using K = fsdp::comm::CollectiveKind;
  json j;
  int64_t intra = 0, inter = 0;
  for (auto [k, name] : {std::pair{K::kAllGather, "all_gather"},
                         std::pair{K::kReduceScatter, "reduce_scatter"},
                         std::pair{K::kAllReduce, "all_reduce"},
                         std::pair{K::kAllToAll, "all_to_all"},  // int8 reduce-scatters
                         std::pair{K::kBroadcast, "broadcast"},
                         std::pair{K::kBarrier, "barrier"}}) {
    const auto& a = after[static_cast<int>(k)];
    const auto& b = before[static_cast<int>(k)];
    j[std::string(name) + "_bytes"] = a.bytes - b.bytes;
    j[std::string(name) + "_calls"] = a.calls - b.calls;
    j[std::string(name) + "_busy_s"] = a.busy_s - b.busy_s;
    j[std::string(name) + "_intra_host_bytes"] = a.intra_host_bytes - b.intra_host_bytes;
    j[std::string(name) + "_inter_host_bytes"] = a.inter_host_bytes - b.inter_host_bytes;
    intra += a.intra_host_bytes - b.intra_host_bytes;
    inter += a.inter_host_bytes - b.inter_host_bytes;
  }
  j["intra_host_bytes"] = intra;
  j["inter_host_bytes"] = inter;
  return j;
}

StepTotals reduce_step_report(double local_loss, const StepMemory& local,
                              fsdp::comm::ProcessGroup& group) {
  at::Tensor loss_t = at::tensor(std::vector<double>{local_loss}, at::kDouble);
  group.all_reduce(loss_t, fsdp::comm::ReduceOp::kAvg)->wait();
  at::Tensor mem_t =
      at::tensor(std::vector<int64_t>{local.param_shard_bytes, local.grad_shard_bytes,
                                      local.optim_state_bytes, local.peak_bytes,
                                      local.unsharded_param_bytes, local.resident_bytes,
                                      local.activation_bytes},
                 at::kLong);
  group.all_reduce(mem_t, fsdp::comm::ReduceOp::kMax)->wait();
  const int64_t* m = mem_t.data_ptr<int64_t>();
  StepTotals t;
  t.loss = loss_t.item<double>();
  t.mem = {m[0], m[1], m[2], m[4], m[5], m[3], m[6]};
  return t;
}

json step_event(const StepRecord& r) {
  const StepMemory& m = r.totals.mem;
  json e = {{"event", "step"},
            {"step", r.step},
            {"loss", r.totals.loss},
            {"lr", r.lr},
            {"grad_norm", r.grad_norm},
            {"tokens", r.tokens},
            {"step_time_s", r.step_time_s},
            {"tokens_per_s", static_cast<double>(r.tokens) / r.step_time_s},
            {"mem",
             {{"param_shard_bytes", m.param_shard_bytes},
              {"grad_shard_bytes", m.grad_shard_bytes},
              {"optim_state_bytes", m.optim_state_bytes},
              {"unsharded_param_bytes", m.unsharded_param_bytes},
              {"resident_bytes", m.resident_bytes},
              {"peak_bytes", m.peak_bytes},
              {"activation_bytes", m.activation_bytes}}},
            {"comm", r.comm}};
  if (r.loss_scaling) {
    e["loss_scale"] = r.loss_scale;
    e["optimizer_stepped"] = r.optimizer_stepped;
  }
  return e;
}

std::string step_line(const StepRecord& r) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "step %ld/%ld | loss %.4f | lr %.2e | grad norm %.3f | %s tok/s | %.0f ms | "
                "mem/rank: state %s, peak %s",
                static_cast<long>(r.step), static_cast<long>(r.total_steps), r.totals.loss, r.lr,
                r.grad_norm, human_count(static_cast<double>(r.tokens) / r.step_time_s).c_str(),
                r.step_time_s * 1e3,
                human_bytes(static_cast<double>(r.totals.mem.resident_bytes)).c_str(),
                human_bytes(static_cast<double>(r.totals.mem.peak_bytes)).c_str());
  return buf;
}

json end_event(const RunTotals& t) {
  return {{"event", "end"},
          {"steps", t.steps},
          {"start_step", t.start_step},
          {"first_train_loss", t.first_train_loss},
          {"final_train_loss", t.final_train_loss},
          {"final_val_loss", t.final_val_loss},
          {"total_time_s", t.total_time_s},
          {"train_time_s", t.train_time_s},
          {"mean_tokens_per_s", t.mean_tokens_per_s}};
}

std::string done_line(const RunTotals& t) {
  // A finished run resumed again (a job script relaunched): nothing trained, nothing to average.
  if (t.start_step >= t.steps) {
    return "done: nothing to train, the run resumed at step " + std::to_string(t.start_step) + " = --steps";
  }
  // A resumed run trained steps start_step+1..steps only: say so, the first loss is not the run's.
  const std::string resumed =
      t.start_step > 0 ? " (steps " + std::to_string(t.start_step + 1) + "-" + std::to_string(t.steps) +
                             ", resumed at step " + std::to_string(t.start_step) + ")"
                       : "";
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "done: train loss %.4f -> %.4f%s, val loss %.4f, %.1f s total, %s tok/s mean",
                t.first_train_loss, t.final_train_loss, resumed.c_str(), t.final_val_loss, t.total_time_s,
                human_count(t.mean_tokens_per_s).c_str());
  return buf;
}

CollectiveTrace::CollectiveTrace(TraceRecorder& trace, fsdp::comm::ProcessGroupPtr group)
    : trace_(trace), group_(std::move(group)) {
  trace_.reset_origin();
  origin_s_ = fsdp::comm::now_s();
  if (trace_.enabled()) {
    group_->stats().set_record_events(true);
    group_->stats().take_events();  // drop the collectives of the set-up
    fsdp::comm::set_record_wait_events(true);
    fsdp::comm::take_wait_events();
  }
}

void CollectiveTrace::flush() {
  if (!trace_.enabled()) return;
  for (const auto& e : group_->stats().take_events()) {
    trace_.add(fsdp::comm::to_string(e.kind), "comm", 1, (e.start_s - origin_s_) * 1e6,
               (e.end_s - e.start_s) * 1e6, {{"bytes", e.bytes}});
  }
  for (const auto& w : fsdp::comm::take_wait_events()) {
    trace_.add(std::string("waiting (") + fsdp::comm::to_string(w.phase) + ")", "exposed", 2,
               (w.start_s - origin_s_) * 1e6, (w.end_s - w.start_s) * 1e6);
  }
}

std::string write_trace(const TraceRecorder& trace, const std::string& path,
                        fsdp::comm::ProcessGroup& group) {
  std::vector<std::string> per_rank = fsdp::comm::all_gather_strings(group, trace.serialize());
  return group.rank() == 0 ? TraceRecorder::write_merged(path, per_rank) : "";
}

}  // namespace apps::train
