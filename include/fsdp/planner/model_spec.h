// Model specs for the planner (layer 4, pure math): a model as lists of parameter shapes grouped
// into FSDP units, plus the architecture numbers that activations and FLOPs need. No tensors.
// docs/planner.md, "Model specs".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::planner {

/// One parameter: its name (as named_parameters() gives it, e.g. "h.0.attn.c_attn.weight"), its
/// shape, and whether it is trained (a frozen one has no gradient, no optimizer state and no
/// reduce-scatter traffic, as in the engine).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  ///< () is a 0-dim parameter: one row of one element
  bool trainable = true;
  /// Elements: the product of the shape (1 for a 0-dim parameter).
  int64_t numel() const;
};

/// One FSDP unit (one fully_shard call): its parameters in registration order (the order of the
/// unit's flat all-gather buffer and of no_shard's buckets).
struct UnitSpec {
  std::string name;  ///< "" for the root, else the wrapped module's name ("h.0")
  std::vector<ParamSpec> params;
  bool is_root = false;
  int64_t numel() const;            ///< elements of all params
  int64_t trainable_numel() const;  ///< elements of the trainable params
};

/// Block families with a known activation and FLOP formula (docs/planner.md, "Activations").
enum class BlockKind {
  kNone,   ///< shapes only (a parameter count): no activation formula, FLOPs 6 x params x tokens
  kGpt,    ///< apps/models/gpt.cpp: pre-LayerNorm, fused qkv with biases, GELU MLP 4C, tied head
  kLlama,  ///< Llama-2: RMSNorm, q/k/v/o without biases (grouped-query k/v), SwiGLU MLP, untied head
};

/// The numbers of a decoder-only transformer that activations and FLOPs depend on.
struct Architecture {
  BlockKind kind = BlockKind::kNone;
  int64_t n_layer = 0;
  int64_t n_embd = 0;       ///< width C
  int64_t n_head = 0;       ///< query heads H (head dim D = C / H)
  int64_t n_kv_head = 0;    ///< key/value heads (= n_head without grouped-query attention)
  int64_t ffn_hidden = 0;   ///< MLP hidden width (GPT: 4C; Llama: the SwiGLU intermediate size)
  int64_t vocab_size = 0;   ///< V
  int64_t context = 0;      ///< longest sequence the model accepts (GPT's block_size)
  bool tied_head = false;   ///< the output head reuses the token embedding (no parameter of its own)
  /// GPT only: "flash", "math" or "auto" (GPTConfig::attention: math for bf16/fp16 at T <= 256).
  std::string attention = "auto";
  int64_t head_dim() const { return n_head > 0 ? n_embd / n_head : 0; }
  int64_t kv_width() const { return n_kv_head * head_dim(); }  ///< width of k and v: H_kv x D
};

/// A model as the engine sees it: units in forward order, the root first (fsdp-train wraps one
/// unit per transformer block plus the root, which holds what no block holds: embeddings, final
/// norm, head).
struct ModelSpec {
  std::string name;
  std::vector<UnitSpec> units;  ///< units[0] is the root
  Architecture arch;
  /// Total parameter count (a tied weight once).
  int64_t num_params() const;
  /// Parameters of the weight matrices used in matrix products per token (every Linear weight and
  /// the head; embedding lookups, norms and biases excluded): the N of FLOPs = 6 N tokens.
  int64_t matmul_params() const;
  /// The block units (every unit but the root).
  int64_t num_blocks() const { return units.empty() ? 0 : static_cast<int64_t>(units.size()) - 1; }
};

/// Shape of apps/models/gpt.h's GPTConfig (the planner mirrors it without linking the app).
struct GptShape {
  int64_t vocab_size = 8192;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t block_size = 256;
  std::string attention = "auto";
};

/// The presets of apps/models/gpt.cpp: "nano", "micro", "gpt2", "gpt2-medium", "gpt2-large",
/// "gpt2-xl", with vocab_size set. Throws fsdp::Error (kInvalidArgument) naming the known presets.
GptShape gpt_shape(const std::string& preset, int64_t vocab_size);
std::vector<std::string> gpt_preset_names();
/// The GPT of apps/models/gpt.cpp as fsdp-train wraps it: root = {wte (V, C), wpe (block_size,
/// C), ln_f weight and bias (C)} (the head is tied to wte), one unit per block "h.i" = {ln_1 w, b;
/// attn.c_attn w (3C, C), b (3C); attn.c_proj w (C, C), b (C); ln_2 w, b; mlp.c_fc w (4C, C),
/// b (4C); mlp.c_proj w (C, 4C), b (C)}. Throws fsdp::Error (kInvalidArgument) for non-positive
/// sizes or n_embd not divisible by n_head.
ModelSpec gpt_model(const GptShape& shape, const std::string& name = "gpt");

/// Shape of a Llama-2 decoder (Touvron et al. 2023, "Llama 2", table 1 and the released configs).
struct LlamaShape {
  int64_t vocab_size = 32000;
  int64_t n_layer = 32;
  int64_t n_head = 32;
  int64_t n_kv_head = 32;
  int64_t n_embd = 4096;
  int64_t ffn_hidden = 11008;
  int64_t context = 4096;
};

/// "llama2-7b" (C 4096, 32 layers, 32 heads, MLP 11008), "llama2-13b" (5120, 40, 40, 13824),
/// "llama2-70b" (8192, 80, 64 heads with 8 key/value heads, 28672); vocab 32000, context 4096;
/// and "llama-tiny" (64, 2 layers, 4 heads with 2 key/value heads, 172; vocab 8192, context 256),
/// fsdp-train's test model. fsdp-train builds its Llama presets from this table. Throws
/// fsdp::Error (kInvalidArgument) naming the known presets.
LlamaShape llama_shape(const std::string& preset);
std::vector<std::string> llama_preset_names();
/// Root = {embed_tokens (V, C), norm (C), lm_head (V, C)}; block "layers.i" = {input_layernorm
/// (C), q_proj (C, C), k_proj (Ckv, C), v_proj (Ckv, C), o_proj (C, C), post_attention_layernorm
/// (C), gate_proj (I, C), up_proj (I, C), down_proj (C, I)}, Ckv = n_kv_head x C / n_head.
/// Throws fsdp::Error (kInvalidArgument) for non-positive sizes, n_embd not divisible by n_head or
/// n_head not divisible by n_kv_head.
ModelSpec llama_model(const LlamaShape& shape, const std::string& name = "llama");

/// A model known only by its parameter count: `num_params` elements in `num_units` block units of
/// 1-D parameters (as equal as possible; the root is empty). Enough for model-state bytes and
/// traffic (e.g. the 16 bytes/param rule of a "7B" model); no activations (BlockKind::kNone).
/// Throws fsdp::Error (kInvalidArgument) for num_params < 1 or num_units < 1.
ModelSpec params_only_model(int64_t num_params, int64_t num_units, const std::string& name = "params");

/// The layers LoRA adapts by default in a family, as Hugging Face PEFT's defaults: kGpt {"c_attn"},
/// kLlama {"q_proj", "v_proj"}; kNone: none.
std::vector<std::string> lora_default_targets(BlockKind kind);

/// LoRA's target layer names: `targets` as given, the family's default where it is empty, and
/// {"all-linear"} expanded to every Linear of the blocks (kGpt: c_attn, c_proj, c_fc; kLlama: q_proj,
/// k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj). A name matches a layer whose qualified
/// name is the name or ends with "." + name (PEFT's rule). Throws fsdp::Error (kInvalidArgument)
/// for "all-linear" beside other names, or a family without layers (kNone: a --params model).
std::vector<std::string> lora_resolve_targets(BlockKind kind, const std::vector<std::string>& targets);

/// The names of a comma-separated target list ("q_proj, v_proj"), blanks around each dropped; ""
/// gives none (the family's default). Throws fsdp::Error (kInvalidArgument) for an empty name in
/// the list ("c_attn,,c_fc").
std::vector<std::string> split_lora_targets(const std::string& comma_list);

/// `spec` fine-tuned with LoRA adapters (Hu et al. 2021, "LoRA"): every parameter frozen
/// (trainable false: no gradient, no optimizer state, no reduce-scatter), and for each Linear weight
/// (a 2-D LAYER.weight that is no embedding table) whose LAYER a target names
/// (lora_resolve_targets), two trainable parameters in its unit after the layer's own:
/// LAYER.lora_A.weight (rank, in) and LAYER.lora_B.weight (out, rank), as apps/models/lora.h adds
/// them. Throws fsdp::Error (kInvalidArgument) for rank < 1 or a target that names no layer.
ModelSpec with_lora(const ModelSpec& spec, int64_t rank, const std::vector<std::string>& targets);

/// The vocabulary a preset is planned at (fsdp-plan) and dry-run at (fsdp-train --dry-run) unless
/// --vocab-size is given: the published model's for the gpt2 presets (50257, GPT-2's BPE) and
/// llama2-* (32000); 8192, the tokenizer scripts/prepare_data.sh trains for fsdp-train, for nano,
/// micro and llama-tiny. fsdp-train builds every preset at its tokenizer's vocabulary and notes
/// when that differs from this one. Throws fsdp::Error (kInvalidArgument) for an unknown preset.
int64_t preset_vocab_size(const std::string& preset);

/// Every preset name model_preset() accepts: the GPT presets, then the Llama-2 presets.
std::vector<std::string> model_preset_names();

}  // namespace fsdp::planner
