// Tier `unit`: the planner's model of the slow-link options (include/fsdp/planner/): int8
// all-gathers (bytes of the payload formula, nothing else changes) and reshard after forward to a
// node-local group (the backward's gathers on the node, the kept shards in the peak, refusals).
#include <gtest/gtest.h>

#include <algorithm>

#include "fsdp/comm/block_quant.h"
#include "fsdp/planner/memory.h"
#include "fsdp/planner/model_spec.h"
#include "fsdp/planner/plan.h"
#include "fsdp/planner/profile.h"
#include "fsdp/planner/time_model.h"
#include "fsdp/planner/traffic.h"
#include "fsdp/shard/layout.h"
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
      const fp::UnitSpec& u = m.units[a.calls[i].unit];
      EXPECT_EQ(a.calls[i].logical_bytes, 2 * 4 * fp::unit_numbers(u, 2, 0).shard_numel);
      std::vector<int64_t> segments;  // blocks restart at every param's padded shard
      for (const auto& p : u.params) segments.push_back(fsdp::shard::ParamShardSpec::make(p.shape, 2).padded_shard_numel());
      want += 2 * fsdp::comm::int8_payload_bytes(segments);
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
  // "host" (-1) where the shard group lies inside a node (4 ranks, 8 per node): off, as fsdp-train's.
  fp::PlanInputs in;
  in.model = fp::gpt_model(fp::gpt_shape("micro", 8192));
  in.world_size = 4;
  in.strategy = S::kFullShard;
  in.reshard_after_forward_group_size = -1;
  in.profile = fp::builtin_profile("h100");
  EXPECT_EQ(fp::make_plan(in).strategies.at(0).parallelism.label(), "full_shard");
  in.reshard_after_forward_group_size = 3;
  EXPECT_THROW(fp::make_plan(in), fsdp::Error);
}

// no_shard (DDP), recommended wherever it fits, on a 200 Mbit/s link between nodes of 2 ranks: the
// note names full_shard with every slow-link option, which the planner prices far below it.
TEST(PlannerSlowLinks, ABandwidthBoundNoShardNamesFullShardWithTheOptions) {
  fp::PlanInputs in;
  in.model = fp::gpt_model(fp::gpt_shape("gpt2", 8192));
  in.world_size = 4;
  in.ranks_per_node = 2;
  in.profile = fp::builtin_profile("h100");
  in.profile.nics_per_node = 1;
  for (auto* l : {&in.profile.all_gather, &in.profile.reduce_scatter, &in.profile.all_reduce}) {
    l->inter_node.bandwidth_bytes_per_s = 25e6;
  }
  const fp::Plan plan = fp::make_plan(in);
  ASSERT_EQ(plan.recommendation.choice.label(), "no_shard");
  const auto notes = fp::slow_link_notes(in, plan);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("no_shard is bandwidth-bound here"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("with --strategy full_shard --all-gather-codec int8 --reshard-after-forward host "
                          "--host-aware-collectives host --reduce-scatter-codec int8 (full_shard(node=2,host=2))"),
            std::string::npos)
      << notes[0];
  // One node: nothing crosses a link, nothing to say.
  in.ranks_per_node = 4;
  EXPECT_TRUE(fp::slow_link_notes(in, fp::make_plan(in)).empty());
}

// A plan bandwidth-bound on slow links between nodes (h100's inter-node links at 1/100) says which
// fsdp-train flags would shorten its step, and by how much; with fast links it says nothing.
TEST(PlannerSlowLinks, ABandwidthBoundPlanNamesTheSlowLinkFlags) {
  fp::PlanInputs in;
  in.model = fp::llama_model(fp::llama_shape("llama2-7b"));
  in.world_size = 16;
  in.ranks_per_node = 8;
  in.memory_per_rank_bytes = int64_t{12} * 1000 * 1000 * 1000;  // full_shard only (16P/16 = 6.7 GB)
  in.step.precision = fp::Precision::kBf16;
  in.step.seq_len = 1024;
  in.step.activation_checkpointing = true;
  in.profile = fp::builtin_profile("h100");
  const fp::Plan fast = fp::make_plan(in);
  ASSERT_EQ(fast.recommendation.choice.label(), "full_shard");
  EXPECT_TRUE(fp::slow_link_notes(in, fast).empty()) << "NVLink and 8 NICs per node hide it";
  for (auto* l : {&in.profile.all_gather, &in.profile.reduce_scatter, &in.profile.all_reduce}) {
    l->inter_node.bandwidth_bytes_per_s /= 100;
  }
  const fp::Plan slow = fp::make_plan(in);
  ASSERT_EQ(slow.recommendation.choice.label(), "full_shard");
  const auto notes = fp::slow_link_notes(in, slow);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("full_shard is bandwidth-bound here"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("--all-gather-codec int8 --reshard-after-forward host --host-aware-collectives host "
                          "--reduce-scatter-codec int8 (full_shard(node=8,host=8))"),
            std::string::npos)
      << notes[0];
  EXPECT_NE(std::find(slow.notes.begin(), slow.notes.end(), notes[0]), slow.notes.end()) << "in the plan's notes";
  // Asked with the flags already, it has nothing to add.
  in.step.all_gather_codec = fsdp::WireCodec::kInt8;
  in.reshard_after_forward_group_size = -1;
  in.collective_host_size = -1;
  in.step.reduce_scatter_codec = fsdp::WireCodec::kInt8;
  const fp::Plan with_flags = fp::make_plan(in);
  ASSERT_EQ(with_flags.recommendation.choice.label(), "full_shard(node=8,host=8)");
  EXPECT_TRUE(fp::slow_link_notes(in, with_flags).empty());
  // Host-aware, only the cross-host stages cross nodes: H = 2 of the 16 blocks per all-gather.
  const fp::StrategyPlan* fs = nullptr;
  for (const auto& sp : with_flags.strategies) {
    if (sp.parallelism.label() == "full_shard(node=8,host=8)") fs = &sp;
  }
  ASSERT_NE(fs, nullptr);
  double crossing = 0;
  for (const auto& c : fs->traffic.calls) {
    if (c.kind != fsdp::comm::CollectiveKind::kAllGather) continue;
    if (c.crosses_nodes) {
      EXPECT_EQ(c.group, fp::GroupKind::kCrossHost);
      EXPECT_EQ(c.group_size, 2);
      crossing += c.logical_bytes;
    }
  }
  EXPECT_GT(crossing, 0);
  // The bytes received across nodes (fsdp-train's comm.inter_host_bytes, [Note: host traffic]): a
  // cross-host stage has one rank per node, so all it receives crosses; a group of 16 ranks over
  // 2 nodes receives 8 of every 15 parts from the other node.
  double inter = 0;
  for (const auto& c : fs->traffic.calls) {
    if (c.group == fp::GroupKind::kCrossHost) EXPECT_DOUBLE_EQ(c.inter_node_bytes, c.wire_bytes);
    if (c.group == fp::GroupKind::kHost) EXPECT_EQ(c.inter_node_bytes, 0.0);
    if (c.group == fp::GroupKind::kWorld) EXPECT_DOUBLE_EQ(c.inter_node_bytes, c.wire_bytes * 8 / 15);
    inter += c.inter_node_bytes;
  }
  EXPECT_DOUBLE_EQ(fs->traffic.inter_node_bytes(), inter);
  for (const auto& sp : slow.strategies) {
    if (sp.parallelism.label() != "full_shard") continue;
    for (const auto& c : sp.traffic.calls) {
      if (c.group == fp::GroupKind::kShard) EXPECT_DOUBLE_EQ(c.inter_node_bytes, c.wire_bytes * 8 / 15);
    }
    EXPECT_GT(sp.traffic.inter_node_bytes(), 8 * fs->traffic.inter_node_bytes()) << "all four options: >= 8x fewer";
  }
}
