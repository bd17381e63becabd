// fsdp-train: trains a GPT-2-style model on real text with Fully Sharded Data Parallel over MPI
// or Gloo (--backend; auto: gloo under torchrun).
//
//   mpirun -n N build/bin/fsdp-train [flags]        (--help lists them; --config FILE.toml)
//   torchrun --no-python --nproc-per-node N build/bin/fsdp-train [flags]
//
// Contents (apps/train/)
//   main.cpp          this file: the flags, the world group, the trainer, exceptions -> exit codes.
//   train_config.*    every flag and the TOML config file (TrainConfig, parse_train_config).
//   trainer.*         the run: set-up in collective order, the measured step (micro-batches
//                     with gradient accumulation, loss scaling, clipping, AdamW, lr schedule),
//                     evaluation, checkpoints on schedule, the sample and the summary.
//   model_setup.*     batch geometry, the GPT's shape, FSDP options (one unit per Block + the
//                     root), the identical-init check across ranks, AdamW over this rank's shards.
//   corpus.*          the tokenizer model, the training / validation token streams, the samplers.
//   loss_scaling.*    fp16 dynamic loss scaling (fsdp::GradScaler), a pass-through otherwise.
//   checkpointing.*   --resume, --save, --export, --import.
//   resume_checks.*   the TrainState counters of --resume, checked before use.
//   preflight.*       before step 1: output paths writable with room, sample settings.
//   rank_agreement.*  before step 1: the settings and the token streams are the same on every rank.
//   nonfinite.*       the per-step NaN/inf check (--on-nonfinite stop|skip).
//   value_bounds.*    bounds of the numeric flags, with readable messages.
//   reporting.*       lr schedule, console, JSON-lines events, Chrome trace.
//   op_profile.*      --profile: libtorch's operator profiler over the last steps.
//   failures.*        the exit path of every failure (exit codes, the timeout diagnosis).
//   interrupt.*       SIGINT / SIGTERM: one line naming the step and the newest checkpoint.
//   dry_run.*         --dry-run: one rank of an N-rank job accounted in this process.
//   errors.h          UsageError, CheckpointError and RunError.
//
// Measurement rules (what the JSON-lines fields measure): [Note: measurement rules] in
// reporting.h. Checkpoint contents: [Note: checkpoint contents] in checkpointing.h. Both are
// documented for users in apps/README.md. Exit codes: failures.h.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <optional>

#include "fsdp/accounting/budget.h"
#include "fsdp/accounting/memory.h"
#include "fsdp/comm/world.h"
#include "train/checkpointing.h"
#include "train/dry_run.h"
#include "train/errors.h"
#include "train/failures.h"
#include "train/interrupt.h"
#include "train/rank_agreement.h"
#include "train/train_config.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  // Whole lines on stderr: an error line written piece by piece is interleaved with other ranks'
  // output (mpirun --tag-output tags every piece).
  // std::cerr flushes after every << (unitbuf): off, so that its writes reach the line-buffered
  // stderr and leave it a line at a time.
  std::setvbuf(stderr, nullptr, _IOLBF, 1 << 16);
  std::cerr.unsetf(std::ios_base::unitbuf);
  std::string flight_recorder_dir, strategy;
  double agree_s = 30.0;
  try {
    fsdp::comm::init_launcher();
    const int rank = apps::train::world_rank();
    int exit_code = 0;
    std::optional<apps::train::TrainConfig> config = apps::train::parse_train_config(argc, argv, rank, &exit_code);
    if (!config) return exit_code;
    apps::train::install_interrupt_handlers(rank);
    strategy = config->strategy;
    const fsdp::comm::ProcessGroupOptions options = apps::train::group_options(*config);
    flight_recorder_dir = options.flight_recorder_dir;
    agree_s = std::min(agree_s, options.timeout_s);
    fsdp::comm::ProcessGroupPtr world;
    try {
      world = fsdp::comm::world_from_env(config->backend, options);
    } catch (const fsdp::Error& e) {
      // The launch itself is wrong: nothing is running yet that an abort would have to end.
      if (e.kind() != fsdp::ErrorKind::kInvalidArgument && e.kind() != fsdp::ErrorKind::kUnsupported) throw;
      throw apps::train::LaunchError(e.what());
    }
    // Before anything else: every rank was launched with the same settings.
    apps::train::check_ranks_agree(apps::train::shared_settings(*config), *world,
                                   "launch every rank with the same flags and config file");
    if (config->dry_run) {
      if (world->size() > 1) {
        throw apps::train::UsageError("--dry-run simulates --world-size ranks in one process: run it without mpirun or torchrun");
      }
      std::fputs(apps::train::format_dry_run(apps::train::run_dry_run(*config), *config).c_str(), stdout);
      return 0;
    }
    // --resume auto: the newest checkpoint in --save, or a fresh start (a restarted job).
    config->resume_asked = config->resume;
    config->resume = apps::train::resolve_auto_resume(config->resume, config->save, *world);
    fsdp::accounting::install_counting_allocator();
    if (config->memory_budget_bytes > 0) fsdp::accounting::set_memory_budget(config->memory_budget_bytes, rank);
    const bool heap_retained = fsdp::accounting::retain_freed_heap_memory();
    apps::train::train(*config, world, heap_retained);
    return 0;
  } catch (...) {
    return apps::train::exit_on_failure(std::current_exception(), flight_recorder_dir, agree_s, strategy);
  }
}
