#!/usr/bin/env python3
"""End-to-end tests of fsdp-train with Hugging Face models and the Llama family, run by ctest
(apps/CMakeLists.txt) under mpirun; helpers in e2e_common.py.

  train_hf_e2e.py hf  --bin build/bin/fsdp-train --data-dir ./data
      --init-from-hf and --export-hf of a GPT2LMHeadModel against transformers (test_hf).

  train_hf_e2e.py llama  --bin ... --data-dir ...
      fsdp-train trains Llama (test_llama): the llama-tiny preset on the text corpus, a
      LlamaForCausalLM through --init-from-hf and --export-hf (fp32 and bf16), --tokenizer,
      uint32 pre-tokenized ids, and the usage errors of the Llama flags.

Exit 0: pass; 77: skipped (no data / no mpirun); anything else: fail.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (TINY, as_the_ranks_ended, check, error_line, events, launch, launch_prefix,  # noqa: E402
                        losses, mpmd_command, run_main)


def test_hf(opts, tmp):
    """--init-from-hf and --export-hf against transformers: a random GPT2LMHeadModel with the
    tokenizer's vocabulary (8192) goes through fsdp-train and back bit for bit (--lr 1e-30, meta
    init, N = 2 and 4), trains 3 steps from it (loss falls; the export loads with from_pretrained and
    its logits moved), and a model of another vocabulary or an explicit shape flag is refused with
    one line. A model of another tokenizer (vocabulary 96) trains from its own ids, pre-tokenized
    (uint16 train.bin / val.bin): round trip bit for bit, step-1 loss ln 96; an id past the
    vocabulary, a .bin of odd size and a sample without a tokenizer are refused with one line."""
    try:
        import torch
        from safetensors.torch import load_file
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print("  SKIP --init-from-hf checks: %s (scripts/setup.sh installs transformers)" % e)
        return
    torch.manual_seed(0)
    hf = os.path.join(tmp, "hf")
    ref = GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_positions=64, n_embd=64, n_layer=2, n_head=4)).eval()
    with torch.no_grad():  # no zero biases: an update of lr 1e-30 moves a zero, not a 0.02
        for p in ref.parameters():
            p.add_(0.02 * torch.randn_like(p))
    ref.save_pretrained(hf)
    check(TINY[:6] == ["--model", "nano", "--n-layer", "2", "--n-embd", "64"], "the tiny run's shape flags come first")

    def run(args, n, expect_ok=True):
        return run_llama(opts, args, n, expect_ok=expect_ok, shape=False)

    want = load_file(os.path.join(hf, "model.safetensors"))
    for n, strategy in ((2, "full_shard"), (4, "no_shard")):
        out = os.path.join(tmp, "same-%d" % n)
        run(["--init-from-hf", hf, "--meta-init", "--strategy", strategy, "--steps", "1", "--lr", "1e-30",
             "--min-lr", "0", "--export-hf", out], n)
        got = load_file(os.path.join(out, "model.safetensors"))
        check(sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want),
              "N=%d %s: the model goes through fsdp-train and back bit for bit (%d tensors)" % (n, strategy, len(want)))
    m, out = os.path.join(tmp, "hf.jsonl"), os.path.join(tmp, "tuned")
    run(["--init-from-hf", hf, "--meta-init", "--steps", "3", "--lr", "3e-3", "--export-hf", out, "--metrics", m], 2)
    steps = events(m, "step")
    check(len(steps) == 3 and steps[-1]["loss"] < steps[0]["loss"] and abs(steps[0]["loss"] - 9.01) < 0.2,
          "3 steps from the imported model: loss %.3f -> %.3f (ln 8192 = 9.01 at a random GPT-2's start)" %
          (steps[0]["loss"], steps[-1]["loss"]))
    tuned = GPT2LMHeadModel.from_pretrained(out).eval()
    x = torch.randint(0, 8192, (1, 16))
    with torch.no_grad():
        moved = (tuned(x).logits - ref(x).logits).abs().max().item()
    check(moved > 1e-4, "the export loads with from_pretrained and its logits moved (%.2e)" % moved)
    other = os.path.join(tmp, "hf96")
    m96 = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=64, n_embd=64, n_layer=2, n_head=4))
    with torch.no_grad():
        for p in m96.parameters():
            p.add_(0.02 * torch.randn_like(p))
    m96.save_pretrained(other)
    p = run(["--init-from-hf", other, "--steps", "1"], 2, expect_ok=False)
    check(p.returncode == 2 and "vocabulary is 96 tokens, the tokenizer's 8192" in error_line(p) and
          "--data FILE.bin" in error_line(p) + p.stderr,
          "another vocabulary with text: exit %d, %r" % (p.returncode, error_line(p)))
    # Its own ids, pre-tokenized as nanoGPT writes them (uint16, a folder of train.bin and val.bin).
    ids = os.path.join(tmp, "ids96")
    os.makedirs(ids)
    g = torch.Generator().manual_seed(1)
    torch.randint(0, 96, (20000,), generator=g).numpy().astype("<u2").tofile(os.path.join(ids, "train.bin"))
    torch.randint(0, 96, (2000,), generator=g).numpy().astype("<u2").tofile(os.path.join(ids, "val.bin"))
    out96, m = os.path.join(tmp, "same96"), os.path.join(tmp, "ids.jsonl")
    p = run(["--init-from-hf", other, "--data", ids, "--meta-init", "--steps", "1", "--lr", "1e-30", "--min-lr", "0",
             "--export-hf", out96, "--metrics", m], 2)
    want96, got96 = load_file(os.path.join(other, "model.safetensors")), load_file(os.path.join(out96, "model.safetensors"))
    check(all(torch.equal(got96[k], want96[k]) for k in want96) and "tokenized" not in p.stdout,
          "pre-tokenized ids of vocabulary 96: the model goes through fsdp-train and back bit for bit, nothing tokenized")
    loss = events(m, "step")[0]["loss"]
    check(abs(loss - 4.564) < 0.1, "its step-1 loss on uniform random ids is ln 96 = 4.564: %.3f" % loss)
    bad = os.path.join(tmp, "bad.bin")
    arr = torch.randint(0, 96, (5000,), generator=g).numpy().astype("<u2")
    arr[7] = 96
    arr.tofile(bad)
    p = run(["--init-from-hf", other, "--data", bad, "--steps", "1"], 2, expect_ok=False)
    check(p.returncode == 2 and "token id 96 at position 7" in error_line(p) and "bad.bin" in error_line(p),
          "an id past the vocabulary: exit %d, %r" % (p.returncode, error_line(p)))
    with open(bad, "ab") as f:
        f.write(b"\0")
    p = run(["--init-from-hf", other, "--data", bad, "--steps", "1"], 2, expect_ok=False)
    check(p.returncode == 2 and "not a whole number of uint16" in error_line(p),
          "a .bin of an odd size: exit %d, %r" % (p.returncode, error_line(p)))
    p = run(["--init-from-hf", other, "--data", ids, "--steps", "1", "--sample-tokens", "4"], 2, expect_ok=False)
    check(p.returncode == 2 and "--sample-tokens" in error_line(p) and "no tokenizer" in error_line(p),
          "a sample from pre-tokenized data: exit %d, %r" % (p.returncode, error_line(p)))
    p = run(["--init-from-hf", hf, "--n-layer", "4", "--steps", "1"], 1, expect_ok=False)
    check(p.returncode == 2 and "--n-layer" in error_line(p) and "--init-from-hf" in error_line(p),
          "a shape flag beside --init-from-hf: exit %d, %r" % (p.returncode, error_line(p)))



# The Llama runs' shape: llama-tiny (width 64, 2 layers, 4 heads, 2 key/value heads, SwiGLU 172)
# at the tokenizer's vocabulary, the tiny run's batch.
LLAMA = ["--model", "llama-tiny"] + TINY[6:]


def run_llama(opts, args, n, expect_ok=True, shape=True, env=None):
    cmd = launch_prefix(n) + [opts.bin, "--data-dir", opts.data_dir] + (LLAMA if shape else TINY[6:]) + args
    t0 = time.time()
    p = as_the_ranks_ended(subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})), timeout=300))
    print("  n=%d %.1fs rc=%d: %s%s" % (n, time.time() - t0, p.returncode, " ".join(args),
                                        " (%s)" % env if env else ""), flush=True)
    if expect_ok and p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit("FAIL: exit %d: %s" % (p.returncode, " ".join(cmd)))
    return p


def test_llama(opts, tmp):
    """fsdp-train trains Llama.
    * llama-tiny on the text corpus: 6 steps at N = 1 and N = 2 (full_shard) agree within 1e-4
      relative and the loss falls from ln 8192; at N = 2 --meta-init with --activation-checkpointing
      (hybrid_shard) has the same losses within 1e-6; a sample is generated; the config event
      names the family and its key/value heads.
    * --tokenizer FILE reads the text with that SentencePiece model whatever --vocab-size says.
    * A LlamaForCausalLM (grouped-query attention) saved by transformers as a 2-file split
      checkpoint goes through --init-from-hf --meta-init and --export-hf bit for bit at N = 2, and as
      bf16 (--export-hf-dtype bf16, N = 3): every tensor the bf16 cast of transformers' fp32 one,
      config.json's torch_dtype bfloat16, from_pretrained loads it; 3 steps from it lower the loss
      and the export's logits moved.
    * uint32 pre-tokenized ids (--data-dtype uint32) of a vocabulary past 65536: step-1 loss ln V.
    * Usage errors, one line, exit 2: --n-kv-head not dividing --n-head, --n-kv-head for a GPT, a
      missing --tokenizer file, --data-dtype with text, --export-hf-dtype without --export-hf."""
    m1, m2, m3 = (os.path.join(tmp, "llama%d.jsonl" % i) for i in (1, 2, 3))
    run_llama(opts, ["--steps", "6", "--metrics", m1], 1)
    p = run_llama(opts, ["--steps", "6", "--metrics", m2, "--sample-tokens", "8"], 2)
    a, b = losses(m1), losses(m2)
    rel = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
    check(len(a) == 6 and rel <= 1e-4, "llama-tiny N=1 vs N=2 full_shard: 6 losses within %.1e relative" % rel)
    check(abs(a[1] - math.log(8192)) < 0.3 and a[6] < a[1] - 0.2,
          "its loss falls: %.3f -> %.3f (ln 8192 = 9.01 at the start)" % (a[1], a[6]))
    check("sample (8 tokens" in p.stdout, "a sample is generated from the sharded Llama")
    cfg = events(m2, "config")[0]
    check(cfg["family"] == "llama" and cfg["n_kv_head"] == 2 and cfg["n_head"] == 4 and cfg["vocab_size"] == 8192,
          "the config event: family %s, %d heads, %d kv heads, vocabulary %d" %
          (cfg["family"], cfg["n_head"], cfg["n_kv_head"], cfg["vocab_size"]))
    run_llama(opts, ["--steps", "6", "--metrics", m3, "--meta-init", "--activation-checkpointing",
                     "--strategy", "hybrid_shard", "--hybrid-shard-group-size", "2"], 2)
    c = losses(m3)
    rel = max(abs(b[s] - c[s]) / abs(b[s]) for s in b)
    check(rel <= 1e-6, "N=2 --meta-init --activation-checkpointing hybrid_shard: the same losses (%.1e)" % rel)
    # bf16 (bf16 params, all-gathers and reductions; fp32 master weights and loss) on two kernel paths:
    # the CPU's own (oneDNN's AMX / AVX512-BF16 kernels where the CPU has them) and oneDNN held to
    # AVX2, the path of a CPU without bf16 units. Both track the fp32 run.
    for isa in (None, "AVX2"):
        mb = os.path.join(tmp, "llama-bf16-%s.jsonl" % (isa or "native"))
        p = run_llama(opts, ["--steps", "3", "--mixed-precision", "bf16", "--metrics", mb], 2,
                      env={"ONEDNN_MAX_CPU_ISA": isa} if isa else None)
        d = losses(mb)
        if isa is None:
            # Start-up: on a CPU whose bf16 matmuls libtorch cannot run on bf16 units, one line
            # naming the CPU and the measured time of a bf16 matmul against fp32; else none.
            cpu = events(mb, "config")[0]["cpu"]
            said = re.findall(r"warning: --mixed-precision bf16 on (.+) \(libtorch (\w+), no avx512_bf16 or "
                              r"amx_bf16 units that libtorch uses\): a bf16 matmul took ([0-9.e+]+)x the time "
                              r"of an fp32 one here", p.stdout + p.stderr)
            if cpu["bf16_accelerated"]:
                check(not said, "bf16 on a CPU with bf16 units: no warning, got %r" % said)
            else:
                check(len(said) == 1 and said[0][0] == cpu["model"] and said[0][1] == cpu["capability"] and
                      float(said[0][2]) > 0,
                      "bf16 on %s without bf16 units: one warning naming it and the matmul's cost, got %r"
                      % (cpu["model"], said))
        rel = max(abs(d[s_] - b[s_]) / abs(b[s_]) for s_ in (1, 2, 3))
        check(rel <= 5e-3, "bf16 N=2 (oneDNN ISA %s): losses of steps 1-3 within %.1e of fp32's" % (isa or "native", rel))

    # --tokenizer: the file gives the vocabulary (--vocab-size beside it is refused below).
    mt = os.path.join(tmp, "tok.jsonl")
    spm = os.path.join(opts.data_dir, "spm_8192.model")
    run_llama(opts, ["--steps", "1", "--metrics", mt, "--tokenizer", spm], 1)
    cfg = events(mt, "config")[0]
    check(cfg["vocab_size"] == 8192 and cfg["tokenizer"].endswith("spm_8192.model"),
          "--tokenizer FILE: the model's vocabulary is the file's (%d)" % cfg["vocab_size"])

    for args, flag, words, n in ((["--n-kv-head", "3"], "--n-kv-head", "must divide --n-head 4", 1),
                                 (["--model", "nano", "--n-kv-head", "2"], "--n-kv-head", "Llama", 1),
                                 (["--tokenizer", os.path.join(tmp, "none.model")], "--tokenizer", "no file", 1),
                                 (["--data-dtype", "uint32"], "--data-dtype", "pre-tokenized", 1),
                                 (["--export-hf-dtype", "bf16"], "--export-hf-dtype", "--export-hf", 1),
                                 (["--tokenizer", spm, "--vocab-size", "512"], "--vocab-size", "--tokenizer", 1)):
        p = run_llama(opts, ["--steps", "1"] + args, n, expect_ok=False)
        line = error_line(p) or p.stderr.strip().splitlines()[-1][:240]
        check(p.returncode == 2 and flag in line and words in line and "Traceback" not in p.stderr,
              "%s: exit %d, %r" % (" ".join(args), p.returncode, line))

    try:
        import torch
        from safetensors.torch import load_file
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print("  SKIP LlamaForCausalLM checks: %s (scripts/setup.sh installs transformers)" % e)
        return
    torch.manual_seed(0)
    hf = os.path.join(tmp, "hf-llama")
    ref = LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       tie_word_embeddings=False)).eval()
    with torch.no_grad():  # no RMSNorm weight of exactly 1: an update of lr 1e-30 moves none
        for p_ in ref.parameters():
            p_.add_(0.02 * torch.randn_like(p_))
    ref.save_pretrained(hf, max_shard_size="1MB")
    check(os.path.exists(os.path.join(hf, "model.safetensors.index.json")), "transformers wrote a split checkpoint")
    want = {}
    for f in sorted(os.listdir(hf)):
        if f.endswith(".safetensors"):
            want.update(load_file(os.path.join(hf, f)))
    shapeless = ["--steps", "1", "--lr", "1e-30", "--min-lr", "0", "--init-from-hf", hf, "--meta-init"]
    out = os.path.join(tmp, "llama-same")
    run_llama(opts, shapeless + ["--export-hf", out], 2, shape=False)
    got = load_file(os.path.join(out, "model.safetensors"))
    check(sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want),
          "N=2 full_shard: a split LlamaForCausalLM goes through fsdp-train and back bit for bit (%d tensors)" % len(want))
    out16 = os.path.join(tmp, "llama-bf16")
    run_llama(opts, shapeless + ["--strategy", "shard_grad_op", "--global-batch-size", "6", "--export-hf", out16,
                                 "--export-hf-dtype", "bf16"],
              3, shape=False)
    got = load_file(os.path.join(out16, "model.safetensors"))
    with open(os.path.join(out16, "config.json")) as f:
        dtype = json.load(f)["torch_dtype"]
    check(dtype == "bfloat16" and all(got[k].dtype == torch.bfloat16 and torch.equal(got[k], want[k].to(torch.bfloat16))
                                      for k in want),
          "N=3 --export-hf-dtype bf16: every tensor the bf16 cast of the fp32 one, torch_dtype %s" % dtype)
    back = LlamaForCausalLM.from_pretrained(out16, dtype=torch.bfloat16).eval()
    x = torch.randint(0, 8192, (1, 16))
    with torch.no_grad():
        err = (back(x).logits.float() - ref(x).logits).abs().max().item()
    check(back.dtype == torch.bfloat16 and err < 0.05, "from_pretrained loads the bf16 export (logits within %.3f)" % err)
    m, tuned = os.path.join(tmp, "llama-hf.jsonl"), os.path.join(tmp, "llama-tuned")
    run_llama(opts, ["--steps", "3", "--lr", "3e-3", "--init-from-hf", hf, "--meta-init", "--export-hf", tuned,
                     "--metrics", m], 2, shape=False)
    steps = events(m, "step")
    check(len(steps) == 3 and steps[-1]["loss"] < steps[0]["loss"] and abs(steps[0]["loss"] - math.log(8192)) < 0.3,
          "3 steps from the imported Llama: loss %.3f -> %.3f" % (steps[0]["loss"], steps[-1]["loss"]))
    back = LlamaForCausalLM.from_pretrained(tuned).eval()
    with torch.no_grad():
        moved = (back(x).logits - ref(x).logits).abs().max().item()
    check(moved > 1e-4, "the tuned export loads with from_pretrained and its logits moved (%.2e)" % moved)
    with open(os.path.join(tuned, "config.json")) as f:
        conf = json.load(f)
    check(conf.get("bos_token_id") == ref.config.bos_token_id and conf.get("dtype") == "float32",
          "the export's config.json keeps the source's other fields (bos_token_id %s) and says dtype %s" %
          (conf.get("bos_token_id"), conf.get("dtype")))

    # Resuming a fine-tune: the same --init-from-hf gives the config, the checkpoint the weights; a
    # preset of other settings (llama-tiny's rms_norm_eps 1e-5, not the source's 1e-6) is refused.
    ck, mr = os.path.join(tmp, "llama-ck"), os.path.join(tmp, "llama-resumed.jsonl")
    run_llama(opts, ["--steps", "2", "--init-from-hf", hf, "--save", ck], 2, shape=False)
    run_llama(opts, ["--steps", "3", "--init-from-hf", hf, "--resume", ck, "--metrics", mr], 2, shape=False)
    check([e["step"] for e in events(mr, "step")] == [3], "--init-from-hf with --resume trains on from step 3")
    p = run_llama(opts, ["--steps", "3", "--resume", ck, "--block-size", "64"], 2, expect_ok=False)
    check(p.returncode == 2 and "norm_eps" in error_line(p) and "--init-from-hf" in error_line(p),
          "the checkpoint resumed as llama-tiny (another norm epsilon): exit %d, %r" % (p.returncode, error_line(p)))

    # An export into the folder of a split checkpoint replaces it whole; a folder holding both forms
    # is refused; ranks reading different copies at the same path are refused.
    again = os.path.join(tmp, "llama-again")
    shutil.copytree(hf, again)
    run_llama(opts, shapeless + ["--export-hf", again], 2, shape=False)
    left = sorted(f for f in os.listdir(again) if "safetensors" in f)
    check(left == ["model.safetensors"], "an export over a split checkpoint leaves one model: %s" % left)
    run_llama(opts, shapeless + ["--export-hf", os.path.join(tmp, "llama-again2")] + ["--init-from-hf", again], 2,
              shape=False)
    shutil.copy(os.path.join(hf, "model.safetensors.index.json"), again)
    p = run_llama(opts, shapeless + ["--init-from-hf", again], 2, expect_ok=False, shape=False)
    line = next((l for l in p.stderr.splitlines() if "fsdp-train: error:" in l), "")
    check(p.returncode == 1 and "holds both model.safetensors and model.safetensors.index.json" in line,
          "a folder of both forms: exit %d, %r" % (p.returncode, line[-200:]))
    host_a, host_b = os.path.join(tmp, "host-a"), os.path.join(tmp, "host-b")
    shutil.copytree(os.path.join(tmp, "llama-same"), os.path.join(host_a, "m"))
    shutil.copytree(tuned, os.path.join(host_b, "m"))
    side = [os.path.abspath(opts.bin), "--data-dir", os.path.abspath(opts.data_dir)] + TINY[6:] + ["--steps", "1", "--init-from-hf", "m"]
    cmd = mpmd_command([(1, side, host_a), (1, side, host_b)])
    p = as_the_ranks_ended(subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300))
    line = next((l for l in p.stderr.splitlines() if "fsdp-train: error:" in l), "")
    check(p.returncode == 1 and "the ranks read different files" in line and "rank(s) 1" in line,
          "ranks given different copies at one path: exit %d, %r %s" % (p.returncode, line[-260:], p.stderr[-1500:] if not line else ""))

    # Ids past uint16: a vocabulary of 70000, uint32 .bin files.
    ids = os.path.join(tmp, "ids32")
    os.makedirs(ids)
    g = torch.Generator().manual_seed(1)
    torch.randint(0, 70000, (20000,), generator=g).numpy().astype("<u4").tofile(os.path.join(ids, "train.bin"))
    torch.randint(0, 70000, (2000,), generator=g).numpy().astype("<u4").tofile(os.path.join(ids, "val.bin"))
    m32 = os.path.join(tmp, "ids32.jsonl")
    run_llama(opts, ["--steps", "1", "--data", ids, "--data-dtype", "uint32", "--vocab-size", "70000",
                     "--metrics", m32], 2)
    loss = events(m32, "step")[0]["loss"]
    check(abs(loss - math.log(70000)) < 0.1, "uint32 ids of a 70000-token vocabulary: step-1 loss %.3f, ln 70000 = %.3f" %
          (loss, math.log(70000)))
    small = os.path.join(tmp, "ids32-small")
    os.makedirs(small)
    for name, count in (("train.bin", 20000), ("val.bin", 2000)):
        torch.randint(1, 8192, (count,), generator=g).numpy().astype("<u4").tofile(os.path.join(small, name))
    p = run_llama(opts, ["--steps", "1", "--data", small], 1, expect_ok=False)
    check(p.returncode == 2 and "--data-dtype uint32" in error_line(p),
          "uint32 ids read as uint16: exit %d, %r" % (p.returncode, error_line(p)))


def main():
    return run_main({"hf": test_hf, "llama": test_llama}, "fsdp-train-hf-e2e-")


if __name__ == "__main__":
    sys.exit(main())
