// Tier `dist`: host-aware collectives (FullyShardOptions::collective_host_size) and int8
// reduce-scatters (FullyShardOptions::reduce_scatter_codec, ZeRO++'s qgZ) through fully_shard on a
// threaded group of 4 ranks posing as 2 hosts of 2. Oracles: the gradients of a single-process
// model (host-aware stages move the same values); for int8, each rank's unsharded gradient laid
// out in the public FlatLayout, every block quantised and decoded by itself, averaged in rank
// order ([Note: host-aware collectives]); the bytes that cross hosts, from CommStats' host split.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/error_of.h"
#include "../common/flat_blocks.h"
#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "../common/step_comm.h"
#include "../common/threaded.h"
#include "fsdp/comm/block_quant.h"
#include "fsdp/comm/threaded_backend.h"
#include "fsdp/fsdp.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;

namespace host_aware_test {

constexpr int kWorld = 4, kPerHost = 2;
const std::vector<int64_t> kWidths{30, 40, 5};  // l0: 40 x 30 + 40, l1: 5 x 40 + 5

void run_on_hosts(const std::function<void(int, fsdp::comm::ProcessGroupPtr)>& fn) {
  auto groups = fsdp::comm::threaded_world(kWorld, kPerHost);
  on_threads(kWorld, [&](int r) { fn(r, groups[r]); });
}

Chain sharded(const fsdp::comm::ProcessGroupPtr& g, const fsdp::FullyShardOptions& o,
              const std::vector<int64_t>& widths = kWidths, uint64_t seed = 11) {
  Chain model = seeded_chain(widths, seed);
  for (auto& l : model->layers) fsdp::fully_shard(l.ptr(), g, o);
  fsdp::fully_shard(model.ptr(), g, o);
  return model;
}

// One step of `flat`, then one of `host`, on this rank's 3 rows of (x, y); s[0..2]: the group's
// counters before, between and after.
void step_both(Chain& flat, Chain& host, const fsdp::comm::ProcessGroupPtr& g, const at::Tensor& x, const at::Tensor& y,
               int rank, fsdp::comm::CommStats::Snapshot* s) {
  s[0] = g->stats().snapshot();
  F::mse_loss(fsdp::call(flat, x.narrow(0, 3 * rank, 3)), y.narrow(0, 3 * rank, 3)).backward();
  s[1] = g->stats().snapshot();
  F::mse_loss(fsdp::call(host, x.narrow(0, 3 * rank, 3)), y.narrow(0, 3 * rank, 3)).backward();
  s[2] = g->stats().snapshot();
}

// Bytes of a kind this rank exchanged with other hosts between two snapshots.
int64_t inter_host(const fsdp::comm::CommStats::Snapshot& a, const fsdp::comm::CommStats::Snapshot& b,
                   fsdp::comm::CollectiveKind k) {
  return b[static_cast<int>(k)].inter_host_bytes - a[static_cast<int>(k)].inter_host_bytes;
}

// One block quantised and decoded alone (blocks restart at every param).
at::Tensor roundtrip(const at::Tensor& row, const fsdp::shard::FlatLayout& layout) {
  std::vector<int64_t> segments;
  for (const auto& p : layout.params) segments.push_back(p.padded_shard_numel());
  at::Tensor out = at::empty({1, row.numel()});
  fsdp::comm::int8_block_dequantize(fsdp::comm::int8_block_quantize(row.contiguous(), segments).unsqueeze(0),
                                    segments, out);
  return out[0];
}

// Every rank's local gradients of layer i (weight, bias), from a single-process replica each.
std::vector<std::vector<at::Tensor>> local_grads(int i) {
  std::vector<std::vector<at::Tensor>> out;
  const auto [x, y] = regression_batch(0, 3 * kWorld, 30, 5);
  for (int r = 0; r < kWorld; ++r) {
    Chain m = seeded_chain(kWidths, 11);
    F::mse_loss(m->forward(x.narrow(0, 3 * r, 3)), y.narrow(0, 3 * r, 3)).backward();
    out.push_back({m->layers[i]->weight.grad(), m->layers[i]->bias.grad()});
  }
  return out;
}

// The mean of rows in rank order, as the int8 stage's decode adds them.
at::Tensor mean_in_order(const std::vector<at::Tensor>& rows) {
  at::Tensor s = rows[0].clone();
  for (size_t q = 1; q < rows.size(); ++q) s.add_(rows[q]);
  return s.div_(static_cast<double>(rows.size()));
}

fsdp::FullyShardOptions options(int host_size, fsdp::WireCodec ag, fsdp::WireCodec rs) {
  fsdp::FullyShardOptions o;
  o.collective_host_size = host_size;
  o.all_gather_codec = ag;
  o.reduce_scatter_codec = rs;
  return o;
}

}  // namespace host_aware_test

using namespace host_aware_test;
using fsdp::WireCodec;
using K = fsdp::comm::CollectiveKind;

// full_shard over 2 hosts of 2: with hosts of 2 every gather and reduce-scatter runs in two stages
// (twice the calls) and half the bytes cross hosts, each all-gather's output is the same
// (gradients of a single-process model, and with the int8 all-gather those of the flat int8 run,
// to the rounding of the reduce-scatter's other order); the node-local reshard on the same group
// composes with it.
TEST(HostAwareCollectives, SameValuesHalfTheBytesAcrossHosts) {
  for (const bool int8_ag : {false, true}) {
    for (const int node : {0, kPerHost}) {
      SCOPED_TRACE(std::string(int8_ag ? "int8" : "fp32") + " gathers, node-local reshard " + std::to_string(node));
      run_on_hosts([&](int rank, fsdp::comm::ProcessGroupPtr g) {
        const WireCodec ag = int8_ag ? WireCodec::kInt8 : WireCodec::kNone;
        auto flat_o = options(0, ag, WireCodec::kNone), host_o = options(kPerHost, ag, WireCodec::kNone);
        host_o.reshard_after_forward_group_size = node;
        Chain flat = sharded(g, flat_o), host = sharded(g, host_o);
        const auto [x, y] = regression_batch(0, 3 * kWorld, 30, 5);
        Chain ref = seeded_chain(kWidths, 11);
        F::mse_loss(ref->forward(x), y).backward();
        fsdp::comm::CommStats::Snapshot s[3];
        step_both(flat, host, g, x, y, rank, s);
        const StepComm cf = delta(s[0], s[1]), ch = delta(s[1], s[2]);
        // Each layer gathers in forward and again in backward (two stages each when host-aware;
        // one, inside the node, for the backward's node-local gather).
        EXPECT_EQ(cf.ag_calls, 4);
        EXPECT_EQ(ch.ag_calls, node ? 2 * 2 + 2 : 2 * 4);
        EXPECT_EQ(cf.rs_calls, 2);
        EXPECT_EQ(ch.rs_calls, 2 * 2);
        // The forward's gathers and every reduce-scatter cross hosts with half the bytes.
        const int64_t flat_ag = inter_host(s[0], s[1], K::kAllGather), host_ag = inter_host(s[1], s[2], K::kAllGather);
        EXPECT_GT(flat_ag, 0);
        // (with the node-local reshard only the forward's gathers leave the host)
        EXPECT_EQ(host_ag * (node ? 4 : 2), flat_ag) << "flat " << flat_ag << ", host-aware " << host_ag;
        const int64_t flat_rs = inter_host(s[0], s[1], K::kReduceScatter), host_rs = inter_host(s[1], s[2], K::kReduceScatter);
        EXPECT_GT(flat_rs, 0);
        EXPECT_EQ(host_rs * 2, flat_rs);

        const auto refs = params_by_name(ref.ptr());
        const auto flat_grads = fsdp::sharded_parameters(flat.ptr());
        const auto host_params = fsdp::sharded_parameters(host.ptr());
        ASSERT_EQ(flat_grads.size(), host_params.size());
        for (size_t i = 0; i < host_params.size(); ++i) {
          const auto& sp = host_params[i];
          const at::Tensor grad = fsdp::gather_full_tensor(*sp.unit, *sp.param, /*grad=*/true);
          const at::Tensor flat_grad = fsdp::gather_full_tensor(*flat_grads[i].unit, *flat_grads[i].param, true);
          // The two-stage average adds in another order than the flat one: equal to rounding.
          expect_close(grad, flat_grad, 1e-5, 1e-7, "grad of " + sp.name + " vs the flat run");
          if (!int8_ag) expect_close(grad, refs.at(sp.name).grad(), 1e-5, 1e-6, "grad of " + sp.name);
        }
      });
    }
  }
}

// int8 reduce-scatters: flat (each block quantised once, averaged in float32 by its owner), across
// hosts after a full-precision host stage, and under hybrid_shard (the replicas' all-reduce of
// the decoded block). Each result equals its oracle computed from the ranks' local gradients.
TEST(Int8ReduceScatter, BlocksAreAveragedFromTheirQuantisedValues) {
  struct Case {
    const char* name;
    fsdp::ShardingStrategy strategy;
    int hybrid, host;
  };
  for (const Case c : {Case{"full_shard", fsdp::ShardingStrategy::kFullShard, 0, 0},
                       Case{"full_shard across hosts", fsdp::ShardingStrategy::kFullShard, 0, kPerHost},
                       Case{"hybrid_shard (G = 2)", fsdp::ShardingStrategy::kHybridShard, 2, 0}}) {
    SCOPED_TRACE(c.name);
    const int G = c.hybrid ? c.hybrid : kWorld;
    // Expected full gradients of each layer.
    std::vector<std::vector<at::Tensor>> expected;
    std::vector<std::vector<at::Tensor>> exact;
    for (int i = 0; i < 2; ++i) {
      const auto local = local_grads(i);
      const auto layout = fsdp::shard::FlatLayout::make({local[0][0].sizes().vec(), local[0][1].sizes().vec()}, G);
      std::vector<at::Tensor> blocks;
      for (const auto& l : local) blocks.push_back(fsdp_test::to_blocks(l, layout));
      at::Tensor out = at::zeros({G, layout.shard_numel()});
      if (c.host) {
        // Rank (k, p)'s block: the mean over hosts k' of the decoded host-k' average of it.
        for (int t = 0; t < G; ++t) {
          std::vector<at::Tensor> rows;
          for (int k = 0; k < G / kPerHost; ++k) {
            at::Tensor host_avg = blocks[k * kPerHost][t].clone();
            for (int p = 1; p < kPerHost; ++p) host_avg.add_(blocks[k * kPerHost + p][t]);
            rows.push_back(roundtrip(host_avg.div_(kPerHost), layout));
          }
          out[t].copy_(mean_in_order(rows));
        }
      } else {
        // Each shard group's owner averages the decoded blocks; the replicas then average those.
        std::vector<at::Tensor> per_group;
        for (int j = 0; j < kWorld / G; ++j) {
          at::Tensor grp = at::zeros({G, layout.shard_numel()});
          for (int t = 0; t < G; ++t) {
            std::vector<at::Tensor> rows;
            for (int r = j * G; r < (j + 1) * G; ++r) rows.push_back(roundtrip(blocks[r][t], layout));
            grp[t].copy_(mean_in_order(rows));
          }
          per_group.push_back(grp);
        }
        out = per_group.size() == 1 ? per_group[0] : (per_group[0] + per_group[1]) / 2;
      }
      expected.push_back(fsdp_test::from_blocks(out, layout, local[0]));
      exact.push_back({(local[0][0] + local[1][0] + local[2][0] + local[3][0]) / 4,
                       (local[0][1] + local[1][1] + local[2][1] + local[3][1]) / 4});
    }
    run_on_hosts([&](int rank, fsdp::comm::ProcessGroupPtr g) {
      auto o = options(c.host, WireCodec::kNone, WireCodec::kInt8);
      o.strategy = c.strategy;
      o.hybrid_shard_group_size = c.hybrid;
      Chain model = sharded(g, o);
      const auto [x, y] = regression_batch(0, 3 * kWorld, 30, 5);
      const auto before = g->stats().snapshot();
      F::mse_loss(fsdp::call(model, x.narrow(0, 3 * rank, 3)), y.narrow(0, 3 * rank, 3)).backward();
      const auto after = g->stats().snapshot();
      const int a2a = static_cast<int>(K::kAllToAll);
      EXPECT_EQ(after[a2a].calls - before[a2a].calls, 2) << "one int8 all-to-all per unit";
      EXPECT_EQ(delta(before, after).rs_calls, c.host ? 2 : 0) << "the host stage only";
      for (const auto& sp : fsdp::sharded_parameters(model.ptr())) {
        const int i = sp.name.find("l0.") == 0 ? 0 : 1;
        const int which = sp.name.find("weight") != std::string::npos ? 0 : 1;
        const at::Tensor grad = fsdp::gather_full_tensor(*sp.unit, *sp.param, /*grad=*/true);
        expect_close(grad, expected[i][which], 1e-5, 1e-7, "grad of " + sp.name);
        EXPECT_GT((grad - exact[i][which]).abs().max().item<double>(), 1e-7)
            << sp.name << ": the exact average, so the codec did not act";
        EXPECT_LT((grad - exact[i][which]).abs().max().item<double>(), exact[i][which].abs().max().item<double>() / 50)
            << sp.name;
      }
    });
  }
}

// Options that cannot apply are refused at fully_shard with one line naming them.
TEST(HostAwareCollectives, RefusedWhereTheyCannotApply) {
  run_on_hosts([&](int, fsdp::comm::ProcessGroupPtr g) {
    auto no_shard = options(0, WireCodec::kNone, WireCodec::kInt8);
    no_shard.strategy = fsdp::ShardingStrategy::kNoShard;
    std::string e = error_of([&] { fsdp::fully_shard(torch::nn::Linear(3, 4).ptr(), g, no_shard); }).what();
    EXPECT_NE(e.find("reduce_scatter_codec int8 applies to strategies that reduce-scatter"), std::string::npos) << e;
    no_shard = options(2, WireCodec::kNone, WireCodec::kNone);
    no_shard.strategy = fsdp::ShardingStrategy::kNoShard;
    e = error_of([&] { fsdp::fully_shard(torch::nn::Linear(3, 4).ptr(), g, no_shard); }).what();
    EXPECT_NE(e.find("collective_host_size 2 applies to"), std::string::npos) << e;
    e = error_of([&] { fsdp::fully_shard(torch::nn::Linear(3, 4).ptr(), g, options(3, WireCodec::kNone, WireCodec::kNone)); })
            .what();
    EXPECT_NE(e.find("collective_host_size 3 must divide the shard group size 4"), std::string::npos) << e;
  });
}

// bf16 params and reductions (the int8 stage quantises bfloat16 blocks and writes bfloat16
// averages; both host stages round at bfloat16): every option together stays within the
// quantisation and rounding error of the flat bf16 run, and no value is lost (finite, non-zero).
TEST(HostAwareCollectives, Bf16WithEveryWireOption) {
  run_on_hosts([&](int rank, fsdp::comm::ProcessGroupPtr g) {
    auto flat_o = options(0, WireCodec::kNone, WireCodec::kNone);
    auto all_o = options(kPerHost, WireCodec::kInt8, WireCodec::kInt8);
    all_o.reshard_after_forward_group_size = kPerHost;
    for (auto* o : {&flat_o, &all_o}) {
      o->mixed_precision.param_dtype = at::kBFloat16;
      o->mixed_precision.reduce_dtype = at::kBFloat16;
    }
    Chain flat = sharded(g, flat_o), all = sharded(g, all_o);
    const auto [x, y] = regression_batch(0, 3 * kWorld, 30, 5);
    for (Chain m : {flat, all}) {
      F::mse_loss(fsdp::call(m, x.narrow(0, 3 * rank, 3)).to(at::kFloat), y.narrow(0, 3 * rank, 3)).backward();
    }
    const auto a = fsdp::sharded_parameters(flat.ptr()), b = fsdp::sharded_parameters(all.ptr());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const at::Tensor ga = fsdp::gather_full_tensor(*a[i].unit, *a[i].param, true).to(at::kFloat);
      const at::Tensor gb = fsdp::gather_full_tensor(*b[i].unit, *b[i].param, true).to(at::kFloat);
      ASSERT_TRUE(gb.isfinite().all().item<bool>()) << b[i].name;
      const double scale = ga.abs().max().item<double>();
      EXPECT_GT(scale, 0) << a[i].name;
      EXPECT_LT((ga - gb).abs().max().item<double>(), 0.03 * scale) << b[i].name << ": " << err_summary(gb, ga);
    }
  });
}

// 8 ranks as 4 hosts of 2 (h = 2, H = 4: the two sizes differ, so a swapped order cannot pass):
// layers whose rows leave whole hosts with padding only (20 rows: rank 7 none; 3 rows: hosts 2
// and 3 none). Host-aware gradients equal a single process's, half the bytes cross hosts; with
// int8 reduce-scatters every gradient stays within the quantisation error of the exact one.
TEST(HostAwareCollectives, FourHostsOfTwoWithPaddedHosts) {
  constexpr int kRanks = 8;
  const std::vector<int64_t> widths{30, 20, 3, 5};
  auto groups = fsdp::comm::threaded_world(kRanks, 2);
  const auto batch = regression_batch(0, 3 * kRanks, 30, 5);  // (a lambda cannot capture a binding in C++17)
  const at::Tensor x = batch.first, y = batch.second;
  Chain ref = seeded_chain(widths, 5);
  F::mse_loss(ref->forward(x), y).backward();
  const auto refs = params_by_name(ref.ptr());
  on_threads(kRanks, [&](int rank) {
    const auto& g = groups[rank];
    for (const WireCodec rs : {WireCodec::kNone, WireCodec::kInt8}) {
      SCOPED_TRACE(std::string("reduce_scatter_codec ") + fsdp::to_string(rs));
      Chain flat = sharded(g, options(0, WireCodec::kNone, WireCodec::kNone), widths, 5);
      Chain host = sharded(g, options(2, WireCodec::kNone, rs), widths, 5);
      fsdp::comm::CommStats::Snapshot s[3];
      step_both(flat, host, g, x, y, rank, s);
      EXPECT_EQ(2 * inter_host(s[1], s[2], K::kAllGather), inter_host(s[0], s[1], K::kAllGather));
      if (rs == WireCodec::kNone) {
        EXPECT_EQ(2 * inter_host(s[1], s[2], K::kReduceScatter), inter_host(s[0], s[1], K::kReduceScatter));
      }
      for (const auto& sp : fsdp::sharded_parameters(host.ptr())) {
        const at::Tensor grad = fsdp::gather_full_tensor(*sp.unit, *sp.param, /*grad=*/true);
        const at::Tensor want = refs.at(sp.name).grad();
        if (rs == WireCodec::kNone) {
          expect_close(grad, want, 1e-5, 1e-6, "grad of " + sp.name);
        } else {
          EXPECT_LT((grad - want).abs().max().item<double>(), want.abs().max().item<double>() / 50) << sp.name;
        }
        EXPECT_TRUE(at::equal(fsdp::gather_full_tensor(*sp.unit, *sp.param), refs.at(sp.name).detach())) << sp.name;
      }
    }
  });
}
