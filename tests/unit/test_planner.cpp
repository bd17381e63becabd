// Tier `unit`: the planner (include/fsdp/planner/), pure math. Parameter counts of every preset
// against closed forms and published totals, model-state bytes against the shard layout for
// awkward shapes, the 7B headline figures, traffic counts, activations against PyTorch's saved
// tensors, the time model's limits, recommendations, the JSON forms.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "fsdp/common/check.h"
#include "fsdp/planner/activations.h"
#include "fsdp/planner/plan.h"
#include "fsdp/shard/layout.h"
#include "planner_test_helpers.h"

namespace fp = fsdp::planner;
using fsdp::ShardingStrategy;
using S = fsdp::ShardingStrategy;
using planner_test::par;

namespace {

// Closed form of apps/models/gpt.cpp:GPTConfig::num_params (tied head counted once).
int64_t gpt_closed_form(int64_t V, int64_t L, int64_t C, int64_t ctx) {
  const int64_t per_block = 2 * 2 * C + C * 3 * C + 3 * C + C * C + C + C * 4 * C + 4 * C + 4 * C * C + C;
  return V * C + ctx * C + L * per_block + 2 * C;
}

// Llama-2: embeddings and untied head 2VC, final norm C; per block 2C^2 (q, o) + 2 Ckv C (k, v) +
// 3CI (SwiGLU) + 2C (two RMSNorms).
int64_t llama_closed_form(int64_t V, int64_t L, int64_t C, int64_t H, int64_t KV, int64_t I) {
  const int64_t Ckv = KV * (C / H);
  return 2 * V * C + C + L * (2 * C * C + 2 * Ckv * C + 3 * C * I + 2 * C);
}

// A unit of awkward shapes: rows not divisible by N, fewer rows than ranks, 1-D, 0-dim, frozen.
fp::ModelSpec awkward_model() {
  fp::ModelSpec m;
  m.name = "awkward";
  fp::UnitSpec root;
  root.is_root = true;
  root.params = {{"emb", {13, 19}, true}, {"scale", {}, true}};
  fp::UnitSpec a;
  a.name = "a";
  a.params = {{"w", {1, 2}, true}, {"b", {5}, true}, {"frozen", {7, 3}, false}, {"v", {3, 19}, true}};
  fp::UnitSpec b;
  b.name = "b";
  b.params = {{"w", {40, 96}, true}, {"b", {40}, true}};
  m.units = {root, a, b};
  return m;
}

}  // namespace

TEST(PlannerModels, GptPresetsMatchTheClosedFormAndThePublishedCounts) {
  for (const auto& name : fp::gpt_preset_names()) {
    const fp::GptShape s = fp::gpt_shape(name, 8192);
    const fp::ModelSpec m = fp::gpt_model(s, name);
    EXPECT_EQ(m.num_params(), gpt_closed_form(8192, s.n_layer, s.n_embd, s.block_size)) << name;
    EXPECT_EQ(m.num_blocks(), s.n_layer) << name;
    EXPECT_EQ(m.units[0].params.size(), 4u) << name << ": root = wte, wpe, ln_f weight and bias";
  }
  // GPT-2 with its own vocabulary (50257) and context 1024: the published (Hugging Face) totals.
  const std::pair<const char*, int64_t> published[] = {
      {"gpt2", 124'439'808}, {"gpt2-medium", 354'823'168}, {"gpt2-large", 774'030'080}, {"gpt2-xl", 1'557'611'200}};
  for (const auto& [name, count] : published) {
    EXPECT_EQ(fp::gpt_model(fp::gpt_shape(name, 50257), name).num_params(), count) << name;
  }
  EXPECT_EQ(fp::gpt_model(fp::gpt_shape("micro", 8192)).num_params(), 13'891'584);  // docs/BENCHMARKS.md
  EXPECT_EQ(fp::gpt_model(fp::gpt_shape("gpt2", 8192)).num_params(), 92'133'888);
}

TEST(PlannerModels, LlamaPresetsMatchThePublishedCounts) {
  const std::pair<const char*, int64_t> published[] = {
      {"llama2-7b", 6'738'415'616}, {"llama2-13b", 13'015'864'320}, {"llama2-70b", 68'976'648'192}};
  for (const auto& [name, count] : published) {
    const fp::LlamaShape s = fp::llama_shape(name);
    const fp::ModelSpec m = fp::llama_model(s, name);
    EXPECT_EQ(m.num_params(), count) << name;
    EXPECT_EQ(m.num_params(), llama_closed_form(s.vocab_size, s.n_layer, s.n_embd, s.n_head, s.n_kv_head, s.ffn_hidden))
        << name;
    EXPECT_EQ(m.num_blocks(), s.n_layer);
    EXPECT_FALSE(m.arch.tied_head);
  }
  const fp::ModelSpec m70 = fp::llama_model(fp::llama_shape("llama2-70b"));
  EXPECT_EQ(m70.arch.n_kv_head, 8);
  EXPECT_EQ(m70.units[1].params[2].name, "layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(m70.units[1].params[2].shape, (std::vector<int64_t>{1024, 8192})) << "8 KV heads x 128";
  EXPECT_EQ(m70.units[1].params[6].shape, (std::vector<int64_t>{28672, 8192}));
  EXPECT_EQ(fp::llama_model(fp::llama_shape("llama2-7b")).units[1].params[6].shape, (std::vector<int64_t>{11008, 4096}));
  EXPECT_EQ(fp::llama_model(fp::llama_shape("llama2-13b")).units[1].params[8].shape, (std::vector<int64_t>{5120, 13824}));
  // Overrides change the count as the closed form says.
  fp::LlamaShape s = fp::llama_shape("llama2-7b");
  s.n_layer = 2;
  s.n_kv_head = 8;
  EXPECT_EQ(fp::llama_model(s).num_params(), llama_closed_form(32000, 2, 4096, 32, 8, 11008));
}

TEST(PlannerModels, BadShapesAndNamesAreRejected) {
  auto expect_invalid = [](auto fn) {
    try {
      fn();
      ADD_FAILURE() << "accepted";
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.kind(), fsdp::ErrorKind::kInvalidArgument) << e.what();
    }
  };
  expect_invalid([] { fp::gpt_shape("gpt5", 8192); });
  expect_invalid([] { fp::llama_shape("llama3"); });
  expect_invalid([] {
    fp::GptShape s;
    s.n_head = 3;  // 128 % 3 != 0
    fp::gpt_model(s);
  });
  expect_invalid([] {
    fp::LlamaShape s;
    s.n_kv_head = 5;
    fp::llama_model(s);
  });
  expect_invalid([] { fp::params_only_model(0, 4); });
  expect_invalid([] { fp::model_state_bytes(fp::params_only_model(10, 1), par(S::kHybridShard, 4, 3), {}); });
  expect_invalid([] { fp::model_state_bytes(fp::params_only_model(10, 1), par(S::kFullShard, 4), {}, 4); });
}

// Model-state bytes against the shard layout, for every rank of N = 1..9 ranks.
TEST(PlannerMemory, ModelStateMatchesTheShardLayoutForAwkwardShapes) {
  const fp::ModelSpec m = awkward_model();
  fp::StepSetup st;
  int64_t trainable = 0;
  for (const auto& u : m.units) trainable += u.trainable_numel();
  for (int64_t N = 1; N <= 9; ++N) {
    for (S s : {S::kFullShard, S::kShardGradOp, S::kZero1, S::kNoShard, S::kHybridShard}) {
      const int64_t G = s == S::kNoShard ? 1 : s == S::kHybridShard ? (N % 3 == 0 ? 3 : 1) : N;
      int64_t grads_over_ranks = 0;
      for (int64_t r = 0; r < N; ++r) {
        int64_t padded = 0, real = 0, padded_full = 0;
        for (const auto& u : m.units) {
          std::vector<std::vector<int64_t>> shapes;
          for (const auto& p : u.params) shapes.push_back(p.shape);
          const auto layout = fsdp::shard::FlatLayout::make(shapes, G);
          padded += layout.shard_numel();
          padded_full += layout.total_numel();
          for (size_t i = 0; i < u.params.size(); ++i) {
            if (u.params[i].trainable) real += layout.params[i].real_numel(r % G);
          }
        }
        const fp::ModelStateBytes b = fp::model_state_bytes(m, par(s, N, G), st, r);
        SCOPED_TRACE(fsdp::to_string(s) + " N=" + std::to_string(N) + " rank " + std::to_string(r));
        EXPECT_EQ(b.sharded_param_bytes, 4 * padded);
        EXPECT_EQ(b.sharded_grad_bytes, 4 * real);
        EXPECT_EQ(b.optim_state_bytes, 8 * real);
        EXPECT_EQ(b.resident_unsharded_param_bytes, s == S::kZero1 ? 4 * padded_full : 0);
        if (r < G) grads_over_ranks += b.sharded_grad_bytes;
        // Within padding of the closed form: at most one row per parameter per rank, 16 bytes per element.
        const double closed = fp::closed_form_model_state_bytes(par(s, N, G), static_cast<double>(m.num_params()), st);
        EXPECT_NEAR(static_cast<double>(b.total_bytes()), closed, 16.0 * 19 * 8 * (s == S::kZero1 ? 2 : 1) + 16.0 * 96 * 2);
      }
      EXPECT_EQ(grads_over_ranks, 4 * trainable) << "one shard group's grads partition the trainable rows";
    }
  }
  // SGD keeps 4 (momentum) or 0 bytes; bf16 changes only zero1's resident full params.
  st.optimizer = fp::OptimizerKind::kSgdMomentum;
  EXPECT_EQ(fp::model_state_bytes(m, par(S::kFullShard, 1), st).optim_state_bytes, 4 * (m.num_params() - 21));
  st.optimizer = fp::OptimizerKind::kSgd;
  EXPECT_EQ(fp::model_state_bytes(m, par(S::kFullShard, 1), st).optim_state_bytes, 0);
  st.precision = fp::Precision::kBf16;
  EXPECT_EQ(fp::model_state_bytes(m, par(S::kZero1, 1), st).resident_unsharded_param_bytes, 2 * m.num_params());
}

// The headline: a 7B model, AdamW, mixed precision: 16 bytes per parameter, 112 GB per rank under
// DDP, 14 GB per rank with FULL_SHARD at N = 8 (model state only).
TEST(PlannerMemory, SevenBillionHeadline) {
  const fp::ModelSpec m = fp::params_only_model(7'000'000'000, 32, "7B");
  fp::StepSetup st;
  st.precision = fp::Precision::kBf16;
  EXPECT_EQ(fp::model_state_bytes(m, par(S::kNoShard, 8), st).total_bytes(), 112'000'000'000);
  const fp::ModelStateBytes fs = fp::model_state_bytes(m, par(S::kFullShard, 8), st);
  EXPECT_EQ(fs.total_bytes(), 14'000'000'000);
  EXPECT_EQ(fs.sharded_param_bytes, 3'500'000'000) << "fp32 master rows: 4 B/param / 8";
  EXPECT_EQ(fs.sharded_grad_bytes, 3'500'000'000) << "fp32 sharded grads: 4 B/param / 8";
  EXPECT_EQ(fs.optim_state_bytes, 7'000'000'000) << "AdamW m + v: 8 B/param / 8";
  const fp::BytesPerParam engine = fp::engine_bytes_per_param(st.precision, st.optimizer);
  const fp::BytesPerParam paper = fp::zero_paper_bytes_per_param(st.precision, st.optimizer);
  EXPECT_EQ(engine.params, 4);
  EXPECT_EQ(engine.grads, 4);
  EXPECT_EQ(engine.optimizer, 8);
  EXPECT_EQ(paper.params, 2);
  EXPECT_EQ(paper.grads, 2);
  EXPECT_EQ(paper.optimizer, 12) << "ZeRO: K = 12 (fp32 master copy, momentum, variance)";
  EXPECT_EQ(engine.total(), 16);
  EXPECT_EQ(paper.total(), 16);
  EXPECT_EQ(fp::zero_paper_model_state_bytes(par(S::kNoShard, 8), 7e9, paper), 112e9);
  EXPECT_EQ(fp::zero_paper_model_state_bytes(par(S::kFullShard, 8), 7e9, paper), 14e9);
  // ZeRO section 5's stages: P_os 4 + 12/N, P_os+g 2 + 14/N (bytes per param).
  EXPECT_EQ(fp::zero_paper_model_state_bytes(par(S::kZero1, 8), 7e9, paper), 7e9 * (4 + 12.0 / 8));
  EXPECT_EQ(fp::zero_paper_model_state_bytes(par(S::kShardGradOp, 8), 7e9, paper), 7e9 * (2 + 14.0 / 8));
  // Llama-2-7B (6.74B params): every dimension divides 8, so 16P/8 exactly.
  const fp::ModelSpec llama = fp::llama_model(fp::llama_shape("llama2-7b"));
  EXPECT_EQ(fp::model_state_bytes(llama, par(S::kFullShard, 8), st).total_bytes(), 2 * llama.num_params());
  EXPECT_EQ(fp::model_state_bytes(llama, par(S::kNoShard, 8), st).total_bytes(), 16 * llama.num_params());
}

// Traffic per step as the engine's CommStats counts it (tests/mpi/test_strategies.cpp asserts the
// same numbers against the engine).
TEST(PlannerTraffic, CountsAndLogicalBytesPerStrategy) {
  const fp::ModelSpec m = fp::gpt_model(fp::gpt_shape("micro", 8192));
  const int64_t P = m.num_params(), root = m.units[0].numel(), U = 7;
  fp::StepSetup st;
  const fp::StepTraffic fs = fp::step_traffic(m, par(S::kFullShard, 2), st);
  EXPECT_EQ(fs.all_gather.calls, 2 * U - 1) << "the root stays gathered from forward to backward";
  EXPECT_EQ(fs.all_gather.logical_bytes, 2 * 4 * P - 4 * root) << "micro's dimensions divide 2: no padding";
  EXPECT_EQ(fs.reduce_scatter.calls, U);
  EXPECT_EQ(fs.reduce_scatter.logical_bytes, 4 * P);
  EXPECT_EQ(fs.all_reduce.calls, 2);
  EXPECT_EQ(fs.all_reduce.logical_bytes, 8 * 2 + 16) << "the finite check (an int64 per rank), the grad norm (2 doubles)";
  EXPECT_DOUBLE_EQ(fs.all_gather.wire_bytes, 0.5 * static_cast<double>(fs.all_gather.logical_bytes));
  const fp::StepTraffic sgo = fp::step_traffic(m, par(S::kShardGradOp, 2), st);
  EXPECT_EQ(sgo.all_gather.calls, U);
  EXPECT_EQ(sgo.all_gather.logical_bytes, 4 * P);
  const fp::StepTraffic ddp = fp::step_traffic(m, par(S::kNoShard, 2), st);
  EXPECT_EQ(ddp.all_gather.calls, 0);
  EXPECT_EQ(ddp.all_reduce.logical_bytes, 4 * P + 16 + 16);
  EXPECT_DOUBLE_EQ(ddp.all_reduce.wire_bytes, 2 * 0.5 * static_cast<double>(4 * P + 16 + 16));
  // bf16 halves every gather and reduction.
  st.precision = fp::Precision::kBf16;
  EXPECT_EQ(fp::step_traffic(m, par(S::kFullShard, 2), st).logical_bytes(), (fs.logical_bytes() - 32) / 2 + 32)
      << "the all-reduces of flags and norms stay as they are";
  // Gradient accumulation: gathers every micro-batch, reductions once.
  st.precision = fp::Precision::kFp32;
  st.accumulation_steps = 4;
  const fp::StepTraffic acc = fp::step_traffic(m, par(S::kFullShard, 2), st);
  EXPECT_EQ(acc.all_gather.calls, 4 * (2 * U - 1));
  EXPECT_EQ(acc.reduce_scatter.calls, U);
  EXPECT_EQ(fp::step_traffic(m, par(S::kZero1, 2), st).all_gather.calls, U) << "zero1 gathers once per step";
  // hybrid_shard at N = 4, G = 2: full_shard over 2 + one replica all-reduce of each shard.
  st.accumulation_steps = 1;
  const fp::StepTraffic hy = fp::step_traffic(m, par(S::kHybridShard, 4, 2), st);
  EXPECT_EQ(hy.all_gather.logical_bytes, fs.all_gather.logical_bytes);
  EXPECT_EQ(hy.all_reduce.calls, U + 2);
  EXPECT_EQ(hy.all_reduce.logical_bytes, 4 * P / 2 + 16 + 8 * 4);
  st.nonfinite_check = false;
  EXPECT_EQ(fp::step_traffic(m, par(S::kHybridShard, 4, 2), st).all_reduce.calls, U + 1);
}

TEST(PlannerTraffic, DdpBucketsFollowTheEnginesPlan) {
  fp::UnitSpec u;
  u.params = {{"w0", {96, 96}, true}, {"b0", {96}, true}, {"frozen", {10}, false}, {"w1", {40, 96}, true}};
  // Reverse order, greedy up to 36,864 bytes (9,216 fp32 elements): {w1 3840, b0 96} then {w0}.
  EXPECT_EQ(fp::ddp_bucket_numels(u, 9216 * 4, 4), (std::vector<int64_t>{3936, 9216}));
  EXPECT_EQ(fp::ddp_bucket_numels(u, 1, 4), (std::vector<int64_t>{3840, 96, 9216})) << "one param per bucket";
  EXPECT_EQ(fp::ddp_bucket_numels(u, 1 << 30, 2), (std::vector<int64_t>{13152}));
}

TEST(PlannerTraffic, GroupsCrossNodesAsTheRanksLieOnThem) {
  EXPECT_FALSE(fp::group_crosses_nodes(par(S::kFullShard, 8, 0, 8), fp::GroupKind::kShard));
  EXPECT_TRUE(fp::group_crosses_nodes(par(S::kFullShard, 16, 0, 8), fp::GroupKind::kShard));
  EXPECT_FALSE(fp::group_crosses_nodes(par(S::kHybridShard, 64, 8, 8), fp::GroupKind::kShard));
  EXPECT_TRUE(fp::group_crosses_nodes(par(S::kHybridShard, 64, 8, 8), fp::GroupKind::kReplicate));
  EXPECT_TRUE(fp::group_crosses_nodes(par(S::kHybridShard, 64, 16, 8), fp::GroupKind::kShard));
  EXPECT_TRUE(fp::group_crosses_nodes(par(S::kHybridShard, 24, 3, 8), fp::GroupKind::kShard)) << "3 does not tile 8";
}

// Saved bytes of one GPT block and of the root, as PyTorch's saved-tensor hooks measure them on
// bench/peer_gpt.py's identical model (unique storages, parameters excluded): B = 2, C = 128, H = 4.
TEST(PlannerActivations, GptMatchesPyTorchsSavedTensors) {
  fp::GptShape s;
  s.vocab_size = 1000;
  s.n_layer = 1;
  s.block_size = 1024;
  const fp::ModelSpec m = fp::gpt_model(s);
  fp::StepSetup st;
  st.micro_batch_size = 2;
  st.seq_len = 64;
  fp::ActivationModel a = fp::activation_model(m, st);
  EXPECT_EQ(a.attention_kernel, "flash");
  EXPECT_EQ(a.block_bytes, 1'052'672) << "fp32, T = 64: 16 B*T*C*4 + logsumexp + LayerNorm stats";
  EXPECT_EQ(a.root_bytes, 646'660) << "ids, positions, ln_f in/out + stats, log-probs, targets, total weight";
  st.precision = fp::Precision::kBf16;
  a = fp::activation_model(m, st);
  EXPECT_EQ(a.attention_kernel, "math") << "auto: bf16 with T <= 256";
  EXPECT_EQ(a.block_bytes, 726'016) << "bf16 math attention, T = 64";
  st.seq_len = 512;
  EXPECT_EQ(fp::activation_model(m, st).block_bytes, 4'218'880) << "bf16 flash, T = 512";
  st.precision = fp::Precision::kFp32;
  EXPECT_EQ(fp::activation_model(m, st).block_bytes, 8'421'376) << "fp32 flash, T = 512";
  st.activation_checkpointing = true;
  a = fp::activation_model(m, st);
  EXPECT_EQ(a.total_saved_bytes, a.checkpointed_block_bytes + a.root_bytes);
  EXPECT_EQ(a.block_input_bytes, 2 * 512 * 128 * 4);
  EXPECT_EQ(a.checkpointed_block_bytes, 2 * 512 * 128 * 4 + 5056) << "the input and the CPU generator state";
  // What fsdp::checkpoint_activations saves: the CPU generator's state tensor, in this libtorch.
  EXPECT_EQ(static_cast<int64_t>(at::detail::getDefaultCPUGenerator().get_state().nbytes()),
            fp::kCpuGeneratorStateBytes);
  EXPECT_FALSE(fp::activation_model(fp::params_only_model(100, 2), st).known);
}

TEST(PlannerMemory, PeakIsTheLargestMomentAndFallsWithTheWorldSize) {
  const fp::ModelSpec m = fp::llama_model(fp::llama_shape("llama2-7b"));
  fp::StepSetup st;
  st.precision = fp::Precision::kBf16;
  st.seq_len = 4096;
  int64_t last = INT64_MAX;
  for (int64_t n : {8, 16, 32, 64}) {
    const fp::PeakBytes p = fp::peak_bytes(m, par(S::kFullShard, n), st);
    EXPECT_LT(p.peak_bytes, last);
    last = p.peak_bytes;
    const fp::ModelStateBytes s = fp::model_state_bytes(m, par(S::kFullShard, n), st);
    EXPECT_GE(p.peak_bytes, s.sharded_param_bytes + s.optim_state_bytes);
    // full_shard holds the root and max_unsharded_units blocks, in bf16, padded.
    EXPECT_EQ(p.unsharded_param_bytes, 2 * (m.units[0].numel() + 2 * m.units[1].numel())) << n;
  }
  // shard_grad_op keeps every block's full params until its backward; DDP holds 16P plus bf16 casts.
  EXPECT_GT(fp::peak_bytes(m, par(S::kShardGradOp, 8), st).unsharded_param_bytes, 2 * m.num_params() / 2);
  EXPECT_GE(fp::peak_bytes(m, par(S::kNoShard, 8), st).peak_bytes, 18 * m.num_params());
  // Activation checkpointing lowers the peak.
  fp::StepSetup ck = st;
  ck.activation_checkpointing = true;
  EXPECT_LT(fp::peak_bytes(m, par(S::kFullShard, 8), ck).peak_bytes, fp::peak_bytes(m, par(S::kFullShard, 8), st).peak_bytes);
}

// [Note: tied head gradient] micro (V 8192, C 384, 6 blocks, head tied to wte), fp32, AdamW. The
// oracle is the counting allocator's peak of fsdp-train's steady steps (the larger of steps 2 and 3
// of 3: the blocks a reduce-scatter receives exist only while the communication thread runs it; command in
// docs/BENCHMARKS.md, "Planner vs measured"): with 2 x 64 tokens per rank it is reached in the
// token embedding's backward, where the head's gradient of wte, the lookup's and their sum coexist
// (3 x 12.6 MB); with two micro-batches of 1 x 64 the head's gradient waits beside the .grad of the
// first micro-batch through the second's backward.
TEST(PlannerMemory, TiedHeadGradientsAsMeasured) {
  const fp::ModelSpec m = fp::gpt_model(fp::gpt_shape("micro", 8192));
  fp::StepSetup st;
  st.micro_batch_size = 2;
  st.seq_len = 64;
  const int64_t V = 8192, C = 384;
  // The moment at N = 2, term by term, from the engine's buffers.
  const fp::ModelStateBytes state = fp::model_state_bytes(m, par(S::kZero1, 2), st);
  const fp::UnitNumbers root = fp::unit_numbers(m.units[0], 2, 0), h0 = fp::unit_numbers(m.units[1], 2, 0);
  const int64_t want = state.sharded_param_bytes + state.optim_state_bytes + state.resident_unsharded_param_bytes +
                       (state.sharded_grad_bytes - 4 * root.real_trainable_numel - 4 * h0.real_trainable_numel) +
                       4 * root.trainable_numel + 2 * 4 * V * C +  // the root's grads, lookup grad and the sum
                       4 * (h0.reduce_numel + h0.reduce_shard_numel) +  // h.0's reduce-scatter in flight:
                       4 * h0.reduce_numel +  // its input and output shard, and the blocks its all-to-all receives
                       fp::activation_model(m, st).root_lookup_bytes;
  const fp::PeakBytes p2 = fp::peak_bytes(m, par(S::kZero1, 2), st);
  EXPECT_EQ(p2.moment, "backward of the token embedding");
  EXPECT_EQ(p2.peak_bytes, want);
  struct Case {
    S strategy;
    int64_t n, micro, accum, measured;
    const char* moment;
  };
  for (const Case& c : {Case{S::kZero1, 2, 2, 1, 212'256'796, "backward of the token embedding"},
                        Case{S::kZero1, 4, 1, 1, 159'934'740, "backward of the token embedding"},
                        Case{S::kZero1, 2, 1, 2, 231'211'292, "backward of h.4"},
                        Case{S::kFullShard, 2, 1, 2, 202'819'100, "backward of h.4"}}) {
    fp::StepSetup s = st;
    s.micro_batch_size = c.micro;
    s.accumulation_steps = c.accum;
    const fp::PeakBytes p = fp::peak_bytes(m, par(c.strategy, c.n), s);
    const double err = static_cast<double>(p.peak_bytes - c.measured) / static_cast<double>(c.measured);
    EXPECT_EQ(p.moment, c.moment) << fsdp::to_string(c.strategy) << " N=" << c.n << " accumulation " << c.accum;
    EXPECT_GE(err, -0.002) << fsdp::to_string(c.strategy) << " N=" << c.n << ": planner " << p.peak_bytes
                           << " vs measured " << c.measured;
    EXPECT_LE(err, 0.01) << fsdp::to_string(c.strategy) << " N=" << c.n << ": planner " << p.peak_bytes
                         << " vs measured " << c.measured;
  }
}

// A block's backward holds the previous block's reduce-scatter in flight (the worst case). On the
// all-to-all route the blocks it receives (for bf16 also the float32 sum and the block being
// widened) exist only while it runs: reduce_in_flight_bytes names them. Its input and output stay
// until the next unit's reduce-scatter is issued, whatever the timing; NCCL's in-place ring and
// no_shard's buckets hold nothing that depends on it.
TEST(PlannerMemory, TheReduceScatterInFlightIsNamedInThePeak) {
  const fp::ModelSpec m = fp::gpt_model(fp::gpt_shape("micro", 8192));
  fp::StepSetup st;
  st.micro_batch_size = 4;
  st.seq_len = 64;
  // Every block has the same numbers; the root (wte, wpe, ln_f) is reduced last.
  const fp::UnitNumbers h = fp::unit_numbers(m.units[1], 2, 0), root = fp::unit_numbers(m.units[0], 2, 0);
  ASSERT_GT(root.reduce_numel, h.reduce_numel);
  std::set<std::string> moments;
  for (fp::Precision precision : {fp::Precision::kFp32, fp::Precision::kBf16}) {
    for (fp::ReduceScatterRoute route : {fp::ReduceScatterRoute::kAllToAll, fp::ReduceScatterRoute::kInPlace}) {
      fp::StepSetup s = st;
      s.precision = precision;
      s.reduce_scatter_route = route;
      const fp::PeakBytes p = fp::peak_bytes(m, par(S::kFullShard, 2), s);
      const std::string what = fp::to_string(precision) + " " + fp::to_string(route) + " at " + p.moment;
      moments.insert(p.moment.rfind("backward of h.", 0) == 0 ? "a block" : p.moment);
      int64_t want = 0;
      if (route == fp::ReduceScatterRoute::kAllToAll && p.moment.rfind("backward of h.", 0) == 0) {
        ASSERT_NE(p.moment, "backward of h.5") << "the last block has no reduce-scatter before it";
        // One block's received blocks: fp32 4 x G x shard; bf16 2 x G x shard + 8 x shard.
        want = precision == fp::Precision::kFp32 ? 4 * h.reduce_numel : 2 * h.reduce_numel + 8 * h.reduce_shard_numel;
      }
      // At the end of backward h.0's would run beside the root's larger one, one after the other: 0.
      EXPECT_EQ(p.reduce_in_flight_bytes, want) << what;
      EXPECT_LE(p.reduce_in_flight_bytes, p.unsharded_grad_bytes) << what;
    }
  }
  // fp32 peaks in a block's backward, bf16 all-to-all at the end of backward and bf16 in place at
  // the start: each branch above is taken.
  EXPECT_EQ(moments, (std::set<std::string>{"a block", "end of backward", "start of backward"}));
  const fp::PeakBytes one = fp::peak_bytes(m, par(S::kFullShard, 1), st);  // N = 1 scatters nothing
  EXPECT_EQ(one.moment.rfind("backward of h.", 0), 0u) << one.moment;
  EXPECT_EQ(one.reduce_in_flight_bytes, 0);
  EXPECT_EQ(fp::peak_bytes(m, par(S::kNoShard, 2), st).reduce_in_flight_bytes, 0) << "buckets are held";
}

// [Note: engine copies] in closed form, fp32 at N = 1 (no padding, no cast): no_shard packs its
// buckets and adds them into the gradients (8 + 8 bytes per trainable element); full_shard copies
// each gathered unit into the params (8 bytes per element: the root once, a block in forward and
// again in backward), packs (8) and adds (8) the gradients. Bytes over the profile's copy rate.
TEST(PlannerTime, EngineCopiesInClosedForm) {
  const fp::ModelSpec m = fp::gpt_model(fp::gpt_shape("micro", 8192));
  fp::DeviceProfile p = fp::builtin_profile("h100");
  p.memory_copy_bytes_per_s = 1e10;
  fp::StepSetup st;  // fp32, AdamW
  double root = 0, blocks = 0;
  for (size_t u = 0; u < m.units.size(); ++u) (u == 0 ? root : blocks) += static_cast<double>(m.units[u].numel());
  const double all = root + blocks;  // every micro param is trainable
  EXPECT_NEAR(fp::estimate_step_time(m, par(S::kNoShard, 1), st, p).copy_s, 16 * all / 1e10, 1e-12);
  EXPECT_NEAR(fp::estimate_step_time(m, par(S::kFullShard, 1), st, p).copy_s, (8 * (root + 2 * blocks) + 16 * all) / 1e10,
              1e-12);
  // bf16 params: no_shard casts every fp32 row (4 + 2) and copies it into the params (2 + 2) once per
  // step, packs the bf16 gradients into bf16 buckets (2 + 2) and adds them into fp32 (2 + 4).
  st.precision = fp::Precision::kBf16;
  EXPECT_NEAR(fp::estimate_step_time(m, par(S::kNoShard, 1), st, p).copy_s, (10 + 4 + 6) * all / 1e10, 1e-12);
  // Halving the rate doubles the copies and nothing else.
  const fp::StepTime a = fp::estimate_step_time(m, par(S::kFullShard, 4), st, p);
  p.memory_copy_bytes_per_s /= 2;
  const fp::StepTime b = fp::estimate_step_time(m, par(S::kFullShard, 4), st, p);
  EXPECT_NEAR(b.copy_s, 2 * a.copy_s, 1e-12);
  EXPECT_NEAR(b.step_s - a.step_s, a.copy_s, 1e-9);
}

TEST(PlannerTime, ComputeAndCommunicationLimits) {
  const fp::ModelSpec m = fp::llama_model(fp::llama_shape("llama2-7b"));
  fp::StepSetup st;
  st.precision = fp::Precision::kBf16;
  st.seq_len = 4096;
  const fp::DeviceProfile h100 = fp::builtin_profile("h100");
  // One rank: no communication time; FLOPs = 6 N tokens + causal attention 6 L C (T + 1) tokens
  // (PaLM's 12 L T C over the T(T+1)/2 query-key pairs a causal mask leaves); the update moves 40
  // bytes per parameter (AdamW's 28 + the gradient's norm and clip) at 3.35 TB/s.
  const fp::StepTime one = fp::estimate_step_time(m, par(S::kFullShard, 1), st, h100);
  const double tokens = 4096, N = static_cast<double>(m.matmul_params());
  EXPECT_DOUBLE_EQ(one.flops, 6 * N * tokens + 6.0 * 32 * 4096 * 4097 * tokens);
  EXPECT_EQ(fp::step_update_bytes_per_elem(fp::OptimizerKind::kAdamW), 40);
  EXPECT_NEAR(one.update_s, static_cast<double>(m.num_params()) * 40 / 3.35e12, 1e-9 * one.update_s);
  EXPECT_NEAR(one.step_s, one.compute_s + one.update_s + one.copy_s, 1e-12 * one.compute_s);
  // The published bf16 efficiency at C = 4096: the h100 curve's first point.
  EXPECT_DOUBLE_EQ(one.compute_s, one.flops / (989.5e12 * 0.344));
  EXPECT_DOUBLE_EQ(one.matmul_efficiency, 0.344);
  // Sharded: the update covers this rank's shard only.
  EXPECT_NEAR(fp::estimate_step_time(m, par(S::kFullShard, 8), st, h100).update_s, one.update_s / 8,
              1e-6 * one.update_s);
  // Many ranks: a step is never shorter than its compute or than its busiest queue.
  for (S s : {S::kNoShard, S::kZero1, S::kShardGradOp, S::kFullShard}) {
    const fp::StepTime t = fp::estimate_step_time(m, par(s, 16, 0, 8), st, h100);
    EXPECT_GE(t.step_s, t.compute_s) << fsdp::to_string(s);
    EXPECT_GE(t.step_s + 1e-12, t.comm_s) << fsdp::to_string(s) << ": one queue runs every collective in turn";
    EXPECT_NEAR(t.exposed_comm_s, t.step_s - t.compute_s - t.update_s - t.copy_s, 1e-12);
  }
  // Where communication shares the compute cores nothing hides: the step is the sum of compute,
  // update and every collective of the step's traffic (the replay and step_traffic agree).
  fp::DeviceProfile cpu = h100;
  cpu.comm_overlaps_compute = false;
  for (S s : {S::kNoShard, S::kZero1, S::kShardGradOp, S::kFullShard}) {
    const fp::StepTime t = fp::estimate_step_time(m, par(s, 16, 0, 8), st, cpu);
    EXPECT_NEAR(t.step_s, t.compute_s + t.update_s + t.copy_s + t.comm_s, 1e-9 * t.step_s) << fsdp::to_string(s);
    EXPECT_GT(t.step_s, fp::estimate_step_time(m, par(s, 16, 0, 8), st, h100).step_s) << fsdp::to_string(s);
  }
  fp::StepTime hy = fp::estimate_step_time(m, par(S::kHybridShard, 16, 8, 8), st, cpu);
  EXPECT_NEAR(hy.step_s, hy.compute_s + hy.update_s + hy.copy_s + hy.comm_s, 1e-9 * hy.step_s);
  // hybrid's replica all-reduce (inter-node, 2 replicas) starts on its own queue once its unit's
  // reduce-scatter is done and is waited for with it: on an overlapping profile it hides behind the
  // next units' backward, so hybrid at G = 8 costs little more than full_shard over one node.
  {
    const fp::StepTime fs8 = fp::estimate_step_time(m, par(S::kFullShard, 8, 0, 8), st, h100);
    const fp::StepTime hy8 = fp::estimate_step_time(m, par(S::kHybridShard, 16, 8, 8), st, h100);
    const double replica_s = hy8.comm_s - fs8.comm_s;  // the replica all-reduces (and a wider finite check)
    EXPECT_GT(replica_s, 0.02 * fs8.step_s);
    EXPECT_LT(hy8.step_s - fs8.step_s, 0.1 * replica_s) << "replica all-reduces " << replica_s << " s";
    EXPECT_GE(hy8.step_s, fs8.step_s);
  }
  // Shared cores: each kind's collectives cost shared_core_factor times their time alone.
  fp::DeviceProfile slow = cpu;
  slow.all_gather.shared_core_factor = slow.reduce_scatter.shared_core_factor = slow.all_reduce.shared_core_factor = 2.5;
  for (S s : {S::kNoShard, S::kFullShard}) {
    const fp::StepTime a = fp::estimate_step_time(m, par(s, 16, 0, 8), st, cpu);
    const fp::StepTime b = fp::estimate_step_time(m, par(s, 16, 0, 8), st, slow);
    EXPECT_NEAR(b.comm_s, 2.5 * a.comm_s, 1e-9 * b.comm_s) << fsdp::to_string(s);
    EXPECT_NEAR(b.step_s - a.step_s, 1.5 * a.comm_s, 1e-9 * b.step_s) << fsdp::to_string(s);
  }
  // Compute oversubscribing the cores ([Note: time-shared cores]): each collective runs on its
  // queue for its time alone and takes time alone x factor from the compute thread; the compute
  // thread also waits where it needs a result. So the step lies between compute + update + copies
  // + factor x every collective and the shared-core step at factor 1 (everything serial), and a
  // smaller factor gives a shorter step.
  fp::DeviceProfile shared = cpu;
  shared.compute_oversubscribed = true;
  shared.all_gather.shared_core_factor = shared.reduce_scatter.shared_core_factor = shared.all_reduce.shared_core_factor = 0.4;
  fp::DeviceProfile shared_low = shared;
  shared_low.all_gather.shared_core_factor = shared_low.reduce_scatter.shared_core_factor =
      shared_low.all_reduce.shared_core_factor = 0.1;
  for (S s : {S::kNoShard, S::kZero1, S::kShardGradOp, S::kFullShard}) {
    const fp::StepTime serial = fp::estimate_step_time(m, par(s, 16, 0, 8), st, cpu);
    const fp::StepTime b = fp::estimate_step_time(m, par(s, 16, 0, 8), st, shared);
    EXPECT_NEAR(b.comm_s, serial.comm_s, 1e-9 * serial.comm_s) << fsdp::to_string(s) << ": comm_s is time alone";
    EXPECT_GE(b.step_s + 1e-12, b.compute_s + b.update_s + b.copy_s + 0.4 * b.comm_s) << fsdp::to_string(s);
    EXPECT_LT(b.step_s, serial.step_s) << fsdp::to_string(s);
    EXPECT_LE(fp::estimate_step_time(m, par(s, 16, 0, 8), st, shared_low).step_s, b.step_s) << fsdp::to_string(s);
  }
  // Processor sharing ([Note: processor sharing]): with a duration factor d a collective runs d
  // times slower while the compute thread computes and at its speed alone while it waits. comm_s
  // (time alone) and the compute thread's own work do not change; the step never shrinks and grows
  // by at most (d - 1) x the collectives' time alone; a collective that all but stops beside
  // compute (d = 1000) runs only in the waits, so full_shard's step grows.
  fp::DeviceProfile longer = shared, stalled = shared;
  longer.all_gather.duration_factor = longer.reduce_scatter.duration_factor = longer.all_reduce.duration_factor = 3.0;
  stalled.all_gather.duration_factor = stalled.reduce_scatter.duration_factor = stalled.all_reduce.duration_factor =
      1000.0;
  for (S s : {S::kNoShard, S::kZero1, S::kShardGradOp, S::kFullShard}) {
    const fp::StepTime b = fp::estimate_step_time(m, par(s, 16, 0, 8), st, shared);
    const fp::StepTime d = fp::estimate_step_time(m, par(s, 16, 0, 8), st, longer);
    EXPECT_DOUBLE_EQ(d.comm_s, b.comm_s) << fsdp::to_string(s);
    EXPECT_DOUBLE_EQ(d.compute_s + d.update_s + d.copy_s, b.compute_s + b.update_s + b.copy_s) << fsdp::to_string(s);
    EXPECT_GE(d.step_s + 1e-12, b.step_s) << fsdp::to_string(s);
    EXPECT_LE(d.step_s, b.step_s + 2.0 * b.comm_s + 1e-12) << fsdp::to_string(s);
    EXPECT_GE(fp::estimate_step_time(m, par(s, 16, 0, 8), st, stalled).step_s + 1e-12, d.step_s) << fsdp::to_string(s);
  }
  EXPECT_GT(fp::estimate_step_time(m, par(S::kFullShard, 16, 0, 8), st, stalled).step_s,
            fp::estimate_step_time(m, par(S::kFullShard, 16, 0, 8), st, shared).step_s * 1.01);
  // The duration factor is unused where compute fits the cores.
  {
    fp::DeviceProfile fits_longer = cpu;
    fits_longer.all_gather.duration_factor = fits_longer.reduce_scatter.duration_factor = 3.0;
    EXPECT_DOUBLE_EQ(fp::estimate_step_time(m, par(S::kFullShard, 16, 0, 8), st, fits_longer).step_s,
                     fp::estimate_step_time(m, par(S::kFullShard, 16, 0, 8), st, cpu).step_s);
  }
  // Overlapping communication ignores the factor.
  fp::DeviceProfile h100_slow = h100;
  h100_slow.all_reduce.shared_core_factor = 10;
  EXPECT_DOUBLE_EQ(fp::estimate_step_time(m, par(S::kNoShard, 16, 0, 8), st, h100_slow).step_s,
                   fp::estimate_step_time(m, par(S::kNoShard, 16, 0, 8), st, h100).step_s);
  // A measured model rate replaces the matmul rate x efficiency.
  cpu.model_flops_per_s_bf16 = 100e12;
  cpu.compute_efficiency = 0.5;
  EXPECT_DOUBLE_EQ(fp::estimate_step_time(m, par(S::kFullShard, 1), st, cpu).compute_s, one.flops / 100e12);
  // Collective cost (NCCL's model, test_planner_gpu.cpp for more): a fixed 8.4 us + (n-1) NVLink
  // steps of 3.4 us + (n-1)/n bytes / bandwidth; across two nodes an all-reduce of 1 MB takes the
  // tree (latency 2 x (7 NVLink + 1 network step)) over 8 adapters of 50 GB/s.
  const double ag = fp::collective_time_s(h100, fsdp::comm::CollectiveKind::kAllGather, 8'000'000'000, 8, false);
  EXPECT_DOUBLE_EQ(ag, 8.4e-6 + 7 * 3.4e-6 + 7.0 / 8 * 8e9 / 450e9);
  EXPECT_NEAR(fp::collective_time_s(h100, fsdp::comm::CollectiveKind::kAllReduce, 1'000'000, 16, true),
              8.4e-6 + 2 * (7 * 3.4e-6 + 9.6e-6) + 2 * 1e6 / 400e9, 1e-15);
  EXPECT_EQ(fp::collective_time_s(h100, fsdp::comm::CollectiveKind::kAllReduce, 1'000'000, 1, false), 0.0);
  // Checkpointing recomputes one forward: 8/6 of the block FLOPs.
  fp::StepSetup ck = st;
  ck.activation_checkpointing = true;
  EXPECT_GT(fp::step_flops(m, ck), fp::step_flops(m, st) * 1.3);
}
