// GPT2LMHeadModel checkpoints (gpt_hf.h).
#include "models/gpt_hf.h"

#include <stdexcept>

#include "models/hf_config.h"

namespace apps::models {

using nlohmann::json;
using namespace hf;

GPTConfig gpt_config_from_hf(const json& c) {
  expect_model(c, "gpt2", "GPT2LMHeadModel");
  GPTConfig g;
  g.vocab_size = positive(c, "vocab_size");
  g.block_size = positive(c, "n_positions");
  g.n_embd = positive(c, "n_embd");
  g.n_layer = positive(c, "n_layer");
  g.n_head = positive(c, "n_head");
  if (g.n_embd % g.n_head != 0) refuse("n_head", c["n_head"], "a divisor of n_embd");
  if (c.contains("activation_function") && c["activation_function"] != "gelu_new" &&
      c["activation_function"] != "gelu_pytorch_tanh") {
    refuse("activation_function", c["activation_function"], "gelu_new, the tanh approximation");
  }
  g.layer_norm_eps = positive_real(c, "layer_norm_epsilon", 1e-5);
  expect_null_or(c, "n_inner", 4 * g.n_embd, "null or 4 x n_embd");
  expect_value(c, "scale_attn_weights", true, "true");
  expect_value(c, "scale_attn_by_inverse_layer_idx", false, "false");
  expect_value(c, "reorder_and_upcast_attn", false, "false");
  expect_value(c, "tie_word_embeddings", true, "true: the head is tied to wte");
  expect_value(c, "add_cross_attention", false, "false");
  return g;
}

json gpt_config_to_hf(const GPTConfig& g) {
  return json{{"architectures", {"GPT2LMHeadModel"}},
              {"model_type", "gpt2"},
              {"vocab_size", g.vocab_size},
              {"n_positions", g.block_size},
              {"n_ctx", g.block_size},
              {"n_embd", g.n_embd},
              {"n_layer", g.n_layer},
              {"n_head", g.n_head},
              {"n_inner", nullptr},
              {"activation_function", "gelu_new"},
              {"layer_norm_epsilon", g.layer_norm_eps},
              {"scale_attn_weights", true},
              {"scale_attn_by_inverse_layer_idx", false},
              {"reorder_and_upcast_attn", false},
              {"tie_word_embeddings", true},
              {"resid_pdrop", 0.0},
              {"embd_pdrop", 0.0},
              {"attn_pdrop", 0.0},
              {"torch_dtype", "float32"}};
}

fsdp::checkpoint::SafetensorsSource gpt2_hf_tensor(const std::string& param) {
  bool conv1d = false;
  for (const char* s : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    conv1d = conv1d || ends_with(param, s);
  }
  return {"transformer." + param, conv1d};
}

fsdp::checkpoint::SafetensorsImportOptions gpt2_hf_import_options() {
  fsdp::checkpoint::SafetensorsImportOptions o;
  o.source_of = gpt2_hf_tensor;
  o.ignore = [](const std::string& t) {
    return t == "lm_head.weight" || ends_with(t, ".attn.bias") || ends_with(t, ".attn.masked_bias");
  };
  return o;
}

}  // namespace apps::models
