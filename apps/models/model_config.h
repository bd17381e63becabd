// ModelConfig: which decoder-only model fsdp-train builds (GPT-2-style or Llama-2-style) and its
// shape, with what the trainer, the dry run and the Hugging Face mappings need of each family: the
// block type that is an FSDP unit, the initialisation, the parameters without weight decay,
// config.json and the tensor names.
#pragma once

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/materialize.h"
#include "models/causal_lm.h"
#include "models/gpt.h"
#include "models/llama.h"

namespace apps::models {

/// Which model and its shape: a GPT (models/gpt.h) or a Llama (models/llama.h).
class ModelConfig {
 public:
  ModelConfig();  ///< the default GPTConfig
  ModelConfig(const GPTConfig& gpt);      // NOLINT(google-explicit-constructor): either family is a ModelConfig
  ModelConfig(const LlamaConfig& llama);  // NOLINT(google-explicit-constructor)

  bool is_llama() const;
  /// "gpt" or "llama".
  std::string family() const;
  /// Hugging Face's class for this family: "GPT2LMHeadModel" or "LlamaForCausalLM".
  std::string hf_architecture() const;
  /// The GPT shape (is_llama() false) / the Llama shape (true); the other throws std::logic_error.
  const GPTConfig& gpt() const;
  const LlamaConfig& llama() const;
  GPTConfig& gpt();
  LlamaConfig& llama();

  int64_t vocab_size() const;
  int64_t n_layer() const;
  int64_t n_head() const;
  int64_t n_kv_head() const;  ///< key/value heads: n_head for a GPT
  int64_t width() const;      ///< n_embd / d_model
  int64_t context() const;    ///< block_size / max_seq, in tokens
  const std::string& attention() const;
  void set_attention(const std::string& kernel);
  int64_t num_params() const;

 private:
  std::variant<GPTConfig, LlamaConfig> shape_;
};

/// Every preset name: GPT's (gpt_preset_names) then Llama's (llama_preset_names).
std::vector<std::string> model_preset_names();

/// The preset `name` at vocabulary vocab_size (the tokenizer's: GPT and Llama presets alike take
/// it). Throws std::invalid_argument naming the known presets.
ModelConfig model_preset(const std::string& name, int64_t vocab_size);

/// The model of cfg on `device`: on the CPU initialised (model_init), on the meta device holding
/// nothing (fully_shard it, then fsdp::materialize(model, model_init(cfg)) or an import). Draws
/// from the global torch generator. Throws std::invalid_argument for an inconsistent shape.
std::shared_ptr<CausalLMImpl> build_model(const ModelConfig& cfg, at::Device device);

/// The wrap policy giving one FSDP unit per block (fsdp::wrap_by_type of the family's block type).
fsdp::WrapPolicy block_wrap_policy(const ModelConfig& cfg);

/// The family's initialisation (gpt_init, llama_init).
fsdp::ModuleInit model_init(const ModelConfig& cfg);

/// Whether parameter `name` (as fsdp::sharded_parameters names it) of a 2-D or larger shape is an
/// embedding table, which AdamW's weight decay leaves alone: wte and wpe (GPT), embed_tokens (Llama).
bool is_embedding_param(const ModelConfig& cfg, const std::string& name);

/// The ModelConfig of a Hugging Face config.json: model_type "gpt2" (gpt_config_from_hf) or
/// "llama" (llama_config_from_hf). Throws std::invalid_argument naming the field and its value for
/// another model_type or a setting the family's mapping refuses.
ModelConfig model_config_from_hf(const nlohmann::json& config);

/// config.json for cfg (gpt_config_to_hf, llama_config_to_hf), with torch_dtype `dtype_name`
/// ("float32", "bfloat16").
nlohmann::json model_config_to_hf(const ModelConfig& cfg, const std::string& dtype_name = "float32");

/// import_safetensors options for the family's Hugging Face checkpoints.
fsdp::checkpoint::SafetensorsImportOptions hf_import_options(const ModelConfig& cfg);

/// The family's Hugging Face name and layout of parameter `param` (gpt2_hf_tensor, llama_hf_tensor).
fsdp::checkpoint::SafetensorsSource hf_tensor(const ModelConfig& cfg, const std::string& param);

}  // namespace apps::models
