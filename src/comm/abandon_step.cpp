// [Note: abandoned steps] abandon_step: the markers a rank queues after abandoning a forward pass,
// one group at a time, then the confirmation (the verdict itself is the collective check's:
// collective_check.cpp).
#include <algorithm>
#include <chrono>
#include <thread>

#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"
#include "group_state.h"

namespace fsdp::comm {

WorkPtr ProcessGroup::issue_abandon_marker(const AbandonedPass& pass, int ordinal, std::shared_ptr<MarkerOutcome> outcome) {
  // Not counted in stats: no data moves. The reason travels in the signature's unit field.
  OpTag tag{pass.reason, "abandoned step", pass.forward_pass};
  tag.sync_epoch = pass.sync_epoch;
  const Described d{CollectiveKind::kBarrier, nullptr, ReduceOp::kSum, -1, &tag, -1};
  return enqueue(d, [] {}, nullptr, std::move(outcome), static_cast<int>(pass.kind), ordinal);
}

AbandonResult abandon_step(const std::vector<ProcessGroup*>& groups, const AbandonedPass& pass) {
  // Every group on its own: its next marker as soon as its last one ran, so that a peer blocked in
  // one group (and so not yet abandoning) is never kept waiting by this rank's wait in another.
  struct Open {
    ProcessGroup* group;
    WorkPtr work;
    std::shared_ptr<MarkerOutcome> outcome;
    int ordinal = 0;
  };
  AbandonResult result;
  std::exception_ptr first_error;
  std::vector<Open> open;
  auto issue = [&](Open& o) {
    o.outcome = std::make_shared<MarkerOutcome>();
    ++o.ordinal;
    result.rounds = std::max(result.rounds, o.ordinal);
    try {
      o.work = o.group->issue_abandon_marker(pass, o.ordinal, o.outcome);
      return true;
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
      return false;  // the group refused it (timed out, diverged)
    }
  };
  for (ProcessGroup* g : groups) {
    open.push_back({g, nullptr, nullptr, 0});
    if (!issue(open.back())) open.pop_back();
  }
  while (!open.empty()) {
    bool progressed = false;
    for (size_t i = 0; i < open.size();) {
      Open& o = open[i];
      if (!o.work->is_completed()) {
        ++i;
        continue;
      }
      progressed = true;
      bool done = true;
      try {
        o.work->wait();
        if (o.outcome->settled) {
          result.peer_failed = result.peer_failed || o.outcome->peer_failed;
          result.forward_pass = std::max(result.forward_pass, o.outcome->forward_pass);
        } else {
          done = !issue(o);
        }
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
      if (done) {
        open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (first_error) std::rethrow_exception(first_error);
  // Confirmation: one more marker on every group, now that each is settled (so at the same
  // position on every rank), saying whether any marker of this rank met a peer's real op. The
  // largest group (the tree's data-parallel group: every rank) gives every rank the same verdict.
  const bool met = result.rounds > 1;
  std::vector<std::pair<ProcessGroup*, std::shared_ptr<MarkerOutcome>>> confirmations;
  for (ProcessGroup* g : groups) {
    auto outcome = std::make_shared<MarkerOutcome>();
    OpTag tag{"", "abandoned step (confirmation)", pass.forward_pass};
    tag.sync_epoch = pass.sync_epoch;
    const ProcessGroup::Described d{CollectiveKind::kBarrier, nullptr, ReduceOp::kSum, -1, &tag, -1};
    g->enqueue(d, [] {}, nullptr, outcome, static_cast<int>(pass.kind) + detail::kConfirmation, met ? 2 : 1)
        ->wait();
    confirmations.push_back({g, outcome});
  }
  const auto& widest = *std::max_element(confirmations.begin(), confirmations.end(),
                                         [](const auto& a, const auto& b) { return a.first->size() < b.first->size(); });
  result.forward_pass = std::max(result.forward_pass, widest.second->forward_pass);
  result.peer_failed = result.peer_failed || widest.second->peer_failed;
  if (!widest.second->ambiguous.empty()) {
    for (auto& [g, outcome] : confirmations) g->refuse(widest.second->ambiguous);
    throw Error(ErrorKind::kMismatch, ErrorContext{widest.first->rank(), "", "abandon_step"}, widest.second->ambiguous);
  }
  return result;
}

}  // namespace fsdp::comm
