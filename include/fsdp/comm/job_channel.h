// The job's own channel between its processes, apart from every process group: what a program
// needs after a failure, when a group may be blocked or unusable (an agreement with a time limit,
// the abort of every process).
#pragma once

#include <memory>
#include <vector>

namespace fsdp::comm {

/// One per process, installed by the function that made the world group (mpi_world: MPI_COMM_WORLD
/// itself, which no group communicates on; gloo_world: keys of the rendezvous store). Before one
/// is installed, job_channel() is a channel of this process alone (rank 0 of 1). Thread-safe to
/// read once installed; install before other threads use it.
class JobChannel {
 public:
  virtual ~JobChannel() = default;
  /// This process in the job, [0, size()).
  virtual int rank() const = 0;
  /// Processes of the job.
  virtual int size() const = 0;
  /// Every process's `mine` (element r: rank r's), once every process has called this within
  /// wait_s seconds of this one; empty when some did not (they are blocked elsewhere, or gone).
  /// Blocks at most wait_s; never throws. The k-th call of each process meets the k-th of the
  /// others.
  virtual std::vector<int> gather_ints(int mine, double wait_s) = 0;
  /// Ends every process of the job with a failure (MPI: MPI_Abort; Gloo: this process exits with
  /// `code` and the launcher, torchrun, ends the others). Does not return.
  [[noreturn]] virtual void abort_job(int code) = 0;
};

/// The installed channel (or the one-process channel).
JobChannel& job_channel();
/// Installs `channel` as this process's channel (replacing any other).
void set_job_channel(std::shared_ptr<JobChannel> channel);

}  // namespace fsdp::comm
