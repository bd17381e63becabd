// Tier `unit`: the planner's GPT spec is the model fsdp-train builds. apps/models/gpt.cpp's GPT,
// constructed here (no process group), has the same parameters (names, shapes, order) in the same
// FSDP units (one per block "h.i" + the root) and the same count as GPTConfig::num_params().
#include <gtest/gtest.h>

#include "fsdp/planner/model_spec.h"
#include "models/gpt.h"

namespace fp = fsdp::planner;

TEST(PlannerGptSpec, SameParametersAsTheModule) {
  for (const std::string preset : {"nano", "micro"}) {
    SCOPED_TRACE(preset);
    const auto cfg = apps::models::gpt_preset(preset, 8192);
    fp::GptShape s = fp::gpt_shape(preset, 8192);
    ASSERT_EQ(s.n_layer, cfg.n_layer);
    ASSERT_EQ(s.n_head, cfg.n_head);
    ASSERT_EQ(s.n_embd, cfg.n_embd);
    ASSERT_EQ(s.block_size, cfg.block_size);
    const fp::ModelSpec spec = fp::gpt_model(s, preset);
    apps::models::GPT model(cfg);
    EXPECT_EQ(spec.num_params(), cfg.num_params());
    // The module's parameters, grouped as fully_shard_tree(wrap_by_type<BlockImpl>) groups them:
    // "h.i.*" to unit i + 1, everything else to the root, each in registration order.
    std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> units(cfg.n_layer + 1);
    for (const auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      size_t u = 0;
      if (name.rfind("h.", 0) == 0) u = 1 + std::stoul(name.substr(2, name.find('.', 2) - 2));
      units[u].emplace_back(name, item.value().sizes().vec());
    }
    ASSERT_EQ(spec.units.size(), units.size());
    for (size_t u = 0; u < units.size(); ++u) {
      ASSERT_EQ(spec.units[u].params.size(), units[u].size()) << "unit " << u;
      for (size_t i = 0; i < units[u].size(); ++i) {
        EXPECT_EQ(spec.units[u].params[i].name, units[u][i].first) << "unit " << u << " param " << i;
        EXPECT_EQ(spec.units[u].params[i].shape, units[u][i].second) << units[u][i].first;
      }
    }
  }
}
