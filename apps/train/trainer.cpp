// fsdp-train's run (trainer.h): set-up, the measured training part of a step, evaluation and the
// step loop. Collectives are issued in the same order on every rank.
#include "train/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "data/batch_sampler.h"
#include "data/tokenizer.h"
#include "fsdp/accounting/budget.h"
#include "fsdp/accounting/memory.h"
#include "fsdp/common/activity.h"
#include "fsdp/common/check.h"
#include "fsdp/common/cpu_info.h"
#include "fsdp/optim/clip.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/materialize.h"
#include "models/model_config.h"
#include "models/gpt.h"
#include "train/checkpointing.h"
#include "train/corpus.h"
#include "train/errors.h"
#include "train/loss_scaling.h"
#include "train/model_setup.h"
#include "train/nonfinite.h"
#include "train/op_profile.h"
#include "train/preflight.h"
#include "train/rank_agreement.h"
#include "train/reporting.h"

namespace apps::train {
namespace {

/// Mean loss over `batches` global validation batches, micro sequences per forward. Collective
/// over group (the model's forwards, then one all-reduce); no grad.
double evaluate(const std::shared_ptr<models::CausalLMImpl>& model, const data::DistributedBatchSampler& val, int64_t batches,
                int64_t micro, fsdp::comm::ProcessGroup& group) {
  at::NoGradGuard no_grad;
  const int64_t T = val.seq_len();
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    at::Tensor batch = val.eval_batch(b);  // (G/N, T+1)
    for (int64_t r = 0; r < batch.size(0); r += micro) {
      at::Tensor mb = batch.slice(0, r, std::min(r + micro, batch.size(0)));
      at::Tensor logits = fsdp::call(model, mb.slice(1, 0, T));
      sum += models::gpt_loss(logits.to(at::kFloat), mb.slice(1, 1, T + 1)).item<double>();
      ++count;
    }
  }
  at::Tensor mean = at::tensor(std::vector<double>{sum / count}, at::kDouble);
  group.all_reduce(mean, fsdp::comm::ReduceOp::kAvg)->wait();
  return mean.item<double>();
}

/// What the measured part of a step leaves on this rank.
struct StepResult {
  double local_loss = 0.0;  ///< mean over this rank's rows
  double grad_norm = 0.0;
  bool stepped = true;
  double loss_scale = 1.0;  ///< the scale this step's backward used
  StepMemory mem;           ///< this rank's; peak_bytes filled by the caller
  fsdp::comm::CommStats::Snapshot stats_before;
  double step_time_s = 0.0;
};

/// One run: the set-up in the constructor (in the order of its collectives), then run().
class Trainer {
 public:
  Trainer(const TrainConfig& c, fsdp::comm::ProcessGroupPtr group, bool heap_retained);
  void run();

 private:
  StepResult train_step(const at::Tensor& batch, int64_t step);
  /// The counting allocator's bytes now, less the unsharded params alive (activation_bytes).
  int64_t held_for_activations() const;
  void eval_now(int64_t step);
  void save_now();
  // --on-output-error stop: the ranks agree (one all-reduce, only under stop) on whether any
  // rank's output failed (`failed_here`: this rank's); if one did, every rank throws the same
  // RunError naming them and `when`. The failing rank has said which file and why.
  void stop_if_output_failed(bool failed_here, const std::string& when);
  void sample();

  const TrainConfig cfg_;
  const fsdp::comm::ProcessGroupPtr group_;
  const int rank_, world_;
  Console console_;
  const BatchGeometry batch_;
  const fsdp::FullyShardOptions fsdp_options_, root_options_;
  LossScaling loss_scaling_;
  RunFacts facts_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  Corpus corpus_;
  std::optional<data::DistributedBatchSampler> train_sampler_, val_sampler_;
  int64_t eval_batches_ = 0;  ///< --eval-batches, at most the validation set once
  models::ModelConfig model_config_;
  std::shared_ptr<models::CausalLMImpl> model_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  TrainProgress progress_;
  std::optional<JsonLines> metrics_;
  TraceRecorder trace_;
  double last_val_ = NAN;
  std::optional<NonFiniteInjection> inject_nonfinite_;  ///< test only
};

Trainer::Trainer(const TrainConfig& c, fsdp::comm::ProcessGroupPtr group, bool heap_retained)
    : cfg_(c),
      group_(std::move(group)),
      rank_(group_->rank()),
      world_(group_->size()),
      console_(rank_,
               c.progress == "bar" || (c.progress == "auto" && ::isatty(STDOUT_FILENO) != 0)),
      batch_(resolve_batch(c, world_)),
      fsdp_options_(resolve_fsdp_options(c, *group_)),
      root_options_(root_options_of(fsdp_options_)),
      loss_scaling_(c.mixed_precision == "fp16"),
      trace_(rank_, !c.trace.empty()),
      inject_nonfinite_(nonfinite_injection_from_env()) {
  facts_.threads = resolve_threads(cfg_);
  at::set_num_threads(facts_.threads);
  // Data: rank 0 tokenizes first (a barrier).
  // Pre-tokenized --data (uint16 ids) needs no tokenizer: the vocabulary is --init-from-hf's, or
  // --vocab-size.
  const bool pretokenized = pretokenized_data(cfg_);
  if (pretokenized && !cfg_.tokenizer.empty()) {
    throw UsageError("--tokenizer: a pre-tokenized --data (" + cfg_.data + ") has no text to read with it");
  }
  if (!pretokenized && cfg_.data_dtype != "uint16") {
    throw UsageError("--data-dtype " + cfg_.data_dtype + " applies to pre-tokenized .bin ids, not the text of " +
                     (cfg_.data.empty() ? cfg_.data_dir + "/corpus" : cfg_.data));
  }
  if (!pretokenized) {
    facts_.tokenizer_path = tokenizer_path(cfg_);
    try {  // the same file on every rank: the same verdict, a usage error rather than an abort
      tokenizer_ = std::make_unique<data::Tokenizer>(facts_.tokenizer_path);
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string(cfg_.tokenizer.empty() ? "--data-dir / --vocab-size: " : "--tokenizer: ") + e.what());
    }
  } else if (cfg_.sample_tokens > 0) {
    throw UsageError("--sample-tokens: a pre-tokenized --data (" + cfg_.data +
                     ") comes with no tokenizer to encode the prompt and decode the sample");
  }
  model_config_ =
      resolve_model(cfg_, tokenizer_ ? tokenizer_->vocab_size() : cfg_.vocab_size, /*tokenizer_vocab=*/!pretokenized);
  // Everything the end of the run needs is checked now, before any data or training.
  const models::ModelConfig& mcfg = model_config_;
  PreflightFacts pf;
  pf.vocab_size = mcfg.vocab_size();
  pf.prompt_tokens = tokenizer_ ? static_cast<int64_t>(tokenizer_->encode(cfg_.sample_prompt).size()) : 0;
  pf.checkpoint_bytes = checkpoint_bytes_of(mcfg.num_params());
  pf.export_bytes = export_bytes_of(mcfg.num_params());
  pf.build_bytes = cfg_.meta_init ? 16 * mcfg.num_params() / world_ : 4 * mcfg.num_params();
  preflight(cfg_, pf, *group_);
  // Data: rank 0 tokenizes first (a barrier).
  {
    const fsdp::ActivityScope activity(nullptr, "loading data");
    corpus_ = load_corpus(cfg_, tokenizer_.get(), mcfg.vocab_size(), *group_, console_);
    check_ranks_agree(data_settings(*corpus_.train, *corpus_.val), *group_,
                      "every rank must read the same text with the same tokenizer: --data, --data-dir");
    train_sampler_.emplace(make_sampler(corpus_.train, cfg_, rank_, world_, "training"));
    val_sampler_.emplace(make_sampler(corpus_.val, cfg_, rank_, world_, "validation"));
    // A validation pass covers the set at most once: batches past its end would repeat windows.
    const int64_t whole = std::max<int64_t>(1, val_sampler_->eval_windows() / val_sampler_->global_batch_size());
    eval_batches_ = std::min(cfg_.eval_batches, whole);
    if (eval_batches_ < cfg_.eval_batches) {
      console_.line("validation: --eval-batches " + std::to_string(cfg_.eval_batches) + " is more than the set holds (" +
                    std::to_string(val_sampler_->eval_windows()) + " sequences of " +
                    std::to_string(val_sampler_->seq_len()) + " tokens, " + std::to_string(whole) +
                    " global batch(es)): each pass evaluates " + std::to_string(whole));
    }
  }

  // Model: identical init on every rank (checked), then one unit per block plus the root.
  // --meta-init: built on the meta device, sharded, then each rank writes its rows module by
  // module with the values of the CPU build (no rank holds the full model, so the checksum check
  // of the full parameters cannot run; every rank draws the same stream from --seed).
  torch::manual_seed(cfg_.seed);
  {
    const fsdp::ActivityScope activity(nullptr, "model build");
    model_ = models::build_model(mcfg, cfg_.meta_init ? at::kMeta : at::kCPU);
    model_->set_activation_checkpointing(cfg_.activation_checkpointing);
    if (!cfg_.meta_init) check_identical_init(*model_, *group_);
  }
  try {
    const fsdp::ActivityScope activity(nullptr, "fully_shard");
    fsdp::fully_shard_tree(model_, group_, models::block_wrap_policy(mcfg), fsdp_options_, root_options_);
  } catch (const fsdp::OutOfMemory&) {
    throw;  // the memory budget, not the settings
  } catch (const fsdp::Error& e) {
    if (is_per_rank_failure(e)) throw;  // a stalled or failed collective, not the settings
    throw UsageError(std::string("the FSDP engine rejected these settings: ") + e.what());
  }
  // --init-from-hf writes every parameter's rows from the file: a meta build needs no init.
  if (cfg_.meta_init && cfg_.init_from_hf.empty()) fsdp::materialize(model_, models::model_init(mcfg));
  facts_.import_s = import_weights(cfg_, model_, group_) + import_hf_weights(cfg_, mcfg, model_, group_);
  optimizer_ = make_optimizer(model_, mcfg, cfg_);
  const Resumed resumed = resume(cfg_, model_, *optimizer_, loss_scaling_, group_);
  progress_ = resumed.progress;

  metrics_.emplace(cfg_.metrics, rank_, cfg_.on_output_error == "stop");
  facts_.model = cfg_.init_from_hf.empty() ? cfg_.model : mcfg.hf_architecture() + " from " + cfg_.init_from_hf;
  facts_.family = mcfg.family();
  facts_.n_layer = mcfg.n_layer();
  facts_.n_head = mcfg.n_head();
  facts_.n_kv_head = mcfg.n_kv_head();
  facts_.n_embd = mcfg.width();
  facts_.block_size = mcfg.context();
  facts_.vocab_size = mcfg.vocab_size();
  facts_.attention = mcfg.attention();
  facts_.num_params = mcfg.num_params();
  facts_.train_path = corpus_.train_path;
  facts_.val_path = corpus_.val_path;
  facts_.train_tokens = corpus_.train->size();
  facts_.val_tokens = corpus_.val->size();
  facts_.backend = group_->backend_name();
  facts_.world_size = world_;
  facts_.host_of_ranks = group_->host_of_ranks();
  facts_.strategy = fsdp::to_string(fsdp_options_.strategy);
  facts_.forward_prefetch = fsdp_options_.forward_prefetch;
  facts_.hybrid_shard_group_size = fsdp_options_.hybrid_shard_group_size;
  facts_.bucket_cap_bytes = fsdp_options_.bucket_cap_bytes.value_or(fsdp::kDefaultBucketCapBytes);
  facts_.root_output_fp32 = root_options_.mixed_precision.output_dtype.has_value();
  facts_.micro_batch_size = batch_.micro;
  facts_.accumulation_steps = batch_.accum;
  facts_.heap_retained = heap_retained;
  facts_.resumed_from = resumed.path;
  facts_.start_step = resumed.progress.step;
  facts_.load_s = resumed.load_s;
  const fsdp::CpuInfo& cpu = fsdp::cpu_info();
  metrics_->write(config_event(cfg_, facts_, cpu));
  print_start(console_, cfg_, facts_, cpu);
}

int64_t Trainer::held_for_activations() const {
  return fsdp::accounting::current_bytes() -
         fsdp::accounting::model_state_bytes(model_).unsharded_param_bytes;
}

StepResult Trainer::train_step(const at::Tensor& batch, int64_t step) {
  // The measured part of the step: [Note: measurement rules] in reporting.h.
  StepResult r;
  const int64_t T = cfg_.seq_len, micro = batch_.micro, accum = batch_.accum;
  fsdp::accounting::reset_peak_bytes();
  r.stats_before = group_->stats().snapshot();
  const auto t0 = Clock::now();
  try {
  for (int64_t k = 0; k < accum; ++k) {
    fsdp::set_requires_gradient_sync(model_, k == accum - 1);
    at::Tensor mb = batch.slice(0, k * micro, (k + 1) * micro);  // (micro, T+1)
    at::Tensor loss;
    const int64_t held_before = held_for_activations();
    {
      TraceScope s(trace_, "forward mb" + std::to_string(k));
      at::Tensor logits = fsdp::call(model_, mb.slice(1, 0, T));  // (micro, T, V)
      const fsdp::ActivityScope activity(nullptr, "loss");
      loss = models::gpt_loss(logits.to(at::kFloat), mb.slice(1, 1, T + 1));
      if (inject_nonfinite_ && inject_nonfinite_->step == step && inject_nonfinite_->rank == rank_) {
        loss = loss * std::numeric_limits<double>::quiet_NaN();  // test only
      }
    }
    // [Note: measurement rules] What the forward and the loss left for backward.
    r.mem.activation_bytes = std::max(r.mem.activation_bytes, held_for_activations() - held_before);
    {
      TraceScope s(trace_, "backward mb" + std::to_string(k));
      const fsdp::ActivityScope activity(nullptr, "backward");
      loss_scaling_.scale(loss / static_cast<double>(accum)).backward();
    }
    r.local_loss += loss.item<double>() / static_cast<double>(accum);
  }
  } catch (...) {
    // A failure between the forward and the backward (the loss refused by --memory-budget) on
    // this rank: its peers may be in that backward; they fail their step too and the ranks agree
    // on the report (failures.h). Failures inside forward or backward are settled there.
    fsdp::abandon_step(model_);
    throw;
  }
  fsdp::accounting::ModelStateBytes state;
  r.loss_scale = loss_scaling_.current_scale();
  {
    TraceScope s(trace_, "optimizer step (clip + AdamW)");
    const fsdp::ActivityScope activity(nullptr, "optimizer step");
    loss_scaling_.unscale(model_);
    r.grad_norm = fsdp::clip_grad_norm(model_, cfg_.grad_clip);
    const std::string nonfinite = nonfinite_report(step, r.local_loss, r.grad_norm,
                                                   !loss_scaling_.enabled(), model_, *group_);
    if (!nonfinite.empty() && cfg_.on_nonfinite == "stop") {
      throw RunError(nonfinite + "; stopped before the optimizer step, no checkpoint of this step "
                     "(--on-nonfinite skip drops such steps instead)");
    }
    if (!nonfinite.empty()) {
      r.stepped = false;  // --on-nonfinite skip: the update is dropped, as the fp16 scaler does
      loss_scaling_.skip_step();
      console_.line(nonfinite + "; update skipped (--on-nonfinite skip)");
    } else {
      r.stepped = loss_scaling_.step(*optimizer_, model_);
    }
    state = fsdp::accounting::model_state_bytes(model_, optimizer_.get());
    optimizer_->zero_grad();
  }
  r.step_time_s = seconds_since(t0);
  const int64_t activation_bytes = r.mem.activation_bytes;
  r.mem = {state.sharded_param_bytes, state.sharded_grad_bytes, state.optim_state_bytes,
           state.unsharded_param_bytes, state.resident_bytes(), 0, activation_bytes};
  return r;
}

void Trainer::stop_if_output_failed(bool failed_here, const std::string& when) {
  if (cfg_.on_output_error != "stop") return;
  const std::vector<int> failed = ranks_where(failed_here, *group_);
  if (failed.empty()) return;
  throw RunError("the output of " + rank_list(failed) + " could not be written (the warning above names the file "
                 "and the reason); stopped " + when + " (--on-output-error stop; checkpoints up to here are "
                 "complete; 'warn' trains on without that output)");
}

void Trainer::eval_now(int64_t step) {
  const double t0 = trace_.now_us();
  const fsdp::ActivityScope activity(nullptr, "evaluation");
  last_val_ = evaluate(model_, *val_sampler_, eval_batches_, batch_.micro, *group_);
  trace_.add("eval", "compute", 0, t0, trace_.now_us() - t0);
  metrics_->write({{"event", "eval"}, {"step", step}, {"val_loss", last_val_}});
  char buf[96];
  std::snprintf(buf, sizeof(buf), "step %ld: val loss %.4f", static_cast<long>(step), last_val_);
  console_.line(buf);
}

void Trainer::save_now() {
  const double t0_us = trace_.now_us();
  const fsdp::ActivityScope activity(nullptr, "checkpoint save");
  const Saved saved = save(cfg_, progress_, model_, *optimizer_, loss_scaling_, group_);
  trace_.add("checkpoint save", "compute", 0, t0_us, trace_.now_us() - t0_us);
  metrics_->write({{"event", "checkpoint"}, {"step", progress_.step}, {"path", saved.path},
                   {"save_s", saved.save_s}});
  console_.line("step " + std::to_string(progress_.step) + ": checkpoint " + saved.path + " (" +
                std::to_string(saved.save_s).substr(0, 5) + " s)");
}

void Trainer::sample() {
  const double t0 = trace_.now_us();
  std::vector<int32_t> prompt32 = tokenizer_->encode(cfg_.sample_prompt);
  std::vector<int64_t> prompt(prompt32.begin(), prompt32.end());
  std::vector<int64_t> out = model_->generate(prompt, cfg_.sample_tokens, cfg_.sample_temperature,
                                              cfg_.sample_top_k, cfg_.seed);
  trace_.add("generate", "compute", 0, t0, trace_.now_us() - t0);
  std::vector<int32_t> out32(prompt32);  // decode prompt + continuation together (spacing)
  out32.insert(out32.end(), out.begin(), out.end());
  console_.line("sample (" + std::to_string(cfg_.sample_tokens) + " tokens, temperature " +
                std::to_string(cfg_.sample_temperature).substr(0, 4) + ", top-k " +
                std::to_string(cfg_.sample_top_k) + "):\n" + tokenizer_->decode(out32));
}

void Trainer::run() {
  group_->barrier()->wait();
  CollectiveTrace comm_trace(trace_, group_);  // the trace's origin, on every rank
  const auto run_start = Clock::now();
  const int64_t start_step = facts_.start_step;
  if (start_step > cfg_.steps) {
    throw UsageError("--resume " + facts_.resumed_from + " is at step " + std::to_string(start_step) +
                     ", beyond --steps " + std::to_string(cfg_.steps) + " (raise --steps to train on)");
  }
  const int64_t tokens_per_step = cfg_.global_batch_size * cfg_.seq_len;
  double train_seconds = 0.0, first_loss = NAN, last_loss = NAN;
  OpProfiler op_profiler;
  const int64_t profile_from = std::max(start_step + 1, cfg_.steps - cfg_.profile_steps + 1);
  double profiled_s = 0.0;
  for (int64_t step = start_step + 1; step <= cfg_.steps; ++step) {
    if (!cfg_.profile.empty() && step == profile_from) op_profiler.start();
    const double lr =
        lr_at(++progress_.lr_step, cfg_.steps, cfg_.warmup_steps, cfg_.lr, cfg_.min_lr);
    for (auto& g : optimizer_->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    }
    at::Tensor batch = train_sampler_->train_batch(progress_.batch_pos++);  // (G/N, T+1)
    StepResult r = train_step(batch, step);
    progress_.step = step;
    if (op_profiler.active()) {
      profiled_s += r.step_time_s;
      if (step == cfg_.steps) {
        // Stopped before the last step's evaluation and checkpoint, which are not step time.
        const std::string path =
            rank_ == 0 ? cfg_.profile : cfg_.profile + ".rank" + std::to_string(rank_);
        std::vector<OpTotals> ops = op_profiler.stop(path);
        console_.line("operator profile of the last " +
                      std::to_string(cfg_.steps - profile_from + 1) + " step(s), rank 0 (" +
                      std::to_string(profiled_s * 1e3).substr(0, 7) + " ms of steps; trace " +
                      cfg_.profile + "):\n" +
                      format_op_table(ops, profiled_s, 25));
      }
    }
    const auto stats_after = group_->stats().snapshot();
    r.mem.peak_bytes = fsdp::accounting::peak_bytes();
    train_seconds += r.step_time_s;

    // Reporting (collectives outside the measured part).
    StepRecord rec;
    rec.totals = reduce_step_report(r.local_loss, r.mem, *group_);
    last_loss = rec.totals.loss;
    if (step == start_step + 1) first_loss = last_loss;
    rec.comm = comm_delta(r.stats_before, stats_after);
    comm_trace.flush();
    rec.step = step;
    rec.total_steps = cfg_.steps;
    rec.lr = lr;
    rec.grad_norm = r.grad_norm;
    rec.tokens = tokens_per_step;
    rec.step_time_s = r.step_time_s;
    rec.loss_scaling = loss_scaling_.enabled();
    rec.loss_scale = r.loss_scale;
    rec.optimizer_stepped = r.stepped;
    metrics_->write(step_event(rec));
    console_.progress(step_line(rec));

    if ((cfg_.eval_every > 0 && step % cfg_.eval_every == 0) || step == cfg_.steps) eval_now(step);
    if (!cfg_.save.empty() &&
        ((cfg_.save_every > 0 && step % cfg_.save_every == 0) || step == cfg_.steps)) {
      save_now();
    }
    comm_trace.flush();
    stop_if_output_failed(metrics_->failed(), "after step " + std::to_string(step));
  }

  if (cfg_.sample_tokens > 0) sample();
  if (!cfg_.export_path.empty()) {
    const double t0_us = trace_.now_us();
    const double export_s = export_weights(cfg_, model_, group_);
    trace_.add("export", "compute", 0, t0_us, trace_.now_us() - t0_us);
    comm_trace.flush();
    metrics_->write({{"event", "export"}, {"path", cfg_.export_path}, {"export_s", export_s}});
    console_.line("exported the full state dict to " + cfg_.export_path + " (" +
                  std::to_string(export_s).substr(0, 5) + " s)");
  }
  if (!cfg_.export_hf.empty()) {
    const double t0_us = trace_.now_us();
    const double export_s = export_hf_weights(cfg_, model_config_, model_, group_);
    trace_.add("export (Hugging Face)", "compute", 0, t0_us, trace_.now_us() - t0_us);
    comm_trace.flush();
    metrics_->write({{"event", "export_hf"}, {"path", cfg_.export_hf}, {"export_s", export_s}});
    console_.line("exported a Hugging Face " + model_config_.hf_architecture() + " (" + cfg_.export_hf_dtype + ") to " +
                  cfg_.export_hf + " (" +
                  std::to_string(export_s).substr(0, 5) + " s)");
  }
  RunTotals totals;
  totals.total_time_s = seconds_since(run_start);
  totals.steps = cfg_.steps;
  totals.start_step = start_step;
  totals.first_train_loss = first_loss;
  totals.final_train_loss = last_loss;
  totals.final_val_loss = last_val_;
  totals.train_time_s = train_seconds;
  const int64_t tokens_trained = tokens_per_step * (cfg_.steps - start_step);
  totals.mean_tokens_per_s =
      train_seconds > 0 ? static_cast<double>(tokens_trained) / train_seconds : 0.0;
  metrics_->write(end_event(totals));
  console_.line(done_line(totals));
  std::string trace_failed;
  if (!cfg_.trace.empty()) {
    trace_failed = write_trace(trace_, cfg_.trace, *group_);
    console_.line(trace_failed.empty() ? "trace written to " + cfg_.trace
                                       : "fsdp-train: warning: --trace '" + cfg_.trace + "' could not be written: " +
                                             trace_failed + " (no file left; training and checkpoints are complete)");
  }
  stop_if_output_failed(metrics_->failed() || !trace_failed.empty(), "at the end of the run");
  group_->barrier()->wait();
}

}  // namespace

void train(const TrainConfig& c, const fsdp::comm::ProcessGroupPtr& group, bool heap_retained) {
  Trainer trainer(c, group, heap_retained);
  trainer.run();
}

}  // namespace apps::train
