#!/usr/bin/env python3
"""Bad input to fsdp-train, run by ctest (apps/CMakeLists.txt, test fsdp_train_inputs) under mpirun.

  train_inputs.py --bin build/bin/fsdp-train --data-dir ./data

Every failure is exit 2 (usage) or 1 (runtime) with one line "fsdp-train: error: ..." from rank 0,
no MPI_ABORT banner and no backtrace:
  * ranks launched with different settings (MPMD: model shape, optimizer, schedule, clipping,
    batch geometry, strategy, precision, seed, data): exit 2 before step 1, one line naming the
    setting and each side's value;
  * flags out of range (readable bounds), --sample-top-k above the vocabulary, an empty
    --sample-prompt, --export / --metrics / --trace in a missing directory, --save on a full or
    too small file system (a tmpfs mounted here when root; else skipped with the reason): all
    refused before step 1; --eval-batches past the validation set capped at the set, with one line;
  * a NaN loss injected on rank 1 at step 2 (FSDP_TRAIN_INJECT_NONFINITE): exit 1 naming step 2
    and rank 1, checkpoint of step 1 only; --on-nonfinite skip trains on;
  * edited manifests (chunk_rows -1 and 0), edited counters (step -3, lr_step), another
    --global-batch-size or --beta1 / --beta2 / --weight-decay than the checkpoint's (refused, naming
    both values), and a damaged newest checkpoint when resuming its directory (refused, naming the
    older one);
  * --import of torch.save(model.state_dict()) with a "module." prefix (an OrderedDict with
    _metadata) loads the weights exactly; a .npz, random bytes and a dict of non-tensors are
    refused in one line.
Exit 0: pass; 77: skipped (no data / no mpirun); anything else: fail.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_e2e import TINY, check, events  # noqa: E402


def run(args, n, opts, env=None):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(n), opts.bin,
           "--data-dir", opts.data_dir] + TINY + args
    e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                       timeout=300)
    print("  n=%d %.1fs rc=%d: %s" % (n, time.time() - t0, p.returncode, " ".join(args)), flush=True)
    return p


def expect_error(p, code, *needles):
    """Exit `code`, exactly one error line containing every needle, no abort banner or backtrace."""
    out = p.stdout + p.stderr
    lines = [l for l in out.splitlines() if "error" in l.lower()]
    ok = (p.returncode == code and len(lines) == 1 and all(n in lines[0] for n in needles) and
          "MPI_ABORT" not in out and "Exception raised from" not in out and "frame #" not in out
          and len(lines[0]) < 600)
    if not ok:
        sys.stderr.write(out[-3000:])
    check(ok, "exit %d, one line with %s: %r" % (p.returncode, needles, lines[0][:300] if lines else ""))


def run_mpmd(args_a, args_b, n_each, opts):
    """Ranks 0..n_each-1 launched with args_a, the next n_each with args_b (as a wrong hostfile, a
    per-node config file or a stale environment does), each on the TINY model."""
    base = [opts.bin, "--data-dir", opts.data_dir] + TINY + ["--steps", "2"]
    cmd = (["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", str(n_each)] + base + args_a +
           [":", "-n", str(n_each)] + base + args_b)
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=90)
    print("  n=%d %.1fs rc=%d: %s | %s" % (2 * n_each, time.time() - t0, p.returncode, " ".join(args_a),
                                          " ".join(args_b)), flush=True)
    return p


def test_rank_settings(opts, tmp):
    """One family of settings per launch differs between the two halves of the ranks: every rank
    exits 2 before step 1 with one line naming the setting and each half's value."""
    text = os.path.join(opts.data_dir, "corpus", "train.txt")
    a, b = os.path.join(tmp, "a.txt"), os.path.join(tmp, "b.txt")
    with open(text, "rb") as f:
        head = f.read(200000)
    for path, content in ((a, head), (b, b"Amen. " + head[6:])):  # the same size, other words first
        with open(path, "wb") as f:
            f.write(content)
    cases = [  # (family, args of the first half, of the second half, the flag named, values shown)
        ("model shape", ["--n-head", "2"], ["--n-head", "4"], "--n-head", ("'2'", "'4'")),
        ("optimizer", ["--lr", "0.001"], ["--lr", "0.002"], "--lr", ("'0.001'", "'0.002'")),
        ("optimizer", ["--beta1", "0.9"], ["--beta1", "0.8"], "--beta1", ("'0.9'", "'0.8'")),
        ("schedule", ["--min-lr", "1e-4"], ["--min-lr", "2e-4"], "--min-lr", ("'0.0001'", "'0.0002'")),
        ("clipping", [], ["--grad-clip", "0.5"], "--grad-clip", ("'1'", "'0.5'")),
        ("batch geometry", [], ["--micro-batch-size", "1"], "--micro-batch-size", ("'0'", "'1'")),
        ("strategy", [], ["--strategy", "no_shard"], "--strategy", ("'full_shard'", "'no_shard'")),
        ("precision", [], ["--mixed-precision", "bf16"], "--mixed-precision", ("'fp32'", "'bf16'")),
        ("seed", ["--seed", "1"], ["--seed", "2"], "--seed", ("'1'", "'2'")),
        ("data identity", ["--data", a], ["--data", b], "--data (training tokens)", ("tokens, fnv1a",)),
    ]
    for i, (family, args_a, args_b, flag, shown) in enumerate(cases):
        for n_each in ((1, 2) if i % 3 == 0 else (1,)):
            p = run_mpmd(args_a, args_b, n_each, opts)
            ranks = ("rank 0 ", "rank 1 ") if n_each == 1 else ("ranks 0, 1 ", "ranks 2, 3 ")
            expect_error(p, 2, "ranks disagree on " + flag + ":", *ranks, *shown)
            check("step 1/" not in p.stdout, family + ": a step ran")


def edit_manifest(ckpt_dir, fn):
    path = os.path.join(ckpt_dir, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    fn(m)
    with open(path, "w") as f:
        json.dump(m, f)


def test_flags(opts, tmp):
    m = os.path.join(tmp, "m.jsonl")
    expect_error(run(["--steps=-1"], 1, opts), 2, "--steps", "outside [1, 1073741824]")
    expect_error(run(["--lr", "inf"], 1, opts), 2, "--lr", "not a finite number")
    expect_error(run(["--sample-tokens", "4", "--sample-top-k", "9000"], 1, opts), 2,
                 "--sample-top-k 9000 exceeds the vocabulary of 8192")
    expect_error(run(["--sample-tokens", "4", "--sample-prompt", ""], 1, opts), 2, "--sample-prompt")
    expect_error(run(["--forward-prefetch", "maybe"], 1, opts), 2, "--forward-prefetch", "'maybe' is not true or false")
    missing = os.path.join(tmp, "missing")
    for flag in ("--export", "--metrics", "--trace"):
        extra = ["--metrics", m] if flag != "--metrics" else []
        p = run(["--steps", "2", flag, os.path.join(missing, "x")] + extra, 2, opts)
        expect_error(p, 2, flag, "does not exist")
        check(not events(m, "step"), "%s in a missing directory: refused before step 1" % flag)
    # The flight recorder's directory is only written on a failure: checked before step 1 all the
    # same (a path under a file, an unwritable place), and never created by a healthy run.
    afile = os.path.join(tmp, "afile")
    open(afile, "w").close()
    for bad, why in ((os.path.join(afile, "fr"), "is not a directory"), (afile, "is not a directory")):
        p = run(["--steps", "2", "--metrics", m, "--flight-recorder-dir", bad], 2, opts)
        expect_error(p, 2, "flight recorder", why)
        check(not events(m, "step"), "--flight-recorder-dir %s: refused before step 1" % bad)
    fr = os.path.join(tmp, "new", "fr")
    p = run(["--steps", "1", "--metrics", m, "--flight-recorder-dir", fr], 2, opts)
    check(p.returncode == 0 and not os.path.exists(fr),
          "--flight-recorder-dir in a directory still to make: accepted, and a healthy run makes none")
    # A validation pass covers the set at most once, and says so when --eval-batches asks more.
    p = run(["--steps", "1", "--eval-batches", "1000000"], 2, opts)
    said = re.search(r"validation: --eval-batches 1000000 is more than the set holds \((\d+) sequences "
                     r"of \d+ tokens, (\d+) global batch\(es\)\): each pass evaluates (\d+)", p.stdout)
    check(p.returncode == 0 and said and said.group(2) == said.group(3) and int(said.group(2)) >= 1,
          "--eval-batches past the validation set: capped with one line, got %r" % p.stdout[-400:])


def test_disk_full(opts, tmp):
    mnt = os.path.join(tmp, "tmpfs")
    os.makedirs(mnt)
    if os.geteuid() != 0:
        print("  SKIP disk-full checks: not root (cannot mount a tmpfs)")
        return
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print("  SKIP disk-full checks: mount -t tmpfs failed: %s" % r.stdout.strip())
        return
    try:
        expect_error(run(["--steps", "2", "--save", os.path.join(mnt, "ck")], 2, opts), 2,
                     "--save", "a checkpoint needs about", "free")
        with open(os.path.join(mnt, "fill"), "wb") as f:  # fill the file system completely
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        expect_error(run(["--steps", "2", "--export", os.path.join(mnt, "x.pt")], 1, opts), 2,
                     "--export", "cannot write a file there")
    finally:
        subprocess.run(["umount", mnt])


def test_nonfinite_and_resume(opts, tmp):
    ck = os.path.join(tmp, "ck")
    m = os.path.join(tmp, "nf.jsonl")
    inject = {"FSDP_TRAIN_INJECT_NONFINITE": "2:1"}
    p = run(["--steps", "3", "--save", ck, "--save-every", "1", "--metrics", m], 2, opts, inject)
    expect_error(p, 1, "step 2", "non-finite loss", "rank 1")
    check(sorted(os.listdir(ck)) == ["latest", "step-000000001"] and
          [e["step"] for e in events(m, "step")] == [1],
          "NaN at step 2: only step 1 trained and saved: %s" % sorted(os.listdir(ck)))

    ck2 = os.path.join(tmp, "ck2")
    full = os.path.join(tmp, "full.pt")
    m2 = os.path.join(tmp, "skip.jsonl")
    p = run(["--steps", "3", "--save", ck2, "--save-every", "1", "--on-nonfinite", "skip",
             "--export", full, "--metrics", m2], 2, opts, inject)
    check(p.returncode == 0 and [e["step"] for e in events(m2, "step")] == [1, 2, 3] and
          "update skipped" in p.stdout, "--on-nonfinite skip: exit %d, trains steps 1-3" % p.returncode)

    step1 = os.path.join(ck, "step-000000001")
    shutil.copytree(step1, step1 + ".orig")
    cases = [
        ("chunk_rows -1", lambda j: j["tensors"]["model/wte.weight"]["shards"][0].update(chunk_rows=-1),
         1, "chunk_rows: expected >= 1, got -1"),
        ("chunk_rows 0", lambda j: j["tensors"]["model/wte.weight"]["shards"][0].update(chunk_rows=0),
         1, "chunk_rows: expected >= 1, got 0"),
        ("step -3", lambda j: j["train_state"]["ints"].update(step=-3), 1, "'step': expected >= 0, got -3"),
        ("lr_step", lambda j: j["train_state"]["ints"].update(lr_step=5), 1, "'lr_step'"),
    ]
    for what, fn, code, needle in cases:
        shutil.rmtree(step1)
        shutil.copytree(step1 + ".orig", step1)
        edit_manifest(step1, fn)
        expect_error(run(["--steps", "3", "--resume", step1], 2, opts), code, "--resume", needle)
    shutil.rmtree(step1)
    shutil.copytree(step1 + ".orig", step1)
    expect_error(run(["--steps", "3", "--resume", step1, "--global-batch-size", "8"], 2, opts), 2,
                 "says --global-batch-size 4", "this run has 8")
    # A resumed AdamW keeps the options it was saved with: a flag that differs is refused, never
    # ignored (it used to train bit-identically to a resume without it).
    for flag, value, saved in (("--beta1", "0.5", "0.9"), ("--beta2", "0.9", "0.95"), ("--weight-decay", "0.01", "0.1")):
        expect_error(run(["--steps", "3", "--resume", step1, flag, value], 2, opts), 2,
                     "says %s %s" % (flag, saved), "this run has %s" % value)

    newest = os.path.join(ck2, "step-000000003")
    edit_manifest(newest, lambda j: j["tensors"]["model/wte.weight"]["shards"][0].update(chunk_rows=0))
    expect_error(run(["--steps", "3", "--resume", ck2], 2, opts), 1, "step-000000003",
                 "chunk_rows", "name it explicitly, e.g. '%s'" % os.path.join(ck2, "step-000000002"))
    return full


def test_import(opts, tmp, full):
    try:
        import numpy
        import torch
    except ImportError:
        print("  SKIP import checks: python3 cannot import torch and numpy")
        return
    import collections
    sd = torch.load(full, weights_only=True)
    od = collections.OrderedDict(("module." + k, v) for k, v in sd.items())
    od._metadata = collections.OrderedDict({"": {"version": 1}})  # as model.state_dict() has
    wrapped = os.path.join(tmp, "wrapped.pt")
    torch.save(od, wrapped)
    re_pt = os.path.join(tmp, "re.pt")
    p = run(["--steps", "1", "--lr", "1e-30", "--min-lr", "0", "--import", wrapped, "--export",
             re_pt], 1, opts)
    y = torch.load(re_pt, weights_only=True) if p.returncode == 0 else {}
    worst = max(((sd[k] - y[k]).abs().max().item() for k in sd), default=1.0) if y else 1.0
    check(p.returncode == 0 and sorted(y) == sorted(sd) and worst < 1e-6,
          "--import of an OrderedDict state dict with 'module.' keys: exit %d, max abs diff %.3g" %
          (p.returncode, worst))
    npz = os.path.join(tmp, "w.npz")
    numpy.savez(npz, a=numpy.zeros(3))
    junk = os.path.join(tmp, "junk.pt")
    with open(junk, "wb") as f:
        f.write(os.urandom(4096))
    other = os.path.join(tmp, "other.pt")
    torch.save({"a": 1, "b": [1, 2]}, other)
    for path, needle in ((npz, "not a torch.save file"), (junk, "not a zip archive"),
                         (other, "dict entry: expected str -> tensor")):
        expect_error(run(["--steps", "1", "--import", path], 2, opts), 1, "--import", needle)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--data-dir", required=True)
    opts = ap.parse_args()
    if shutil.which("mpirun") is None:
        print("SKIP: no mpirun")
        return 77
    if not os.path.isfile(os.path.join(opts.data_dir, "spm_8192.model")):
        print("SKIP: no data in %s (run scripts/prepare_data.sh %s)" % (opts.data_dir, opts.data_dir))
        return 77
    tmp = tempfile.mkdtemp(prefix="fsdp-train-inputs-")
    try:
        t0 = time.time()
        test_flags(opts, tmp)
        test_rank_settings(opts, tmp)
        test_disk_full(opts, tmp)
        full = test_nonfinite_and_resume(opts, tmp)
        test_import(opts, tmp, full)
        print("PASS (%.1f s)" % (time.time() - t0))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
