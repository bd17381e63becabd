#!/usr/bin/env python3
"""Bad input to fsdp-train, run by ctest (apps/CMakeLists.txt, test fsdp_train_inputs) under mpirun.

  train_inputs.py --bin build/bin/fsdp-train --data-dir ./data

Every failure is exit 2 (usage) or 1 (runtime) with one line "fsdp-train: error: ..." from rank 0,
no MPI_ABORT banner and no backtrace:
  * ranks launched with different settings (MPMD: model shape, optimizer, schedule, clipping,
    batch geometry, strategy, precision, seed, data): exit 2 before step 1, one line naming the
    setting and each side's value;
  * ids rewritten in a token cache: rebuilt from the text (its ids' checksum), saying why, the
    same step-1 loss;
  * --backend nccl in a build without CUDA (known, not built) and an unknown backend: exit 2, the
    line saying why;
  * flags out of range (readable bounds), --sample-top-k above the vocabulary, an empty
    --sample-prompt, --export / --metrics / --trace in a missing directory, --save on a full or
    too small file system (a tmpfs mounted here when root; else skipped with the reason): all
    refused before step 1; --eval-batches past the validation set capped at the set, with one line;
  * --flight-recorder-dir /proc/fsdp_fr, --config naming a directory or nothing, a model larger than
    the machine's memory: refused before step 1; --metrics and --trace on a full disk: one warning
    each naming the file and errno, no partial file, training to the end;
Exit 0: pass; 77: skipped (no data / no mpirun); anything else: fail.
"""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import TINY, as_the_ranks_ended, check, events, expect_error, mpmd_command, run, run_main  # noqa: E402


def test_token_cache(opts, tmp):
    """Ids rewritten inside a token cache (*.tok) are not trained on: the cache fails its ids'
    checksum, is rebuilt from the text (one line says why), and step 1 has the loss of a run on the
    untouched cache."""
    text = os.path.join(tmp, "cache-text.txt")
    with open(os.path.join(opts.data_dir, "corpus", "train.txt"), "rb") as f, open(text, "wb") as g:
        g.write(f.read(300000))
    loss = re.compile(r"step 1/1 \| loss ([0-9.]+)")
    first = run(["--steps", "1", "--data", text], 2, opts)
    check(first.returncode == 0 and "tokenized" in first.stdout, "the first run builds the cache")
    caches = [f for f in os.listdir(tmp) if f.startswith("cache-text.txt.") and f.endswith(".tok")]
    check(len(caches) == 1, "one token cache beside the text: %s" % caches)
    with open(os.path.join(tmp, caches[0]), "r+b") as f:
        f.seek(56 + 2 * 1000)  # the header, then uint16 ids: rewrite ids 1000..1003
        f.write(bytes([7, 0, 7, 0, 7, 0, 7, 0]))
    again = run(["--steps", "1", "--data", text], 2, opts)
    check(again.returncode == 0 and "its header or ids do not match their checksum" in again.stdout,
          "a rewritten cache is rebuilt, saying why: %r" % again.stdout[-400:])
    a, b = loss.search(first.stdout), loss.search(again.stdout)
    check(a is not None and b is not None and a.group(1) == b.group(1),
          "the same step-1 loss as on the untouched cache: %s vs %s" % (a and a.group(1), b and b.group(1)))


def run_mpmd(args_a, args_b, n_each, opts):
    """Ranks 0..n_each-1 launched with args_a, the next n_each with args_b (as a wrong hostfile, a
    per-node config file or a stale environment does), each on the TINY model."""
    base = [opts.bin, "--data-dir", opts.data_dir] + TINY + ["--steps", "2"]
    cmd = mpmd_command([(n_each, base + args_a, None), (n_each, base + args_b, None)])
    t0 = time.time()
    p = as_the_ranks_ended(subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=90))
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
    ids, out = os.path.join(tmp, "ids.bin"), os.path.join(tmp, "export-hf")
    with open(ids, "wb") as f:
        f.write(bytes(40000))
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
        # Read before any collective could notice: ids of another width, an export of another dtype.
        ("ids width", ["--data", ids, "--data-dtype", "uint32"], ["--data", ids], "--data-dtype",
         ("'uint32'", "'uint16'")),
        ("export dtype", ["--export-hf", out, "--export-hf-dtype", "bf16"], ["--export-hf", out], "--export-hf-dtype",
         ("'bf16'", "'fp32'")),
        ("adapters", [], ["--lora-rank", "2"], "--lora-rank", ("'0'", "'2'")),
    ]
    for i, (family, args_a, args_b, flag, shown) in enumerate(cases):
        for n_each in ((1, 2) if i % 3 == 0 else (1,)):
            p = run_mpmd(args_a, args_b, n_each, opts)
            ranks = ("rank 0 ", "rank 1 ") if n_each == 1 else ("ranks 0, 1 ", "ranks 2, 3 ")
            expect_error(p, 2, "ranks disagree on " + flag + ":", *ranks, *shown)
            check("step 1/" not in p.stdout, family + ": a step ran")


def test_budget_on_some_ranks(opts, tmp):
    """--memory-budget on the first half of the ranks only, tight enough to refuse an allocation of
    step 1 in the forward, the loss or the backward: the other ranks' steps are abandoned (they
    were waiting in collectives the refused ranks never issue), every rank joins the report, one
    line names the refused ranks, exit 1, no abort."""
    phases = set()
    for budget, n_each in (("6MB", 1), ("8MB", 1), ("12MB", 1), ("6MB", 2)):
        p = run_mpmd(["--memory-budget", budget], [], n_each, opts)
        expect_error(p, 1, "out of memory on %d of %d ranks; the others abandoned the step" % (n_each, 2 * n_each),
                     "memory budget of %.1f MB exceeded" % float(budget[:-2]))
        for phase in ("forward", "loss", "backward"):
            if "] %s: memory budget" % phase in p.stderr or "' %s: memory budget" % phase in p.stderr:
                phases.add(phase)
    check(len(phases) >= 2, "the budgets were refused in more than one phase of the step: %s" % sorted(phases))


def test_backend_names(opts):
    """--backend takes the names of the library's registry: a known backend this build lacks (nccl
    in a build without CUDA) is refused saying so, an unknown one with the known names; exit 2,
    one line, no backtrace."""
    usage = " ".join(subprocess.run([opts.bin, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, timeout=60).stdout.split())
    check("'nccl': " in usage, "--help lists the nccl backend")
    if re.search(r"'nccl': [^;]*\(not in this build\)", usage):
        expect_error(run(["--steps", "1", "--backend", "nccl"], 1, opts), 2, "--backend",
                     "backend 'nccl' is not in this build (it needs a CUDA build (FSDP_WITH_CUDA))",
                     "use --backend mpi (mpirun) or gloo (torchrun)")
    else:
        print("  --backend nccl: this build has it (its --help does not mark it); its refusal not tested")
    expect_error(run(["--steps", "1", "--backend", "tcp"], 1, opts), 2, "--backend",
                 "backend 'tcp': expected one of auto, mpi, gloo, nccl")


def test_flags(opts, tmp):
    m = os.path.join(tmp, "m.jsonl")
    expect_error(run(["--steps=-1"], 1, opts), 2, "--steps", "outside [1, 1073741824]")
    expect_error(run(["--lr", "inf"], 1, opts), 2, "--lr", "not a finite number")
    expect_error(run(["--sample-tokens", "4", "--sample-top-k", "9000"], 1, opts), 2,
                 "--sample-top-k 9000 exceeds the vocabulary of 8192")
    expect_error(run(["--sample-tokens", "4", "--sample-prompt", " "], 1, opts), 2,
                 "--sample-prompt ' ' encodes to no token")
    # An empty value (an unset shell variable: --save "$CKPT", --save=$CKPT) is refused, not read as
    # no --save or, after '=', as "the value is the next argument".
    for args in (["--save", ""], ["--memory-budget", ""], ["--resume", ""], ["--sample-prompt", ""],
                 ["--save=", "--activation-checkpointing"], ["--memory-budget="]):
        flag = args[0].rstrip("=")
        expect_error(run(["--steps", "2", "--metrics", m] + args, 1, opts), 2, flag + ": is empty")
        check(not events(m, "step"), "%s: refused before step 1" % args)
    # A typo or a flag without a value keeps its own message; the seed has bounds (no wrap of -1).
    expect_error(run(["--steps", "2", "--sav", ""], 1, opts), 2, "an empty argument after '--sav'")
    test_backend_names(opts)
    expect_error(run(["--steps", "2", "--seed", "-1"], 1, opts), 2, "--seed: -1 is outside [0, ")
    toml = os.path.join(tmp, "empty.toml")
    with open(toml, "w") as f:
        f.write('save = ""\nsteps = 2\n')
    expect_error(run(["--config", toml, "--metrics", m], 1, opts), 2, "key 'save' is empty")
    check(not events(m, "step"), "an empty key of the config file: refused before step 1")
    # A file that sets nothing, and one flag set twice (its dash and underscore spellings).
    for text, needle in (("# nothing yet\n", "sets no key (an empty file, or comments only)"),
                         ("seq_len = 32\nseq-len = 16\n", "keys 'seq-len' and 'seq_len' both set --seq-len: keep one")):
        with open(toml, "w") as f:
            f.write(text)
        expect_error(run(["--config", toml, "--metrics", m], 1, opts), 2, needle)
    expect_error(run(["--forward-prefetch", "maybe"], 1, opts), 2, "--forward-prefetch", "'maybe' is not true or false")
    expect_error(run(["--steps", "2", "--metrics", m, "--strategy", "no_shard", "--all-gather-codec", "int8"], 1, opts),
                 2, "--all-gather-codec int8 applies to strategies that all-gather params, not no_shard")
    check(not events(m, "step"), "--all-gather-codec int8 with no_shard: refused before step 1")
    for args, says in ((["--strategy", "shard_grad_op", "--reshard-after-forward", "1"],
                        "--reshard-after-forward 1 applies to --strategy full_shard or hybrid_shard, not shard_grad_op"),
                       (["--reshard-after-forward", "3"], "--reshard-after-forward 3 must divide the shard group size 2"),
                       (["--reshard-after-forward", "-1"], "expected a non-negative integer or host, got '-1'"),
                       (["--strategy", "no_shard", "--reduce-scatter-codec", "int8"],
                        "--reduce-scatter-codec int8 applies to strategies that reduce-scatter gradients, not no_shard"),
                       (["--strategy", "no_shard", "--host-aware-collectives", "2"],
                        "--host-aware-collectives 2 applies to strategies that all-gather params and reduce-scatter"),
                       (["--host-aware-collectives", "3"], "--host-aware-collectives 3 must divide the shard group size 2")):
        expect_error(run(["--steps", "2", "--metrics", m] + args, 2, opts), 2, says)
        check(not events(m, "step"), "%s: refused before step 1" % args)
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
    # Permission bits do not tell (root may "write" /proc): the check makes a probe directory.
    if os.path.isdir("/proc") and os.geteuid() == 0:
        expect_error(run(["--steps", "2", "--flight-recorder-dir", "/proc/fsdp_fr"], 2, opts), 2,
                     "flight recorder", "cannot be created in '/proc'")
    expect_error(run(["--steps", "2", "--config", tmp], 1, opts), 2, "--config", "is a directory")
    expect_error(run(["--steps", "2", "--config", os.path.join(tmp, "none.toml")], 1, opts), 2,
                 "--config", "does not exist")
    # Sizes from flags are checked against memory before anything of that size is allocated (it
    # used to end in a 34 GB alloc_cpu failure and a backtrace).
    expect_error(run(["--steps", "1", "--n-embd", "1048576", "--n-head", "1"], 2, opts), 2,
                 "needs at least", "this machine's memory")
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
        # Output on the full disk: one warning naming the file and errno each, no half-written
        # file, training to the end (exit 0).
        os.remove(os.path.join(mnt, "fill"))
        m = os.path.join(mnt, "m.jsonl")
        with open(os.path.join(mnt, "fill"), "wb") as f:  # leave less than a run's metrics
            try:
                while os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize > 12288:
                    f.write(b"\0" * 4096)
                    f.flush()
            except OSError:
                pass
        p = run(["--steps", "30", "--metrics", m, "--trace", os.path.join(mnt, "t.json"),
                 "--flight-recorder-dir", os.path.join(tmp, "fr-full")], 2, opts)
        out = p.stdout + p.stderr
        check(p.returncode == 0 and "step 30/30" in p.stdout, "a full disk under --metrics: trained to the end")
        check(out.count("--metrics '%s'" % m) == 1 and "No space left on device" in out,
              "the metrics failure said once, with errno: %r" % out[-600:])
        check("--trace '%s' could not be written" % os.path.join(mnt, "t.json") in out and
              not os.path.exists(os.path.join(mnt, "t.json")), "the trace failure said, no file left")
        with open(m) as f:
            lines = f.read().splitlines()
        whole = True
        for line in lines:
            try:
                json.loads(line)
            except ValueError:
                whole = False
        check(lines and whole, "the metrics file ends after its last whole event (%d lines, no half-written one)" %
              len(lines))
        # --on-output-error stop: the same full disk stops every rank after the step whose metrics
        # failed, exit 1, one line from rank 0 (after the warning naming the file and errno).
        for n in (2, 4):
            os.remove(m)
            trace = os.path.join(tmp, "stop-%d.json" % n)
            p = run(["--steps", "30", "--metrics", m, "--on-output-error", "stop", "--trace", trace,
                     "--flight-recorder-dir", os.path.join(tmp, "fr-full")], n, opts)
            check(not os.path.exists(trace), "N=%d a run stopped early leaves no trace file" % n)
            out = p.stdout + p.stderr
            stop = re.findall(r"fsdp-train: error: the output of rank 0 could not be written .*stopped after step (\d+)",
                              out)
            check(p.returncode == 1 and len(stop) == 1 and out.count("fsdp-train: error") == 1 and
                  "step 30/30" not in p.stdout and "No space left on device" in out and
                  "the run stops after this step" in out and "MPI_ABORT" not in out and "frame #" not in out,
                  "N=%d --on-output-error stop on a full disk: exit %d, stopped after step %s" %
                  (n, p.returncode, stop))
    finally:
        subprocess.run(["umount", mnt])


def test_all(opts, tmp):
    test_flags(opts, tmp)
    test_rank_settings(opts, tmp)
    test_budget_on_some_ranks(opts, tmp)
    test_token_cache(opts, tmp)
    test_disk_full(opts, tmp)


def main():
    return run_main({"inputs": test_all}, "fsdp-train-inputs-")


if __name__ == "__main__":
    sys.exit(main())
