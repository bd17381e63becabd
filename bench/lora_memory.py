#!/usr/bin/env python3
"""Peak memory of a LoRA fine-tune against a full fine-tune of the same model, measured by
fsdp-train and planned by fsdp-plan (docs/BENCHMARKS.md, "LoRA against a full fine-tune").

    python3 bench/lora_memory.py [--np 2] [--model gpt2] [--steps 3] [--rank 8] [--out DIR]

A random GPT2LMHeadModel of the preset's shape (transformers, GPT-2's vocabulary 50257) is written
once; fsdp-train fine-tunes it from --init-from-hf with --meta-init on uniform random ids
(pre-tokenized, so no tokenizer is involved), full_shard, fp32, first in full and then with
--lora-rank R on c_attn; each run's peak is the largest per-step `mem.peak_bytes` (the counting
allocator's peak, MAX over ranks) and its model state `mem` by kind after the last step. fsdp-plan
plans the same step (--reduce-scatter-route all_to_all, as fsdp-train over MPI), with and without
--lora-rank. Prints a Markdown table.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def last_mem(metrics):
    steps = [e for e in map(json.loads, open(metrics)) if e.get("event") == "step"]
    return steps[-1]["mem"], max(e["mem"]["peak_bytes"] for e in steps), steps[-1]["step_time_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    shapes = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024)}
    layers, heads, width = shapes[a.model]
    out = a.out or tempfile.mkdtemp(prefix="lora-memory-")
    hf = os.path.join(out, a.model + "-hf")
    if not os.path.exists(os.path.join(hf, "model.safetensors")):
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_positions=1024)).save_pretrained(hf)
    ids = os.path.join(out, "ids.bin")
    if not os.path.exists(ids):
        torch.randint(0, 50257, (400000,), generator=torch.Generator().manual_seed(1)).numpy().astype("<u2").tofile(ids)
    bin_dir = os.path.join(ROOT, "build", "bin")
    common = ["--init-from-hf", hf, "--meta-init", "--data", ids, "--strategy", "full_shard", "--steps", str(a.steps),
              "--global-batch-size", str(a.batch), "--seq-len", str(a.seq_len), "--threads", "1", "--eval-every", "0",
              "--eval-batches", "1", "--progress", "lines", "--warmup-steps", "1"]
    plan_common = ["--model", a.model, "--world-size", str(a.np), "--strategy", "full_shard", "--micro-batch-size",
                   str(a.batch // a.np), "--seq-len", str(a.seq_len), "--reduce-scatter-route", "all_to_all", "--json"]
    rows = []
    for label, extra, plan_extra in (("full fine-tune", [], []),
                                     ("LoRA r=%d (c_attn)" % a.rank, ["--lora-rank", str(a.rank), "--lora-alpha",
                                                                      str(2 * a.rank)], ["--lora-rank", str(a.rank)])):
        m = os.path.join(out, "m-%d.jsonl" % len(rows))
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(a.np), os.path.join(bin_dir, "fsdp-train")]
        subprocess.run(cmd + common + extra + ["--metrics", m], check=True, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
        mem, peak, step_s = last_mem(m)
        plan = json.loads(subprocess.run([os.path.join(bin_dir, "fsdp-plan")] + plan_common + plan_extra, check=True,
                                         stdout=subprocess.PIPE, text=True).stdout)["strategies"][0]
        rows.append((label, mem, peak, plan, step_s))
    print("| run (%s, N = %d, full_shard, fp32, %d x %d tokens) | params | grads | optimizer state | measured peak "
          "| fsdp-plan's peak | step |" % (a.model, a.np, a.batch, a.seq_len))
    print("|---|---|---|---|---|---|---|")
    mib = lambda b: "%.1f MiB" % (b / 2**20)  # noqa: E731
    for label, mem, peak, plan, step_s in rows:
        print("| %s | %s | %s | %s | %s | %s | %.2f s |" % (
            label, mib(mem["param_shard_bytes"]), mib(mem["grad_shard_bytes"]), mib(mem["optim_state_bytes"]),
            mib(peak), mib(plan["peak"]["peak_bytes"]), step_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
