// LoRA over a planner model spec (model_spec.h: lora_default_targets, lora_resolve_targets,
// with_lora): adapters as apps/models/lora.h adds them, the base frozen.
#include "fsdp/common/check.h"
#include "fsdp/planner/model_spec.h"

#include <algorithm>

namespace fsdp::planner {
namespace {

const ErrorContext kLoraWhere{-1, "", "planner LoRA spec"};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The layer of a Linear weight ("h.0.attn.c_attn" of "h.0.attn.c_attn.weight"), or "" for any other
// parameter: 1-D ones, and the embedding tables (the tied GPT head has no weight of its own).
std::string linear_layer(const ParamSpec& p) {
  if (p.shape.size() != 2 || !ends_with(p.name, ".weight")) return "";
  const std::string layer = p.name.substr(0, p.name.size() - 7);
  if (layer == "wte" || layer == "wpe" || layer == "embed_tokens") return "";
  return layer;
}

bool names(const std::string& layer, const std::string& target) {
  return layer == target || ends_with(layer, "." + target);
}

}  // namespace

std::vector<std::string> lora_default_targets(BlockKind kind) {
  if (kind == BlockKind::kGpt) return {"c_attn"};
  if (kind == BlockKind::kLlama) return {"q_proj", "v_proj"};
  return {};
}

std::vector<std::string> lora_resolve_targets(BlockKind kind, const std::vector<std::string>& targets) {
  FSDP_CHECK(kind != BlockKind::kNone, ErrorKind::kInvalidArgument, kLoraWhere,
             "LoRA needs a model with layers (a preset), not one known by its parameter count alone");
  if (targets.empty()) return lora_default_targets(kind);
  bool all = false;
  for (const auto& t : targets) all = all || t == "all-linear";
  if (!all) {
    // Hugging Face's qualified names (PEFT matches those) are these layers' with the family's prefix.
    const std::string prefix = kind == BlockKind::kGpt ? "transformer." : "model.";
    std::vector<std::string> out;
    for (const auto& t : targets) out.push_back(t.rfind(prefix, 0) == 0 ? t.substr(prefix.size()) : t);
    return out;
  }
  FSDP_CHECK(targets.size() == 1, ErrorKind::kInvalidArgument, kLoraWhere,
             "LoRA target 'all-linear' stands alone, not beside other names");
  if (kind == BlockKind::kLlama) return {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return {"c_attn", "c_proj", "c_fc"};
}

std::vector<std::string> split_lora_targets(const std::string& comma_list) {
  std::vector<std::string> out;
  if (comma_list.empty()) return out;
  const std::string list = comma_list + ",";
  for (size_t start = 0, comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1) {
    std::string name = list.substr(start, comma - start);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    FSDP_CHECK(!name.empty(), ErrorKind::kInvalidArgument, kLoraWhere, "LoRA target list '", comma_list,
               "': an empty name in the list");
    out.push_back(name);
  }
  return out;
}

ModelSpec with_lora(const ModelSpec& spec, int64_t rank, const std::vector<std::string>& targets) {
  FSDP_CHECK(rank >= 1, ErrorKind::kInvalidArgument, kLoraWhere, "LoRA rank ", rank, " is not >= 1");
  const std::vector<std::string> resolved = lora_resolve_targets(spec.arch.kind, targets);
  std::vector<bool> used(resolved.size(), false);
  ModelSpec out = spec;
  for (auto& unit : out.units) {
    std::vector<ParamSpec> params, pending;  // pending: the adapters of pending_layer
    std::string pending_layer;
    for (const auto& p : unit.params) {
      // A layer's own parameters first (its bias after its weight), then A and B, as registered.
      if (!pending.empty() && p.name != pending_layer + ".bias") {
        params.insert(params.end(), pending.begin(), pending.end());
        pending.clear();
      }
      params.push_back(p);
      params.back().trainable = false;
      const std::string layer = linear_layer(p);
      bool hit = false;
      for (size_t i = 0; i < resolved.size() && !layer.empty(); ++i) {
        if (names(layer, resolved[i])) hit = used[i] = true;
      }
      if (!hit) continue;
      pending_layer = layer;
      pending.push_back(ParamSpec{layer + ".lora_A.weight", {rank, p.shape[1]}, true});
      pending.push_back(ParamSpec{layer + ".lora_B.weight", {p.shape[0], rank}, true});
    }
    params.insert(params.end(), pending.begin(), pending.end());
    unit.params = std::move(params);
  }
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (used[i]) continue;
    std::vector<std::string> leaves;  // the layer names a target may end with
    for (const auto& unit : spec.units) {
      for (const auto& p : unit.params) {
        const std::string layer = linear_layer(p);
        const std::string leaf = layer.substr(layer.rfind('.') + 1);
        if (!layer.empty() && std::find(leaves.begin(), leaves.end(), leaf) == leaves.end()) leaves.push_back(leaf);
      }
    }
    std::string known;
    for (const auto& l : leaves) known += (known.empty() ? "'" : ", '") + l + "'";
    throw Error(ErrorKind::kInvalidArgument, kLoraWhere,
                str_cat("LoRA target '", resolved[i], "' names no Linear layer of ", spec.name, "; its layers: ", known,
                        " (a target is a layer's name or the end of its qualified name; or all-linear)"));
  }
  return out;
}

}  // namespace fsdp::planner
