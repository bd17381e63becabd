#!/usr/bin/env python3
"""Hugging Face interop of the GPT and Llama models against transformers (ctest `hf_interop`).

  hf_interop.py --bin build/bin/hf_interop

transformers builds a small random GPT2LMHeadModel, and a LlamaForCausalLM with grouped-query
attention (4 query heads, 2 key/value heads), with config values that are not transformers' defaults
(GPT-2's layer_norm_epsilon 1e-3, Llama's rms_norm_eps 1e-4 and rope_theta 5e5), and saves each with save_pretrained, as one
model.safetensors and as a split checkpoint (max_shard_size: several files and an index).
fsdp-cpp (hf_interop.cpp) builds the model from config.json on the meta device, shards it and
imports the weights straight into the shards, at N = 1, 2, 3, 4 under every strategy (hybrid_shard
where N is even and > 2): its logits on a fixed batch equal transformers' within 1e-5 (fp32).
Then it trains 20 AdamW steps on the batch and exports a Hugging Face directory (one file, and split); transformers
loads it with from_pretrained: logits equal fsdp-cpp's after training within 1e-5 and greedy
generate gives the same tokens. A checkpoint of another shape is refused with one line naming the
tensor; a config field that changes the math (GPT-2's n_inner, Llama's rope_scaling) naming the
field.

Exit 0: pass; 77: skipped (no mpirun, no transformers); anything else: fail.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from e2e_common import as_the_ranks_ended, launch_prefix, launcher

B, T, V = 2, 16, 96
STRATEGIES = ["full_shard", "shard_grad_op", "zero1", "no_shard", "hybrid_shard"]


def check(ok, what):
    print(("  ok: " if ok else "  FAIL: ") + what, flush=True)
    if not ok:
        sys.exit(1)


def run(opts, n, args):
    """n ranks of the interop binary under mpirun, or torchrun over Gloo (FSDP_E2E_LAUNCHER)."""
    prefix = launch_prefix(n)
    if launcher() == "mpirun":
        prefix = prefix[:-2] + ["--bind-to", "none"] + prefix[-2:]
    p = subprocess.run(prefix + [opts.bin] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return as_the_ranks_ended(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    opts = ap.parse_args()
    if launcher() == "mpirun" and shutil.which("mpirun") is None:
        print("SKIP: no mpirun")
        return 77
    try:
        import numpy as np
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print("SKIP: %s (scripts/setup.sh installs transformers)" % e)
        return 77
    torch.manual_seed(0)
    tmp = tempfile.mkdtemp(prefix="fsdp-hf-")
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        families = [
            ("gpt2", lambda: GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                                                               layer_norm_epsilon=1e-3))),
            ("llama", lambda: LlamaForCausalLM(LlamaConfig(
                vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=172, max_position_embeddings=32, rms_norm_eps=1e-4, rope_theta=500000.0))),
        ]
        tokens = torch.randint(0, V, (B, T))
        tok_path = os.path.join(tmp, "tokens.bin")
        tokens.numpy().astype("<i8").tofile(tok_path)
        base = ["--tokens", tok_path, "--batch", str(B), "--seq", str(T)]

        def logits(path):
            return np.fromfile(path, dtype="<f4").reshape(B, T, V)

        for family, make in families:
            print("%s:" % family, flush=True)
            ref = make().eval()
            with torch.no_grad():  # random biases and norms, not the init's zeros and ones
                for p in ref.parameters():
                    p.add_(0.02 * torch.randn_like(p))
            one, split = os.path.join(tmp, family + "-one"), os.path.join(tmp, family + "-split")
            ref.save_pretrained(one)
            ref.save_pretrained(split, max_shard_size="60KB")
            check(len([f for f in os.listdir(split) if f.endswith(".safetensors")]) > 2 and
                  os.path.exists(os.path.join(split, "model.safetensors.index.json")),
                  "%s: a split checkpoint of several files" % family)
            with torch.no_grad():
                want = ref(tokens).logits.float().numpy()

            # Import at every N and strategy, from both layouts (alternating).
            worst = 0.0
            k = 0
            for n in (1, 2, 3, 4):
                for s in STRATEGIES:
                    if s == "hybrid_shard" and (n % 2 or n <= 2):
                        continue
                    src = (one, split)[k % 2]
                    k += 1
                    out = os.path.join(tmp, "l.bin")
                    p = run(opts, n, ["--hf", src, "--strategy", s, "--logits", out] + base)
                    check(p.returncode == 0, "N=%d %s import from %s: exit %d %s" %
                          (n, s, os.path.basename(src), p.returncode, p.stderr[-500:]))
                    err = float(np.abs(logits(out) - want).max())
                    worst = max(worst, err)
                    check(err <= 1e-5, "N=%d %s from %s: logits equal transformers' (max abs diff %.2e)" %
                          (n, s, os.path.basename(src), err))
            print("  %s import: worst logits difference %.2e over %d runs" % (family, worst, k))

            # Train, export, load back in transformers.
            cls = type(ref)
            for n, s, max_bytes in ((2, "full_shard", 0), (3, "shard_grad_op", 50000)):
                exp = os.path.join(tmp, "%s-export-%d" % (family, n))
                after, greedy = os.path.join(tmp, "after.bin"), os.path.join(tmp, "greedy.bin")
                p = run(opts, n, ["--hf", one, "--strategy", s, "--logits", os.path.join(tmp, "l.bin"),
                                  "--train-steps", "20", "--lr", "0.01", "--export", exp,
                                  "--export-max-file-bytes", str(max_bytes), "--logits-after", after,
                                  "--greedy", "8", "--greedy-prompt", "4", "--greedy-out", greedy] + base)
                check(p.returncode == 0, "N=%d %s train + export: exit %d %s" % (n, s, p.returncode, p.stderr[-500:]))
                files = sorted(f for f in os.listdir(exp) if f.endswith(".safetensors"))
                check((len(files) > 1) == (max_bytes > 0) and not [f for f in os.listdir(exp) if f.endswith(".tmp")],
                      "N=%d export: %d file(s), no temporary left" % (n, len(files)))
                back = cls.from_pretrained(exp).eval()
                with torch.no_grad():
                    got = back(tokens).logits.float().numpy()
                trained = logits(after)
                err = float(np.abs(got - trained).max())
                moved = float(np.abs(trained - want).max())
                check(moved > 1e-3, "N=%d: training moved the logits (%.2e)" % (n, moved))
                check(err <= 1e-5, "N=%d: from_pretrained(export) logits equal fsdp-cpp's after training "
                                   "(max abs diff %.2e)" % (n, err))
                prompt = tokens[:1, :4]
                gen = back.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                                    do_sample=False, pad_token_id=V - 1)[0, 4:].tolist()
                ours = np.fromfile(greedy, dtype="<i8").tolist()
                check(gen == ours and len(set(ours)) > 1, "N=%d: greedy generate gives the same tokens %s (transformers: %s)" % (n, ours, gen))

        # Refusals: one line naming the tensor or the field.
        other = os.path.join(tmp, "other")
        GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                                   n_inner=96)).save_pretrained(other)
        with open(os.path.join(other, "config.json")) as f:
            c = json.load(f)
        c["n_inner"] = None  # the config claims 4 x n_embd; the weights say 96
        with open(os.path.join(other, "config.json"), "w") as f:
            json.dump(c, f)
        p = run(opts, 2, ["--hf", other, "--logits", os.path.join(tmp, "x.bin")] + base)
        lines = [l for l in p.stderr.splitlines() if "error" in l]
        check(p.returncode != 0 and len(lines) == 1 and "transformer.h.0.mlp.c_fc.weight" in lines[0] and
              "(48, 96)" in lines[0].replace("[", "(").replace("]", ")"),
              "weights of another shape: one line naming the tensor: %r" % (lines[0][:300] if lines else p.stderr[-300:]))
        c["n_inner"] = 96
        with open(os.path.join(other, "config.json"), "w") as f:
            json.dump(c, f)
        p = run(opts, 1, ["--hf", other, "--logits", os.path.join(tmp, "x.bin")] + base)
        check(p.returncode != 0 and "n_inner = 96" in p.stderr, "a config field that changes the math is named: %r" %
              p.stderr.strip()[-200:])
        llama = os.path.join(tmp, "llama-one")
        with open(os.path.join(llama, "config.json")) as f:
            c = json.load(f)
        c["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
        with open(os.path.join(llama, "config.json"), "w") as f:
            json.dump(c, f)
        p = run(opts, 1, ["--hf", llama, "--logits", os.path.join(tmp, "x.bin")] + base)
        check(p.returncode != 0 and "rope_scaling = " in p.stderr and
              "(absent or null: rotary scaling is not implemented)" in p.stderr, "Llama's rope_scaling is named: %r" %
              p.stderr.strip()[-200:])
        print("PASS")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
