#include "train/failures.h"
#include "train/interrupt.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <thread>
#include <vector>

#include "diagnose/diagnosis.h"
#include "fsdp/accounting/budget.h"
#include "fsdp/comm/job_channel.h"
#include "fsdp/comm/world.h"
#include "fsdp/common/check.h"
#include "train/errors.h"

namespace apps::train {
namespace {

// The collective timeout: every live rank times out within moments of the others and writes its
// dump; the lowest rank with a dump waits briefly for the others', then diagnoses. The others give
// it time to print before they abort the job (its own abort ends them sooner).
void diagnose_timeout(int rank, const std::string& dir) {
  if (dir.empty()) return;
  std::this_thread::sleep_for(std::chrono::seconds(3));
  try {
    std::vector<std::string> problems;
    auto dumps = diagnose::read_dumps(dir, &problems);
    if (dumps.empty() || dumps.front().rank != rank) {  // a lower rank speaks
      std::this_thread::sleep_for(std::chrono::seconds(5));
      return;
    }
    const int world = fsdp::comm::job_channel().size();
    std::cerr << "fsdp-train [rank " << rank << "]: diagnosis (fsdp-diagnose " << dir << "): "
              << diagnose::diagnose(dumps, world) << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "fsdp-train [rank " << rank << "]: no diagnosis: " << e.what() << std::endl;
  }
}

// Every rank's verdict (element r: rank r's `mine`) once every rank reached this call within
// agree_s seconds; empty when some did not (their peers are then still training or blocked in a
// collective). Over the job's own channel (MPI_COMM_WORLD, or the Gloo rendezvous store), which no
// process group communicates on.
std::vector<int> verdicts_of_all_ranks(int mine, int size, double agree_s) {
  if (size <= 1) return {mine};
  return fsdp::comm::job_channel().gather_ints(mine, agree_s);
}

// What a rank reports to the agreement after a failed step.
enum Verdict : int { kRefused = 1, kAbandoned = 2 };

}  // namespace

int world_rank() {
  const fsdp::comm::JobChannel& job = fsdp::comm::job_channel();
  return job.size() > 1 ? job.rank() : fsdp::comm::launcher_rank();
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

namespace {

// e.what() without its "[fsdp rank R] " when R is this rank: the line already says "[rank R]".
std::string own_what(const std::exception& e, int rank) {
  const std::string w = e.what(), tag = "[fsdp rank " + std::to_string(rank) + "] ";
  return w.rfind(tag, 0) == 0 ? w.substr(tag.size()) : w;
}

}  // namespace

int exit_on_failure(std::exception_ptr error, const std::string& flight_recorder_dir, double agree_s,
                    const std::string& strategy) {
  const int rank = world_rank();
  const int size = fsdp::comm::job_channel().size();
  // The failure is being reported: a launcher's SIGTERM from here on (mpirun ending the job once a
  // rank exited) ends the process without the interrupt line, which would name a step not the cause.
  quiet_interrupt_handlers();
  try {
    std::rethrow_exception(error);
  } catch (const UsageError& e) {
    // Every rank reaches the same verdict: rank 0 reports it, all exit cleanly.
    if (rank == 0) std::cerr << "fsdp-train: error: " << e.what() << std::endl;
    return 2;
  } catch (const LaunchError& e) {
    std::cerr << "fsdp-train [rank " << rank << "]: error: " << own_what(e, rank) << std::endl;
    return 2;
  } catch (const CheckpointError& e) {
    if (rank == 0) std::cerr << "fsdp-train: error: " << e.what() << std::endl;
    return 1;
  } catch (const fsdp::OutOfMemory& e) {
    fsdp::accounting::clear_memory_budget();  // the report may allocate
    const std::string remedy =
        std::string(" (raise --memory-budget, or need less: ") +
        (strategy == "full_shard" ? "more ranks, "
                                  : "a more sharded --strategy (full_shard shards params, grads and optimizer state), ") +
        "--activation-checkpointing, a smaller --micro-batch-size)";
    // The ranks the budget refused, and those whose step was abandoned because of them
    // ([Note: abandoned steps]), agree; the lowest refused rank prints the one line.
    const std::vector<int> all = verdicts_of_all_ranks(kRefused, size, agree_s);
    if (!all.empty()) {
      const auto refused = std::count(all.begin(), all.end(), int{kRefused});
      const auto first = std::find(all.begin(), all.end(), int{kRefused}) - all.begin();
      if (rank == first) {
        std::cerr << "fsdp-train: error: out of memory on "
                  << (refused == size ? "every rank (" : "") << refused << " of " << size
                  << (refused == size ? ")" : " ranks; the others abandoned the step") << ", rank " << rank << ": "
                  << e.what() << remedy << std::endl;
      }
      return 1;
    }
    std::cerr << "fsdp-train [rank " << rank << "]: error: " << own_what(e, rank) << remedy << std::endl;
  } catch (const RunError& e) {
    if (rank == 0) std::cerr << "fsdp-train: error: " << e.what() << std::endl;
    return 1;
  } catch (const fsdp::Error& e) {
    if (e.kind() == fsdp::ErrorKind::kStepAbandoned) {
      // A peer's step failed first: when it was refused by the budget, it reports for every rank.
      const std::vector<int> all = verdicts_of_all_ranks(kAbandoned, size, agree_s);
      if (!all.empty() && std::count(all.begin(), all.end(), int{kRefused}) > 0) return 1;
    }
    if (e.kind() == fsdp::ErrorKind::kMismatch) {
      // The collective check fails the same collective on every rank with the same verdict.
      if (rank == 0) std::cerr << "fsdp-train: error: " << e.what() << std::endl;
      return 1;
    }
    std::cerr << "fsdp-train [rank " << rank << "]: error: " << own_what(e, rank) << std::endl;
    // A rendezvous that timed out ran no collective: no flight recorder to read.
    if (e.kind() == fsdp::ErrorKind::kTimeout && e.where().op != "gloo rendezvous") diagnose_timeout(rank, flight_recorder_dir);
  } catch (const std::exception& e) {
    std::cerr << "fsdp-train [rank " << rank << "]: error: " << own_what(e, rank) << std::endl;
  } catch (...) {
    std::cerr << "fsdp-train [rank " << rank << "]: error: unknown exception" << std::endl;
  }
  // Peers may be blocked in a collective: abort the whole job instead of hanging.
  if (size > 1) fsdp::comm::job_channel().abort_job(1);
  return 1;
}

}  // namespace apps::train
