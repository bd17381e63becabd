// Step time (pure math): compute from FLOPs at the profile's matmul rate, communication from an
// alpha-beta ring model per collective, and how much of it the compute hides given the engine's
// issue order and prefetch. docs/planner.md, "Time model" (and its limits).
#pragma once

#include <cstdint>

#include "fsdp/planner/model_spec.h"
#include "fsdp/planner/profile.h"
#include "fsdp/planner/setup.h"
#include "fsdp/planner/traffic.h"

namespace fsdp::planner {

/// Matmul FLOPs of one unit for one micro-batch of tau = B x T tokens (PaLM, Chowdhery et al.
/// 2022, appendix B, with causal attention): forward = 2 x (the unit's matmul params) x tau, plus
/// in a block the causal attention's QK^T and AV, 2 x C x (T + 1) per token (query i meets i keys:
/// 2 x 2C x T(T+1)/2 per sequence); backward = 2 x forward; a checkpointed block
/// (StepSetup::checkpoints_block) runs its forward once more in its backward (`recompute`,
/// included in `backward`). The root's matmul is the head (V x C). A parameter-count model:
/// 2 x params x tau per unit forward.
struct UnitFlops {
  double forward = 0.0;
  double backward = 0.0;   ///< recompute included
  double recompute = 0.0;  ///< the checkpointed forward run again in backward (0 without)
};
UnitFlops unit_flops(const ModelSpec& model, int64_t unit, const StepSetup& setup);
/// Hardware FLOPs of one rank for one optimizer step (all micro-batches): forward + backward,
/// recompute included (what the GPU runs; the numerator of HFU).
double step_flops(const ModelSpec& model, const StepSetup& setup);
/// Model FLOPs of one rank for one optimizer step: step_flops less the recompute (the numerator of
/// MFU; Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models").
double model_step_flops(const ModelSpec& model, const StepSetup& setup);

/// Modeled seconds of one collective of `logical_bytes` over a group placed as `group`
/// (traffic.h group_placement); 0 for one rank. A calibrated profile within a node
/// (DeviceProfile::has_measured_points): its measured points per ring step, their seconds made
/// non-decreasing in bytes (running maximum), linear in the ring's chunk (logical_bytes / n)
/// between them, the first point's seconds below them, the largest point's seconds per byte past
/// them, times the group's ring steps: the measured seconds at the calibration's world size and
/// sizes where they rise. Else, with n ranks, m nodes, g = n / m ranks of the group per node,
/// s = ring_steps(kind, n), W = ring_wire_bytes(kind, logical_bytes, n):
///  - profiles with nics_per_node 0: s x alpha + W / bandwidth, on the intra-node link in one node,
///    else on the inter-node one (every ring step waits for its slowest hop), at min(intra_node
///    bandwidth, g / node_size x inter_node bandwidth): the node's one link, its share of it when
///    other groups of the kind cross it beside this one (hybrid's replica groups, host-aware
///    collectives' groups across hosts: one rank per node each);
///  - profiles with nics_per_node k >= 1, NCCL's algorithms (docs/planner.md, "Collectives across
///    nodes"): bus bandwidth B = intra_node bandwidth in one node, else min(intra_node bandwidth,
///    k x g / node_size x inter_node bandwidth) (one ring per NIC: a node's ring bytes leave through
///    all of its NICs at once, its share of them when other groups of the kind run beside it);
///    ring = base + (s - s_m) alpha_intra + s_m alpha_inter + W / B with s_m = ring_steps(kind, m);
///    all-reduce takes the lower of the ring and the tree, base + 2 ((g - 1) alpha_intra +
///    ceil(log2 m) alpha_inter) + 2 x logical_bytes / B (NCCL's double binary tree across nodes,
///    a chain within each).
/// Throws fsdp::Error (kInvalidArgument) where the profile has no collectives.
double collective_time_s(const DeviceProfile& profile, fsdp::comm::CollectiveKind kind, int64_t logical_bytes,
                         const GroupPlacement& group);
/// The same for n ranks on one node (crosses_nodes false) or spread over
/// max(2, ceil(n / profile.ranks_per_node)) nodes of profile.ranks_per_node ranks.
double collective_time_s(const DeviceProfile& profile, fsdp::comm::CollectiveKind kind, int64_t logical_bytes,
                         int64_t n, bool crosses_nodes);
/// nccl-tests' bus bandwidth (doc/PERFORMANCE.md in NVIDIA/nccl-tests) of a collective that took
/// `seconds`: algorithm bandwidth logical_bytes / seconds times (n-1)/n for all-gather and
/// reduce-scatter, 2(n-1)/n for all-reduce (= ring_wire_bytes / seconds); 0 for n = 1.
double bus_bandwidth_bytes_per_s(fsdp::comm::CollectiveKind kind, int64_t logical_bytes, int64_t n, double seconds);

/// Estimated time of one step on one rank.
struct StepTime {
  double flops = 0.0;           ///< per rank per step: hardware FLOPs (step_flops, recompute included)
  double model_flops = 0.0;     ///< per rank per step: model FLOPs (model_step_flops, no recompute)
  double compute_s = 0.0;       ///< flops / profile rate for the precision
  /// The fraction of the precision's matmul peak compute_s is priced at (profile.h
  /// DeviceProfile::efficiency at the model's width); 0 where the profile's measured model rate
  /// was used instead.
  double matmul_efficiency = 0.0;
  double update_s = 0.0;        ///< the step update: sum over this rank's trainable shards of step_update_tensor_s
  double comm_s = 0.0;          ///< sum of every collective's modeled time alone (x shared_core_factor where
                                ///< communication shares the cores and compute fits them; neither factor where
                                ///< compute oversubscribes them: then exposed_comm_s, which counts the
                                ///< slowdown and the compute thread's share, can exceed it)
  double copy_s = 0.0;          ///< the engine's copies on the compute thread ([Note: engine copies])
  double exposed_comm_s = 0.0;  ///< step_s - compute_s - update_s - copy_s: communication compute did not hide
  double step_s = 0.0;
  double tokens_per_s = 0.0;    ///< all ranks: world x accumulation x micro x seq / step_s
  /// model_flops / (step_s x the precision's matmul peak), and flops / (the same): model and
  /// hardware FLOPs utilisation; 0 where the profile has no peak for the precision.
  double mfu = 0.0;
  double hfu = 0.0;
};

/// Replays one step as the engine runs it: one compute thread; one communication queue per
/// process group, run in issue order; forward prefetch of the next unit and backward prefetch of
/// the previous one within max_unsharded_units (shard_grad_op's kept units count, so its prefetch
/// stops after the bound); each reduce-scatter waited for when the next one is issued, hybrid's
/// replica all-reduce after it on the compute thread; no_shard's buckets issued as each unit's
/// backward ends and waited for at the end; the root's reduce-scatter at the end of backward; the
/// finite-check and grad-norm all-reduces after backward, then the step update (over the rank's
/// trainable shards, one tensor per parameter, the profile's step_update_tensor_s). The engine's
/// copies run on the compute thread at the profile's memory_copy_bytes_per_s, bytes read plus
/// written: each unshard's cast of the fp32 shard to param_dtype when it differs (S (4 + p)) and
/// copy of the gathered buffer into the params (2 p G S); each reduction's packing of the
/// gradients (p + r per element of the reduce-scatter input; no_shard: of its trainable elements)
/// and the add of the reduced rows into the fp32 sharded gradient (r + 4 per real element); no_shard
/// copies only with a cast (p, r: param and reduce dtype bytes; S: shard elements). Where the profile's
/// communication shares the compute cores (comm_overlaps_compute false) every collective also
/// takes its time from the compute thread, times its kind's shared_core_factor: nothing hides.
/// Where the compute threads oversubscribe the cores (compute_oversubscribed) each collective runs
/// on its queue for its time alone, duration_factor times slower while the compute thread computes
/// and at its speed alone while it waits (replay_queues.h), and takes time alone x
/// shared_core_factor (its share of the cores) from the compute thread, which waits where it needs
/// the result (docs/planner.md, "Compute that oversubscribes the cores").
/// Throws fsdp::Error (kInvalidArgument) for a bad parallelism or setup, or a profile with no rate.
StepTime estimate_step_time(const ModelSpec& model, const Parallelism& par, const StepSetup& setup,
                            const DeviceProfile& profile);

}  // namespace fsdp::planner
