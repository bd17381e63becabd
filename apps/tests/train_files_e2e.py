#!/usr/bin/env python3
"""Bad checkpoints and imported files given to fsdp-train, run by ctest (apps/CMakeLists.txt, test
fsdp_train_files) under mpirun; like train_inputs.py, every failure is one line, no MPI_ABORT
banner, no backtrace.

  train_files_e2e.py --bin build/bin/fsdp-train --data-dir ./data

  * a NaN loss injected on rank 1 at step 2 (FSDP_TRAIN_INJECT_NONFINITE): exit 1 naming step 2
    and rank 1, checkpoint of step 1 only; --on-nonfinite skip trains on;
  * edited manifests (chunk_rows -1 and 0), edited counters (step -3, lr_step), the optimizer's
    options and a counter edited by hand (refused by the manifest's seal), another
    --global-batch-size or --beta1 / --beta2 / --weight-decay than the checkpoint's (refused, naming
    both values), and a damaged newest checkpoint when resuming its directory (refused, naming the
    older one);
  * --import of torch.save(model.state_dict()) with a "module." prefix (an OrderedDict with
    _metadata) loads the weights exactly; a .npz, random bytes, a dict of non-tensors, a flipped
    byte inside a tensor record (its CRC-32) and a file saved without CRCs are refused in one line;
    a sharded checkpoint directory, a Hugging Face directory and a .safetensors file are refused
    naming --resume / --init-from-hf;
  * a run interrupted once it has saved a checkpoint (SIGINT to a process started by hand, exit
    130; SIGINT to mpirun, which stops its ranks with SIGTERM) says in one line the step it was in,
    the newest checkpoint and the --resume that continues it; interrupted before its first save,
    that no checkpoint was written; its checkpoint resumed with another --n-head (the same shapes)
    is refused naming both head counts;
  * ranks given another run's checkpoint (same name and sequence) under --resume, or another
    file under --import, at the same path: refused before step 1.
Exit 0: pass; 77: skipped (no data / no mpirun); anything else: fail.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (TINY, as_the_ranks_ended, check, events, expect_error, launch_prefix, launcher,  # noqa: E402
                        mpmd_command, mpirun_default_teardown, run, run_main, write_manifest)


def edit_manifest(ckpt_dir, fn, seal=True):
    """Edits manifest.json with fn, sealed again as a save does (train_e2e.write_manifest), or,
    with seal=False, as a hand edit leaves it: the old seal in front of the new body."""
    path = os.path.join(ckpt_dir, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    old = m.pop("manifest_crc32")
    fn(m)
    if seal:
        write_manifest(path, m)
    else:
        with open(path, "w") as f:
            f.write('{"manifest_crc32": "%s",' % old + json.dumps(m, indent=1)[1:])


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
    # The same fields edited by hand (not sealed again), the optimizer's options included: the
    # manifest's seal refuses them before any is used (they used to resume with other losses).
    for what, fn in (("beta1", lambda j: j["optimizer"]["groups"][0]["options"]["beta1"].update(
                         value=0.5, bits="0x3fe0000000000000")),
                     ("weight_decay", lambda j: j["optimizer"]["groups"][0]["options"]["weight_decay"].update(
                         value=0.0, bits="0x0")),
                     ("lr_step", lambda j: j["train_state"]["ints"].update(lr_step=5))):
        shutil.rmtree(step1)
        shutil.copytree(step1 + ".orig", step1)
        edit_manifest(step1, fn, seal=False)
        expect_error(run(["--steps", "3", "--resume", step1], 2, opts), 1, "--resume",
                     "manifest.json' does not match its seal")
    shutil.rmtree(step1)
    shutil.copytree(step1 + ".orig", step1)
    expect_error(run(["--steps", "3", "--resume", step1, "--global-batch-size", "8"], 2, opts), 2,
                 "says --global-batch-size 4", "this run has 8")
    # A resumed AdamW keeps the options it was saved with: a flag that differs is refused, never
    # ignored (it used to train bit-identically to a resume without it).
    for flag, value, saved in (("--beta1", "0.5", "0.9"), ("--beta2", "0.9", "0.95"), ("--weight-decay", "0.01", "0.1")):
        expect_error(run(["--steps", "3", "--resume", step1, flag, value], 2, opts), 2,
                     "says %s %s" % (flag, saved), "this run has %s" % value)

    # The newest checkpoint's shard file is damaged (its manifest intact): --resume auto refuses,
    # names what the user asked, and the older checkpoint that could be named instead.
    ck3 = os.path.join(tmp, "ck3")
    shutil.copytree(ck2, ck3)
    shard = os.path.join(ck3, "step-000000003", "rank-00000-of-00002.bin")
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    expect_error(run(["--steps", "4", "--save", ck3, "--resume", "auto"], 2, opts), 1, "--resume auto",
                 "checksum mismatch", "name it explicitly, e.g. '%s'" % os.path.join(ck3, "step-000000002"))
    # Its manifest gone as well, and no `latest`: refused as damage, never skipped for step 2.
    os.remove(os.path.join(ck3, "step-000000003", "manifest.json"))
    os.remove(os.path.join(ck3, "latest"))
    expect_error(run(["--steps", "4", "--save", ck3, "--resume", "auto"], 2, opts), 1, "step-000000003",
                 "shard files but no manifest.json", "name it explicitly, e.g. '%s'" % os.path.join(ck3, "step-000000002"))

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
    # A flipped byte inside a tensor's record: refused by the record's CRC-32 (it used to load).
    import zipfile
    flipped = os.path.join(tmp, "flipped.pt")
    shutil.copy(wrapped, flipped)
    with zipfile.ZipFile(flipped) as z:
        rec = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(flipped, "r+b") as f:
        f.seek(rec.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
        at = rec.header_offset + 30 + name_len + extra_len + rec.file_size // 2
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x04]))
    cases = [(npz, "not a torch.save file"), (junk, "not a zip archive"),
             (other, "dict entry: expected str -> tensor"), (flipped, "does not match its CRC-32")]
    if hasattr(torch.serialization, "set_crc32_options"):  # a file without CRCs is refused, not trusted
        no_crc = os.path.join(tmp, "no_crc.pt")
        torch.serialization.set_crc32_options(False)
        try:
            torch.save(od, no_crc)
        finally:
            torch.serialization.set_crc32_options(True)
        cases.append((no_crc, "carries no CRC-32"))
    for path, needle in cases:
        expect_error(run(["--steps", "1", "--import", path], 2, opts), 1, "--import", needle)
    # Weights of another kind: the flag that reads them.
    ck = os.path.join(tmp, "ck")  # test_nonfinite_and_resume's sharded checkpoints
    hf = os.path.join(tmp, "hf-like")
    os.makedirs(hf)
    for name in ("config.json", "model.safetensors"):
        open(os.path.join(hf, name), "w").close()
    for path, needle in ((ck, "this is a sharded checkpoint, continue it with --resume " + ck),
                         (hf, "this is a Hugging Face model, start from it with --init-from-hf " + hf),
                         (os.path.join(hf, "model.safetensors"),
                          "is a safetensors file; --import reads one file written by --export or torch.save: start "
                          "from a Hugging Face model with --init-from-hf " + hf)):
        expect_error(run(["--steps", "1", "--import", path], 2, opts), 2, "--import", needle)


def interrupt(opts, tmp, tag, n, wait_for_checkpoint):
    """Starts a long run (n = 1: the process itself, no launcher), sends SIGINT once its step-2
    checkpoint is out (or, without, once it trains), and returns (exit code, output, the newest
    checkpoint's path or None)."""
    ck, m = os.path.join(tmp, tag), os.path.join(tmp, tag + ".jsonl")
    argv = [opts.bin, "--data-dir", opts.data_dir] + TINY + ["--steps", "100000", "--metrics", m]
    argv += ["--save", ck, "--save-every", "2"] if wait_for_checkpoint else []
    cmd = (launch_prefix(n) if n > 1 else []) + argv
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=mpirun_default_teardown(dict(os.environ, OMP_NUM_THREADS="1")))
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:
        try:  # the file may end in a line being written
            if events(m, "checkpoint" if wait_for_checkpoint else "step"):
                break
        except ValueError:
            pass
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out = p.communicate(timeout=60)[0]
    saved = [e["path"] for e in events(m, "checkpoint")]
    print("  %s n=%d rc=%d" % (tag, n, p.returncode), flush=True)
    return p.returncode, out, saved[-1] if saved else None


def test_interrupt(opts, tmp):
    rc, out, newest = interrupt(opts, tmp, "sigint", 1, True)
    lines = [l for l in out.splitlines() if re.match(r"fsdp-train: interrupted by SIGINT (during step|while saving the "
                                                     r"checkpoint of step) \d+ of 100000( \(left incomplete, unused\))?; ", l)]
    check(rc == 130 and newest and len(lines) == 1 and
          ("; the newest checkpoint is %s: to continue, run the same command with --resume %s (or --resume latest)" %
           (newest, newest)) in lines[0] and "Traceback" not in out and "MPI_ABORT" not in out,
          "SIGINT to a process: exit %d, one line naming the step and %s: %r" % (rc, newest, lines or out[-300:]))
    # The same shapes, another head count: refused, naming both (and no fixed-point formatting).
    expect_error(run(["--steps", "100000", "--resume", newest, "--n-head", "8"], 2, opts), 2,
                 "the checkpoint's model has n_head 4, this run's 8")
    if launcher() == "mpirun":
        rc, out, newest = interrupt(opts, tmp, "mpirun", 2, True)
        lines = [l for l in out.splitlines() if re.match(r"fsdp-train: (stopped by SIGTERM|interrupted by SIGINT) "
                                                         r"(during step|while saving the checkpoint of step) \d+ ", l)]
        check(rc != 0 and newest and len(lines) == 1 and ("the newest checkpoint is %s" % newest) in lines[0],
              "SIGINT to mpirun: exit %d, rank 0's one line naming %s: %r" % (rc, newest, lines or out[-300:]))
    rc, out, newest = interrupt(opts, tmp, "nosave", 1, False)
    check(rc == 130 and newest is None and
          "; no checkpoint was written (--save DIR --save-every K would let a run continue)" in out,
          "SIGINT to a run without --save: exit %d: %r" % (rc, out[-300:]))


def test_other_contents_at_one_path(opts, tmp):
    """Ranks that see different files at the same path (hosts with disks of their own): another
    run's checkpoint of the same name and sequence under --resume, another file under --import.
    Refused before step 1, naming the ranks, not trained to the end."""
    for seed in ("1", "2"):
        host = os.path.join(tmp, "host-" + seed)
        os.makedirs(host)
        p = run(["--steps", "1", "--seed", seed, "--save", os.path.join(host, "ck"), "--export",
                 os.path.join(host, "w.pt")], 2, opts)
        check(p.returncode == 0, "seed %s: a checkpoint and an export" % seed)
    for args, needle in ((["--resume", "ck/step-000000001"], "ranks resolved different checkpoints"),
                         (["--import", "w.pt"], "the ranks read different files at this path: rank(s) 1")):
        side = [os.path.abspath(opts.bin), "--data-dir", os.path.abspath(opts.data_dir)] + TINY + ["--steps", "2"] + args
        cmd = mpmd_command([(1, side, os.path.join(tmp, "host-1")), (1, side, os.path.join(tmp, "host-2"))])
        p = as_the_ranks_ended(subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                              env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120))
        line = next((l for l in p.stderr.splitlines() if "fsdp-train: error:" in l), "")
        check(p.returncode != 0 and needle in line and "step 1/" not in p.stdout,
              "%s: other contents at one path: exit %d, %r" % (args, p.returncode, line[-300:] or p.stderr[-600:]))


def test_all(opts, tmp):
    test_interrupt(opts, tmp)
    full = test_nonfinite_and_resume(opts, tmp)
    test_import(opts, tmp, full)
    test_other_contents_at_one_path(opts, tmp)


def main():
    return run_main({"files": test_all}, "fsdp-train-files-")


if __name__ == "__main__":
    sys.exit(main())
