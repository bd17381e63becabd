// Tier `dist`: the int8 all-gather codec (FullyShardOptions::all_gather_codec, ZeRO++'s qwZ)
// through fully_shard on the threaded group. Oracle: each rank's padded flat shard (the public
// FlatLayout) quantised and decoded by itself; forward and backward must both compute with exactly
// those values, the reduced gradients must be a single-process reference's on them, the master
// params stay exact, and the all-gathers carry exactly the int8 payloads.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include "../common/flat_blocks.h"
#include "../common/error_of.h"
#include "../common/models.h"
#include "../common/parity.h"
#include "../common/scenario_util.h"
#include "../common/step_comm.h"
#include "../common/threaded.h"
#include "fsdp/comm/block_quant.h"
#include "fsdp/fsdp.h"

using namespace fsdp_test;
namespace F = torch::nn::functional;

namespace {

constexpr int kWorld = 4;
const std::vector<int64_t> kWidths{30, 40, 5};

// The full params of one Linear unit (weight (out, in), bias (out)) as the int8 codec decodes them
// over a shard group of g ranks: rank r's padded flat shard, quantised and decoded alone.
std::vector<at::Tensor> decoded_unit(const torch::nn::Linear& l, int64_t g, int64_t* payload_bytes) {
  const std::vector<at::Tensor> full{l->weight.detach(), l->bias.detach()};
  const auto layout = fsdp::shard::FlatLayout::make({full[0].sizes().vec(), full[1].sizes().vec()}, g);
  const int64_t S = layout.shard_numel();
  const at::Tensor blocks = fsdp_test::to_blocks(full, layout);
  at::Tensor decoded = at::empty({g, S});
  std::vector<at::Tensor> payloads;
  // Blocks restart at every param: the weight's padded shard, then the bias's.
  const std::vector<int64_t> segments{layout.params[0].padded_shard_numel(), layout.params[1].padded_shard_numel()};
  for (int64_t r = 0; r < g; ++r) payloads.push_back(fsdp::comm::int8_block_quantize(blocks[r], segments));
  fsdp::comm::int8_block_dequantize(at::stack(payloads), segments, decoded);
  *payload_bytes = fsdp::comm::int8_payload_bytes(segments);
  return fsdp_test::from_blocks(decoded, layout, full);
}

fsdp::FullyShardOptions int8_options(fsdp::ShardingStrategy s, int hybrid_size = 0) {
  fsdp::FullyShardOptions o;
  o.strategy = s;
  o.hybrid_shard_group_size = hybrid_size;
  o.all_gather_codec = fsdp::WireCodec::kInt8;
  return o;
}

Chain sharded_chain(const fsdp::comm::ProcessGroupPtr& g, const fsdp::FullyShardOptions& o) {
  Chain model = seeded_chain(kWidths, 11);  // l0: 40 x 30 + 40 (two blocks and a tail per shard at G = 2), l1: 5 x 40 + 5
  for (auto& l : model->layers) fsdp::fully_shard(l.ptr(), g, o);
  fsdp::fully_shard(model.ptr(), g, o);
  return model;
}

}  // namespace

// One step of full_shard (G = 4) and hybrid_shard (G = 2): the reduced gradients are those of a
// single-process model holding the decoded weights (so forward and backward both used them), they
// differ from the exact model's, the master params are untouched, and the all-gathers moved
// 2 x G x payload bytes per unit (forward and backward).
TEST(Int8AllGather, GradientsAreThoseOfTheDecodedWeights) {
  for (int G : {kWorld, 2}) {
    SCOPED_TRACE("shard group " + std::to_string(G));
    const auto strategy = G == kWorld ? fsdp::ShardingStrategy::kFullShard : fsdp::ShardingStrategy::kHybridShard;
    run_threaded(kWorld, [&](int rank, fsdp::comm::ProcessGroupPtr g) {
      Chain exact = seeded_chain(kWidths, 11), decoded = seeded_chain(kWidths, 11);
      int64_t payload[2];
      {
        at::NoGradGuard no_grad;
        for (int i = 0; i < 2; ++i) {
          const auto d = decoded_unit(exact->layers[i], G, &payload[i]);
          decoded->layers[i]->weight.copy_(d[0]);
          decoded->layers[i]->bias.copy_(d[1]);
        }
      }
      Chain model = sharded_chain(g, int8_options(strategy, strategy == fsdp::ShardingStrategy::kHybridShard ? G : 0));
      const auto [x, y] = regression_batch(0, 3 * kWorld, 30, 5);
      for (Chain ref : {exact, decoded}) F::mse_loss(ref->forward(x), y).backward();

      const auto before = g->stats().snapshot();
      F::mse_loss(fsdp::call(model, x.narrow(0, 3 * rank, 3)), y.narrow(0, 3 * rank, 3)).backward();
      const StepComm c = delta(before, g->stats().snapshot());
      EXPECT_EQ(c.ag_calls, 4);
      EXPECT_EQ(c.ag_bytes, 2 * G * (payload[0] + payload[1]));

      const auto ref_decoded = params_by_name(decoded.ptr()), ref_exact = params_by_name(exact.ptr());
      for (const auto& sp : fsdp::sharded_parameters(model.ptr())) {
        const at::Tensor grad = fsdp::gather_full_tensor(*sp.unit, *sp.param, /*grad=*/true);
        expect_close(grad, ref_decoded.at(sp.name).grad(), 1e-5, 1e-6, "grad of " + sp.name);
        EXPECT_GT((grad - ref_exact.at(sp.name).grad()).abs().max().item<double>(), 1e-5)
            << sp.name << ": the gradient of the exact weights, so the codec did not act";
        EXPECT_TRUE(at::equal(fsdp::gather_full_tensor(*sp.unit, *sp.param), ref_exact.at(sp.name).detach()))
            << sp.name << ": the master params must stay exact";
      }
    });
  }
}

// The decoded params themselves, bit for bit, where the strategy keeps them after forward:
// shard_grad_op in bf16 (until the end of backward) and zero1 (between steps).
TEST(Int8AllGather, KeptParamsAreTheDecodedShardsBitForBit) {
  for (auto strategy : {fsdp::ShardingStrategy::kShardGradOp, fsdp::ShardingStrategy::kZero1}) {
    SCOPED_TRACE(fsdp::to_string(strategy));
    run_threaded(kWorld, [&](int, fsdp::comm::ProcessGroupPtr g) {
      auto o = int8_options(strategy);
      const auto dtype = strategy == fsdp::ShardingStrategy::kShardGradOp ? at::kBFloat16 : at::kFloat;
      o.mixed_precision.param_dtype = dtype;
      Chain exact = seeded_chain(kWidths, 11);
      Chain model = sharded_chain(g, o);
      const at::Tensor out = fsdp::call(model, at::ones({2, 30}));
      for (int i = 0; i < 2; ++i) {
        int64_t payload = 0;
        const auto d = decoded_unit(exact->layers[i], kWorld, &payload);
        EXPECT_TRUE(at::equal(model->layers[i]->weight.detach(), d[0].to(dtype))) << "layer " << i << " weight";
        EXPECT_TRUE(at::equal(model->layers[i]->bias.detach(), d[1].to(dtype))) << "layer " << i << " bias";
      }
      out.sum().backward();
    });
  }
}

// no_shard gathers nothing: the codec is refused at fully_shard with one line naming both.
TEST(Int8AllGather, RefusedWhereNothingIsGathered) {
  run_threaded(2, [&](int, fsdp::comm::ProcessGroupPtr g) {
    torch::nn::Linear l(3, 4);
    const std::string e =
        error_of([&] { fsdp::fully_shard(l.ptr(), g, int8_options(fsdp::ShardingStrategy::kNoShard)); }).what();
    EXPECT_NE(e.find("all_gather_codec int8"), std::string::npos) << e;
    EXPECT_NE(e.find("no_shard"), std::string::npos) << e;
  });
}
