// Communication per step (pure math): every collective one rank issues in a training step, as the
// engine's CommStats counts them (calls and logical bytes; the MPI tests assert them), and the
// bytes a ring moves through each rank. docs/planner.md, "Traffic".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/comm/comm_stats.h"
#include "fsdp/planner/model_spec.h"
#include "fsdp/planner/setup.h"

namespace fsdp::planner {

/// Which process group a collective runs on.
enum class GroupKind {
  kShard,      ///< the unit's shard group (the world, or a hybrid shard group of G ranks)
  kReplicate,  ///< hybrid_shard's replicate group (N/G ranks holding the same rows)
  kWorld,      ///< the whole data-parallel group (no_shard buckets, grad-norm and loss-scaler flags)
  kNode,       ///< the node-local group of Parallelism::node_group_size() consecutive ranks (hpZ)
  kHost,       ///< host-aware collectives' stage inside the host: host_stage_size() consecutive ranks
  kCrossHost,  ///< their stage across hosts: shard_group_size() / host_stage_size() ranks, one per host
};
/// "shard", "replicate", "world", "node", "host", "cross_host".
const char* to_string(GroupKind g);

/// One collective of a step.
struct CollectiveCall {
  fsdp::comm::CollectiveKind kind = fsdp::comm::CollectiveKind::kAllGather;
  GroupKind group = GroupKind::kShard;
  int64_t group_size = 1;      ///< ranks of that group
  bool crosses_nodes = false;  ///< its ranks sit on more than one node
  int64_t nodes = 1;           ///< nodes its ranks sit on (group_placement)
  int64_t unit = -1;           ///< index into ModelSpec::units; -1 for the step's scalar flags
  /// CommStats' logical bytes: all-gather output, reduce-scatter input, all-reduce tensor, in the
  /// caller's dtype.
  int64_t logical_bytes = 0;
  /// Bytes this rank sends (= receives) in a ring: (n-1)/n x logical for all-gather and
  /// reduce-scatter, 2(n-1)/n x logical for all-reduce (reduce-scatter + all-gather); 0 when n = 1.
  double wire_bytes = 0.0;
  /// Of those, the bytes this rank receives from ranks on other nodes, as CommStats splits them
  /// ([Note: host traffic]): wire bytes x (n - m) / (n - 1) with m = ranks of the group on this
  /// rank's node (group_placement: spread evenly over its nodes); 0 when it does not cross nodes.
  double inter_node_bytes = 0.0;
};

/// Totals of one kind of collective per step.
struct KindTotals {
  int64_t calls = 0;
  int64_t logical_bytes = 0;
  double wire_bytes = 0.0;
};

/// The collectives of one step (all micro-batches), and their totals by kind.
struct StepTraffic {
  std::vector<CollectiveCall> calls;  ///< in issue order within each micro-batch
  KindTotals all_gather, reduce_scatter, all_reduce;
  KindTotals all_to_all;  ///< the int8 reduce-scatters (StepSetup::reduce_scatter_codec)
  /// Sum of logical bytes over all kinds.
  int64_t logical_bytes() const {
    return all_gather.logical_bytes + reduce_scatter.logical_bytes + all_reduce.logical_bytes + all_to_all.logical_bytes;
  }
  double wire_bytes() const {
    return all_gather.wire_bytes + reduce_scatter.wire_bytes + all_reduce.wire_bytes + all_to_all.wire_bytes;
  }
  /// Sum of CollectiveCall::inter_node_bytes: what this rank receives across nodes per step (the
  /// planner's side of fsdp-train's comm.inter_host_bytes).
  double inter_node_bytes() const {
    double b = 0.0;
    for (const auto& c : calls) b += c.inter_node_bytes;
    return b;
  }
};

/// Whether a group of `group_size` ranks spans nodes: the shard group of consecutive ranks, or the
/// replicate group (stride = shard group size), with par.node_size() ranks per node.
bool group_crosses_nodes(const Parallelism& par, GroupKind group);

/// Where one group's ranks lie: `ranks` of them over `nodes` nodes of `node_size` ranks each (the
/// node's other ranks belong to the other groups of the same kind, which run at the same time).
struct GroupPlacement {
  int64_t ranks = 1;
  int64_t nodes = 1;
  int64_t node_size = 1;
};
/// The placement of a group of the given kind (ranks in order, par.node_size() per node): one node
/// when it does not cross nodes (group_crosses_nodes); the world over ceil(N / node) nodes; a shard
/// group of G consecutive ranks over G / node nodes (ceil, and at least 2 where G straddles a node
/// boundary); a replicate group (stride G) over N/G / (node / G) nodes when G divides the node, else
/// one rank per node.
GroupPlacement group_placement(const Parallelism& par, GroupKind group);

/// Every collective of one steady-state training step (setup.accumulation_steps micro-batches,
/// gradient sync on the last), as the engine issues them:
///   full_shard, hybrid_shard: per micro-batch one all-gather per unit with params in forward and
///     one more per non-root unit in backward (the root stays gathered: 2U - 1; with a node-local
///     reshard of g ranks the backward's runs over the node group, g x S_g x param bytes, never
///     int8 encoded: it carries the rows the forward computed with); one reduce-scatter
///     per unit with trainable params in the last micro-batch; hybrid_shard with G < N: one
///     all-reduce of the unit's reduced shard across the replicas after each reduce-scatter;
///   shard_grad_op: one all-gather per unit per micro-batch (kept until the end of backward);
///   zero1: one all-gather per unit per step (lazily, at the first forward after the rows changed);
///   no_shard: one all-reduce per bucket (ddp_bucket_numels) in the last micro-batch;
///   plus one all-reduce of 16 bytes (grad norm) and, with loss scaling, one of 8 bytes.
/// Throws fsdp::Error (kInvalidArgument) for a bad parallelism or setup.
StepTraffic step_traffic(const ModelSpec& model, const Parallelism& par, const StepSetup& setup);

/// Steps of a ring collective over n ranks: n - 1 for an all-gather or reduce-scatter, 2(n - 1) for
/// an all-reduce (a reduce-scatter, then an all-gather); 0 for n <= 1.
double ring_steps(fsdp::comm::CollectiveKind kind, int64_t n);

/// Bytes a ring moves through one rank for `logical_bytes` of a collective over n ranks.
double ring_wire_bytes(fsdp::comm::CollectiveKind kind, int64_t logical_bytes, int64_t n);

}  // namespace fsdp::planner
