// Hugging Face GPT2LMHeadModel checkpoints for the GPT model: its config.json to a GPTConfig and
// back, and the names and layouts of its weights (docs/checkpoints.md, "Hugging Face").
#pragma once

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/safetensors.h"
#include "models/gpt.h"

namespace apps::models {

/// The GPTConfig of a GPT2LMHeadModel's config.json (model_type "gpt2"): vocab_size,
/// n_positions (block_size), n_embd, n_layer, n_head, layer_norm_epsilon (default 1e-5). Fields
/// that would change the math this model computes are checked and any other value refused:
/// activation_function gelu_new (the tanh approximation; "gelu_pytorch_tanh" is the same), n_inner null or
/// 4 x n_embd, scale_attn_weights true, scale_attn_by_inverse_layer_idx false,
/// reorder_and_upcast_attn false, tie_word_embeddings true. Throws std::invalid_argument naming the
/// field, its value and what is supported.
GPTConfig gpt_config_from_hf(const nlohmann::json& config);

/// config.json of a GPT2LMHeadModel with cfg's shape (what from_pretrained needs), for export.
nlohmann::json gpt_config_to_hf(const GPTConfig& cfg);

/// GPT2LMHeadModel's names for this model's parameters: "transformer." + the name; the Conv1D
/// weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) stored transposed, (in, out).
fsdp::checkpoint::SafetensorsSource gpt2_hf_tensor(const std::string& param);

/// import_safetensors options for a GPT2LMHeadModel checkpoint: gpt2_hf_tensor, and the tensors
/// that are no weight here ignored: lm_head.weight (the head is tied to wte) and the attention
/// masks older checkpoints saved (attn.bias, attn.masked_bias).
fsdp::checkpoint::SafetensorsImportOptions gpt2_hf_import_options();

}  // namespace apps::models
