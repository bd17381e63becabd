// fsdp-train's run (trainer.h): the step loop, with its evaluations, checkpoints, sample and
// export. The set-up is trainer_setup.cpp's, a step trainer_step.cpp's.
#include "train/trainer.h"
#include "train/interrupt.h"
#include "train/trainer_impl.h"

#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "fsdp/accounting/memory.h"
#include "fsdp/common/activity.h"
#include "train/checkpointing.h"
#include "train/errors.h"
#include "train/op_profile.h"
#include "train/rank_agreement.h"
#include "train/reporting.h"

namespace apps::train {

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
  set_interrupt_state(progress_.step, cfg_.steps, newest_checkpoint_, cfg_.save, /*saving=*/true);
  const Saved saved = save(cfg_, progress_, model_config_, model_, *optimizer_, loss_scaling_, group_);
  trace_.add("checkpoint save", "compute", 0, t0_us, trace_.now_us() - t0_us);
  newest_checkpoint_ = saved.path;
  set_interrupt_state(progress_.step, cfg_.steps, newest_checkpoint_, cfg_.save);
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
  newest_checkpoint_ = facts_.resumed_from;
  for (int64_t step = start_step + 1; step <= cfg_.steps; ++step) {
    set_interrupt_state(step, cfg_.steps, newest_checkpoint_, cfg_.save);
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
    const auto exposed_after = fsdp::comm::exposed_wait_s();
    r.mem.peak_bytes = fsdp::accounting::peak_bytes();
    train_seconds += r.step_time_s;

    // Reporting (collectives outside the measured part).
    StepRecord rec;
    rec.totals = reduce_step_report(r.local_loss, r.mem, *group_);
    last_loss = rec.totals.loss;
    if (step == start_step + 1) first_loss = last_loss;
    rec.comm = comm_delta(r.stats_before, stats_after);
    rec.comm["exposed_s"] = exposed_delta(r.exposed_before, exposed_after);
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

  set_interrupt_state(cfg_.steps + 1, cfg_.steps, newest_checkpoint_, cfg_.save);
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
  if (!cfg_.export_adapter.empty()) {
    const double export_s = export_adapter_weights(cfg_, model_config_, model_, group_);
    metrics_->write({{"event", "export_adapter"}, {"path", cfg_.export_adapter}, {"export_s", export_s}});
    console_.line("exported the LoRA adapters (PEFT) to " + cfg_.export_adapter + " (" +
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

void train(const TrainConfig& c, const fsdp::comm::ProcessGroupPtr& group, bool heap_retained) {
  Trainer trainer(c, group, heap_retained);
  trainer.run();
}

}  // namespace apps::train
