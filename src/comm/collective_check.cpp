#include "collective_check.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "fsdp/common/check.h"
#include "fsdp/common/hash.h"

namespace fsdp::comm::detail {

namespace {

// "rank 3", "ranks 0, 2"
std::string ranks(const std::vector<int>& rs) {
  std::string out = rs.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < rs.size(); ++i) out += (i ? ", " : "") + std::to_string(rs[i]);
  return out;
}

void settle_abandoned(GroupState& group, Op& op, const Signature* sigs);

}  // namespace

Signature make_signature(int64_t seq, CollectiveKind kind, const at::Tensor* tensor, ReduceOp reduce_op, int root,
                         const OpTag* tag, int marker_kind, int marker_ordinal) {
  Signature s;
  std::memset(&s, 0, sizeof(Signature));
  s.seq = seq;
  s.kind = static_cast<int32_t>(kind);
  s.dtype = tensor ? static_cast<int32_t>(tensor->scalar_type()) : -1;
  s.numel = tensor ? tensor->numel() : 0;
  s.reduce_op = reduce_op == ReduceOp::kSum && kind != CollectiveKind::kReduceScatter && kind != CollectiveKind::kAllReduce
                    ? -1
                    : static_cast<int32_t>(reduce_op);
  s.root = root;
  s.forward_pass = -1;
  s.sync_epoch = -1;
  if (tag) {
    s.forward_pass = tag->forward_pass;
    s.sync_epoch = tag->sync_epoch;
    s.unit_hash = fnv1a64(tag->unit);  // the same on every host (std::hash may differ)
    std::strncpy(s.unit, tag->unit.c_str(), sizeof(s.unit) - 1);
    std::strncpy(s.phase, tag->phase.c_str(), sizeof(s.phase) - 1);
  }
  s.marker = marker_kind;
  s.marker_ordinal = marker_ordinal;
  return s;
}

void settle_alone(Op& op) {
  if (!op.marker_outcome) return;
  op.marker_outcome->settled = true;  // no peer to wait for
  op.marker_outcome->peer_failed = false;
  op.marker_outcome->forward_pass = op.signature.forward_pass;
}

std::string describe(const Signature& s, const Op* whole) {
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

void check_same_op(GroupState& group, Op& op) {
  const int size_ = group.size();
  const int rank_ = group.rank();
  const std::string& name_ = group.name();
  constexpr int64_t kBytes = sizeof(Signature);
  at::Tensor mine = at::empty({kBytes}, at::kByte);
  std::memcpy(mine.data_ptr(), &op.signature, kBytes);
  at::Tensor all = at::empty({size_ * kBytes}, at::kByte);
  group.control().all_gather(all, mine);  // never the data backend ([Note: control channel])
  const auto* sigs = reinterpret_cast<const Signature*>(all.data_ptr());
  for (int r = 0; r < size_; ++r) {
    if (sigs[r].marker >= 0) return settle_abandoned(group, op, sigs);
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
  for (size_t i = 0; i < sides.size(); ++i) msg += (i ? "; " : "") + ranks(sides[i].second) + " issued " + sides[i].first;
  msg += str_cat(". ", ranks(differ), differ.size() == 1 ? " differs" : " differ", " from rank 0. Every rank must run the same units in the "
                 "same order (same forward and backward, same number of calls of each unit); "
                 "data-dependent control flow must take the same path on every rank");
  throw Error(ErrorKind::kMismatch, ErrorContext{rank_, op.signature.unit, to_string(op.kind)}, msg);
}

namespace {

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
void settle_abandoned(GroupState& group, Op& op, const Signature* sigs) {
  const int size_ = group.size();
  const int rank_ = group.rank();
  const std::string& name_ = group.name();
  using Kind = AbandonedPass::Kind;
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
  group.refuse(msg);
  throw Error(ErrorKind::kMismatch, ErrorContext{rank_, op.signature.unit, to_string(op.kind)}, msg);
}

}  // namespace

}  // namespace fsdp::comm::detail
