// The planner's LoRA spec (model_spec.h: with_lora, lora_resolve_targets, split_lora_targets):
// adapters where apps/models/lora.h puts them, the base frozen, the model state and the FLOPs of a
// fine-tune over a frozen base.
#include <gtest/gtest.h>

#include "fsdp/common/check.h"
#include "fsdp/planner/memory.h"
#include "fsdp/planner/model_spec.h"
#include "fsdp/planner/time_model.h"

namespace fp = fsdp::planner;

namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const fsdp::Error& e) {
    return e.message();
  }
  return "(no error)";
}

}  // namespace

TEST(PlannerLora, AdaptersFollowTheirLayerAndOnlyTheyTrain) {
  const fp::ModelSpec base = fp::gpt_model(fp::gpt_shape("nano", 8192), "nano");  // C = 128, 4 blocks
  const fp::ModelSpec m = fp::with_lora(base, 4, {});                              // PEFT's default: c_attn
  ASSERT_EQ(m.units.size(), base.units.size());
  const auto& b0 = m.units[1].params;
  std::vector<std::string> names;
  for (const auto& p : b0) names.push_back(p.name);
  const std::vector<std::string> want{"h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.attn.c_attn.weight",
                                      "h.0.attn.c_attn.bias", "h.0.attn.c_attn.lora_A.weight",
                                      "h.0.attn.c_attn.lora_B.weight", "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias",
                                      "h.0.ln_2.weight", "h.0.ln_2.bias", "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias",
                                      "h.0.mlp.c_proj.weight", "h.0.mlp.c_proj.bias"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(b0[4].shape, (std::vector<int64_t>{4, 128}));  // A (r, in)
  EXPECT_EQ(b0[5].shape, (std::vector<int64_t>{384, 4}));  // B (out, r)
  int64_t trainable = 0;
  for (const auto& u : m.units) trainable += u.trainable_numel();
  EXPECT_EQ(trainable, 4 * 4 * (128 + 384));                // 4 blocks x r (in + out)
  EXPECT_EQ(m.num_params(), base.num_params() + trainable);
  EXPECT_EQ(m.units[0].trainable_numel(), 0) << "the root (embeddings, ln_f) is frozen";

  // Model state at N = 4 (AdamW, fp32): the frozen base holds its master rows only.
  fp::Parallelism par;
  par.world_size = 4;
  const fp::ModelStateBytes s = fp::model_state_bytes(m, par, fp::StepSetup{});
  EXPECT_EQ(s.optim_state_bytes, 8 * trainable / 4);  // every adapter divides by 4 (rows 4 and 384)
  EXPECT_EQ(s.sharded_grad_bytes, 4 * trainable / 4);

  // Llama: all-linear adapts the seven projections of every block, not the head.
  const fp::ModelSpec llama = fp::with_lora(fp::llama_model(fp::llama_shape("llama2-7b"), "7b"), 8, {"all-linear"});
  int64_t adapters = 0;
  for (const auto& u : llama.units) {
    for (const auto& p : u.params) adapters += p.trainable ? 1 : 0;
  }
  EXPECT_EQ(adapters, 32 * 7 * 2);
}

TEST(PlannerLora, TargetsAreResolvedAndCheckedOnce) {
  EXPECT_EQ(fp::split_lora_targets(" q_proj , v_proj"), (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_TRUE(fp::split_lora_targets("").empty());
  EXPECT_NE(message_of([] { fp::split_lora_targets("c_attn,,c_fc"); }).find("an empty name in the list"),
            std::string::npos);
  EXPECT_EQ(fp::lora_resolve_targets(fp::BlockKind::kLlama, {}), (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(fp::lora_resolve_targets(fp::BlockKind::kGpt, {"all-linear"}),
            (std::vector<std::string>{"c_attn", "c_proj", "c_fc"}));
  const fp::ModelSpec nano = fp::gpt_model(fp::gpt_shape("nano", 8192), "nano");
  EXPECT_EQ(message_of([&] { fp::with_lora(nano, 4, {"q_proj"}); }),
            "LoRA target 'q_proj' names no Linear layer of nano; its layers: 'c_attn', 'c_proj', 'c_fc' (a target is a "
            "layer's name or the end of its qualified name; or all-linear)");
  // Hugging Face's qualified names, as PEFT takes them, name the same layers.
  EXPECT_EQ(fp::lora_resolve_targets(fp::BlockKind::kGpt, {"transformer.h.0.attn.c_attn"}),
            (std::vector<std::string>{"h.0.attn.c_attn"}));
  EXPECT_EQ(fp::lora_resolve_targets(fp::BlockKind::kLlama, {"model.layers.1.mlp.down_proj", "q_proj"}),
            (std::vector<std::string>{"layers.1.mlp.down_proj", "q_proj"}));
  int64_t one = 0;
  for (const auto& u : fp::with_lora(nano, 4, {"transformer.h.0.attn.c_attn"}).units) one += u.trainable_numel();
  EXPECT_EQ(one, 4 * (128 + 384)) << "one layer, block 0's";
  EXPECT_NE(message_of([&] { fp::with_lora(nano, 0, {}); }).find("LoRA rank 0 is not >= 1"), std::string::npos);
  EXPECT_NE(message_of([&] { fp::with_lora(nano, 4, {"all-linear", "c_fc"}); }).find("stands alone"), std::string::npos);
  EXPECT_NE(message_of([] { fp::with_lora(fp::params_only_model(1000, 2), 4, {}); }).find("parameter count alone"),
            std::string::npos);
  EXPECT_NE(message_of([&] { fp::with_lora(nano, 4, {"wte"}); }).find("names no Linear layer"), std::string::npos)
      << "an embedding table is no Linear";
}

// A frozen base computes no weight gradients: a block's backward is its forward's input gradients
// plus attention's two passes, not twice the forward.
TEST(PlannerLora, BackwardOfAFrozenBaseIsAboutOneForward) {
  const fp::ModelSpec base = fp::gpt_model(fp::gpt_shape("gpt2", 50257), "gpt2");
  const fp::ModelSpec lora = fp::with_lora(base, 8, {});
  fp::StepSetup st;
  st.seq_len = 1024;
  const fp::UnitFlops full = fp::unit_flops(base, 1, st), tuned = fp::unit_flops(lora, 1, st);
  EXPECT_DOUBLE_EQ(full.backward, 2 * full.forward);
  EXPECT_DOUBLE_EQ(tuned.forward, full.forward);
  const double attention = 2.0 * 768 * (1024 + 1) * 1024;  // per sequence, micro-batch 1
  const double matmul = full.forward - attention;
  const double share = static_cast<double>(lora.units[1].trainable_numel()) / static_cast<double>(lora.units[1].numel());
  EXPECT_DOUBLE_EQ(tuned.backward, matmul * (1 + share) + 2 * attention);
  EXPECT_LT(tuned.backward, 1.2 * tuned.forward);
}
