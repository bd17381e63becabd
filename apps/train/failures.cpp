#include "train/failures.h"

#include <mpi.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <thread>

#include "diagnose/diagnosis.h"
#include "fsdp/common/check.h"
#include "train/errors.h"

namespace apps::train {
namespace {

// The collective timeout: every live rank times out within moments of the others and writes its
// dump; the lowest rank with a dump waits briefly for the others', then diagnoses.
void diagnose_timeout(int rank, const std::string& dir) {
  if (dir.empty()) return;
  std::this_thread::sleep_for(std::chrono::seconds(3));
  try {
    std::vector<std::string> problems;
    auto dumps = diagnose::read_dumps(dir, &problems);
    if (dumps.empty() || dumps.front().rank != rank) return;  // a lower rank speaks
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    std::cerr << "fsdp-train [rank " << rank << "]: diagnosis (fsdp-diagnose " << dir << "): "
              << diagnose::diagnose(dumps, world) << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "fsdp-train [rank " << rank << "]: no diagnosis: " << e.what() << std::endl;
  }
}

}  // namespace

int world_rank() {
  int init = 0, fin = 0, rank = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

fsdp::comm::ProcessGroupOptions group_options(const TrainConfig& c) {
  fsdp::comm::ProcessGroupOptions o;
  try {
    o = fsdp::comm::ProcessGroupOptions::from_env();
  } catch (const fsdp::Error& e) {
    throw UsageError(e.message());
  }
  if (c.collective_timeout_s) o.timeout_s = *c.collective_timeout_s;
  if (!c.flight_recorder_dir.empty()) {
    o.flight_recorder_dir = c.flight_recorder_dir;
  } else if (o.flight_recorder_dir.empty()) {
    const std::filesystem::path metrics(c.metrics);
    o.flight_recorder_dir = c.metrics.empty() ? "flight-recorder" : (metrics.parent_path() / "flight-recorder").string();
  }
  return o;
}

int exit_on_failure(std::exception_ptr error, const std::string& flight_recorder_dir) {
  const int rank = world_rank();
  int size = 1;
  int init = 0;
  MPI_Initialized(&init);
  if (init) MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    std::rethrow_exception(error);
  } catch (const UsageError& e) {
    // Every rank reaches the same verdict: rank 0 reports it, all exit cleanly.
    if (rank == 0) std::cerr << "fsdp-train: error: " << e.what() << std::endl;
    return 2;
  } catch (const CheckpointError& e) {
    if (rank == 0) std::cerr << "fsdp-train: error: " << e.what() << std::endl;
    return 1;
  } catch (const fsdp::Error& e) {
    if (e.kind() == fsdp::ErrorKind::kMismatch) {
      // The collective check fails the same collective on every rank with the same verdict.
      if (rank == 0) std::cerr << "fsdp-train: error: " << e.what() << std::endl;
      return 1;
    }
    std::cerr << "fsdp-train [rank " << rank << "]: error: " << e.what() << std::endl;
    if (e.kind() == fsdp::ErrorKind::kTimeout) diagnose_timeout(rank, flight_recorder_dir);
  } catch (const std::exception& e) {
    std::cerr << "fsdp-train [rank " << rank << "]: error: " << e.what() << std::endl;
  } catch (...) {
    std::cerr << "fsdp-train [rank " << rank << "]: error: unknown exception" << std::endl;
  }
  // Peers may be blocked in a collective: abort the whole job instead of hanging.
  if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

}  // namespace apps::train
