// Hugging Face LlamaForCausalLM checkpoints for the Llama model: its config.json to a LlamaConfig
// and back, and the names of its weights (docs/checkpoints.md, "Hugging Face").
#pragma once

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/safetensors.h"
#include "models/llama.h"

namespace apps::models {

/// The LlamaConfig of a LlamaForCausalLM's config.json (model_type "llama"): vocab_size,
/// hidden_size (d_model), num_hidden_layers, num_attention_heads, num_key_value_heads (grouped-query
/// attention; default num_attention_heads), intermediate_size (ffn), max_position_embeddings,
/// rms_norm_eps, rope_theta. Fields that would change the math this model computes are checked and
/// any other value refused: hidden_act silu, rope_scaling null, attention_bias and mlp_bias false,
/// head_dim (when given) hidden_size / num_attention_heads, pretraining_tp 1, tie_word_embeddings
/// false (the head is untied). Throws std::invalid_argument naming the field, its value and what
/// is supported.
LlamaConfig llama_config_from_hf(const nlohmann::json& config);

/// config.json of a LlamaForCausalLM with cfg's shape (what from_pretrained needs), for export.
nlohmann::json llama_config_to_hf(const LlamaConfig& cfg);

/// LlamaForCausalLM's names for this model's parameters: "model." + the name, lm_head.weight as it
/// is; nothing stored transposed. The rotary layout is transformers' (pairs i and i + D/2 rotate
/// together: the q_proj and k_proj rows of its checkpoints are in that order), which is this model's.
fsdp::checkpoint::SafetensorsSource llama_hf_tensor(const std::string& param);

/// import_safetensors options for a LlamaForCausalLM checkpoint (llama_hf_tensor; the rotary
/// frequencies older checkpoints saved, self_attn.rotary_emb.inv_freq, are skipped).
fsdp::checkpoint::SafetensorsImportOptions llama_hf_import_options();

}  // namespace apps::models
