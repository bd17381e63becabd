#include "fsdp/planner/activations.h"

#include <algorithm>

namespace fsdp::planner {
namespace {

struct Builder {
  std::vector<SavedTensor>* out;
  void add(const std::string& name, const std::string& formula, int64_t bytes) {
    out->push_back(SavedTensor{name, formula, bytes});
  }
};

bool name_ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Whether some unit's layer `layer` (a name suffix: "mlp.c_fc", "lm_head") computes a weight
// gradient, for which autograd keeps the layer's input: its weight trainable, or a LoRA adapter on
// it (whose A takes the same input). A frozen layer keeps only what the input gradient needs.
bool weight_grad(const ModelSpec& m, const std::string& layer, bool root) {
  for (const auto& u : m.units) {
    if (u.is_root != root) continue;
    for (const auto& p : u.params) {
      const bool own = p.name == layer + ".weight" || name_ends_with(p.name, "." + layer + ".weight");
      const bool adapter = name_ends_with(p.name, layer + ".lora_A.weight");
      if ((own && p.trainable) || adapter) return true;
    }
  }
  return false;
}

// LoRA adapters of one block: A's output (B's input, r per token) is what each keeps beyond its
// layer's input; the most any block holds.
int64_t adapter_rank_sum(const ModelSpec& m) {
  int64_t most = 0;
  for (const auto& u : m.units) {
    if (u.is_root) continue;
    int64_t r = 0;
    for (const auto& p : u.params) {
      if (name_ends_with(p.name, ".lora_A.weight") && !p.shape.empty()) r += p.shape[0];
    }
    most = std::max(most, r);
  }
  return most;
}

int64_t sum(const std::vector<SavedTensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.bytes;
  return n;
}

}  // namespace

std::string resolve_gpt_attention(const std::string& attention, Precision precision, int64_t seq_len) {
  const bool low = precision != Precision::kFp32;
  return attention == "math" || (attention == "auto" && low && seq_len <= 256) ? "math" : "flash";
}

ActivationModel activation_model(const ModelSpec& model, const StepSetup& setup) {
  ActivationModel m;
  const Architecture& A = model.arch;
  if (A.kind == BlockKind::kNone) return m;
  m.known = true;
  const int64_t B = setup.micro_batch_size, T = setup.seq_len, C = A.n_embd, H = A.n_head;
  const int64_t V = A.vocab_size, I = A.ffn_hidden, Ckv = A.kv_width();
  const int64_t a = param_bytes_per_elem(setup.precision);  // activation dtype = param dtype
  const int64_t BT = B * T, BTC = BT * C;
  Builder blk{&m.block}, root{&m.root};
  // A layer's input is kept for its weight gradient only: with the layer frozen (a LoRA base), only
  // where something else needs it.
  auto grad = [&model](const char* layer) { return weight_grad(model, layer, false); };

  if (A.kind == BlockKind::kGpt) {
    m.attention_kernel = resolve_gpt_attention(A.attention, setup.precision, T);
    blk.add("ln_1 input (the block input x)", "B*T*C*a", BTC * a);
    blk.add("ln_1 mean and rstd", "2*B*T*a", 2 * BT * a);
    if (grad("attn.c_attn")) blk.add("ln_1 output (c_attn input)", "B*T*C*a", BTC * a);
    if (m.attention_kernel == "flash") {
      blk.add("qkv (c_attn output; q, k, v are views the attention kernel saves)", "3*B*T*C*a", 3 * BTC * a);
      blk.add("attention output (also c_proj's input: the kernel returns a transposed view of a "
              "(B,T,H,D) buffer, so .contiguous() copies nothing)",
              "B*T*C*a", BTC * a);
      blk.add("attention logsumexp (fp32)", "B*H*T*4", B * H * T * 4);
    } else {
      blk.add("q, k^T, v as contiguous bmm inputs (matmul copies the strided views)", "3*B*T*C*a",
              3 * BTC * a);
      blk.add("softmax output (fp32)", "B*H*T*T*4", B * H * T * T * 4);
      if (a != 4) blk.add("probabilities in the activation dtype (probs @ v input)", "B*H*T*T*a", B * H * T * T * a);
      blk.add("causal mask (bool)", "T*T", T * T);
      if (grad("attn.c_proj")) blk.add("attention output made contiguous (c_proj input)", "B*T*C*a", BTC * a);
    }
    blk.add("x + attn (ln_2 input)", "B*T*C*a", BTC * a);
    blk.add("ln_2 mean and rstd", "2*B*T*a", 2 * BT * a);
    if (grad("mlp.c_fc")) blk.add("ln_2 output (c_fc input)", "B*T*C*a", BTC * a);
    blk.add("c_fc output (GELU input)", "B*T*4C*a", BT * I * a);
    if (grad("mlp.c_proj")) blk.add("GELU output (mlp.c_proj input)", "B*T*4C*a", BT * I * a);

    root.add("token ids (wte lookup)", "B*T*8", BT * 8);
    root.add("positions (wpe lookup)", "T*8", T * 8);
    root.add("ln_f input (the last block's output)", "B*T*C*a", BTC * a);
    root.add("ln_f mean and rstd", "2*B*T*a", 2 * BT * a);
    if (weight_grad(model, "wte", true)) root.add("ln_f output (head input)", "B*T*C*a", BTC * a);
  } else {  // kLlama
    m.attention_kernel = "flash";
    blk.add("input_layernorm input (the block input x)", "B*T*C*a", BTC * a);
    blk.add("input_layernorm rstd (fp32)", "B*T*4", BT * 4);
    if (grad("q_proj") || grad("k_proj") || grad("v_proj")) {
      blk.add("input_layernorm output (q/k/v input)", "B*T*C*a", BTC * a);
    }
    blk.add("q after RoPE", "B*T*C*a", BTC * a);
    blk.add("k after RoPE, v", "2*B*T*Ckv*a", 2 * BT * Ckv * a);
    blk.add("attention output (o_proj input)", "B*T*C*a", BTC * a);
    blk.add("attention logsumexp (fp32)", "B*H*T*4", B * H * T * 4);
    blk.add("x + attn (post_attention_layernorm input)", "B*T*C*a", BTC * a);
    blk.add("post_attention_layernorm rstd (fp32)", "B*T*4", BT * 4);
    if (grad("gate_proj") || grad("up_proj")) {
      blk.add("post_attention_layernorm output (gate/up input)", "B*T*C*a", BTC * a);
    }
    blk.add("gate_proj output (SiLU input), SiLU output, up_proj output", "3*B*T*I*a", 3 * BT * I * a);
    if (grad("down_proj")) blk.add("their product (down_proj input)", "B*T*I*a", BT * I * a);

    root.add("token ids (embedding lookup)", "B*T*8", BT * 8);
    root.add("norm input (the last block's output)", "B*T*C*a", BTC * a);
    root.add("norm rstd (fp32)", "B*T*4", BT * 4);
    if (weight_grad(model, "lm_head", true)) root.add("norm output (lm_head input)", "B*T*C*a", BTC * a);
  }
  if (const int64_t r = adapter_rank_sum(model); r > 0) {
    blk.add("LoRA: each adapter's A output (its B's input)", "B*T*r*a per adapter", BT * r * a);
  }
  // The loss (gpt_loss: cross entropy on the fp32 logits; the root unit casts its output to fp32).
  root.add("log-probabilities (log_softmax output, fp32)", "B*T*V*4", BT * V * 4);
  root.add("targets and nll_loss's total weight", "B*T*8 + 4", BT * 8 + 4);

  m.block_bytes = sum(m.block);
  m.block_input_bytes = BTC * a;
  m.checkpointed_block_bytes = m.block_input_bytes + kCpuGeneratorStateBytes;
  m.root_bytes = sum(m.root);
  m.root_lookup_bytes = A.kind == BlockKind::kGpt ? BT * 8 + T * 8 : BT * 8;
  m.loss_transient_bytes = 2 * BT * V * 4;
  const bool frozen_lookup = !weight_grad(model, A.kind == BlockKind::kGpt ? "wte" : "embed_tokens", true) &&
                             !(A.kind == BlockKind::kGpt && weight_grad(model, "wpe", true));
  if (frozen_lookup && !setup.checkpoints_block(1)) {
    // The first norm's input and statistics: LayerNorm's mean and rstd, RMSNorm's fp32 rstd.
    m.first_block_frozen_input_bytes = BTC * a + (A.kind == BlockKind::kGpt ? 2 * BT * a : BT * 4);
  }
  m.total_saved_bytes = m.root_bytes - m.first_block_frozen_input_bytes;
  for (int64_t b = 1; b <= A.n_layer; ++b) {
    m.total_saved_bytes += setup.checkpoints_block(b) ? m.checkpointed_block_bytes : m.block_bytes;
  }
  return m;
}

}  // namespace fsdp::planner
