#include "fsdp/planner/traffic.h"

#include <algorithm>

#include "fsdp/planner/memory.h"
#include "fsdp/runtime/strategy_traits.h"

namespace fsdp::planner {
namespace {

using S = fsdp::ShardingStrategy;
using K = fsdp::comm::CollectiveKind;

}  // namespace

const char* to_string(GroupKind g) {
  switch (g) {
    case GroupKind::kShard: return "shard";
    case GroupKind::kReplicate: return "replicate";
    case GroupKind::kWorld: return "world";
    case GroupKind::kNode: return "node";
    case GroupKind::kHost: return "host";
    case GroupKind::kCrossHost: return "cross_host";
  }
  return "?";
}

double ring_steps(K kind, int64_t n) {
  if (n <= 1) return 0.0;
  return static_cast<double>(kind == K::kAllReduce ? 2 * (n - 1) : n - 1);
}

double ring_wire_bytes(K kind, int64_t logical_bytes, int64_t n) {
  if (n <= 1) return 0.0;
  const double f = static_cast<double>(n - 1) / static_cast<double>(n);
  return (kind == K::kAllReduce ? 2.0 : 1.0) * f * static_cast<double>(logical_bytes);
}

bool group_crosses_nodes(const Parallelism& par, GroupKind group) {
  const int64_t N = par.world_size, node = par.node_size(), G = par.shard_group_size();
  if (N <= node) return false;
  switch (group) {
    case GroupKind::kWorld: return true;
    case GroupKind::kShard: return G > node || node % G != 0;  // some group straddles a node boundary
    case GroupKind::kReplicate: return N - G >= node;           // ranks r, r+G, ... beyond one node
    case GroupKind::kNode: {
      const int64_t g = par.node_group_size();
      return g > 0 && (g > node || node % g != 0);
    }
    case GroupKind::kHost: {
      const int64_t h = par.host_stage_size();
      return h > 0 && (h > node || node % h != 0);
    }
    case GroupKind::kCrossHost:  // ranks r, r + h, ... spanning the shard group
      return par.host_stage_size() > 0 && (G > node || node % G != 0);
  }
  return true;
}

GroupPlacement group_placement(const Parallelism& par, GroupKind group) {
  const int64_t N = par.world_size, node = par.node_size(), G = par.shard_group_size();
  GroupPlacement g;
  g.ranks = group == GroupKind::kShard       ? G
            : group == GroupKind::kReplicate ? N / G
            : group == GroupKind::kNode      ? std::max<int64_t>(1, par.node_group_size())
            : group == GroupKind::kHost      ? std::max<int64_t>(1, par.host_stage_size())
            : group == GroupKind::kCrossHost ? G / std::max<int64_t>(1, par.host_stage_size())
                                             : N;
  g.node_size = node;
  if (!group_crosses_nodes(par, group)) return g;
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  switch (group) {
    case GroupKind::kWorld: g.nodes = ceil_div(N, node); break;
    case GroupKind::kShard: g.nodes = std::max<int64_t>(2, ceil_div(G, node)); break;
    case GroupKind::kReplicate: g.nodes = ceil_div(g.ranks, G < node && node % G == 0 ? node / G : 1); break;
    case GroupKind::kNode: g.nodes = std::max<int64_t>(2, ceil_div(g.ranks, node)); break;
    case GroupKind::kHost: g.nodes = std::max<int64_t>(2, ceil_div(g.ranks, node)); break;
    case GroupKind::kCrossHost: {
      const int64_t h = par.host_stage_size();
      g.nodes = ceil_div(g.ranks, h < node && node % h == 0 ? node / h : 1);
      break;
    }
  }
  return g;
}

StepTraffic step_traffic(const ModelSpec& model, const Parallelism& par, const StepSetup& setup) {
  par.validate();
  setup.validate();
  const S s = par.strategy;
  const int64_t G = par.shard_group_size(), N = par.world_size;
  const int64_t pb = param_bytes_per_elem(setup.precision), rb = reduce_bytes_per_elem(setup.precision);
  std::vector<UnitNumbers> un;
  for (const auto& u : model.units) un.push_back(unit_numbers(u, G, 0));

  StepTraffic t;
  auto add = [&](K kind, GroupKind group, int64_t unit, int64_t bytes) {
    CollectiveCall c;
    c.kind = kind;
    c.group = group;
    c.group_size = group_placement(par, group).ranks;
    c.crosses_nodes = group_crosses_nodes(par, group);
    c.nodes = group_placement(par, group).nodes;
    c.unit = unit;
    c.logical_bytes = bytes;
    c.wire_bytes = ring_wire_bytes(kind, bytes, c.group_size);
    if (c.crosses_nodes && c.group_size > 1) {
      const double n = static_cast<double>(c.group_size);
      const double m = std::max(1.0, n / static_cast<double>(std::max<int64_t>(1, c.nodes)));
      c.inter_node_bytes = c.wire_bytes * (n - m) / (n - 1.0);
    }
    t.calls.push_back(c);
    KindTotals& k = kind == K::kAllGather       ? t.all_gather
                    : kind == K::kReduceScatter ? t.reduce_scatter
                    : kind == K::kAllToAll      ? t.all_to_all
                                                : t.all_reduce;
    k.calls += 1;
    k.logical_bytes += bytes;
    k.wire_bytes += c.wire_bytes;
  };
  const int64_t U = static_cast<int64_t>(model.units.size());
  // Host-aware collectives: across hosts (H ranks, H of the G blocks), then inside the host.
  const int64_t h = par.host_stage_size(), H = h > 0 ? G / h : 1;
  auto gather = [&](int64_t u) {
    if (un[u].numel == 0) return;
    const int64_t bytes = all_gather_bytes(setup, model.units[u], G);
    if (h > 0) add(K::kAllGather, GroupKind::kCrossHost, u, bytes / G * H);
    add(K::kAllGather, h > 0 ? GroupKind::kHost : GroupKind::kShard, u, bytes);
  };
  const bool int8_reduce = setup.reduce_scatter_codec == fsdp::WireCodec::kInt8 && G > 1;
  auto reduce = [&](int64_t u) {
    const int64_t bytes = rb * un[u].reduce_numel;
    if (h > 0) {
      add(K::kReduceScatter, GroupKind::kHost, u, bytes);
      if (int8_reduce) {
        add(K::kAllToAll, GroupKind::kCrossHost, u, int8_reduce_bytes(model.units[u], G, H));
      } else {
        add(K::kReduceScatter, GroupKind::kCrossHost, u, rb * H * un[u].reduce_shard_numel);
      }
    } else if (int8_reduce) {
      add(K::kAllToAll, GroupKind::kShard, u, int8_reduce_bytes(model.units[u], G, G));
    } else {
      add(K::kReduceScatter, GroupKind::kShard, u, bytes);
    }
  };
  // hpZ: the backward's gather of a kept node-local shard (param dtype, never int8 encoded).
  const int64_t gn = par.node_group_size();
  auto gather_back = [&](int64_t u) {
    if (gn == 0) return gather(u);
    if (un[u].numel > 0) {
      add(K::kAllGather, GroupKind::kNode, u, gn * unit_numbers(model.units[u], gn, 0).shard_numel * pb);
    }
  };
  const StrategyTraits& st = traits_of(s);
  const bool per_phase = st.gathers_params && st.reshard_after_forward;
  for (int64_t mb = 0; mb < setup.accumulation_steps; ++mb) {
    const bool sync = mb + 1 == setup.accumulation_steps;
    // Forward, in forward order (the root first).
    if (st.gathers_params && (!st.lazy_gather || mb == 0)) {
      for (int64_t u = 0; u < U; ++u) gather(u);
    }
    // Backward, in reverse order; the root (units[0]) last, at the end-of-backward callback.
    for (int64_t u = U - 1; u >= 0; --u) {
      if (per_phase && u > 0) gather_back(u);
      if (!sync || un[u].trainable_numel == 0) continue;
      if (st.grad_sync == GradSync::kBuckets) {
        for (int64_t n : ddp_bucket_numels(model.units[u], setup.bucket_cap_bytes, rb)) {
          add(K::kAllReduce, GroupKind::kWorld, u, rb * n);
        }
        continue;
      }
      reduce(u);
      if (st.shard_over == ShardOver::kHybridGroup && G < N) add(K::kAllReduce, GroupKind::kReplicate, u, rb * un[u].reduce_shard_numel);
    }
  }
  if (setup.clip_grad_norm) add(K::kAllReduce, GroupKind::kWorld, -1, 16);  // 2 doubles
  if (setup.loss_scaling) add(K::kAllReduce, GroupKind::kWorld, -1, 8);     // one int64 flag
  if (setup.nonfinite_check) add(K::kAllReduce, GroupKind::kWorld, -1, 8 * N);  // an int64 per rank
  return t;
}

}  // namespace fsdp::planner
