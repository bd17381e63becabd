// Tier `unit`: the planner's model of the slow-link options (include/fsdp/planner/): int8
// all-gathers (bytes of the payload formula, nothing else changes) and reshard after forward to a
// node-local group (the backward's gathers on the node, the kept shards in the peak, refusals).
#include <gtest/gtest.h>

#include "fsdp/comm/block_quant.h"
#include "fsdp/planner/memory.h"
#include "fsdp/planner/model_spec.h"
#include "fsdp/planner/profile.h"
#include "fsdp/planner/time_model.h"
#include "fsdp/planner/traffic.h"
#include "planner_test_helpers.h"

namespace fp = fsdp::planner;
using S = fsdp::ShardingStrategy;
using planner_test::par;

TEST(PlannerSlowLinks, Int8AllGathersCarryThePayloadsOnly) {
  const fp::ModelSpec m = fp::gpt_model(fp::gpt_shape("micro", 8192));
  fp::StepSetup exact, int8;
  int8.all_gather_codec = fsdp::WireCodec::kInt8;
  for (S s : {S::kFullShard, S::kShardGradOp, S::kZero1}) {
    const fp::StepTraffic a = fp::step_traffic(m, par(s, 2), exact), b = fp::step_traffic(m, par(s, 2), int8);
    ASSERT_EQ(a.calls.size(), b.calls.size());
    int64_t want = 0;  // every all-gather: 2 payloads of the unit's shard
    for (size_t i = 0; i < a.calls.size(); ++i) {
      if (a.calls[i].kind != fsdp::comm::CollectiveKind::kAllGather) {
        EXPECT_EQ(b.calls[i].logical_bytes, a.calls[i].logical_bytes) << "only all-gathers change";
        continue;
      }
      const int64_t S_u = fp::unit_numbers(m.units[a.calls[i].unit], 2, 0).shard_numel;
      EXPECT_EQ(a.calls[i].logical_bytes, 2 * 4 * S_u);
      want += 2 * fsdp::comm::int8_payload_bytes(S_u);
    }
    EXPECT_EQ(b.all_gather.logical_bytes, want) << fsdp::to_string(s);
    EXPECT_EQ(b.all_gather.calls, a.all_gather.calls);
    EXPECT_EQ(fp::peak_bytes(m, par(s, 2), int8).peak_bytes, fp::peak_bytes(m, par(s, 2), exact).peak_bytes);
  }
  EXPECT_EQ(fp::step_traffic(m, par(S::kNoShard, 2), int8).logical_bytes(),
            fp::step_traffic(m, par(S::kNoShard, 2), exact).logical_bytes())
      << "no_shard has no all-gather to encode";
}

// 8 ranks on 2 nodes of 4, full_shard, hpZ over each node: the forward's gathers span the nodes,
// the backward's (one per block: the root stays gathered) stay on one, 4 x S_4 x 4 bytes each.
TEST(PlannerSlowLinks, NodeLocalReshardMovesTheBackwardGathersOntoTheNode) {
  const fp::ModelSpec m = fp::gpt_model(fp::gpt_shape("micro", 8192));
  fp::StepSetup st;
  fp::Parallelism plain = par(S::kFullShard, 8, 0, 4), node = plain;
  node.reshard_after_forward_group_size = 4;
  EXPECT_EQ(node.label(), "full_shard(node=4)");
  EXPECT_EQ(node.node_group_size(), 4);
  const fp::StepTraffic a = fp::step_traffic(m, plain, st), b = fp::step_traffic(m, node, st);
  EXPECT_EQ(b.all_gather.calls, a.all_gather.calls);
  int64_t on_node = 0, crossing = 0;
  for (const auto& c : b.calls) {
    if (c.kind != fsdp::comm::CollectiveKind::kAllGather) continue;
    if (c.group == fp::GroupKind::kNode) {
      ++on_node;
      EXPECT_FALSE(c.crosses_nodes);
      EXPECT_EQ(c.group_size, 4);
      EXPECT_EQ(c.logical_bytes, 4 * 4 * fp::unit_numbers(m.units[c.unit], 4, 0).shard_numel);
      EXPECT_GT(c.unit, 0) << "the root keeps its params through backward";
    } else {
      ++crossing;
      EXPECT_TRUE(c.crosses_nodes);
    }
  }
  EXPECT_EQ(on_node, static_cast<int64_t>(m.units.size()) - 1);
  EXPECT_EQ(crossing, static_cast<int64_t>(m.units.size()));
  // Memory: micro's step peaks in the backward of h.4 (units[5]) with and without; then h.3 is
  // gathered already (prefetched: its shard went into the gather) and h.0 to h.2 still hold theirs.
  const fp::PeakBytes pa = fp::peak_bytes(m, plain, st), pb = fp::peak_bytes(m, node, st);
  int64_t kept = 0;
  for (size_t u = 1; u <= 3; ++u) kept += 4 * fp::unit_numbers(m.units[u], 4, 0).shard_numel;
  EXPECT_EQ(pa.moment, "backward of h.4");
  EXPECT_EQ(pb.moment, "backward of h.4");
  EXPECT_EQ(pb.node_shard_bytes, kept);
  EXPECT_EQ(pb.peak_bytes, pa.peak_bytes + kept);
  // Time: on a profile whose links between nodes are slower, the node's gathers are cheaper.
  const fp::DeviceProfile h100 = fp::builtin_profile("h100");
  EXPECT_LT(fp::estimate_step_time(m, node, st, h100).comm_s, fp::estimate_step_time(m, plain, st, h100).comm_s);
}

TEST(PlannerSlowLinks, NodeLocalReshardIsRefusedWhereItCannotApply) {
  fp::Parallelism p = par(S::kShardGradOp, 8, 0, 4);
  p.reshard_after_forward_group_size = 4;
  EXPECT_THROW(p.validate(), fsdp::Error);
  p = par(S::kFullShard, 8, 0, 4);
  p.reshard_after_forward_group_size = 3;
  EXPECT_THROW(p.validate(), fsdp::Error);
  p.reshard_after_forward_group_size = 8;
  EXPECT_NO_THROW(p.validate());
  EXPECT_EQ(p.node_group_size(), 0) << "the whole shard group: nothing kept";
  EXPECT_EQ(p.label(), "full_shard");
}
