#include "fsdp/comm/process_group.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <sstream>

#include "fsdp/common/hash.h"
#include "fsdp/common/activity.h"
#include "fsdp/common/check.h"

namespace fsdp::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

namespace {
// PyTorch's names: float32, bfloat16, int64, ...
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kByte: return "uint8";
    default: return c10::toString(t);
  }
}
}  // namespace

struct ProcessGroup::Family {
  std::shared_ptr<CommStats> stats;
  std::shared_ptr<FlightRecorder> recorder;
  int root_rank;  // this process's rank in the group the family started from
  int root_size;
};

ProcessGroupOptions ProcessGroupOptions::from_env() {
  ProcessGroupOptions o;
  if (const char* t = std::getenv("FSDP_COLLECTIVE_TIMEOUT_S"); t && *t) {
    char* end = nullptr;
    const double v = std::strtod(t, &end);
    FSDP_CHECK(end && *end == '\0' && std::isfinite(v) && v > 0, ErrorKind::kInvalidArgument,
               (ErrorContext{-1, "", "ProcessGroupOptions"}),
               expected_actual("FSDP_COLLECTIVE_TIMEOUT_S", "a number of seconds > 0", std::string("'") + t + "'"));
    o.timeout_s = v;
  }
  if (const char* d = std::getenv("FSDP_FLIGHT_RECORDER_DIR"); d && *d) o.flight_recorder_dir = d;
  return o;
}

ProcessGroup::ProcessGroup(std::unique_ptr<Backend> backend, ProcessGroupOptions options, std::string name)
    : ProcessGroup(std::move(backend), options, std::move(name), nullptr) {}

ProcessGroup::ProcessGroup(std::unique_ptr<Backend> backend, ProcessGroupOptions options, std::string name,
                           std::shared_ptr<Family> family)
    : backend_(std::move(backend)),
      rank_(backend_ ? backend_->rank() : -1),
      size_(backend_ ? backend_->size() : 0),
      backend_name_(backend_ ? backend_->name() : ""),
      options_(std::move(options)),
      name_(std::move(name)),
      family_(family ? std::move(family)
                     : std::make_shared<Family>(Family{std::make_shared<CommStats>(),
                                                       std::make_shared<FlightRecorder>(
                                                           static_cast<size_t>(std::max(1, options_.flight_recorder_entries))),
                                                       rank_, size_})),
      stats_(family_->stats),
      recorder_(family_->recorder) {
  FSDP_CHECK(backend_ != nullptr, ErrorKind::kInvalidArgument, (ErrorContext{-1, "", "ProcessGroup"}),
             "the backend is null");
  FSDP_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, ErrorKind::kInvalidArgument,
             (ErrorContext{rank_, "", "ProcessGroup"}), "invalid backend: rank ", rank_, " of size ", size_);
  host_of_ranks_ = backend_->host_of_ranks();
  FSDP_CHECK(static_cast<int>(host_of_ranks_.size()) == size_, ErrorKind::kInvalidArgument,
             (ErrorContext{rank_, "", "ProcessGroup"}), "invalid backend: ", host_of_ranks_.size(),
             " host entries for ", size_, " ranks");
  num_hosts_ = 1 + *std::max_element(host_of_ranks_.begin(), host_of_ranks_.end());
  ranks_on_my_host_ = static_cast<int>(
      std::count(host_of_ranks_.begin(), host_of_ranks_.end(), host_of_ranks_[static_cast<size_t>(rank_)]));
  FSDP_CHECK(options_.timeout_s > 0 && options_.abort_grace_s >= 0, ErrorKind::kInvalidArgument,
             (ErrorContext{rank_, "", "ProcessGroup"}), "timeout_s must be > 0 and abort_grace_s >= 0, got ",
             options_.timeout_s, " and ", options_.abort_grace_s);
  if (size_ > 1) worker_ = std::thread([this] { worker_loop(); });
}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lock(mu_);
  // A timed-out collective may still be running inside the transport (MPI cannot cancel it):
  // such a backend is never freed, the job ends by abort (on_unrecoverable).
  if (!broken_.empty()) (void)backend_.release();
  // Otherwise backend_ is destroyed after this body, with no op left that could use it.
}

void ProcessGroup::worker_loop() {
  // A memory budget never refuses this thread's allocations (the collective check's signatures,
  // reduction scratch): a refusal here would fail one rank's op while its peers wait in it.
  const BudgetExemptScope exempt;
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    run_op(op);
  }
}

std::string ProcessGroup::describe(const Signature& s, const Op* whole) const {
  const std::string* unit = whole ? &whole->unit : nullptr;
  if (s.marker >= kConfirmation) {
    return str_cat("the confirmation of abandoned forward pass ", s.forward_pass);
  }
  if (s.marker >= 0) {
    return s.marker == static_cast<int32_t>(AbandonedPass::Kind::kCompleted)
               ? str_cat("nothing more of forward pass ", s.forward_pass, " (it ran that forward and no backward)")
               : str_cat("nothing more of forward pass ", s.forward_pass,
                         s.marker == static_cast<int32_t>(AbandonedPass::Kind::kFailedWithoutGrad) ? ", without grad" : "",
                         " (its step failed: ", s.unit, ")");
  }
  std::string d = to_string(static_cast<CollectiveKind>(s.kind));
  if (s.dtype >= 0) d += str_cat(" of ", s.numel, " ", dtype_name(static_cast<c10::ScalarType>(s.dtype)));
  if (s.reduce_op >= 0) d += str_cat(" (", to_string(static_cast<ReduceOp>(s.reduce_op)), ")");
  if (s.root >= 0) d += str_cat(" from root ", s.root);
  if (unit ? !unit->empty() : s.unit[0] != 0) d += str_cat(", unit '", unit ? *unit : std::string(s.unit), "'");
  if (whole ? !whole->phase.empty() : s.phase[0] != 0) d += str_cat(", ", whole ? whole->phase : std::string(s.phase));
  if (s.forward_pass >= 0) d += str_cat(" (forward pass ", s.forward_pass, ")");
  return d;
}

void ProcessGroup::check_same_op(Op& op) {
  static_assert(sizeof(Signature) == 152, "docs/architecture.md and process_group.h state the signature's size");
  constexpr int64_t kBytes = sizeof(Signature);
  at::Tensor mine = at::empty({kBytes}, at::kByte);
  std::memcpy(mine.data_ptr(), &op.signature, kBytes);
  at::Tensor all = at::empty({size_ * kBytes}, at::kByte);
  backend_->all_gather(all, mine);
  const auto* sigs = reinterpret_cast<const Signature*>(all.data_ptr());
  for (int r = 0; r < size_; ++r) {
    if (sigs[r].marker >= 0) return settle_abandoned(op, sigs);
  }
  bool same = true;
  for (int r = 0; r < size_ && same; ++r) same = std::memcmp(&sigs[r], &sigs[0], kBytes) == 0;
  if (same) return;
  // Every rank builds the same verdict from the same data: group the ranks by what they issued.
  std::vector<std::pair<std::string, std::vector<int>>> sides;
  std::vector<int> differ;
  for (int r = 0; r < size_; ++r) {
    if (std::memcmp(&sigs[r], &sigs[0], kBytes) != 0) differ.push_back(r);
    const std::string d = describe(sigs[r]);
    auto it = std::find_if(sides.begin(), sides.end(), [&](const auto& p) { return p.first == d; });
    if (it == sides.end()) sides.push_back({d, {r}}); else it->second.push_back(r);
  }
  std::string msg = str_cat("ranks disagree at collective #", op.seq, " of group '", name_, "': ");
  auto ranks = [](const std::vector<int>& rs) {
    std::string out = rs.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < rs.size(); ++i) out += (i ? ", " : "") + std::to_string(rs[i]);
    return out;
  };
  for (size_t i = 0; i < sides.size(); ++i) msg += (i ? "; " : "") + ranks(sides[i].second) + " issued " + sides[i].first;
  msg += str_cat(". ", ranks(differ), differ.size() == 1 ? " differs" : " differ", " from rank 0. Every rank must run the same units in the "
                 "same order (same forward and backward, same number of calls of each unit); "
                 "data-dependent control flow must take the same path on every rank");
  throw Error(ErrorKind::kMismatch, ErrorContext{rank_, op.signature.unit, to_string(op.kind)}, msg);
}

// [Note: abandoned steps] A step that fails on one rank may fail on another at a different point
// (a hook that throws on one rank's data only, a memory budget refusing a gather on the rank
// whose other buffers are larger), or not at all: the ranks have issued different numbers of the
// step's collectives, and a rank waiting in one its peer will never issue would wait until its
// timeout. abandon_step fills the positions: every rank whose step failed queues markers, one at
// a time per group; a peer's collective met by a marker is not run and fails (kStepAbandoned),
// which fails the peer's step too, so that it joins with markers of its own; at the first
// position where every rank's op is a marker no rank has anything else queued, and the ops pair
// again from there. Every rank decides from the same gathered signatures, so all agree on each
// position's outcome. A collective of another forward pass (or of no step, e.g. the optimizer's)
// met by a marker means a rank finished the step another abandoned: their parameters differ from
// here on, and no later collective could be trusted, so the group refuses every op since, naming
// the ranks (restore the last checkpoint). Cost: one all-gather of a signature per marker; none
// while steps succeed.
void ProcessGroup::settle_abandoned(Op& op, const Signature* sigs) {
  using Kind = AbandonedPass::Kind;
  auto ranks = [](const std::vector<int>& rs) {
    std::string out = rs.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < rs.size(); ++i) out += (i ? ", " : "") + std::to_string(rs[i]);
    return out;
  };
  if (op.signature.marker >= kConfirmation) {
    // Every rank's confirmation, one per group after it settled (abandon_step): what each rank
    // did, and whether any of its markers met a real op of a peer.
    std::vector<int> failed, unmet_completed;
    for (int r = 0; r < size_; ++r) {
      FSDP_CHECK(sigs[r].marker >= kConfirmation, ErrorKind::kMismatch, (ErrorContext{rank_, "", to_string(op.kind)}),
                 "rank ", r, " issued ", describe(sigs[r]), " where every rank confirms an abandoned step in group '",
                 name_, "'");
      const auto kind = static_cast<Kind>(sigs[r].marker - kConfirmation);
      if (kind != Kind::kCompleted) failed.push_back(r);
      if (kind == Kind::kCompleted && sigs[r].marker_ordinal == 1) unmet_completed.push_back(r);
      op.marker_outcome->forward_pass = std::max(op.marker_outcome->forward_pass, sigs[r].forward_pass);
    }
    op.marker_outcome->settled = true;
    op.marker_outcome->peer_failed = !failed.empty();
    // A rank ran the pass to its end without backward, no peer was in that backward (none of its
    // markers met a real op), and another rank's step failed in it: that rank may have gone on
    // with its batch (an evaluation with grad) or skipped it (a step that failed between forward
    // and backward without fsdp::abandon_step). Which cannot be told.
    if (!failed.empty() && !unmet_completed.empty()) {
      op.marker_outcome->ambiguous = str_cat(
          ranks(failed), " failed forward pass ", sigs[failed.front()].forward_pass, ", which ", ranks(unmet_completed),
          " ran to its end without backward, while no rank was in its backward: whether ", ranks(unmet_completed),
          " skipped the batch cannot be told. In the catch block of a step that fails between forward and "
          "backward call fsdp::abandon_step(model); run evaluations under torch::NoGradGuard. The group refuses "
          "every later collective; end the run or restore the last checkpoint");
    }
    return;
  }
  std::vector<int> markers, others, failed;
  int64_t first_pass = std::numeric_limits<int64_t>::max();
  bool without_grad = false;
  std::string reason;
  for (int r = 0; r < size_; ++r) {
    if (sigs[r].marker < 0) {
      others.push_back(r);
      continue;
    }
    markers.push_back(r);
    first_pass = std::min(first_pass, sigs[r].forward_pass);
    const auto kind = static_cast<Kind>(sigs[r].marker % kConfirmation);
    without_grad = without_grad || kind == Kind::kFailedWithoutGrad;
    if (kind != Kind::kCompleted) {
      if (failed.empty()) reason = sigs[r].unit;
      failed.push_back(r);
    }
  }
  // Recoverable: no rank has reduced gradients the others did not (the same sync epoch: no
  // optimizer step between them), no rank is at an earlier pass than the abandoned one, and a pass
  // without grad (an evaluation) is abandoned only by ranks still in that very pass.
  bool recoverable = first_pass >= 0;
  for (int r = 0; r < size_ && recoverable; ++r) {
    recoverable = sigs[r].marker < kConfirmation && sigs[r].sync_epoch == sigs[markers.front()].sync_epoch &&
                  sigs[r].forward_pass >= first_pass && (!without_grad || sigs[r].forward_pass == first_pass);
  }
  if (recoverable) {
    if (others.empty()) {
      op.marker_outcome->settled = true;
      op.marker_outcome->peer_failed = !failed.empty();
      return;
    }
    if (op.signature.marker >= 0) return;  // a peer is still in the step: another round
    const std::vector<int>& by = failed.empty() ? markers : failed;
    throw Error(ErrorKind::kStepAbandoned, ErrorContext{rank_, op.signature.unit, to_string(op.kind)},
                str_cat(ranks(by), " abandoned forward pass ", first_pass,
                        failed.empty() ? " (it ran that forward and no backward)" : " (its step failed: " + reason + ")",
                        "; collective #", op.seq, " of group '", name_, "' (", describe(op.signature, &op),
                        ") is not run: the step fails on every rank, and the loop goes on with the next one"));
  }
  std::string msg = str_cat("ranks left a step at different points, at collective #", op.seq, " of group '", name_,
                            "': ");
  std::vector<std::pair<std::string, std::vector<int>>> sides;
  for (int r = 0; r < size_; ++r) {
    const std::string d = describe(sigs[r]) + (sigs[r].sync_epoch >= 0 && sigs[r].sync_epoch != sigs[markers.front()].sync_epoch
                                                   ? str_cat(" after ", sigs[r].sync_epoch, " reduced backward passes")
                                                   : "");
    auto it = std::find_if(sides.begin(), sides.end(), [&](const auto& p) { return p.first == d; });
    if (it == sides.end()) sides.push_back({d, {r}}); else it->second.push_back(r);
  }
  for (size_t i = 0; i < sides.size(); ++i) msg += (i ? "; " : "") + ranks(sides[i].second) + " issued " + sides[i].first;
  msg += ". A rank went on past what another abandoned: the ranks are no longer at the same batch of their "
         "loops (and hold different parameters if an optimizer step ran since). The group refuses every later "
         "collective; end the run or restore the last checkpoint";
  refuse(msg);
  throw Error(ErrorKind::kMismatch, ErrorContext{rank_, op.signature.unit, to_string(op.kind)}, msg);
}

void ProcessGroup::refuse(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (diverged_.empty()) diverged_ = why;
}

std::string ProcessGroup::diverged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return diverged_;
}

void ProcessGroup::on_unrecoverable(const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.empty()) return;
    broken_ = what;
  }
  dump_flight_recorder(what);
  if (!options_.abort_after_timeout) return;
  // MPI cannot cancel the collective: give the program abort_grace_s to report, then end the job.
  Backend* backend = backend_.get();  // never freed once broken (see the destructor)
  const double grace = options_.abort_grace_s;
  std::thread([backend, grace] {
    std::this_thread::sleep_for(std::chrono::duration<double>(grace));
    std::fprintf(stderr, "[fsdp] aborting the job: a collective timed out %.0f s ago and the process "
                 "has not ended\n", grace);
    backend->abort_job(1);
  }).detach();
}

std::string ProcessGroup::dump_flight_recorder(const std::string& reason) {
  if (options_.flight_recorder_dir.empty()) return "";
  std::string error;
  const std::string path =
      recorder_->dump(options_.flight_recorder_dir, family_->root_rank, family_->root_size, reason, &error);
  std::lock_guard<std::mutex> lock(mu_);
  dump_error_ = error;
  return path;
}

std::string ProcessGroup::flight_recorder_note() const {
  if (options_.flight_recorder_dir.empty()) return "; set FSDP_FLIGHT_RECORDER_DIR to record the last collectives";
  std::lock_guard<std::mutex> lock(mu_);
  return dump_error_.empty() ? "; flight recorder in " + options_.flight_recorder_dir
                             : "; the flight recorder could not be written: " + dump_error_;
}

void ProcessGroup::run_op(Op& op) {
  if (op.after) {
    // A dependency on another group's op: its error is reported by its own Work; this op runs
    // regardless, so that every rank of this group keeps the same sequence of ops.
    try {
      op.after->wait();
    } catch (...) {
    }
    op.after.reset();
  }
  const double t0 = now_s();
  recorder_->mark_running(op.record_id, t0);
  std::exception_ptr err;
  std::string failure;
  bool timed_out = false;
  bool abandoned = false;  // a peer's abandoned step: not a fault worth a flight-recorder dump
  try {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.empty()) {
        throw Error(ErrorKind::kTimeout, ErrorContext{rank_, op.signature.unit, to_string(op.kind)},
                    str_cat("collective #", op.seq, " of group '", name_, "' not run: the group is unusable since ",
                            broken_));
      }
      if (!diverged_.empty()) {
        throw Error(ErrorKind::kMismatch, ErrorContext{rank_, op.signature.unit, to_string(op.kind)},
                    str_cat("collective #", op.seq, " of group '", name_, "' not run: ", diverged_));
      }
    }
    if (size_ > 1) {
      backend_->set_deadline(t0 + options_.timeout_s);
      check_same_op(op);
    } else if (op.marker_outcome) {
      op.marker_outcome->settled = true;  // no peer to wait for
      op.marker_outcome->peer_failed = false;
      op.marker_outcome->forward_pass = op.signature.forward_pass;
    }
    op.fn();
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kTimeout && e.message().find("the group is unusable since") == std::string::npos) {
      const std::string what = str_cat("collective #", op.seq, " of group '", name_, "' (", describe(op.signature, &op),
                                       ", ", op.bytes, " bytes) did not complete within ", options_.timeout_s,
                                       " s on rank ", rank_, " (world rank ", family_->root_rank, ")");
      on_unrecoverable(what);
      timed_out = true;
      err = std::make_exception_ptr(Error(ErrorKind::kTimeout, ErrorContext{rank_, op.signature.unit, to_string(op.kind)},
                                          what + "; the group is unusable and the job will be aborted" +
                                              flight_recorder_note()));
    } else {
      err = std::current_exception();
      abandoned = e.kind() == ErrorKind::kStepAbandoned;
    }
    failure = e.what();
  } catch (const std::exception& e) {
    err = std::current_exception();
    failure = e.what();
  } catch (...) {
    err = std::current_exception();
    failure = "unknown error";
  }
  op.fn = nullptr;  // release the op's tensors before signalling completion
  const double t1 = now_s();
  recorder_->mark_done(op.record_id, t1,
                       !err ? OpState::kCompleted : (timed_out ? OpState::kTimedOut : OpState::kFailed), failure);
  if (timed_out) {
    dump_flight_recorder(failure);  // again, now that this op's record says how it ended
  } else if (err && !abandoned && failure.find("the group is unusable") == std::string::npos &&
             failure.find("not run: ranks left a step") == std::string::npos) {
    dump_flight_recorder(failure);  // a mismatch or a transport failure: worth the record
  }
  if (op.counted) stats_->record_time(op.kind, t0, t1, op.bytes, op.seq);
  op.work->finish(err, t1 - t0);
}

WorkPtr ProcessGroup::enqueue(const Described& d, std::function<void()> fn, WorkPtr after,
                              std::shared_ptr<MarkerOutcome> marker_outcome, int marker_kind, int marker_ordinal) {
  auto work = std::make_shared<Work>();
  std::unique_lock<std::mutex> lock(mu_);
  const ErrorContext where{rank_, d.tag ? d.tag->unit : "", to_string(d.kind)};
  FSDP_CHECK(!stopping_, ErrorKind::kState, where, "issued on a process group that is shutting down");
  FSDP_CHECK(broken_.empty(), ErrorKind::kTimeout, where, "the group '", name_, "' is unusable since ", broken_);
  FSDP_CHECK(diverged_.empty(), ErrorKind::kMismatch, where, "the group '", name_, "' refuses every collective: ",
             diverged_);
  Op op;
  op.kind = d.kind;
  op.counted = d.logical_bytes >= 0;
  op.bytes = std::max<int64_t>(d.logical_bytes, 0);
  op.seq = next_seq_++;
  std::memset(&op.signature, 0, sizeof(Signature));
  op.signature.seq = op.seq;
  op.signature.kind = static_cast<int32_t>(d.kind);
  op.signature.dtype = d.tensor ? static_cast<int32_t>(d.tensor->scalar_type()) : -1;
  op.signature.numel = d.tensor ? d.tensor->numel() : 0;
  op.signature.reduce_op = d.reduce_op == ReduceOp::kSum && d.kind != CollectiveKind::kReduceScatter &&
                                   d.kind != CollectiveKind::kAllReduce
                               ? -1
                               : static_cast<int32_t>(d.reduce_op);
  op.signature.root = d.root;
  op.signature.forward_pass = -1;
  op.signature.sync_epoch = -1;
  if (d.tag) {
    op.signature.forward_pass = d.tag->forward_pass;
    op.signature.sync_epoch = d.tag->sync_epoch;
    op.unit = d.tag->unit;
    op.phase = d.tag->phase;
    op.signature.unit_hash = fnv1a64(d.tag->unit);  // the same on every host (std::hash may differ)
    std::strncpy(op.signature.unit, d.tag->unit.c_str(), sizeof(op.signature.unit) - 1);
    std::strncpy(op.signature.phase, d.tag->phase.c_str(), sizeof(op.signature.phase) - 1);
  }
  CollectiveRecord rec;
  rec.group = name_;
  rec.seq = op.seq;
  rec.kind = d.kind;
  rec.dtype = d.tensor ? dtype_name(d.tensor->scalar_type()) : "";
  rec.numel = op.signature.numel;
  rec.bytes = op.bytes;
  if (d.tag) rec.tag = *d.tag;
  if (op.marker_outcome) rec.tag.unit.clear();
  rec.issue_s = now_s();
  op.record_id = recorder_->add(std::move(rec));
  if (op.counted) stats_->record_issue(d.kind, op.bytes, split_by_host(d.kind, op.bytes, size_, ranks_on_my_host_));
  op.fn = std::move(fn);
  op.work = work;
  op.after = std::move(after);
  op.signature.marker = marker_kind;
  op.signature.marker_ordinal = marker_ordinal;
  if (marker_outcome) {
    op.marker_outcome = std::move(marker_outcome);
    op.unit.clear();  // the reason travels in the signature's unit field only
  }
  if (size_ == 1) {
    // No peer to wait for: run inline. Every op of this group runs inline, so issue order is kept.
    lock.unlock();
    run_op(op);
    return work;
  }
  queue_.push_back(std::move(op));
  lock.unlock();
  cv_.notify_one();
  return work;
}

namespace {

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }


ErrorContext at_op(int rank, const char* op) { return ErrorContext{rank, "", op}; }

void check_reducible(int rank, const char* op, const at::Tensor& t) {
  FSDP_CHECK(t.scalar_type() != at::kByte, ErrorKind::kInvalidArgument, at_op(rank, op),
             "uint8 tensors cannot be reduced");
}

// An fp32/fp64/int reduction through the backend: kAvg is a sum followed by a division.
void reduce_with(Backend& b, const at::Tensor& result, ReduceOp op,
                 const std::function<void(ReduceOp)>& run) {
  run(op == ReduceOp::kAvg ? ReduceOp::kSum : op);
  if (op != ReduceOp::kAvg) return;
  if (at::isIntegralType(result.scalar_type(), /*includeBool=*/false)) {
    result.div_(b.size(), "floor");
  } else {
    result.div_(b.size());
  }
}

// Copy for a group of one rank, where every collective is the identity.
void copy_if_distinct(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.data_ptr() != src.data_ptr() && dst.numel() > 0) dst.view(-1).copy_(src.view(-1));
}

}  // namespace

void ProcessGroup::check_tensor(const char* op, const char* what, const at::Tensor& t) const {
  const ErrorContext where = at_op(rank_, op);
  FSDP_CHECK(t.defined(), ErrorKind::kInvalidArgument, where, what, " is undefined");
  FSDP_CHECK(t.is_contiguous(), ErrorKind::kInvalidArgument, where, what,
             " must be contiguous (sizes ", t.sizes(), ", strides ", t.strides(), ")");
  const auto d = t.scalar_type();
  const bool ok = d == at::kFloat || d == at::kDouble || d == at::kBFloat16 || d == at::kHalf ||
                  d == at::kInt || d == at::kLong || d == at::kByte;
  FSDP_CHECK(ok, ErrorKind::kInvalidArgument, where, "unsupported dtype ", d, " for ", what,
             " (float32, float64, bfloat16, float16, int32, int64, uint8)");
  const bool simulated_host = backend_->simulated() && t.device().is_cpu();  // its own rule
  FSDP_CHECK(t.device().type() == backend_->device_type() || simulated_host, ErrorKind::kInvalidArgument, where,
             expected_actual(std::string(what) + " device", c10::DeviceTypeName(backend_->device_type(), true),
                             t.device()),
             " (the ", backend_name_, " backend)");
  FSDP_CHECK(t.numel() <= backend_->max_elements(), ErrorKind::kInvalidArgument, where, what, " has ",
             t.numel(), " elements, more than the ", backend_name_, " backend's limit of ",
             backend_->max_elements(), " per collective; split the FSDP unit into smaller units");
}

WorkPtr ProcessGroup::all_gather_into_tensor(at::Tensor output, at::Tensor input, const OpTag& tag) {
  const char* op = "all_gather_into_tensor";
  check_tensor(op, "input", input);
  check_tensor(op, "output", output);
  FSDP_CHECK(output.scalar_type() == input.scalar_type(), ErrorKind::kInvalidArgument, at_op(rank_, op),
             "dtype mismatch, input ", input.scalar_type(), " vs output ", output.scalar_type());
  FSDP_CHECK(output.numel() == input.numel() * size_, ErrorKind::kInvalidArgument, at_op(rank_, op),
             "output must hold world size x input numel = ", size_, " x ", input.numel(), " = ",
             input.numel() * size_, " elements, got ", output.numel());
  const Described d{CollectiveKind::kAllGather, &input, ReduceOp::kSum, -1, &tag,
                    static_cast<int64_t>(output.nbytes())};
  if (size_ == 1) return enqueue(d, [output, input] { copy_if_distinct(output, input); });
  return enqueue(d, [this, output, input] { backend_->all_gather(output, input); });
}

WorkPtr ProcessGroup::reduce_scatter_tensor(at::Tensor output, at::Tensor input, ReduceOp rop,
                                            const OpTag& tag) {
  const char* op = "reduce_scatter_tensor";
  check_tensor(op, "input", input);
  check_tensor(op, "output", output);
  check_reducible(rank_, op, input);
  FSDP_CHECK(output.scalar_type() == input.scalar_type(), ErrorKind::kInvalidArgument, at_op(rank_, op),
             "dtype mismatch, input ", input.scalar_type(), " vs output ", output.scalar_type());
  FSDP_CHECK(input.numel() == output.numel() * size_, ErrorKind::kInvalidArgument, at_op(rank_, op),
             "input must hold world size x output numel = ", size_, " x ", output.numel(), " = ",
             output.numel() * size_, " elements, got ", input.numel());
  const Described d{CollectiveKind::kReduceScatter, &input, rop, -1, &tag, static_cast<int64_t>(input.nbytes())};
  if (size_ == 1) {  // every reduction over one rank is the identity
    return enqueue(d, [output, input] { copy_if_distinct(output, input); });
  }
  if (is_half(input.scalar_type())) {
    return enqueue(d, [this, output, input, rop] { reduce_scatter_low_precision(output, input, rop); });
  }
  return enqueue(d, [this, output, input, rop] {
    reduce_with(*backend_, output, rop, [&](ReduceOp o) { backend_->reduce_scatter(output, input, o); });
  });
}

WorkPtr ProcessGroup::all_reduce(at::Tensor tensor, ReduceOp rop, const OpTag& tag, WorkPtr after) {
  const char* op = "all_reduce";
  check_tensor(op, "tensor", tensor);
  check_reducible(rank_, op, tensor);
  const Described d{CollectiveKind::kAllReduce, &tensor, rop, -1, &tag, static_cast<int64_t>(tensor.nbytes())};
  if (size_ == 1) return enqueue(d, [] {});  // the identity: nothing to wait for
  std::function<void()> fn;
  if (is_half(tensor.scalar_type())) {
    fn = [this, tensor, rop] { all_reduce_low_precision(tensor, rop); };
  } else {
    fn = [this, tensor, rop] { reduce_with(*backend_, tensor, rop, [&](ReduceOp o) { backend_->all_reduce(tensor, o); }); };
  }
  return enqueue(d, std::move(fn), std::move(after));
}

WorkPtr ProcessGroup::all_to_all(at::Tensor output, at::Tensor input, const OpTag& tag) {
  const char* op = "all_to_all";
  check_tensor(op, "input", input);
  check_tensor(op, "output", output);
  FSDP_CHECK(output.scalar_type() == input.scalar_type(), ErrorKind::kInvalidArgument, at_op(rank_, op),
             "dtype mismatch, input ", input.scalar_type(), " vs output ", output.scalar_type());
  FSDP_CHECK(output.numel() == input.numel() && input.numel() % size_ == 0,
             ErrorKind::kInvalidArgument, at_op(rank_, op), "input and output must hold world size ",
             size_, " x n elements each, got input ", input.numel(), " and output ", output.numel());
  const Described d{CollectiveKind::kAllToAll, &input, ReduceOp::kSum, -1, &tag, static_cast<int64_t>(input.nbytes())};
  if (size_ == 1) return enqueue(d, [output, input] { copy_if_distinct(output, input); });
  return enqueue(d, [this, output, input] { backend_->all_to_all(output, input); });
}

WorkPtr ProcessGroup::broadcast(at::Tensor tensor, int root, const OpTag& tag) {
  check_tensor("broadcast", "tensor", tensor);
  FSDP_CHECK(root >= 0 && root < size_, ErrorKind::kInvalidArgument, at_op(rank_, "broadcast"),
             "root ", root, " outside the group of size ", size_);
  const Described d{CollectiveKind::kBroadcast, &tensor, ReduceOp::kSum, root, &tag,
                    static_cast<int64_t>(tensor.nbytes())};
  if (size_ == 1) return enqueue(d, [] {});
  return enqueue(d, [this, tensor, root] { backend_->broadcast(tensor, root); });
}

WorkPtr ProcessGroup::barrier(const OpTag& tag, bool counted) {
  const Described d{CollectiveKind::kBarrier, nullptr, ReduceOp::kSum, -1, &tag, counted ? 0 : -1};
  if (size_ == 1) return enqueue(d, [] {});
  return enqueue(d, [this] { backend_->barrier(); });
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) {
  std::unique_ptr<Backend> sub;
  // Not counted in stats (logical bytes -1): it is set-up, not training traffic.
  const OpTag tag{"", "split"};
  const Described d{CollectiveKind::kBarrier, nullptr, ReduceOp::kSum, -1, &tag, -1};
  enqueue(d, [this, color, key, &sub] { sub = backend_->split(color, key); })->wait();
  return std::shared_ptr<ProcessGroup>(
      new ProcessGroup(std::move(sub), options_, str_cat(name_, "/split(", color, ")"), family_));
}

std::shared_ptr<ProcessGroup> ProcessGroup::split_blocks(int block, bool strided) {
  FSDP_CHECK(block >= 1 && size_ % block == 0, ErrorKind::kInvalidArgument, at_op(rank_, "split_blocks"),
             expected_actual("block", str_cat("a divisor of the group size ", size_), block));
  std::unique_ptr<Backend> sub;
  const OpTag tag{"", "split"};
  const Described d{CollectiveKind::kBarrier, nullptr, ReduceOp::kSum, -1, &tag, -1};
  enqueue(d, [this, block, strided, &sub] { sub = backend_->split_blocks(block, strided); })->wait();
  const int color = strided ? rank_ % block : rank_ / block;
  return std::shared_ptr<ProcessGroup>(
      new ProcessGroup(std::move(sub), options_, str_cat(name_, "/split(", color, ")"), family_));
}

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
    g->enqueue(d, [] {}, nullptr, outcome, static_cast<int>(pass.kind) + ProcessGroup::kConfirmation, met ? 2 : 1)
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

c10::DeviceType ProcessGroup::device_type() const { return backend_->device_type(); }

bool ProcessGroup::simulated() const { return backend_->simulated(); }

// [Note: low-precision reductions] A bf16/fp16 reduce-scatter sends each block in its own dtype to
// the rank that owns it (one all-to-all: the (N-1)/N x input bytes of a ring reduce-scatter), and
// the owner adds the N blocks in float32 in rank order, rounding once. Widening to float32 before
// the collective would double the bytes on the wire; reducing in bf16 would round N-1 times.
void ProcessGroup::reduce_scatter_low_precision(const at::Tensor& output, const at::Tensor& input,
                                                ReduceOp op) {
  at::NoGradGuard no_grad;
  const int64_t n = output.numel();
  at::Tensor blocks = at::empty({size_ * n}, input.options());
  backend_->all_to_all(blocks, input);
  at::Tensor parts = blocks.view({size_, n}).to(at::kFloat);  // row q: rank q's block for me
  at::Tensor acc = parts[0].clone();
  for (int q = 1; q < size_; ++q) {
    switch (op) {
      case ReduceOp::kMax: at::maximum_out(acc, acc, parts[q]); break;
      case ReduceOp::kMin: at::minimum_out(acc, acc, parts[q]); break;
      default: acc.add_(parts[q]); break;
    }
  }
  if (op == ReduceOp::kAvg) acc.div_(size_);
  output.view(-1).copy_(acc);
}

// All-reduce = the reduce-scatter above over blocks padded to a multiple of the group size, then an
// all-gather of the rounded blocks: every rank ends with bitwise the same values.
void ProcessGroup::all_reduce_low_precision(const at::Tensor& tensor, ReduceOp op) {
  at::NoGradGuard no_grad;
  const int64_t m = tensor.numel();
  const int64_t c = (m + size_ - 1) / size_;
  at::Tensor padded = at::zeros({size_ * c}, tensor.options());
  padded.narrow(0, 0, m).copy_(tensor.view(-1));
  at::Tensor mine = at::empty({c}, tensor.options());
  reduce_scatter_low_precision(mine, padded, op);
  backend_->all_gather(padded, mine);
  tensor.view(-1).copy_(padded.narrow(0, 0, m));
}

int uniform_ranks_per_host(const ProcessGroup& group) {
  const std::vector<int>& hosts = group.host_of_ranks();
  const int n = group.size();
  const int k = n / group.num_hosts();
  bool ok = k * group.num_hosts() == n;
  for (int r = 0; ok && r < n; ++r) ok = hosts[static_cast<size_t>(r)] == r / k;
  if (!ok) {
    std::ostringstream layout;
    for (int h = 0; h < group.num_hosts(); ++h) {
      layout << (h ? "; " : "") << "host " << h << ": ranks";
      for (int r = 0; r < n; ++r) {
        if (hosts[static_cast<size_t>(r)] == h) layout << ' ' << r;
      }
    }
    FSDP_CHECK(false, ErrorKind::kUnsupported, (ErrorContext{group.rank(), "", "uniform_ranks_per_host"}),
               "expected the same number of consecutive ranks on every host (one shard group per host), "
               "got ", group.size(), " ranks on ", group.num_hosts(), " hosts (", layout.str(),
               "); launch the same number of ranks per host, mapped by slot (mpirun -npernode K, "
               "srun --ntasks-per-node K)");
  }
  return k;
}

std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine, const OpTag& tag) {
  const int n = group.size();
  at::Tensor len = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong);
  at::Tensor lens = at::empty({n}, at::kLong);
  group.all_gather_into_tensor(lens, len, tag)->wait();
  const int64_t max_len = std::max<int64_t>(lens.max().item<int64_t>(), 1);
  at::Tensor buf = at::zeros({max_len}, at::kByte);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::empty({n * max_len}, at::kByte);
  group.all_gather_into_tensor(all, buf, tag)->wait();
  std::vector<std::string> out;
  out.reserve(n);
  const char* base = static_cast<const char*>(all.data_ptr());
  const int64_t* l = lens.data_ptr<int64_t>();
  for (int r = 0; r < n; ++r) out.emplace_back(base + r * max_len, static_cast<size_t>(l[r]));
  return out;
}

}  // namespace fsdp::comm
