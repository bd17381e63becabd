// How fsdp-train ends after a failure: which errors every rank agrees on (one message from rank 0,
// a clean exit), and which need the job aborted because a peer may be blocked in a collective.
//
// Exit codes: 0 done (or --help); 2 a bad flag or setting (rank 0 prints it once, every rank
// exits); 1 a failure every rank reached together (a checkpoint operation, a non-finite loss,
// ranks that ran different collectives, every rank out of its --memory-budget: rank 0 prints it,
// every rank exits); otherwise the error is printed by
// each rank that hits it, with its rank, and the job is aborted. A collective timeout also prints
// the diagnosis of the flight-recorder dumps (which ranks wait where, which rank left no dump)
// from the lowest live rank before the abort.
#pragma once

#include <exception>
#include <string>

#include "fsdp/comm/process_group.h"
#include "train/train_config.h"

namespace apps::train {

/// This process's rank in the job (its job channel's, or its launcher's before the world group).
int world_rank();

/// The world group's options: --collective-timeout / FSDP_COLLECTIVE_TIMEOUT_S, and the flight
/// recorder directory (--flight-recorder-dir, FSDP_FLIGHT_RECORDER_DIR, flight-recorder/ beside
/// --metrics, ./flight-recorder). Throws UsageError for a malformed environment value.
fsdp::comm::ProcessGroupOptions group_options(const TrainConfig& config);

/// Reports `error` as described above and returns the exit code (or aborts the job).
///
/// fsdp::OutOfMemory (the --memory-budget refused an allocation): the budget is lifted, then the
/// ranks agree without the process group (fsdp::comm::job_channel(): MPI_COMM_WORLD or the Gloo store,
/// waited for at most agree_s seconds). A rank whose step was abandoned because a peer's failed
/// (fsdp::Error, kStepAbandoned) joins the same agreement. When every rank joins and at least one
/// was refused (every rank, the usual case, or some when the ranks' refusal points differ), the
/// lowest refused rank prints one line ("out of memory on every rank (N of N)" or "on K of N
/// ranks; the others abandoned the step") and every rank exits with 1; otherwise a peer may be
/// blocked in a collective, so the rank prints its own line and the job is aborted.
/// The remedy it suggests follows `strategy` (--strategy; "" when the flags were not parsed): a
/// more sharded strategy unless it is full_shard already.
int exit_on_failure(std::exception_ptr error, const std::string& flight_recorder_dir, double agree_s = 30.0,
                    const std::string& strategy = "");

}  // namespace apps::train
