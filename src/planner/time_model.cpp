#include "fsdp/planner/time_model.h"

#include <algorithm>

#include "fsdp/common/check.h"
#include "fsdp/runtime/strategy_traits.h"
#include "fsdp/planner/memory.h"
#include "fsdp/planner/replay_queues.h"
#include "fsdp/planner/traffic.h"
#include "fsdp/shard/layout.h"

namespace fsdp::planner {
namespace {

using S = fsdp::ShardingStrategy;
using K = fsdp::comm::CollectiveKind;
const ErrorContext kTimeModelWhere{-1, "", "planner time model"};

// One collective in the replay: seconds it runs on its group's queue at its speed alone, how many
// times slower it runs beside computing ([Note: processor sharing]), and seconds it takes from the
// compute thread while it runs ([Note: time-shared cores]).
struct Op {
  double queue_s = 0.0;
  double slowdown = 1.0;
  double cpu_s = 0.0;
};

// The replay's queues: one per process group; a hybrid replica all-reduce (kReplicate) depends on its
// reduce-scatter (kShard), on a lower queue.
enum QueueIndex : int { kShardQueue = 0, kReplicateQueue = 1, kWorldQueue = 2, kNumQueues = 3 };

}  // namespace

UnitFlops unit_flops(const ModelSpec& model, int64_t unit, const StepSetup& setup) {
  const Architecture& A = model.arch;
  const double tau = static_cast<double>(setup.micro_batch_size * setup.seq_len);
  UnitFlops f;
  double matmul = 0.0, attention = 0.0;  // forward FLOPs of the weight products and of attention
  if (A.kind == BlockKind::kNone) {
    matmul = 2.0 * static_cast<double>(model.units[unit].numel()) * tau;
  } else if (unit == 0) {
    matmul = 2.0 * static_cast<double>(A.vocab_size * A.n_embd) * tau;  // the head
  } else {
    const double per_block = static_cast<double>(model.matmul_params() - A.vocab_size * A.n_embd) /
                             static_cast<double>(A.n_layer);
    // Causal attention: query i meets i keys; QK^T and AV cost 2 x 2C x T(T+1)/2 per sequence.
    attention = 2.0 * static_cast<double>(A.n_embd) * static_cast<double>(setup.seq_len + 1) * tau;
    matmul = 2.0 * per_block * tau;
  }
  f.forward = matmul + attention;
  // Backward: the input gradient of every product, and the weight gradient of the trainable share
  // only (a frozen base computes none: a LoRA fine-tune's backward is about one forward).
  const UnitSpec& u = model.units[unit];
  const double trainable = u.numel() > 0 ? static_cast<double>(u.trainable_numel()) / static_cast<double>(u.numel()) : 1.0;
  f.backward = matmul * (1.0 + trainable) + 2.0 * attention;
  if (setup.checkpoints_block(unit)) {  // units[u] is block u
    f.recompute = f.forward;
    f.backward += f.recompute;
  }
  return f;
}

double step_flops(const ModelSpec& model, const StepSetup& setup) {
  double total = 0.0;
  for (int64_t u = 0; u < static_cast<int64_t>(model.units.size()); ++u) {
    const UnitFlops f = unit_flops(model, u, setup);
    total += f.forward + f.backward;
  }
  return total * static_cast<double>(setup.accumulation_steps);
}

double model_step_flops(const ModelSpec& model, const StepSetup& setup) {
  double total = 0.0;
  for (int64_t u = 0; u < static_cast<int64_t>(model.units.size()); ++u) {
    const UnitFlops f = unit_flops(model, u, setup);
    total += f.forward + f.backward - f.recompute;
  }
  return total * static_cast<double>(setup.accumulation_steps);
}

// [Note: step replay] docs/planner.md, "Time model". Times in seconds from the start of the
// step; `t` is the compute thread's clock.
StepTime estimate_step_time(const ModelSpec& model, const Parallelism& par, const StepSetup& setup,
                            const DeviceProfile& profile) {
  par.validate();
  setup.validate();
  const double rate = profile.flops_per_s(setup.precision, model.arch.n_embd);
  FSDP_CHECK(rate > 0, ErrorKind::kInvalidArgument, kTimeModelWhere, "profile '", profile.name, "' has no matmul rate for ",
             to_string(setup.precision));
  const S s = par.strategy;
  const int64_t U = static_cast<int64_t>(model.units.size());
  const int64_t G = par.shard_group_size(), N = par.world_size;
  const int64_t pb = param_bytes_per_elem(setup.precision), rb = reduce_bytes_per_elem(setup.precision);
  const StrategyTraits& st = traits_of(s);
  const bool per_phase = st.gathers_params && st.reshard_after_forward, sgo = gathers_once_per_step(st);
  const bool zero1 = st.lazy_gather, ddp = st.grad_sync == GradSync::kBuckets;
  const bool bounded = per_phase || sgo;  // units the max_unsharded_units bound counts
  const GroupPlacement shard_x = group_placement(par, GroupKind::kShard);
  const GroupPlacement rep_x = group_placement(par, GroupKind::kReplicate);
  const GroupPlacement world_x = group_placement(par, GroupKind::kWorld);
  const GroupPlacement node_x = group_placement(par, GroupKind::kNode);
  const int64_t gn = par.node_group_size();  // hpZ: the backward gathers over gn ranks
  // Host-aware collectives: each gather and reduction is two stages, one after the other on the
  // communication threads (across hosts over H ranks, inside the host over h).
  const int64_t hs = par.host_stage_size(), H = hs > 0 ? G / hs : 1;
  const GroupPlacement host_x = group_placement(par, GroupKind::kHost);
  const GroupPlacement cross_x = group_placement(par, GroupKind::kCrossHost);
  const bool int8_reduce = setup.reduce_scatter_codec == fsdp::WireCodec::kInt8 && G > 1 && !ddp;

  // A collective in the replay (profile.h CollectiveLinks). Overlapping communication: its time
  // alone on its queue. Shared cores, compute fitting them: time alone x the shared-core factor,
  // on the compute thread's clock. [Note: time-shared cores] Compute oversubscribing the cores:
  // its time alone on its queue, run duration_factor times slower while the compute thread
  // computes ([Note: processor sharing]), and time alone x the shared-core factor (its share of the
  // cores, measured beside a pass that does not wait) from the compute thread; where the compute
  // thread needs its result it waits for it, and every rank waits at once, so nobody's compute
  // fills that time and the collective runs at its speed alone.
  const bool time_shared = profile.compute_oversubscribed;
  const bool overlaps = profile.comm_overlaps_compute || time_shared;
  auto op = [&](K kind, int64_t bytes, const GroupPlacement& group) {
    const double alone = collective_time_s(profile, kind, bytes, group);
    if (alone <= 0 || profile.comm_overlaps_compute) return Op{alone, 1.0, 0.0};
    const CollectiveLinks& l = profile.links(kind);
    return time_shared ? Op{alone, l.duration_factor, alone * l.shared_core_factor}
                       : Op{alone * l.shared_core_factor, 1.0, 0.0};
  };
  // [Note: engine copies] The engine's own passes over memory on the compute thread, at the
  // profile's copy rate (bytes read + written): an unshard casts the fp32 shard to param_dtype
  // (when it differs) and copies the gathered buffer into the params; a reduction packs the
  // gradients into one reduce_dtype buffer (no_shard: into its buckets) and adds the reduced rows
  // into the fp32 sharded gradient.
  // With the int8 codec the unshard quantises instead of casting: the master read into a float32
  // copy (4 + 4), |x| and the block maxima (4 + 4), the division, rounding and clamp in place
  // (3 x (4 + 4)), the int8 payload written (4 + 1): 45 bytes per shard element; decoding reads
  // each int8 value into a float32 row (1 + 4), scales it in place (4 + 4) and rounds it into the
  // param_dtype buffer (4 + pb): 17 + pb per gathered element, before the usual copy into the params.
  constexpr int64_t kInt8EncodeBytesPerElem = 45, kInt8DecodeBytesPerElem = 17;
  constexpr int64_t kMasterBytes = 4;  // fp32 master rows and sharded gradients
  const double copy_rate = profile.memory_copy_bytes_per_s;
  FSDP_CHECK(copy_rate > 0, ErrorKind::kInvalidArgument, kTimeModelWhere, "profile '", profile.name,
             "' has no memory copy rate");
  auto copy_s = [&](int64_t bytes) { return static_cast<double>(bytes) / copy_rate; };
  // Two stages on one queue, the second after the first: their times add.
  auto then = [](const Op& a, const Op& b) {
    return Op{a.queue_s + b.queue_s, std::max(a.slowdown, b.slowdown), a.cpu_s + b.cpu_s};
  };
  std::vector<double> unshard_copy(U, 0.0), pack_copy(U, 0.0), add_copy(U, 0.0);
  std::vector<double> fwd(U), bwd(U);
  std::vector<Op> ag(U), rs(U), rep(U), ag_node(U);
  std::vector<double> node_copy(U, 0.0);
  double update_s = 0.0;  // the step update of this rank's trainable shards, tensor by tensor
  std::vector<std::vector<Op>> buckets(U);
  std::vector<bool> has(U), trains(U);
  for (int64_t u = 0; u < U; ++u) {
    const UnitFlops f = unit_flops(model, u, setup);
    fwd[u] = f.forward / rate;
    bwd[u] = f.backward / rate;
    const UnitNumbers n = unit_numbers(model.units[u], G, 0);
    has[u] = n.numel > 0;
    trains[u] = n.trainable_numel > 0;
    for (const auto& p : model.units[u].params) {
      if (p.trainable) {
        update_s += profile.step_update_tensor_s(
            setup.optimizer, fsdp::shard::ParamShardSpec::make(p.shape, G).real_numel(0));
      }
    }
    // no_shard: a cast copy only when param_dtype differs (else the params are the shards).
    const bool cast = pb != kMasterBytes;
    if (setup.all_gather_codec == fsdp::WireCodec::kInt8 && st.gathers_params) {
      unshard_copy[u] = copy_s(kInt8EncodeBytesPerElem * n.shard_numel +
                               (kInt8DecodeBytesPerElem + pb) * n.gathered_numel + 2 * pb * n.gathered_numel);
    } else if (!ddp || cast) {
      unshard_copy[u] = copy_s((cast ? (kMasterBytes + pb) * n.shard_numel : 0) + 2 * pb * n.gathered_numel);
    }
    pack_copy[u] = copy_s((pb + rb) * (ddp ? n.trainable_numel : n.reduce_numel));
    add_copy[u] = copy_s((rb + kMasterBytes) * (ddp ? n.trainable_numel : n.real_trainable_numel));
    ag[u] = op(K::kAllGather, all_gather_bytes(setup, model.units[u], G), shard_x);
    if (gn > 0) {
      // The kept shard: written after forward (read + write S_g), gathered, copied into the params.
      const int64_t s_g = unit_numbers(model.units[u], gn, 0).shard_numel;
      ag_node[u] = op(K::kAllGather, gn * s_g * pb, node_x);
      node_copy[u] = copy_s(2 * pb * s_g + 2 * pb * gn * s_g);
    }
    const int64_t reduce_bytes = rb * n.reduce_numel;
    if (hs > 0) {
      const int64_t gathered = all_gather_bytes(setup, model.units[u], G);
      ag[u] = then(op(K::kAllGather, gathered / G * H, cross_x), op(K::kAllGather, gathered, host_x));
      // The int8 stage moves its payload as an all-to-all, timed as a reduce-scatter of as many bytes.
      rs[u] = then(op(K::kReduceScatter, reduce_bytes, host_x),
                   int8_reduce ? op(K::kReduceScatter, int8_reduce_bytes(model.units[u], G, H), cross_x)
                               : op(K::kReduceScatter, rb * H * n.reduce_shard_numel, cross_x));
    } else {
      rs[u] = int8_reduce ? op(K::kReduceScatter, int8_reduce_bytes(model.units[u], G, G), shard_x)
                          : op(K::kReduceScatter, reduce_bytes, shard_x);
    }
    if (int8_reduce) {
      // Quantising the blocks sent (on the communication thread after a host stage, counted here
      // as compute-thread copies either way) and decoding the n received into float32 and their
      // sum: the int8 all-gather's passes over the n x S' elements of the stage.
      const int64_t staged = (hs > 0 ? H : G) * n.reduce_shard_numel;
      pack_copy[u] += copy_s(kInt8EncodeBytesPerElem * staged + (kInt8DecodeBytesPerElem + 4 + 8) * staged);
    }
    if (st.shard_over == ShardOver::kHybridGroup && G < N) rep[u] = op(K::kAllReduce, rb * n.reduce_shard_numel, rep_x);
    if (ddp) {
      for (int64_t b : ddp_bucket_numels(model.units[u], setup.bucket_cap_bytes, rb)) {
        buckets[u].push_back(op(K::kAllReduce, rb * b, world_x));
      }
    }
  }

  ReplayQueues queues(kNumQueues);
  double t = 0.0, copied_s = 0.0;
  // Issues `o` on queue `q` (after `dep`): the compute thread goes on, less the op's cpu_s, where
  // communication overlaps compute or time-shares the cores; else it waits for the op.
  auto issue = [&](int q, const Op& o, ReplayQueues::OpId dep = {}) {
    const ReplayQueues::OpId id = queues.issue(q, t, o.queue_s, o.slowdown, dep);
    if (overlaps) {
      t += o.cpu_s;
    } else {
      t = queues.wait(t, id);
    }
    return id;
  };
  auto copy = [&](double d) {  // an engine copy on the compute thread
    t += d;
    copied_s += d;
  };
  for (int64_t mb = 0; mb < setup.accumulation_steps; ++mb) {
    const bool sync = mb + 1 == setup.accumulation_steps;
    const bool gathers = per_phase || sgo || (zero1 && mb == 0);
    std::vector<ReplayQueues::OpId> ready(U);
    std::vector<bool> gathered(U, false), copied(U, false), from_node(U, false);
    int counted = 0;
    // In backward a unit with a kept node-local shard (hpZ) gathers it over the node group.
    bool in_backward = false;
    auto gather = [&](int64_t u) {
      from_node[u] = in_backward && gn > 0 && u > 0;
      ready[u] = issue(kShardQueue, from_node[u] ? ag_node[u] : ag[u]);
      gathered[u] = true;
      copied[u] = false;
      if (u > 0 && bounded) ++counted;
    };
    // A unit's use waits for its all-gather, then copies the gathered buffer out (once per gather).
    auto use = [&](int64_t u) {
      if (!gathered[u]) return;
      t = queues.wait(t, ready[u]);
      if (!copied[u]) copy(from_node[u] ? node_copy[u] : unshard_copy[u]);
      copied[u] = true;
    };
    auto release = [&](int64_t u) {
      if (!gathered[u]) return;
      gathered[u] = false;
      if (u > 0 && bounded) --counted;
    };
    auto may_prefetch = [&](int64_t u) {
      return gathers && u >= 0 && u < U && has[u] && !gathered[u] &&
             (u == 0 || !bounded || counted < setup.max_unsharded_units);
    };
    // Forward: the root first (its embeddings cost no matmul), the blocks, then the root's head.
    for (int64_t u = 0; u < U; ++u) {
      if (gathers && has[u] && !gathered[u]) gather(u);
      use(u);
      if (ddp && mb == 0) copy(unshard_copy[u]);  // a cast copy of the changed shards (0 without a cast)
      if (setup.forward_prefetch && may_prefetch(u + 1)) gather(u + 1);
      if (u > 0) {
        t += fwd[u];
        if (per_phase) release(u);
      }
    }
    t += fwd[0];
    // Backward: the head first (the root stays gathered), then blocks in reverse order.
    in_backward = true;
    t += bwd[0];
    int64_t pending = -1;  // the unit whose reduce-scatter is in flight
    std::vector<ReplayQueues::OpId> rs_done(U);
    auto finish = [&](int64_t u) {
      t = queues.wait(t, rs_done[u]);
      copy(add_copy[u]);
    };
    auto reduce = [&](int64_t u) {
      if (!sync || !trains[u]) return;
      copy(pack_copy[u]);
      if (ddp) {
        for (const Op& d : buckets[u]) issue(kWorldQueue, d);
        return;
      }
      rs_done[u] = issue(kShardQueue, rs[u]);
      // hybrid's replica all-reduce, issued with it, starts once the reduce-scatter is done
      if (rep[u].queue_s > 0) rs_done[u] = issue(kReplicateQueue, rep[u], rs_done[u]);
      if (pending >= 0) finish(pending);
      pending = u;
    };
    for (int64_t u = U - 1; u >= 1; --u) {
      if (per_phase && has[u] && !gathered[u]) gather(u);
      use(u);
      if (per_phase && setup.backward_prefetch && u - 1 >= 1 && may_prefetch(u - 1)) gather(u - 1);
      t += bwd[u];
      reduce(u);
      if (per_phase || sgo) release(u);
    }
    reduce(0);  // the root's, from the end-of-backward callback
    if (pending >= 0) finish(pending);
    if (ddp && sync) {
      t = queues.wait_all(t, kWorldQueue);
      for (int64_t u = 0; u < U; ++u) {
        if (trains[u]) copy(add_copy[u]);  // buckets into the gradients
      }
    }
  }
  // After backward, on the compute thread: the finite check, the grad norm and the update.
  for (const auto& [on, bytes] : {std::pair{setup.nonfinite_check, 8 * N}, std::pair{setup.clip_grad_norm, int64_t{16}},
                                  std::pair{setup.loss_scaling, int64_t{8}}}) {
    if (!on) continue;
    const ReplayQueues::OpId id = issue(kWorldQueue, op(K::kAllReduce, bytes, world_x));  // moves t
    t = queues.wait(t, id);
  }
  t += update_s;

  StepTime r;
  r.flops = step_flops(model, setup);
  r.compute_s = r.flops / rate;
  if (profile.model_flops_per_s(setup.precision) <= 0) {
    r.matmul_efficiency = profile.efficiency(setup.precision, model.arch.n_embd);
  }
  r.update_s = update_s;
  r.copy_s = copied_s;
  for (const auto& c : step_traffic(model, par, setup).calls) {
    r.comm_s += op(c.kind, c.logical_bytes, group_placement(par, c.group)).queue_s;
  }
  r.step_s = t;
  r.exposed_comm_s = std::max(0.0, t - r.compute_s - r.update_s - r.copy_s);
  r.tokens_per_s = static_cast<double>(N * setup.accumulation_steps * setup.micro_batch_size * setup.seq_len) / t;
  r.model_flops = model_step_flops(model, setup);
  if (const double peak = profile.peak_flops_per_s(setup.precision); peak > 0 && t > 0) {
    r.mfu = r.model_flops / (t * peak);
    r.hfu = r.flops / (t * peak);
  }
  return r;
}

}  // namespace fsdp::planner
