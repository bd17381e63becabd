// LoRA adapters on the decoder models (lora.h).
#include "models/lora.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/matmul.h>

#include <cmath>
#include <stdexcept>
#include <utility>

#include "fsdp/common/check.h"
#include "fsdp/common/hash.h"
#include "fsdp/planner/model_spec.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/state_dict.h"
#include "models/hf_config.h"
#include "models/layers.h"

namespace apps::models {
namespace {

using hf::ends_with;

bool matches(const std::string& name, const std::string& target) {
  return name == target || ends_with(name, "." + target);
}

// The model's Linear layers (adapters excluded), by qualified name, in module order.
std::vector<std::pair<std::string, LinearImpl*>> linears(torch::nn::Module& model) {
  std::vector<std::pair<std::string, LinearImpl*>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* l = dynamic_cast<LinearImpl*>(item.value().get());
    if (l == nullptr || ends_with(item.key(), ".lora_A") || ends_with(item.key(), ".lora_B")) continue;
    out.emplace_back(item.key(), l);
  }
  return out;
}

// The generator of the adapter `module`: the run's seed mixed with the module's name.
at::Generator adapter_generator(uint64_t seed, const std::string& module) {
  return at::make_generator<at::CPUGeneratorImpl>(fsdp::fnv1a64(module) ^ (seed * 0x9E3779B97F4A7C15ull));
}

void init_adapter_tensor(const std::string& name, LinearImpl& m, uint64_t seed) {
  if (ends_with(name, "lora_B")) {
    m.weight.zero_();
    return;
  }
  const double bound = 1.0 / std::sqrt(static_cast<double>(m.weight.size(1)));  // kaiming_uniform_(a = sqrt(5))
  m.weight.uniform_(-bound, bound, adapter_generator(seed, name));
}

bool is_adapter_module(const std::string& name) { return ends_with(name, "lora_A") || ends_with(name, "lora_B"); }

}  // namespace

std::vector<std::string> resolve_lora_targets(const LoraConfig& lora, const ModelConfig& cfg) {
  try {
    return fsdp::planner::lora_resolve_targets(cfg.is_llama() ? fsdp::planner::BlockKind::kLlama
                                                              : fsdp::planner::BlockKind::kGpt,
                                               lora.target_modules);
  } catch (const fsdp::Error& e) {
    throw std::invalid_argument(e.message());
  }
}

std::vector<std::string> add_lora(torch::nn::Module& model, const LoraConfig& lora, const ModelConfig& cfg,
                                  at::TensorOptions options, uint64_t seed) {
  const std::vector<std::string> targets = resolve_lora_targets(lora, cfg);
  const auto layers = linears(model);
  for (const auto& t : targets) {
    bool found = false;
    for (const auto& [name, l] : layers) found = found || matches(name, t);
    if (!found) {
      std::string known;
      for (const auto& [name, l] : layers) {
        const std::string leaf = name.substr(name.rfind('.') + 1);
        if (known.find("'" + leaf + "'") == std::string::npos) known += (known.empty() ? "'" : ", '") + leaf + "'";
      }
      throw std::invalid_argument("LoRA target '" + t + "' names no Linear layer of this " + cfg.family() +
                                  " model; its layers: " + known + " (a target is a layer's name or the end of its "
                                  "qualified name, as in PEFT; or all-linear)");
    }
  }
  for (auto& p : model.parameters()) p.set_requires_grad(false);
  std::vector<std::string> adapted;
  for (const auto& [name, l] : layers) {
    bool hit = false;
    for (const auto& t : targets) hit = hit || matches(name, t);
    if (!hit) continue;
    l->add_adapter(lora.rank, lora.alpha, lora.dropout, options);
    adapted.push_back(name);
  }
  if (!options.device().is_meta()) init_adapters(model, seed);
  return adapted;
}

bool is_lora_param(const std::string& name) {
  return name.find("lora_A.") != std::string::npos || name.find("lora_B.") != std::string::npos;
}

fsdp::ModuleInit lora_init(fsdp::ModuleInit base, uint64_t seed) {
  return [base = std::move(base), seed](const std::string& name, torch::nn::Module& m) {
    if (is_adapter_module(name)) {
      if (auto* l = dynamic_cast<LinearImpl*>(&m)) return init_adapter_tensor(name, *l, seed);
    }
    if (base) return base(name, m);
    for (auto& p : m.parameters(/*recurse=*/false)) p.zero_();
  };
}

void init_adapters(torch::nn::Module& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (!is_adapter_module(item.key())) continue;
    if (auto* l = dynamic_cast<LinearImpl*>(item.value().get())) init_adapter_tensor(item.key(), *l, seed);
  }
}

LoraCounts lora_counts(torch::nn::Module& model) {
  LoraCounts c;
  for (const auto& item : model.named_parameters()) {
    c.total += item.value().numel();
    if (is_lora_param(item.key())) c.trainable += item.value().numel();
  }
  return c;
}

std::string peft_tensor_name(const ModelConfig& cfg, const std::string& param) {
  const bool a = ends_with(param, ".lora_A.weight");
  if (!a && !ends_with(param, ".lora_B.weight")) {
    throw std::invalid_argument("'" + param + "' is no LoRA adapter weight (LAYER.lora_A.weight or LAYER.lora_B.weight)");
  }
  const std::string layer = param.substr(0, param.size() - std::string(".lora_A.weight").size());
  std::string hf = hf_tensor(cfg, layer + ".weight").tensor;  // the layer's weight in the Hugging Face model
  hf.resize(hf.size() - std::string(".weight").size());
  return "base_model.model." + hf + (a ? ".lora_A.weight" : ".lora_B.weight");
}

nlohmann::json peft_adapter_config(const LoraConfig& lora, const ModelConfig& cfg, const std::string& base_model) {
  return nlohmann::json{{"peft_type", "LORA"},
                        {"task_type", "CAUSAL_LM"},
                        {"base_model_name_or_path", base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model)},
                        {"r", lora.rank},
                        {"lora_alpha", lora.alpha},
                        {"lora_dropout", lora.dropout},
                        {"target_modules", resolve_lora_targets(lora, cfg)},
                        {"fan_in_fan_out", !cfg.is_llama()},  // GPT-2's Conv1D stores weights (in, out)
                        {"bias", "none"},
                        {"modules_to_save", nullptr},
                        {"init_lora_weights", true},
                        {"use_rslora", false},
                        {"use_dora", false},
                        {"inference_mode", true}};
}

fsdp::checkpoint::SafetensorsExportOptions peft_export_options(const LoraConfig& lora, const ModelConfig& cfg,
                                                               const std::string& base_model) {
  fsdp::checkpoint::SafetensorsExportOptions o;
  o.file_stem = "adapter_model";
  o.skip = [](const std::string& param) { return !is_lora_param(param); };
  o.target_of = [cfg](const std::string& param) {
    return fsdp::checkpoint::SafetensorsSource{peft_tensor_name(cfg, param), false};
  };
  o.extra_files["adapter_config.json"] = peft_adapter_config(lora, cfg, base_model).dump(2) + "\n";
  return o;
}

std::map<std::string, at::Tensor> gather_adapters(const std::shared_ptr<torch::nn::Module>& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& sp : fsdp::sharded_parameters(model)) {
    if (is_lora_param(sp.name)) out[sp.name] = fsdp::gather_full_tensor(*sp.unit, *sp.param);
  }
  return out;
}

void merge_adapters_on_export(fsdp::checkpoint::SafetensorsExportOptions& o, const LoraConfig& lora,
                              std::map<std::string, at::Tensor> adapters) {
  o.skip = [](const std::string& param) { return is_lora_param(param); };
  const double scaling = lora.alpha / static_cast<double>(lora.rank);
  o.value_of = [adapters = std::move(adapters), scaling](const std::string& param, const at::Tensor& full) {
    if (!ends_with(param, ".weight")) return full;
    const std::string layer = param.substr(0, param.size() - std::string(".weight").size());
    auto a = adapters.find(layer + ".lora_A.weight");
    if (a == adapters.end()) return full;
    const at::Tensor& b = adapters.at(layer + ".lora_B.weight");
    at::Tensor delta = at::matmul(b.to(at::kFloat), a->second.to(at::kFloat)).mul_(scaling);  // (out, in)
    return (full.to(at::kFloat) + delta).to(full.scalar_type());
  };
}

}  // namespace apps::models
