"""PyTorch reference GPT, architecturally identical to apps/models/gpt.{h,cpp} (fsdp-cpp).

Same module tree and parameter names (wte, wpe, h.0..h.{L-1}.{ln_1,attn.c_attn,attn.c_proj,ln_2,
mlp.c_fc,mlp.c_proj}, ln_f), same shapes, same parameter count (head tied to wte, counted once), same
GPT-2 init (Linear/Embedding weights ~ N(0, 0.02), residual projections attn.c_proj / mlp.c_proj
~ N(0, 0.02/sqrt(2*n_layer)), biases 0, LayerNorm weight 1 / bias 0), same forward:

    x = wte(idx) + wpe(arange(T));  x = block(x) for each block;  logits = ln_f(x) @ wte.weight^T
    block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
    attn:   q, k, v = c_attn(x).split(C); F.scaled_dot_product_attention(q, k, v, is_causal=True);
            c_proj(y)
    mlp:    c_proj(gelu_tanh(c_fc(x)))

The random streams differ from libtorch's C++ init order only in which numbers are drawn, not in the
distributions (bitwise-identical init across languages is not a goal of this benchmark).

    python3 bench/peer_gpt.py            # prints parameter counts of every preset (vocab 8192)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 8192
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 256

    def num_params(self) -> int:
        """Closed form of GPTConfig::num_params() in apps/models/gpt.cpp (tied head counted once)."""
        C = self.n_embd
        per_block = (2 * 2 * C + C * 3 * C + 3 * C + C * C + C + C * 4 * C + 4 * C + 4 * C * C + C)
        return self.vocab_size * C + self.block_size * C + self.n_layer * per_block + 2 * C


PRESETS = {
    # name: (n_layer, n_head, n_embd, block_size), as gpt_preset() in apps/models/gpt.cpp
    "nano": (4, 4, 128, 256),
    "micro": (6, 6, 384, 256),
    "gpt2": (12, 12, 768, 1024),
    "gpt2-medium": (24, 16, 1024, 1024),
    "gpt2-large": (36, 20, 1280, 1024),
    "gpt2-xl": (48, 25, 1600, 1024),
}


def gpt_preset(name: str, vocab_size: int = 8192) -> GPTConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset '{name}' (known: {', '.join(PRESETS)})")
    L, H, C, ctx = PRESETS[name]
    return GPTConfig(vocab_size=vocab_size, n_layer=L, n_head=H, n_embd=C, block_size=ctx)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        D = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, D).transpose(1, 2)
        k = k.view(B, T, self.n_head, D).transpose(1, 2)
        v = v.view(B, T, self.n_head, D).transpose(1, 2)
        if q.dtype in (torch.bfloat16, torch.float16) and T <= 256:
            # as fsdp-train's --attention auto (apps/models/gpt.h): two matmuls, fp32 softmax
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
            future = torch.ones(T, T, dtype=torch.bool).triu_(1)
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), -1, dtype=torch.float32)
            y = probs.to(q.dtype) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        std, residual_std = 0.02, 0.02 / math.sqrt(2.0 * cfg.n_layer)
        with torch.no_grad():
            nn.init.normal_(self.wte.weight, 0.0, std)
            nn.init.normal_(self.wpe.weight, 0.0, std)
            for b in self.h:
                for lin, s in ((b.attn.c_attn, std), (b.attn.c_proj, residual_std),
                               (b.mlp.c_fc, std), (b.mlp.c_proj, residual_std)):
                    nn.init.normal_(lin.weight, 0.0, s)
                    nn.init.zeros_(lin.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        if T > self.cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight)  # head tied to wte: no parameter of its own


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


if __name__ == "__main__":
    for name in PRESETS:
        cfg = gpt_preset(name)
        line = f"{name:12s} closed form {cfg.num_params():>13,d}"
        if name in ("nano", "micro", "gpt2"):
            with torch.device("meta"):
                m = GPT(cfg)
            n = sum(p.numel() for p in m.parameters())
            line += f"  module {n:>13,d}  {'OK' if n == cfg.num_params() else 'MISMATCH'}"
        print(line)
