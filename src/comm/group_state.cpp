#include "group_state.h"

#include <chrono>
#include <cstdio>
#include <thread>

namespace fsdp::comm::detail {

GroupState::GroupState(BlockingBackend& backend, BlockingBackend& control, ProcessGroupOptions options,
                       std::string name, std::shared_ptr<Family> family)
    : backend_(backend),
      control_(control),
      rank_(backend.rank()),
      size_(backend.size()),
      name_(std::move(name)),
      options_(std::move(options)),
      family_(std::move(family)) {}

std::string GroupState::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

std::string GroupState::diverged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return diverged_;
}

void GroupState::refuse(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (diverged_.empty()) diverged_ = why;
}

void GroupState::on_unrecoverable(const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) return;
    broken_ = what;
  }
  dump_flight_recorder(what);
  if (!options_.abort_after_timeout) return;
  // MPI cannot cancel the collective: give the program abort_grace_s to report, then end the job.
  BlockingBackend* backend = &backend_;  // never freed once broken (ProcessGroup's destructor)
  const double grace = options_.abort_grace_s;
  std::thread([backend, grace] {
    std::this_thread::sleep_for(std::chrono::duration<double>(grace));
    std::fprintf(stderr, "[fsdp] aborting the job: a collective timed out %.0f s ago and the process "
                 "has not ended\n", grace);
    backend->abort_job(1);
  }).detach();
}

std::string GroupState::dump_flight_recorder(const std::string& reason) {
  if (options_.flight_recorder_dir.empty()) return "";
  std::string error;
  const std::string path =
      family_->recorder->dump(options_.flight_recorder_dir, family_->root_rank, family_->root_size, reason, &error);
  std::lock_guard<std::mutex> lock(mu_);
  dump_error_ = error;
  return path;
}

std::string GroupState::flight_recorder_note() const {
  if (options_.flight_recorder_dir.empty()) return "; set FSDP_FLIGHT_RECORDER_DIR to record the last collectives";
  std::lock_guard<std::mutex> lock(mu_);
  return dump_error_.empty() ? "; flight recorder in " + options_.flight_recorder_dir
                             : "; the flight recorder could not be written: " + dump_error_;
}

}  // namespace fsdp::comm::detail
