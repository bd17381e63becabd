// GPT2LMHeadModel checkpoints (gpt_hf.h).
#include "models/gpt_hf.h"

#include <stdexcept>

namespace apps::models {

namespace {

using nlohmann::json;

[[noreturn]] void refuse(const std::string& field, const json& value, const std::string& supported) {
  throw std::invalid_argument("config.json: " + field + " = " + value.dump() + " is not supported here (" +
                              supported + ")");
}

int64_t positive(const json& c, const std::string& field) {
  if (!c.contains(field)) throw std::invalid_argument("config.json: " + field + " is missing");
  const json& v = c[field];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0) refuse(field, v, "an integer > 0");
  return v.get<int64_t>();
}

// A field that, when present, must hold `want` (a missing one takes transformers' default).
void expect_value(const json& c, const std::string& field, const json& want, const std::string& why) {
  if (c.contains(field) && c[field] != want) refuse(field, c[field], why);
}

}  // namespace

GPTConfig gpt_config_from_hf(const json& c) {
  if (!c.is_object()) throw std::invalid_argument("config.json is not a JSON object");
  if (c.value("model_type", std::string()) != "gpt2") {
    refuse("model_type", c.contains("model_type") ? c["model_type"] : json(nullptr), "gpt2");
  }
  if (c.contains("architectures")) {
    const json& a = c["architectures"];
    if (!a.is_array() || a.size() != 1 || a[0] != "GPT2LMHeadModel") refuse("architectures", a, "[\"GPT2LMHeadModel\"]");
  }
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
  if (c.contains("layer_norm_epsilon") &&
      (!c["layer_norm_epsilon"].is_number() || c["layer_norm_epsilon"].get<double>() != 1e-5)) {
    refuse("layer_norm_epsilon", c["layer_norm_epsilon"], "1e-05");
  }
  if (c.contains("n_inner") && !c["n_inner"].is_null() && c["n_inner"] != json(4 * g.n_embd)) {
    refuse("n_inner", c["n_inner"], "null or 4 x n_embd");
  }
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
              {"layer_norm_epsilon", 1e-5},
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
    const std::string suffix = s;
    conv1d = conv1d || (param.size() > suffix.size() && param.compare(param.size() - suffix.size(), suffix.size(), suffix) == 0);
  }
  return {"transformer." + param, conv1d};
}

fsdp::checkpoint::SafetensorsImportOptions gpt2_hf_import_options() {
  fsdp::checkpoint::SafetensorsImportOptions o;
  o.source_of = gpt2_hf_tensor;
  o.ignore = [](const std::string& t) {
    auto ends_with = [&](const std::string& s) {
      return t.size() >= s.size() && t.compare(t.size() - s.size(), s.size(), s) == 0;
    };
    return t == "lm_head.weight" || ends_with(".attn.bias") || ends_with(".attn.masked_bias");
  };
  return o;
}

}  // namespace apps::models
