// One collective's modeled seconds (time_model.h collective_time_s): a calibrated node's measured
// points, the single-ring alpha-beta model, or NCCL's rings and trees over nodes of GPUs with their
// own network adapters. docs/planner.md, "Collectives" and "Collectives across nodes".
#include <algorithm>
#include <cmath>

#include "fsdp/planner/time_model.h"

namespace fsdp::planner {
namespace {

using K = fsdp::comm::CollectiveKind;

// Piecewise-linear in x through `pts` (x > 0 strictly ascending, y >= 0 non-decreasing, at least
// 2): the first point's y below it; past the last point, the last point's y per x times x (its
// rate), so the result is never below a smaller x's.
double interpolate(const std::vector<std::pair<double, double>>& pts, double x) {
  if (x <= pts.front().first) return pts.front().second;
  if (x >= pts.back().first) return pts.back().second * x / pts.back().first;
  std::size_t i = 1;
  while (x > pts[i].first) ++i;
  const auto& [x0, y0] = pts[i - 1];
  const auto& [x1, y1] = pts[i];
  return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

// A calibrated node: the measured points, per ring step against the ring's chunk (logical bytes /
// ranks), their seconds made non-decreasing in bytes (the running maximum: a larger message takes
// no less time, while measured medians can dip by a few percent); at the calibration's world size
// the measured seconds wherever they rise.
double measured_s(const DeviceProfile& profile, int kind_index, K kind, int64_t logical_bytes, int64_t n) {
  const int64_t nc = profile.calibration_world_size;
  std::vector<std::pair<double, double>> per_step;
  double most_s = 0.0;
  for (const CalibrationPoint& p : profile.fits[kind_index].points) {
    most_s = std::max(most_s, p.seconds);
    per_step.emplace_back(static_cast<double>(p.logical_bytes) / static_cast<double>(nc),
                          most_s / ring_steps(kind, nc));
  }
  return ring_steps(kind, n) * interpolate(per_step, static_cast<double>(logical_bytes) / static_cast<double>(n));
}

// The share of a node's network a group crossing nodes has while the other groups of its kind
// cross it beside it: its ranks on the node (n / m) over the node's ranks.
double node_link_share(const GroupPlacement& group) {
  return static_cast<double>(group.ranks) / static_cast<double>(std::max<int64_t>(1, group.nodes)) /
         static_cast<double>(std::max<int64_t>(1, group.node_size));
}

// [Note: collectives across nodes] NCCL builds one ring (channel) per network adapter; each ring
// visits the node's GPUs over NVLink and leaves the node through its own adapter, so every ring
// carries 1/k of the data and a node's ring bytes (the same (n-1)/n or 2(n-1)/n of the message
// whatever the node's size) leave through all k adapters at once. A rank's bus bandwidth is then
// the slower of its NVLink and the node's k adapters; where other groups of the same kind run
// beside this one (hybrid's replica groups: one rank per node each), the adapters are shared in
// proportion to the ranks each group has on the node. Latency: a fixed cost, one NVLink hop per
// ring step within a node, one network hop per step between nodes. All-reduce may also run NCCL's
// double binary tree (a chain within each node): latency logarithmic in the nodes, bandwidth
// 2 x bytes / bus bandwidth; NCCL's tuner takes the faster, and so does the model.
double nccl_s(const DeviceProfile& profile, K kind, int64_t logical_bytes, const GroupPlacement& group) {
  const CollectiveLinks& l = profile.links(kind);
  const int64_t n = group.ranks, m = std::max<int64_t>(1, group.nodes);
  const double g = static_cast<double>(n) / static_cast<double>(m);
  double bus = l.intra_node.bandwidth_bytes_per_s;
  if (m > 1) {
    bus = std::min(bus, static_cast<double>(profile.nics_per_node) * node_link_share(group) *
                            l.inter_node.bandwidth_bytes_per_s);
  }
  const double steps = ring_steps(kind, n), inter_steps = ring_steps(kind, m);
  const double ring = profile.collective_base_latency_s + (steps - inter_steps) * l.intra_node.alpha_s +
                      inter_steps * l.inter_node.alpha_s + ring_wire_bytes(kind, logical_bytes, n) / bus;
  if (kind != K::kAllReduce) return ring;
  const double tree = profile.collective_base_latency_s +
                      2.0 * ((g - 1.0) * l.intra_node.alpha_s +
                             std::ceil(std::log2(static_cast<double>(m))) * l.inter_node.alpha_s) +
                      2.0 * static_cast<double>(logical_bytes) / bus;
  return std::min(ring, tree);
}

}  // namespace

double collective_time_s(const DeviceProfile& profile, K kind, int64_t logical_bytes, const GroupPlacement& group) {
  const int64_t n = group.ranks;
  if (n <= 1) return 0.0;
  const CollectiveLinks& l = profile.links(kind);
  const bool crosses_nodes = group.nodes > 1;
  const int kind_index = kind == K::kAllGather ? 0 : kind == K::kReduceScatter ? 1 : kind == K::kAllReduce ? 2 : -1;
  if (!crosses_nodes && kind_index >= 0 && profile.has_measured_points()) {
    return measured_s(profile, kind_index, kind, logical_bytes, n);
  }
  if (profile.nics_per_node > 0) return nccl_s(profile, kind, logical_bytes, group);
  const LinkProfile& link = crosses_nodes ? l.inter_node : l.intra_node;
  // A node's one link, shared by the groups of this kind that cross it at once.
  const double bw = crosses_nodes ? std::min(node_link_share(group) * l.inter_node.bandwidth_bytes_per_s,
                                             l.intra_node.bandwidth_bytes_per_s)
                                  : link.bandwidth_bytes_per_s;
  return ring_steps(kind, n) * link.alpha_s + ring_wire_bytes(kind, logical_bytes, n) / bw;
}

double collective_time_s(const DeviceProfile& profile, K kind, int64_t logical_bytes, int64_t n, bool crosses_nodes) {
  GroupPlacement g;
  g.ranks = n;
  g.node_size = std::max<int64_t>(1, profile.ranks_per_node);
  g.nodes = crosses_nodes ? std::max<int64_t>(2, (n + g.node_size - 1) / g.node_size) : 1;
  return collective_time_s(profile, kind, logical_bytes, g);
}

double bus_bandwidth_bytes_per_s(K kind, int64_t logical_bytes, int64_t n, double seconds) {
  if (n <= 1 || seconds <= 0) return 0.0;
  return ring_wire_bytes(kind, logical_bytes, n) / seconds;
}

}  // namespace fsdp::planner
