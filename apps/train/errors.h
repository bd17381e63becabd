// The failures fsdp-train reports without aborting the job. Every rank reaches the same verdict, so
// rank 0 prints it and all ranks exit with the code main() maps it to; any other exception is
// printed by the rank that threw it and aborts the job (main.cpp).
#pragma once

#include <stdexcept>
#include <string>

#include "fsdp/common/check.h"

namespace apps::train {

/// True for an fsdp::Error that one rank meets alone or first (a collective that timed out or
/// failed in its transport, a memory budget's refusal, a step a peer abandoned): it must reach the
/// per-rank report (main.cpp: printed by the rank, a timeout diagnosed, the job ended), never be
/// wrapped into a shared verdict that only rank 0 prints (the stalled rank may be rank 0).
inline bool is_per_rank_failure(const fsdp::Error& e) {
  return e.kind() == fsdp::ErrorKind::kTimeout || e.kind() == fsdp::ErrorKind::kCollective ||
         e.kind() == fsdp::ErrorKind::kOutOfMemory || e.kind() == fsdp::ErrorKind::kStepAbandoned;
}

/// A setting the run cannot honour (a bad flag value, a size that does not divide, missing data).
/// Thrown identically on every rank; rank 0 prints it, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A launch this process cannot join (a backend its launcher does not start, torchrun's variables
/// missing or malformed, a MASTER_ADDR that does not resolve), met before any process group
/// exists. Each rank that meets it prints it under its own rank (its peers may not meet it, and no
/// collective is waiting on it), exit code 2, no MPI_Abort.
struct LaunchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A collective checkpoint operation (--resume, --save, --export, --import) failed with
/// fsdp::Error on every rank (the library guarantees the same verdict everywhere). Rank 0 prints
/// it, exit code 1, no MPI_Abort.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A failure every rank detects together during training (a non-finite loss or gradient norm,
/// --on-nonfinite stop), thrown identically on every rank. Rank 0 prints it, exit code 1, no
/// MPI_Abort.
struct RunError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace apps::train
