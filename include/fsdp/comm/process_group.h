// ProcessGroup: the collectives fsdp-cpp needs, independent of FSDP (layer 1 of docs/architecture.md).
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fsdp/comm/backend.h"
#include "fsdp/comm/comm_stats.h"
#include "fsdp/comm/flight_recorder.h"
#include "fsdp/comm/work.h"

namespace fsdp::comm {

namespace detail {
struct Family;
class GroupState;
class IssueOrderExecutor;
}  // namespace detail

/// Settings of a process group, inherited by the groups split from it.
struct ProcessGroupOptions {
  /// A collective not complete this many seconds after it started running fails with fsdp::Error
  /// (kind kTimeout) on this rank, naming the group, the op, its sequence number, bytes, unit and
  /// phase. A timed-out collective cannot be cancelled: the group is unusable afterwards, the
  /// flight recorder is written, and the job is aborted abort_grace_s later unless the process has
  /// ended by then. Default 600 s (PyTorch's), or the environment's FSDP_COLLECTIVE_TIMEOUT_S. > 0.
  double timeout_s = 600.0;
  /// Seconds between a timeout and the abort of the job, for the program to report (>= 0).
  double abort_grace_s = 10.0;
  /// Abort the job after a timeout (false: only fail the ops; for in-process tests).
  bool abort_after_timeout = true;
  /// Where each rank writes its flight recorder (rank-RRRRR.json) on a timeout or a failed or
  /// mismatched collective; "" writes nothing. Default: FSDP_FLIGHT_RECORDER_DIR.
  std::string flight_recorder_dir;
  /// Collectives the flight recorder keeps (the newest).
  int flight_recorder_entries = 2048;

  /// Defaults, with FSDP_COLLECTIVE_TIMEOUT_S and FSDP_FLIGHT_RECORDER_DIR applied. Throws
  /// fsdp::Error (kInvalidArgument) for a malformed or non-positive timeout.
  static ProcessGroupOptions from_env();
};

/// The forward pass a rank abandons (abandon_step).
struct AbandonedPass {
  enum class Kind : int32_t {
    kFailedWithGrad = 0,     ///< this rank's step failed in a forward with grad or its backward
    kFailedWithoutGrad = 1,  ///< this rank's forward failed with grad disabled (an evaluation)
    kCompleted = 2,          ///< the forward ran and no backward will (nothing failed here)
  };
  Kind kind = Kind::kFailedWithGrad;
  int64_t forward_pass = -1;  ///< OpTag::forward_pass of the pass
  int64_t sync_epoch = -1;    ///< OpTag::sync_epoch of the pass
  std::string reason;         ///< for the peers' errors (its first 63 bytes travel)
};

/// How abandon_step settled.
struct AbandonResult {
  /// Rounds of the group that took most: 1 when every rank was at its marker at once.
  int rounds = 0;
  /// Some rank's marker at a settling position was a failure (not Kind::kCompleted).
  bool peer_failed = false;
  /// The latest forward pass among the markers at the settling positions: ranks that ran more
  /// forwards of the abandoned step than others (a later micro-batch) agree on it, so that their
  /// next collectives carry the same pass again (-1 when nothing settled).
  int64_t forward_pass = -1;
};

/// One marker's verdict, written by the communication thread before its Work completes.
struct MarkerOutcome {
  bool settled = false;      ///< every rank's op at its position was a marker
  bool peer_failed = false;  ///< one of them a failure
  int64_t forward_pass = -1; ///< the latest forward pass among them
  std::string ambiguous;     ///< a confirmation: why the ranks cannot agree ("" when they can)
};

/// A group of ranks that run collectives together, over a Backend it owns (the c10d shape). The
/// rooms behind it (src/comm/): the issue-order executor (queue, thread, deadline, flight-recorder
/// hooks), the collective check, the low-precision reductions, the group's failure state.
///
/// Call-order rule: every rank of the group issues the same collectives, with the same sizes and
/// dtypes, in the same order (as with MPI and NCCL). Every op is validated on the calling thread
/// (fsdp::Error, kind kInvalidArgument, naming the rank, the op and expected vs actual), numbered
/// (its sequence number in the group), counted in stats(), recorded in the flight recorder, then
/// queued and executed in issue order on the group's communication thread, so the caller may
/// compute while it runs. Every op returns a Work whose wait() blocks and rethrows the op's error.
/// Tensors passed to an op must stay alive and untouched until its Work completes. A group of one
/// rank runs its ops inline (a local copy or nothing) and completes them before returning.
///
/// [Note: collective check] Before an op moves any data, the ranks exchange a fixed-size
/// description of it (sequence number, kind, dtype, numel, reduction, root, tag: unit, phase and
/// forward pass); when any rank's
/// differs, no data moves and the op fails on every rank with fsdp::Error (kind kMismatch) naming
/// the sequence number, each side's op, unit and phase, and the ranks that disagree, instead of
/// pairing wrong buffers or aborting inside MPI. Always on; cost: one all-gather of 152 bytes per
/// rank per op (docs/architecture.md, "Collectives"). The descriptions travel on the group's
/// control channel, a CPU backend over the same ranks beside the data backend ([Note: control
/// channel] in backend.h): the data backend carries the user's ops only, so that a device
/// backend (NCCL) never sees CPU bytes. Both are split in step.
///
/// Tensors: contiguous, on the backend's device (the CPU for MPI and threads), at most the
/// backend's max_elements() elements, of a dtype the backend supports for the op
/// (Backend::supports; for MPI and threads: float32, float64, bfloat16, float16, int32, int64 or
/// uint8, uint8 for gathers, all-to-all and broadcast only). Reductions of bfloat16/float16 that
/// the backend does not run itself move
/// the low-precision bytes (an all-to-all of the blocks) and add them up in float32 in rank order,
/// rounding once at the end ([Note: all-to-all reductions]). Thread-safe: any thread may issue
/// ops; their order is the order of issue.
class ProcessGroup final : public std::enable_shared_from_this<ProcessGroup> {
 public:
  /// Wraps `backend` (owned), which moves the data, and a control channel it makes
  /// (backend->make_control_channel(): collective over the backend's ranks, so every rank
  /// constructs its group at the same point). The group is named `name` in records and errors.
  /// Starts the communication thread when the group has more than one rank. Throws fsdp::Error
  /// (kInvalidArgument) for a null or inconsistent backend, and what make_control_channel throws
  /// (kUnsupported for a backend with no CPU control channel: use the constructor below).
  ProcessGroup(std::unique_ptr<Backend> backend, ProcessGroupOptions options = ProcessGroupOptions::from_env(),
               std::string name = "world");
  /// Wraps `data` (owned), which moves the tensors of every op, and `control` (owned), a CPU
  /// backend over the same ranks in the same order that carries the group's control traffic
  /// (the collective check) and nothing else; null: data->make_control_channel() (collective,
  /// as above). This is how a device data backend (NCCL) pairs with an MPI or Gloo control
  /// channel. Not collective otherwise. Throws fsdp::Error (kInvalidArgument) naming the rank and
  /// expected vs actual when control's rank, size or device differ from what data implies.
  ProcessGroup(std::unique_ptr<Backend> data, std::unique_ptr<Backend> control,
               ProcessGroupOptions options = ProcessGroupOptions::from_env(), std::string name = "world");
  /// Finishes every queued op, stops the communication thread, then destroys the backend.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// This process's rank in the group, in [0, size()).
  int rank() const { return rank_; }
  /// Number of ranks in the group (the world size of this group).
  int size() const { return size_; }
  /// Backend name, e.g. "mpi" or "threaded".
  const std::string& backend_name() const { return backend_name_; }
  /// The control channel's backend name (the collective check's transport), e.g. "mpi".
  const std::string& control_backend_name() const { return control_backend_name_; }
  /// "world", "world/split(3)", ...
  const std::string& name() const { return name_; }
  const ProcessGroupOptions& options() const { return options_; }

  /// The host of every rank of this group (element r: rank r's host), numbered 0, 1, ... in the
  /// order of each host's lowest rank (Backend::host_of_ranks). Not collective.
  const std::vector<int>& host_of_ranks() const { return host_of_ranks_; }
  /// Number of distinct hosts among this group's ranks.
  int num_hosts() const { return num_hosts_; }
  /// This rank's host (an index of host_of_ranks()).
  int host() const { return host_of_ranks_[static_cast<size_t>(rank_)]; }
  /// Ranks of this group on this rank's host, this rank included.
  int ranks_on_my_host() const { return ranks_on_my_host_; }

  /// [Note: chained ops] Every data op takes an optional `after` and `before`. after: a Work of
  /// another group (e.g. the first stage of a two-stage collective, which writes this op's input):
  /// the op is numbered and queued now but starts on the communication thread only once `after` has
  /// completed, so the caller need not wait in between; its timeout counts from that start. It runs
  /// even when `after` failed (its peers, which may not have, would otherwise wait in it until their
  /// timeout): `after`'s error is its own Work's to report, so wait for `after` first. before: run on
  /// the communication thread when the op starts (after `after`), before any data moves and before
  /// the op's timeout starts counting, e.g. to encode into `input` what `after` wrote. When it
  /// throws, the op still runs with its peers (none waits for this rank) and then fails on this
  /// rank with that error, which the step's failure handling spreads ([Note: failed steps]). A
  /// group of one rank runs the op inline: it waits for `after` on the calling thread.

  /// output (size()*n elements) = concat over ranks r of rank r's input (n elements), rank-major.
  /// Shapes are free; only numel and dtype matter. after, before: [Note: chained ops].
  WorkPtr all_gather_into_tensor(at::Tensor output, at::Tensor input, const OpTag& tag = {},
                                 WorkPtr after = nullptr, std::function<void()> before = nullptr);

  /// output (n elements) = reduce over ranks of input[rank*n : (rank+1)*n] (input: size()*n
  /// elements). op: kSum, kAvg, kMax or kMin. output may alias input's block of this rank.
  /// after, before: [Note: chained ops].
  WorkPtr reduce_scatter_tensor(at::Tensor output, at::Tensor input, ReduceOp op = ReduceOp::kSum,
                                const OpTag& tag = {}, WorkPtr after = nullptr,
                                std::function<void()> before = nullptr);

  /// tensor = reduce over ranks of tensor, in place; bitwise the same on every rank.
  /// after, before: [Note: chained ops] (e.g. after the reduce-scatter that writes `tensor`).
  /// A group of one rank: the identity, which reads nothing and completes at once (without a
  /// `before`; with one, it runs `before` inline once `after` has completed).
  WorkPtr all_reduce(at::Tensor tensor, ReduceOp op = ReduceOp::kSum, const OpTag& tag = {},
                     WorkPtr after = nullptr, std::function<void()> before = nullptr);

  /// output block q (n elements) = rank q's input block rank() (input and output: size()*n).
  /// after, before: [Note: chained ops].
  WorkPtr all_to_all(at::Tensor output, at::Tensor input, const OpTag& tag = {}, WorkPtr after = nullptr,
                     std::function<void()> before = nullptr);

  /// tensor on every rank = tensor of rank root (a rank of this group), in place.
  WorkPtr broadcast(at::Tensor tensor, int root, const OpTag& tag = {});

  /// Completes once every rank of the group has issued its barrier. counted false leaves it out
  /// of stats() (an engine's own synchronisation, not the program's traffic).
  WorkPtr barrier(const OpTag& tag = {}, bool counted = true);

  /// Collective over this group (blocking): ranks with the same color form a new group, ordered by
  /// (key, rank), sharing this group's stats(), flight recorder and options, named
  /// name() + "/split(color)". Every rank must call it in the same order as its other collectives.
  std::shared_ptr<ProcessGroup> split(int color, int key);
  /// Collective over this group (blocking; every rank calls it at the same point of its calls on
  /// this group, as it would split): a new CPU backend over the same ranks in the same order, a
  /// communicator of its own (the data backend's make_control_channel), owned by the caller. It
  /// is how a device group built over this CPU group gets its control channel (nccl_world pairs
  /// it with the NCCL backend through ProcessGroup(data, control, ...)). Throws what
  /// make_control_channel throws (fsdp::Error kUnsupported for a backend without one).
  std::unique_ptr<Backend> make_control_backend();
  /// Collective over this group (blocking), like split: groups of `block` consecutive ranks
  /// (strided false: color rank() / block) or of the ranks with the same rank() % block (strided
  /// true), ordered by rank. Throws fsdp::Error (kInvalidArgument) unless block divides size().
  /// The form every backend supports, the simulated one included (Backend::split_blocks).
  std::shared_ptr<ProcessGroup> split_blocks(int block, bool strided);
  /// Where this group's tensors live (the backend's device_type(): kCPU for MPI and threads,
  /// kMeta for a simulated group).
  c10::DeviceType device_type() const;
  /// True when the ranks are simulated in this process without data (comm::simulated_world).
  bool simulated() const;

  /// Why this group refuses every op since ranks were found to have left a step at different
  /// points ([Note: abandoned steps]); "" while it does not.
  std::string diverged() const;

  /// Counters of this group and of every group split from it (one object per family of groups).
  CommStats& stats() { return *stats_; }
  std::shared_ptr<CommStats> stats_ptr() const { return stats_; }
  /// The flight recorder of the family.
  FlightRecorder& flight_recorder() { return *recorder_; }
  /// Writes the flight recorder to options().flight_recorder_dir (if set) as this process's file;
  /// returns the path ("" when not written). Not collective.
  std::string dump_flight_recorder(const std::string& reason);
  /// Where this rank's last dump went, for error messages: "; flight recorder in DIR", "; the
  /// flight recorder could not be written: WHY", or how to turn it on.
  std::string flight_recorder_note() const;

 private:
  ProcessGroup(std::unique_ptr<Backend> data, std::unique_ptr<Backend> control, ProcessGroupOptions options,
               std::string name, std::shared_ptr<detail::Family> family);

  friend AbandonResult abandon_step(const std::vector<ProcessGroup*>& groups, const AbandonedPass& pass);
  // Refuses every later op with `why` (the ranks agreed that they cannot go on together).
  void refuse(const std::string& why);

  struct Described {  // what enqueue needs to know of an op
    CollectiveKind kind;
    const at::Tensor* tensor;  // the tensor that sizes it (input; null for barrier, split)
    ReduceOp reduce_op;
    int root;
    const OpTag* tag;
    int64_t logical_bytes;  // < 0: not counted in stats (set-up)
  };
  // Numbers, records and counts the op, then hands it to the executor (inline at world size 1).
  // `before`: [Note: chained ops], run by the executor ahead of the check and the deadline.
  WorkPtr enqueue(const Described& d, std::function<void()> fn, WorkPtr after = nullptr,
                  std::shared_ptr<MarkerOutcome> marker_outcome = nullptr, int marker_kind = -1, int marker_ordinal = 0,
                  std::function<void()> before = nullptr);
  // Queues this rank's `ordinal`-th abandon marker of `pass`; *outcome says, once it ran, whether
  // the group is settled.
  WorkPtr issue_abandon_marker(const AbandonedPass& pass, int ordinal, std::shared_ptr<MarkerOutcome> outcome);
  // Validation on the calling thread: `t` may be passed as `what` to an op of `kind`.
  void check_tensor(const char* op, CollectiveKind kind, const char* what, const at::Tensor& t) const;
  // A reduction of this dtype the backend does not run itself: bf16/fp16 over all_to_all.
  bool reduces_in_float32(CollectiveKind kind, c10::ScalarType dtype) const;

  std::unique_ptr<Backend> backend_;  // the data backend; destroyed last (declared first)
  std::unique_ptr<Backend> control_;  // the control channel ([Note: control channel])
  int rank_;
  int size_;
  std::string backend_name_;
  std::string control_backend_name_;
  ProcessGroupOptions options_;
  std::string name_;
  std::shared_ptr<detail::Family> family_;
  std::vector<int> host_of_ranks_;
  int num_hosts_ = 1;
  int ranks_on_my_host_ = 1;
  std::shared_ptr<CommStats> stats_;
  std::shared_ptr<FlightRecorder> recorder_;
  std::unique_ptr<detail::GroupState> state_;
  std::unique_ptr<detail::IssueOrderExecutor> executor_;  // destroyed first (declared last but one)
  std::mutex issue_mu_;  // numbering and queueing are one step: issue order is sequence order
  int64_t next_seq_ = 0;  // guarded by issue_mu_
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

/// Ranks per host of `group` when every host holds the same number of its ranks and each host's
/// ranks are consecutive (ranks 0..k-1 on the first host, k..2k-1 on the next, ...), the layout
/// hybrid_shard's per-host shard groups need. Throws fsdp::Error (kUnsupported) naming every
/// host's ranks otherwise. Not collective (every rank computes the same answer).
int uniform_ranks_per_host(const ProcessGroup& group);

/// [Note: abandoned steps] Puts `groups` back in step after this rank abandoned a forward pass
/// (an FSDP tree's step failed, or its forward ran and its backward never will), when its peers may
/// have issued more or fewer of the pass's collectives than this rank. Collective over every group,
/// called by every rank that abandons the pass; blocks until it is settled on every group. Each
/// group makes progress on its own: a marker at a time, the next as soon as the last one ran. A
/// peer's collective paired with a marker is not run and fails on that peer with fsdp::Error
/// (kStepAbandoned) naming this rank and pass.reason (its first 63 bytes), so that the peer's step
/// fails too and it calls abandon_step; a group is settled at the first position where every
/// rank's op is a marker, from which its ops pair again. This rank's queued collectives complete
/// or fail before it returns. Recoverable when every rank is at the same sync_epoch (no rank has
/// completed a backward that reduced gradients since: no optimizer step) and at no earlier pass
/// than the abandoned one, the very pass for one without grad (an evaluation); otherwise (a rank
/// finished what another abandoned) every rank throws fsdp::Error (kMismatch) naming the sides,
/// and the group refuses every later op with that message. So it does when a pass one rank
/// completed without backward (Kind::kCompleted) meets another rank's failure of it and no peer was
/// in its backward: whether that rank skipped its batch cannot be told. kTimeout as any
/// collective. groups: distinct, the same on every rank, in any order.
AbandonResult abandon_step(const std::vector<ProcessGroup*>& groups, const AbandonedPass& pass);

/// Every rank's `mine`, in rank order (element r is rank r's string; any lengths, any bytes).
/// Collective and blocking over group: two all-gathers (the lengths as int64, then the bytes
/// padded to the longest). Throws fsdp::Error when a collective fails.
std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine, const OpTag& tag = {});

}  // namespace fsdp::comm
