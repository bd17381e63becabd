// LlamaForCausalLM checkpoints (llama_hf.h).
#include "models/llama_hf.h"

#include <stdexcept>

#include "models/hf_config.h"

namespace apps::models {

using nlohmann::json;
using namespace hf;

LlamaConfig llama_config_from_hf(const json& c) {
  expect_model(c, "llama", "LlamaForCausalLM");
  LlamaConfig l;
  l.vocab_size = positive(c, "vocab_size");
  l.d_model = positive(c, "hidden_size");
  l.n_layer = positive(c, "num_hidden_layers");
  l.n_head = positive(c, "num_attention_heads");
  l.n_kv_head = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                    ? positive(c, "num_key_value_heads")
                    : l.n_head;
  l.ffn = positive(c, "intermediate_size");
  l.max_seq = positive(c, "max_position_embeddings");
  l.rms_eps = positive_real(c, "rms_norm_eps", 1e-6);
  l.rope_theta = positive_real(c, "rope_theta", 10000.0);
  if (l.d_model % l.n_head != 0 || (l.d_model / l.n_head) % 2 != 0) {
    refuse("num_attention_heads", c["num_attention_heads"], "a divisor of hidden_size giving heads of even size");
  }
  if (l.n_head % l.n_kv_head != 0) refuse("num_key_value_heads", c["num_key_value_heads"], "a divisor of num_attention_heads");
  if (c.contains("hidden_act") && c["hidden_act"] != "silu" && c["hidden_act"] != "swish") {
    refuse("hidden_act", c["hidden_act"], "silu (or its other name, swish)");
  }
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
    refuse("rope_scaling", c["rope_scaling"], "absent or null: rotary scaling is not implemented");
  }
  expect_value(c, "attention_bias", false, "false");
  expect_value(c, "mlp_bias", false, "false");
  expect_null_or(c, "head_dim", l.d_model / l.n_head, "hidden_size / num_attention_heads");
  expect_value(c, "pretraining_tp", 1, "1");
  expect_value(c, "tie_word_embeddings", false, "false: the head is untied");
  return l;
}

json llama_config_to_hf(const LlamaConfig& l) {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", l.vocab_size},
              {"hidden_size", l.d_model},
              {"num_hidden_layers", l.n_layer},
              {"num_attention_heads", l.n_head},
              {"num_key_value_heads", l.n_kv_head},
              {"head_dim", l.d_model / l.n_head},
              {"intermediate_size", l.ffn},
              {"max_position_embeddings", l.max_seq},
              {"rms_norm_eps", l.rms_eps},
              {"rope_theta", l.rope_theta},
              {"rope_scaling", nullptr},
              {"hidden_act", "silu"},
              {"attention_bias", false},
              {"mlp_bias", false},
              {"pretraining_tp", 1},
              {"tie_word_embeddings", false},
              {"attention_dropout", 0.0},
              {"torch_dtype", "float32"}};
}

fsdp::checkpoint::SafetensorsSource llama_hf_tensor(const std::string& param) {
  if (param == "lm_head.weight") return {param, false};
  return {"model." + param, false};
}

fsdp::checkpoint::SafetensorsImportOptions llama_hf_import_options() {
  fsdp::checkpoint::SafetensorsImportOptions o;
  o.source_of = llama_hf_tensor;
  o.ignore = [](const std::string& t) { return ends_with(t, ".self_attn.rotary_emb.inv_freq"); };
  return o;
}

}  // namespace apps::models
