#include "fsdp/planner/model_spec.h"

#include <algorithm>

#include "fsdp/common/check.h"

namespace fsdp::planner {
namespace {

const ErrorContext kSpecWhere{-1, "", "planner model spec"};

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

void add(UnitSpec& u, const std::string& name, std::vector<int64_t> shape) {
  u.params.push_back(ParamSpec{u.name.empty() ? name : u.name + "." + name, std::move(shape), true});
}

}  // namespace

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t UnitSpec::numel() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

int64_t UnitSpec::trainable_numel() const {
  int64_t n = 0;
  for (const auto& p : params) n += p.trainable ? p.numel() : 0;
  return n;
}

int64_t ModelSpec::num_params() const {
  int64_t n = 0;
  for (const auto& u : units) n += u.numel();
  return n;
}

int64_t ModelSpec::matmul_params() const {
  if (arch.kind == BlockKind::kNone) return num_params();
  const int64_t C = arch.n_embd, I = arch.ffn_hidden, Ckv = arch.kv_width();
  int64_t per_block = 0;
  if (arch.kind == BlockKind::kGpt) per_block = 3 * C * C + C * C + 2 * C * I;   // c_attn, c_proj, MLP
  if (arch.kind == BlockKind::kLlama) per_block = 2 * C * C + 2 * Ckv * C + 3 * C * I;  // q,o; k,v; SwiGLU
  return arch.n_layer * per_block + arch.vocab_size * C;  // + the head (tied or not: one matmul)
}

std::vector<std::string> gpt_preset_names() {
  return {"nano", "micro", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
}

GptShape gpt_shape(const std::string& preset, int64_t vocab_size) {
  GptShape g;
  g.vocab_size = vocab_size;
  auto set = [&](int64_t layers, int64_t heads, int64_t width, int64_t ctx) {
    g.n_layer = layers;
    g.n_head = heads;
    g.n_embd = width;
    g.block_size = ctx;
  };
  // fsdp-train builds its GPT presets from this table (apps/models/gpt.cpp:gpt_preset).
  if (preset == "nano") set(4, 4, 128, 256);
  else if (preset == "micro") set(6, 6, 384, 256);
  else if (preset == "gpt2") set(12, 12, 768, 1024);
  else if (preset == "gpt2-medium") set(24, 16, 1024, 1024);
  else if (preset == "gpt2-large") set(36, 20, 1280, 1024);
  else if (preset == "gpt2-xl") set(48, 25, 1600, 1024);
  else {
    throw Error(ErrorKind::kInvalidArgument, kSpecWhere,
                str_cat("unknown GPT preset '", preset, "' (known: ", join(gpt_preset_names()), ")"));
  }
  return g;
}

ModelSpec gpt_model(const GptShape& s, const std::string& name) {
  FSDP_CHECK(s.vocab_size > 0 && s.n_layer > 0 && s.n_head > 0 && s.n_embd > 0 && s.block_size > 0,
             ErrorKind::kInvalidArgument, kSpecWhere, "GPT shape: all sizes must be positive (vocab ",
             s.vocab_size, ", layers ", s.n_layer, ", heads ", s.n_head, ", width ", s.n_embd,
             ", context ", s.block_size, ")");
  FSDP_CHECK(s.n_embd % s.n_head == 0, ErrorKind::kInvalidArgument, kSpecWhere, "GPT shape: n_embd ",
             s.n_embd, " is not divisible by n_head ", s.n_head);
  FSDP_CHECK(s.attention == "auto" || s.attention == "flash" || s.attention == "math",
             ErrorKind::kInvalidArgument, kSpecWhere,
             expected_actual("GPT attention kernel", "auto, flash or math", s.attention));
  const int64_t C = s.n_embd;
  ModelSpec m;
  m.name = name;
  m.arch = {BlockKind::kGpt, s.n_layer, C, s.n_head, s.n_head, 4 * C, s.vocab_size, s.block_size,
            /*tied_head=*/true, s.attention};
  // Root: the GPT module's own parameters in registration order (wte, wpe, then ln_f after h).
  UnitSpec root;
  root.is_root = true;
  add(root, "wte.weight", {s.vocab_size, C});
  add(root, "wpe.weight", {s.block_size, C});
  add(root, "ln_f.weight", {C});
  add(root, "ln_f.bias", {C});
  m.units.push_back(std::move(root));
  for (int64_t i = 0; i < s.n_layer; ++i) {
    UnitSpec b;
    b.name = "h." + std::to_string(i);
    add(b, "ln_1.weight", {C});
    add(b, "ln_1.bias", {C});
    add(b, "attn.c_attn.weight", {3 * C, C});
    add(b, "attn.c_attn.bias", {3 * C});
    add(b, "attn.c_proj.weight", {C, C});
    add(b, "attn.c_proj.bias", {C});
    add(b, "ln_2.weight", {C});
    add(b, "ln_2.bias", {C});
    add(b, "mlp.c_fc.weight", {4 * C, C});
    add(b, "mlp.c_fc.bias", {4 * C});
    add(b, "mlp.c_proj.weight", {C, 4 * C});
    add(b, "mlp.c_proj.bias", {C});
    m.units.push_back(std::move(b));
  }
  return m;
}

std::vector<std::string> llama_preset_names() { return {"llama-tiny", "llama2-7b", "llama2-13b", "llama2-70b"}; }

LlamaShape llama_shape(const std::string& preset) {
  LlamaShape l;  // vocab 32000, context 4096 for all three
  auto set = [&](int64_t width, int64_t layers, int64_t heads, int64_t kv_heads, int64_t ffn) {
    l.n_embd = width;
    l.n_layer = layers;
    l.n_head = heads;
    l.n_kv_head = kv_heads;
    l.ffn_hidden = ffn;
  };
  if (preset == "llama-tiny") {  // fsdp-train's test model: the default tokenizer's 8192 tokens, context 256
    set(64, 2, 4, 2, 172);
    l.vocab_size = 8192;
    l.context = 256;
  } else if (preset == "llama2-7b") set(4096, 32, 32, 32, 11008);
  else if (preset == "llama2-13b") set(5120, 40, 40, 40, 13824);
  else if (preset == "llama2-70b") set(8192, 80, 64, 8, 28672);
  else {
    throw Error(ErrorKind::kInvalidArgument, kSpecWhere,
                str_cat("unknown Llama preset '", preset, "' (known: ", join(llama_preset_names()), ")"));
  }
  return l;
}

int64_t preset_vocab_size(const std::string& preset) {
  const auto gpt = gpt_preset_names();
  if (std::find(gpt.begin(), gpt.end(), preset) != gpt.end()) return preset.rfind("gpt2", 0) == 0 ? 50257 : 8192;
  return llama_shape(preset).vocab_size;  // throws for an unknown name
}

ModelSpec llama_model(const LlamaShape& s, const std::string& name) {
  FSDP_CHECK(s.vocab_size > 0 && s.n_layer > 0 && s.n_head > 0 && s.n_kv_head > 0 && s.n_embd > 0 &&
                 s.ffn_hidden > 0 && s.context > 0,
             ErrorKind::kInvalidArgument, kSpecWhere, "Llama shape: all sizes must be positive");
  FSDP_CHECK(s.n_embd % s.n_head == 0, ErrorKind::kInvalidArgument, kSpecWhere, "Llama shape: n_embd ",
             s.n_embd, " is not divisible by n_head ", s.n_head);
  FSDP_CHECK(s.n_head % s.n_kv_head == 0, ErrorKind::kInvalidArgument, kSpecWhere, "Llama shape: n_head ",
             s.n_head, " is not divisible by n_kv_head ", s.n_kv_head);
  const int64_t C = s.n_embd, I = s.ffn_hidden, Ckv = s.n_kv_head * (C / s.n_head);
  ModelSpec m;
  m.name = name;
  m.arch = {BlockKind::kLlama, s.n_layer, C, s.n_head, s.n_kv_head, I, s.vocab_size, s.context,
            /*tied_head=*/false, "flash"};
  UnitSpec root;
  root.is_root = true;
  add(root, "embed_tokens.weight", {s.vocab_size, C});
  add(root, "norm.weight", {C});
  add(root, "lm_head.weight", {s.vocab_size, C});
  m.units.push_back(std::move(root));
  for (int64_t i = 0; i < s.n_layer; ++i) {
    UnitSpec b;
    b.name = "layers." + std::to_string(i);
    add(b, "input_layernorm.weight", {C});
    add(b, "self_attn.q_proj.weight", {C, C});
    add(b, "self_attn.k_proj.weight", {Ckv, C});
    add(b, "self_attn.v_proj.weight", {Ckv, C});
    add(b, "self_attn.o_proj.weight", {C, C});
    add(b, "post_attention_layernorm.weight", {C});
    add(b, "mlp.gate_proj.weight", {I, C});
    add(b, "mlp.up_proj.weight", {I, C});
    add(b, "mlp.down_proj.weight", {C, I});
    m.units.push_back(std::move(b));
  }
  return m;
}

ModelSpec params_only_model(int64_t num_params, int64_t num_units, const std::string& name) {
  FSDP_CHECK(num_params >= 1 && num_units >= 1, ErrorKind::kInvalidArgument, kSpecWhere,
             "a parameter-count model needs >= 1 parameter and >= 1 unit, got ", num_params, " and ",
             num_units);
  ModelSpec m;
  m.name = name;
  UnitSpec root;
  root.is_root = true;
  m.units.push_back(std::move(root));
  const int64_t base = num_params / num_units, extra = num_params % num_units;
  for (int64_t i = 0; i < num_units; ++i) {
    UnitSpec b;
    b.name = "unit." + std::to_string(i);
    add(b, "weight", {base + (i < extra ? 1 : 0)});
    m.units.push_back(std::move(b));
  }
  m.arch.n_layer = num_units;
  return m;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names = gpt_preset_names();
  for (const auto& n : llama_preset_names()) names.push_back(n);
  return names;
}

}  // namespace fsdp::planner
