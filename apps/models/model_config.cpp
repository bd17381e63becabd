// Which model and its shape (model_config.h).
#include "models/model_config.h"


#include <algorithm>
#include <stdexcept>

#include "models/gpt.h"
#include "models/gpt_hf.h"
#include "models/hf_config.h"
#include "models/llama.h"
#include "models/llama_hf.h"

namespace apps::models {

ModelConfig::ModelConfig() : shape_(GPTConfig{}) {}
ModelConfig::ModelConfig(const GPTConfig& gpt) : shape_(gpt) {}
ModelConfig::ModelConfig(const LlamaConfig& llama) : shape_(llama) {}

bool ModelConfig::is_llama() const { return std::holds_alternative<LlamaConfig>(shape_); }
std::string ModelConfig::family() const { return is_llama() ? "llama" : "gpt"; }
std::string ModelConfig::hf_architecture() const { return is_llama() ? "LlamaForCausalLM" : "GPT2LMHeadModel"; }

const GPTConfig& ModelConfig::gpt() const {
  if (is_llama()) throw std::logic_error("ModelConfig::gpt() of a Llama");
  return std::get<GPTConfig>(shape_);
}
const LlamaConfig& ModelConfig::llama() const {
  if (!is_llama()) throw std::logic_error("ModelConfig::llama() of a GPT");
  return std::get<LlamaConfig>(shape_);
}
GPTConfig& ModelConfig::gpt() { return const_cast<GPTConfig&>(std::as_const(*this).gpt()); }
LlamaConfig& ModelConfig::llama() { return const_cast<LlamaConfig&>(std::as_const(*this).llama()); }

int64_t ModelConfig::vocab_size() const { return is_llama() ? llama().vocab_size : gpt().vocab_size; }
int64_t ModelConfig::n_layer() const { return is_llama() ? llama().n_layer : gpt().n_layer; }
int64_t ModelConfig::n_head() const { return is_llama() ? llama().n_head : gpt().n_head; }
int64_t ModelConfig::n_kv_head() const { return is_llama() ? llama().n_kv_head : gpt().n_head; }
int64_t ModelConfig::width() const { return is_llama() ? llama().d_model : gpt().n_embd; }
int64_t ModelConfig::context() const { return is_llama() ? llama().max_seq : gpt().block_size; }
const std::string& ModelConfig::attention() const { return is_llama() ? llama().attention : gpt().attention; }
void ModelConfig::set_attention(const std::string& kernel) { (is_llama() ? llama().attention : gpt().attention) = kernel; }
int64_t ModelConfig::num_params() const { return is_llama() ? llama().num_params() : gpt().num_params(); }

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names = gpt_preset_names();
  for (const auto& n : llama_preset_names()) names.push_back(n);
  return names;
}

ModelConfig model_preset(const std::string& name, int64_t vocab_size) {
  const auto llama = llama_preset_names();
  if (std::find(llama.begin(), llama.end(), name) != llama.end()) {
    LlamaConfig l = llama_preset(name);
    l.vocab_size = vocab_size;
    return l;
  }
  const auto gpt = gpt_preset_names();
  if (std::find(gpt.begin(), gpt.end(), name) == gpt.end()) {
    std::string known;
    for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown model preset '" + name + "' (known: " + known + ")");
  }
  return gpt_preset(name, vocab_size);
}

std::shared_ptr<CausalLMImpl> build_model(const ModelConfig& cfg, at::Device device) {
  if (cfg.is_llama()) return Llama(cfg.llama(), device).ptr();
  return GPT(cfg.gpt(), device).ptr();
}

fsdp::WrapPolicy block_wrap_policy(const ModelConfig& cfg) {
  return cfg.is_llama() ? fsdp::wrap_by_type<LlamaBlockImpl>() : fsdp::wrap_by_type<BlockImpl>();
}

fsdp::ModuleInit model_init(const ModelConfig& cfg) {
  return cfg.is_llama() ? llama_init(cfg.llama()) : gpt_init(cfg.gpt());
}

bool is_embedding_param(const ModelConfig& cfg, const std::string& name) {
  auto starts = [&](const char* prefix) { return name.rfind(prefix, 0) == 0; };
  return cfg.is_llama() ? starts("embed_tokens.") : starts("wte.") || starts("wpe.");
}

ModelConfig model_config_from_hf(const nlohmann::json& config) {
  if (!config.is_object()) throw std::invalid_argument("config.json is not a JSON object");
  const nlohmann::json type = config.contains("model_type") ? config["model_type"] : nlohmann::json(nullptr);
  if (type == "gpt2") return gpt_config_from_hf(config);
  if (type == "llama") return llama_config_from_hf(config);
  hf::refuse("model_type", type, "gpt2 (GPT2LMHeadModel) or llama (LlamaForCausalLM)");
}

nlohmann::json model_config_to_hf(const ModelConfig& cfg, const std::string& dtype_name) {
  nlohmann::json j = cfg.is_llama() ? llama_config_to_hf(cfg.llama()) : gpt_config_to_hf(cfg.gpt());
  j["torch_dtype"] = dtype_name;  // the key transformers before 4.56 reads
  j["dtype"] = dtype_name;        // and the one it reads since
  return j;
}

fsdp::checkpoint::SafetensorsImportOptions hf_import_options(const ModelConfig& cfg) {
  return cfg.is_llama() ? llama_hf_import_options() : gpt2_hf_import_options();
}

fsdp::checkpoint::SafetensorsSource hf_tensor(const ModelConfig& cfg, const std::string& param) {
  return cfg.is_llama() ? llama_hf_tensor(param) : gpt2_hf_tensor(param);
}

}  // namespace apps::models
