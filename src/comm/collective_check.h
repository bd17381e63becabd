// The cross-rank collective check ([Note: collective check]) and the settling of abandoned steps
// ([Note: abandoned steps]) (internal). Run by the executor before an op moves any data.
#pragma once

#include <string>

#include "group_state.h"

namespace fsdp::comm::detail {

/// The signature of an op described by (kind, sizing tensor's dtype and numel or none, reduction,
/// root, tag, marker kind and ordinal). Unit and phase are cut to the fixed fields.
Signature make_signature(int64_t seq, CollectiveKind kind, const at::Tensor* tensor, ReduceOp reduce_op, int root,
                         const OpTag* tag, int marker_kind, int marker_ordinal);

/// The op as errors name it ("all_gather of 12 float32, unit 'h.2', forward (forward pass 3)");
/// `whole` (this rank's op, when given) replaces the signature's truncated unit and phase.
std::string describe(const Signature& s, const Op* whole = nullptr);

/// Collective over the group's control channel (blocking, on the communication thread): all-gathers every
/// rank's signature of `op`. Returns when they agree. Throws fsdp::Error (kMismatch) on every rank,
/// with the same message, when they differ; when abandon markers are among them, settles the
/// position instead (writing op.marker_outcome, or throwing kStepAbandoned / kMismatch, the latter
/// after refusing the group).
void check_same_op(GroupState& group, Op& op);

/// The verdict of a marker on a group of one rank: settled, no peer failed.
void settle_alone(Op& op);

}  // namespace fsdp::comm::detail
