// LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") on the
// decoder models, as Hugging Face PEFT lays them out: which Linear layers get one, their
// initialisation, PEFT's adapter names and adapter_config.json, and the merged weights for an
// export. The layer itself is models::LinearImpl::add_adapter. docs/training_loops.md, "LoRA".
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/materialize.h"
#include "models/model_config.h"

namespace apps::models {

/// A LoRA fine-tune's settings (PEFT's LoraConfig: r, lora_alpha, lora_dropout, target_modules).
struct LoraConfig {
  int64_t rank = 0;      ///< r; 0: no adapters
  double alpha = 8.0;    ///< lora_alpha: the update is scaled by alpha / r (PEFT's default 8)
  double dropout = 0.0;  ///< lora_dropout on the adapter's input, in training only
  /// Layers that get an adapter, by name: a Linear whose qualified name is the target or ends with
  /// "." + target (PEFT's rule: "c_proj" is both attn.c_proj and mlp.c_proj). Empty: the family's
  /// default (PEFT's: GPT-2 c_attn, Llama q_proj and v_proj). {"all-linear"}: every Linear of the
  /// blocks (not the head).
  std::vector<std::string> target_modules;
  bool enabled() const { return rank > 0; }
};

/// The targets cfg names, its family's default where it names none, with "all-linear" expanded
/// (fsdp::planner::lora_resolve_targets: one definition for fsdp-train and fsdp-plan). Throws
/// std::invalid_argument for "all-linear" beside other names.
std::vector<std::string> resolve_lora_targets(const LoraConfig& lora, const ModelConfig& cfg);

/// Adds an adapter of lora's rank, alpha and dropout to every Linear of `model` that a target
/// names (resolve_lora_targets), on `options`' device, and freezes every other parameter
/// (requires_grad false): only the adapters train. On the CPU the adapters get their values
/// (init_adapters with `seed`); on the meta device none (fsdp::materialize with lora_init). Call
/// before fully_shard. Returns the adapted layers' qualified names, in module order. Not
/// collective. Throws std::invalid_argument naming a target that matches no Linear (with the
/// layer names it could have meant), or for lora's rank, alpha or dropout out of range.
std::vector<std::string> add_lora(torch::nn::Module& model, const LoraConfig& lora, const ModelConfig& cfg,
                                  at::TensorOptions options, uint64_t seed);

/// True for an adapter's parameter: a name with a "lora_A" or "lora_B" component.
bool is_lora_param(const std::string& name);

/// The initialisation of a model with adapters: lora_A's weight (r, in) uniform in
/// [-1/sqrt(in), 1/sqrt(in)] (PEFT's kaiming_uniform_ with a = sqrt(5)), lora_B's zero; every other
/// module through `base`, or, when `base` is null, its parameters zeroed (the values an import
/// overwrites: no random draws for a base that comes from a file). lora_A draws from a generator of
/// its own, seeded from `seed` and the module's name, so an adapter has the same values whatever
/// the base's initialisation, the device the model was built on and the world size.
fsdp::ModuleInit lora_init(fsdp::ModuleInit base, uint64_t seed);

/// Writes every adapter of a CPU-built model with lora_init's values. Not collective.
void init_adapters(torch::nn::Module& model, uint64_t seed);

/// Trainable (adapter) parameters and all parameters of the model (full counts, not shards).
struct LoraCounts {
  int64_t trainable = 0;
  int64_t total = 0;
};
LoraCounts lora_counts(torch::nn::Module& model);

/// PEFT's name of an adapter parameter in adapter_model.safetensors: "base_model.model." + the
/// Hugging Face name of its layer + ".lora_A.weight" / ".lora_B.weight" (GPT-2:
/// base_model.model.transformer.h.0.attn.c_attn.lora_A.weight). A (r, in), B (out, r), never
/// transposed (PEFT's adapters are nn.Linear also over GPT-2's Conv1D).
std::string peft_tensor_name(const ModelConfig& cfg, const std::string& param);

/// adapter_config.json of PEFT (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
/// target_modules, fan_in_fan_out true for GPT-2's Conv1D, bias "none"), naming base_model as
/// base_model_name_or_path (null when empty).
nlohmann::json peft_adapter_config(const LoraConfig& lora, const ModelConfig& cfg, const std::string& base_model);

/// export_safetensors options that write the adapter alone as PEFT's adapter_model.safetensors
/// with adapter_config.json beside it (PeftModel.from_pretrained(base, dir) loads it).
fsdp::checkpoint::SafetensorsExportOptions peft_export_options(const LoraConfig& lora, const ModelConfig& cfg,
                                                               const std::string& base_model);

/// Every adapter's full weights, by parameter name, gathered one tensor at a time (small: r x
/// (in + out) per layer). Collective and blocking over the model's groups: every rank calls it;
/// every rank gets them.
std::map<std::string, at::Tensor> gather_adapters(const std::shared_ptr<torch::nn::Module>& model);

/// Makes `o` write merged weights (a PEFT merge_and_unload): each adapted layer's weight becomes
/// W + (alpha / r) B A, computed in float32 from `adapters` (gather_adapters), and the adapters
/// themselves are skipped. The model is not changed.
void merge_adapters_on_export(fsdp::checkpoint::SafetensorsExportOptions& o, const LoraConfig& lora,
                              std::map<std::string, at::Tensor> adapters);

}  // namespace apps::models
