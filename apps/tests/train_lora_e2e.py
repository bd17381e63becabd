#!/usr/bin/env python3
"""End-to-end tests of LoRA fine-tunes through fsdp-train (--lora-rank, --export-adapter), run by
ctest (apps/CMakeLists.txt) under mpirun against transformers and peft; helpers in e2e_common.py.

  train_lora_e2e.py --bin build/bin/fsdp-train --data-dir ./data

Exit 0: pass; 77: skipped (no data / no mpirun); anything else: fail.
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import TINY, as_the_ranks_ended, check, error_line, events, launch_prefix, run_main  # noqa: E402

# A global batch of 12 sequences divides among 2 and 3 ranks.
RUN = TINY[6:] + ["--global-batch-size", "12", "--lr", "1e-2", "--min-lr", "1e-3", "--warmup-steps", "1"]


def run(opts, args, n, expect_ok=True):
    cmd = launch_prefix(n) + [opts.bin, "--data-dir", opts.data_dir] + RUN + args
    t0 = time.time()
    p = as_the_ranks_ended(subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300))
    print("  n=%d %.1fs rc=%d: %s" % (n, time.time() - t0, p.returncode, " ".join(args)), flush=True)
    if expect_ok and p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit("FAIL: exit %d: %s" % (p.returncode, " ".join(cmd)))
    return p


def perturbed(model, torch):
    """A random model without zero biases or unit norms (an update of a frozen tensor would show)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model.eval()


def check_adapter(torch, base_dir, base, adapter_dir, merged_dir, cls, layers, r, alpha, what):
    """The PEFT adapter and the merged export of one run: names and shapes as PEFT writes them, B
    trained (non-zero), peft's logits over the base equal the merged model's, every tensor the
    adapters do not touch bitwise the base's, and each adapted weight the base's plus
    alpha / r * B @ A."""
    from peft import PeftModel
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    check(cfg["peft_type"] == "LORA" and cfg["r"] == r and cfg["lora_alpha"] == alpha and
          cfg["base_model_name_or_path"] == base_dir, "%s: adapter_config.json %s" % (what, cfg))
    ad = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    want = sorted("base_model.model.%s.lora_%s.weight" % (l, ab) for l in layers for ab in "AB")
    check(sorted(ad) == want, "%s: the adapter's tensors are PEFT's names (%d): %s" % (what, len(want), sorted(ad)[:2]))
    check(all(ad[k].abs().max() > 0 for k in ad if ".lora_B." in k), "%s: every lora_B trained away from 0" % what)
    merged = load_file(os.path.join(merged_dir, "model.safetensors"))
    src = load_file(os.path.join(base_dir, "model.safetensors"))
    untouched = [k for k in src if not any(k == l + ".weight" for l in layers)]
    check(sorted(merged) == sorted(src) and all(torch.equal(merged[k], src[k]) for k in untouched),
          "%s: the %d tensors without an adapter are bitwise the base's" % (what, len(untouched)))
    worst = 0.0
    for l in layers:
        a, b = ad["base_model.model.%s.lora_A.weight" % l], ad["base_model.model.%s.lora_B.weight" % l]
        delta = (alpha / r) * (b @ a)  # (out, in)
        if delta.shape != src[l + ".weight"].shape:
            delta = delta.t()  # GPT-2's Conv1D stores (in, out)
        worst = max(worst, (merged[l + ".weight"] - src[l + ".weight"] - delta).abs().max().item())
    check(worst < 1e-6, "%s: each adapted weight is the base's + alpha/r B A (max error %.2e): the base stayed" %
          (what, worst))
    peft_model = PeftModel.from_pretrained(base, adapter_dir).eval()
    x = torch.randint(0, 8192, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, tuned = peft_model(x).logits, cls.from_pretrained(merged_dir).eval()(x).logits
    err = (got - tuned).abs().max().item()
    check(err < 1e-5, "%s: peft's logits over the base equal the merged export's (max abs %.2e)" % (what, err))
    return ad


def test_lora(opts, tmp):
    """LoRA fine-tunes through fsdp-train.
    * GPT-2 (a transformers-written GPT2LMHeadModel) at N = 2, --meta-init, rank 4 alpha 8 on c_attn:
      only adapters train (the start line says so; the --export after 4 steps holds every base
      tensor bitwise the source's), the PEFT
      adapter loads with PeftModel.from_pretrained and its logits equal the merged --export-hf's
      (1e-5); the tensors without an adapter are bitwise the base's.
    * Checkpoints at another world size: the N = 2 run's step-4 checkpoint resumed at N = 3 (no step
      left) exports the same adapter and merged model bit for bit; its step-2 checkpoint resumed at
      N = 3 trains steps 3 and 4 to the N = 2 run's losses (1e-4 relative: another reduction order).
    * Llama (grouped-query attention, n_kv_head 2) at N = 3, all-linear, rank 2: the same checks.
    * Resuming with another --lora-alpha (the same shapes) or --lora-rank is refused naming the
      LoRA flags; --lora-dropout 0.5 gives the same losses with and without --meta-init; targets
      by PEFT's qualified name (transformer.h.0.attn.c_attn) and by suffix.
    * Usage errors (one line, exit 2, before step 1): a target no layer has, --export-adapter without
      --lora-rank, --import with --lora-rank, an empty target name, --export-adapter into the
      --init-from-hf directory or --export-hf's, or at a file, a mistyped --data (named as such,
      not as a missing tokenizer)."""
    try:
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
        import peft  # noqa: F401
    except ImportError as e:
        print("  SKIP LoRA checks: %s (scripts/setup.sh installs transformers and peft)" % e)
        return
    gpt_dir = os.path.join(tmp, "gpt2")
    gpt = perturbed(GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_positions=64, n_embd=64, n_layer=2, n_head=4)), torch)
    gpt.save_pretrained(gpt_dir)
    extra = {"tokenizer_config.json": '{"model_max_length": 64}\n', "merges.txt": "#version: 0.2\nh e\n"}
    for name, text in extra.items():  # stand-ins: the export copies them as they are
        with open(os.path.join(gpt_dir, name), "w") as f:
            f.write(text)
    extra["generation_config.json"] = open(os.path.join(gpt_dir, "generation_config.json")).read()
    ck, m = os.path.join(tmp, "ck"), os.path.join(tmp, "gpt.jsonl")
    out = {k: os.path.join(tmp, k) for k in ("a2", "h2", "a3", "h3")}
    full_pt = os.path.join(tmp, "full.pt")
    p = run(opts, ["--init-from-hf", gpt_dir, "--meta-init", "--lora-rank", "4", "--lora-alpha", "8", "--steps", "4",
                   "--save", ck, "--save-every", "2", "--export-adapter", out["a2"], "--export-hf", out["h2"],
                   "--export", full_pt, "--metrics", m], 2)
    trainable = 2 * 4 * (64 + 192)  # 2 blocks' c_attn: A (4, 64) + B (192, 4)
    check("LoRA: rank 4, alpha 8, adapters on 2 layers; %s trainable params" % f"{trainable:,}" in p.stdout,
          "the start line names the adapters: %r" % [l for l in p.stdout.splitlines() if "LoRA" in l])
    config = events(m, "config")[0]
    check(config["lora"]["trainable_params"] == trainable and
          config["lora"]["layers"] == ["h.0.attn.c_attn", "h.1.attn.c_attn"], "config event: %s" % config["lora"])
    steps = events(m, "step")
    check(len(steps) == 4 and steps[-1]["loss"] < steps[0]["loss"],
          "4 LoRA steps: loss %.4f -> %.4f" % (steps[0]["loss"], steps[-1]["loss"]))
    gpt_layers = ["transformer.h.%d.attn.c_attn" % i for i in range(2)]
    ad2 = check_adapter(torch, gpt_dir, gpt, out["a2"], out["h2"], GPT2LMHeadModel, gpt_layers, 4, 8.0,
                        "GPT-2 N=2")
    copied = {k: open(os.path.join(out["h2"], k)).read() if os.path.exists(os.path.join(out["h2"], k)) else None
              for k in extra}
    check(copied == extra, "--export-hf copies the source's tokenizer files and generation_config.json: %s" %
          [k for k in extra if copied[k] != extra[k]])
    hf_config = json.load(open(os.path.join(out["h2"], "config.json")))
    check(all(hf_config[k] == 0.1 for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")),
          "--export-hf keeps the source's dropout rates (0.1): %s" % {k: hf_config[k] for k in hf_config if "pdrop" in k})
    # The unmerged state after training (--export): every base tensor bitwise the source's.
    from safetensors.torch import load_file
    state, src = torch.load(full_pt, weights_only=True), load_file(os.path.join(gpt_dir, "model.safetensors"))
    base = {k: v for k, v in state.items() if ".lora_" not in k}
    conv1d = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
    same = [k for k, v in base.items()
            if torch.equal(v, src["transformer." + k].t() if k.endswith(conv1d) else src["transformer." + k])]
    check(len(same) == len(base) == 28 and len(state) == 32,
          "after 4 LoRA steps the base is bitwise the source (%d of %d tensors; %d adapters)" %
          (len(same), len(base), len(state) - len(base)))
    # The step-4 checkpoint at another world size: the same adapter and merged model, bit for bit.
    run(opts, ["--init-from-hf", gpt_dir, "--meta-init", "--lora-rank", "4", "--lora-alpha", "8", "--steps", "4",
               "--resume", os.path.join(ck, "step-000000004"), "--export-adapter", out["a3"], "--export-hf", out["h3"]], 3)
    ad3 = load_file(os.path.join(out["a3"], "adapter_model.safetensors"))
    h2, h3 = (load_file(os.path.join(out[k], "model.safetensors")) for k in ("h2", "h3"))
    check(sorted(ad3) == sorted(ad2) and all(torch.equal(ad2[k], ad3[k]) for k in ad2) and
          all(torch.equal(h2[k], h3[k]) for k in h2),
          "the N=2 checkpoint resumed at N=3: adapter and merged export bit for bit the N=2 run's")
    p = run(opts, ["--init-from-hf", gpt_dir, "--lora-rank", "4", "--lora-alpha", "16", "--steps", "4",
                   "--resume", os.path.join(ck, "step-000000002")], 2, expect_ok=False)
    check(p.returncode == 2 and "the checkpoint's model has lora_alpha 8, this run's 16" in error_line(p),
          "another --lora-alpha (the same shapes) is refused: exit %d, %r" % (p.returncode, error_line(p)))
    p = run(opts, ["--init-from-hf", gpt_dir, "--lora-rank", "2", "--steps", "4",
                   "--resume", os.path.join(ck, "step-000000002")], 2, expect_ok=False)
    check(p.returncode == 1 and "the checkpoint's LoRA adapters are not this run's (another --lora-rank" in error_line(p),
          "another --lora-rank: named as such: exit %d, %r" % (p.returncode, error_line(p)[:300]))
    # Dropout masks come from --seed after the build: --meta-init (a base read, not drawn) changes no
    # step. PEFT's qualified names (transformer.h.0...) and suffixes name the layers.
    drop = []
    for meta in ([], ["--meta-init"]):
        md = os.path.join(tmp, "drop%d.jsonl" % len(drop))
        run(opts, ["--init-from-hf", gpt_dir, "--lora-rank", "4", "--lora-dropout", "0.5", "--steps", "3",
                   "--lora-target-modules", "transformer.h.0.attn.c_attn,c_fc", "--metrics", md] + meta, 2)
        drop.append(events(md, "step"))
    check([s["loss"] for s in drop[0]] == [s["loss"] for s in drop[1]],
          "--lora-dropout 0.5: the same losses with and without --meta-init: %s, %s" %
          ([s["loss"] for s in drop[0]], [s["loss"] for s in drop[1]]))
    check(events(md, "config")[0]["lora"]["layers"] == ["h.0.attn.c_attn", "h.0.mlp.c_fc", "h.1.mlp.c_fc"],
          "targets by PEFT's qualified name and by suffix: %s" % events(md, "config")[0]["lora"]["layers"])
    # Resuming the step-2 checkpoint at N = 3 trains on: its steps 3 and 4 follow the N = 2 run's losses.
    m3 = os.path.join(tmp, "gpt3.jsonl")
    run(opts, ["--init-from-hf", gpt_dir, "--lora-rank", "4", "--lora-alpha", "8", "--steps", "4",
               "--resume", os.path.join(ck, "step-000000002"), "--metrics", m3], 3)
    l2, l3 = [s["loss"] for s in steps[2:]], [s["loss"] for s in events(m3, "step")]
    check(len(l3) == 2 and all(abs(a - b) < 1e-4 * abs(a) for a, b in zip(l2, l3)),
          "resumed at N=3 from step 2: losses %s, the N=2 run's %s" % (l3, l2))

    llama_dir = os.path.join(tmp, "llama")
    llama = perturbed(LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=64, intermediate_size=96,
                                                   num_hidden_layers=2, num_attention_heads=4,
                                                   num_key_value_heads=2, max_position_embeddings=64)), torch)
    llama.save_pretrained(llama_dir)
    la, lh = os.path.join(tmp, "la"), os.path.join(tmp, "lh")
    run(opts, ["--init-from-hf", llama_dir, "--meta-init", "--lora-rank", "2", "--lora-alpha", "4",
               "--lora-target-modules", "all-linear", "--steps", "3", "--export-adapter", la, "--export-hf", lh], 3)
    names = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj"]
    check_adapter(torch, llama_dir, llama, la, lh, LlamaForCausalLM,
                  ["model.layers.%d.%s" % (i, n) for i in range(2) for n in names], 2, 4.0, "Llama GQA N=3 all-linear")

    for args, needle in (
            (["--init-from-hf", gpt_dir, "--lora-rank", "4", "--lora-target-modules", "q_proj"],
             "--lora-target-modules: LoRA target 'q_proj' names no Linear layer of this gpt model; its layers: 'c_attn', "
             "'c_proj', 'c_fc'"),
            (["--export-adapter", out["a2"]], "--export-adapter: needs --lora-rank R"),
            (["--lora-rank", "2", "--import", os.path.join(tmp, "none.pt")], "--import: cannot be combined with --lora-rank"),
            (["--lora-rank", "2", "--lora-target-modules", "c_attn,,c_fc"], "an empty name in the list"),
            # Exports that would change the model read, or hold a model and an adapter at once.
            (["--init-from-hf", gpt_dir, "--lora-rank", "2", "--export-adapter", gpt_dir],
             "--export-adapter: is --init-from-hf's directory"),
            (["--init-from-hf", gpt_dir, "--lora-rank", "2", "--export-adapter", out["a2"], "--export-hf", out["a2"]],
             "--export-adapter: is --export-hf's directory too"),
            # Checked before step 1, not after training.
            (["--init-from-hf", gpt_dir, "--lora-rank", "2", "--export-adapter", os.path.join(gpt_dir, "config.json")],
             "--export-adapter '%s': cannot create the directory" % os.path.join(gpt_dir, "config.json")),
            # A mistyped --data beside --init-from-hf is that, not a missing tokenizer.
            (["--init-from-hf", gpt_dir, "--lora-rank", "2", "--data", os.path.join(tmp, "x.bin")],
             "--data: no file or folder at '%s'" % os.path.join(tmp, "x.bin"))):
        p = run(opts, args + ["--steps", "1"], 2, expect_ok=False)
        check(p.returncode == 2 and needle in error_line(p), "usage error %s: exit %d, %r" % (args, p.returncode,
                                                                                            error_line(p)))


def main():
    return run_main({"lora": test_lora}, "fsdp-train-lora-e2e-")


if __name__ == "__main__":
    sys.exit(main())
