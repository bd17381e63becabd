// fsdp-train: trains a GPT-2-style model on real text with Fully Sharded Data Parallel over MPI.
//
//   mpirun -n N build/bin/fsdp-train [flags]        (--help lists them; --config FILE.toml)
//
// Contents (apps/train/)
//   main.cpp          this file: the world group, the flags, the trainer, exceptions -> exit codes.
//   train_config.*    every flag and the TOML config file (TrainConfig, parse_train_config).
//   trainer.*         the run: set-up in collective order, the measured step (micro-batches
//                     with gradient accumulation, loss scaling, clipping, AdamW, lr schedule),
//                     evaluation, checkpoints on schedule, the sample and the summary.
//   model_setup.*     batch geometry, the GPT's shape, FSDP options (one unit per Block + the
//                     root), the identical-init check across ranks, AdamW over this rank's shards.
//   corpus.*          the tokenizer model, the training / validation token streams, the samplers.
//   loss_scaling.*    fp16 dynamic loss scaling (fsdp::GradScaler), a pass-through otherwise.
//   checkpointing.*   --resume, --save (and its directory check), --export, --import.
//   reporting.*       lr schedule, console, JSON-lines events, Chrome trace.
//   op_profile.*      --profile: libtorch's operator profiler over the last steps.
//   errors.h          UsageError and CheckpointError.
//
// Measurement rules (what the JSON-lines fields measure): [Note: measurement rules] in
// reporting.h. Checkpoint contents: [Note: checkpoint contents] in checkpointing.h. Both are
// documented for users in apps/README.md.
//
// Exit codes: 0 done (or --help); 2 a bad flag or setting (rank 0 prints it once, every rank
// exits); 1 a checkpoint operation failed on every rank (rank 0 prints it, every rank exits);
// any other error is printed by each rank that hits it, with its rank, and aborts the job, since
// its peers may be blocked in a collective.
#include <mpi.h>

#include <exception>
#include <iostream>
#include <optional>

#include "fsdp/accounting/memory.h"
#include "fsdp/comm/mpi_backend.h"
#include "train/errors.h"
#include "train/train_config.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  int rank = 0, size = 1;
  try {
    fsdp::comm::ProcessGroupPtr world = fsdp::comm::mpi_world();
    fsdp::accounting::install_counting_allocator();
    const bool heap_retained = fsdp::accounting::retain_freed_heap_memory();
    int exit_code = 0;
    std::optional<apps::train::TrainConfig> config =
        apps::train::parse_train_config(argc, argv, world->rank(), &exit_code);
    if (!config) return exit_code;
    apps::train::train(*config, world, heap_retained);
    return 0;
  } catch (const apps::train::UsageError& e) {
    // Every rank reaches the same verdict: rank 0 reports it, all exit cleanly.
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::cerr << "fsdp-train: error: " << e.what() << std::endl;
    return 2;
  } catch (const apps::train::CheckpointError& e) {
    // Checkpoint calls fail collectively (same error on every rank): rank 0 reports, all exit.
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::cerr << "fsdp-train: error: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    int init = 0;
    MPI_Initialized(&init);
    if (init) {
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    std::cerr << "fsdp-train [rank " << rank << "]: error: " << e.what() << std::endl;
    // Peers may be blocked in a collective: abort the whole job instead of hanging.
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
