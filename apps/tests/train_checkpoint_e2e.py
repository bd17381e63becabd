#!/usr/bin/env python3
"""Checkpoints of fsdp-train end to end, run by ctest (apps/CMakeLists.txt, fsdp_train_resume)
under mpirun.

  train_checkpoint_e2e.py --bin build/bin/fsdp-train --data-dir ./data
      Checkpoint / resume / export / import of fsdp-train:
      * a 6-step run at N=2 saving every step with --keep 4 (checks that exactly step-3..6 remain)
        and exporting; a run resumed at N=2 from step 3 repeats the losses of steps 4-6 bit for bit;
        a run resumed at N=1 from the same checkpoint matches them within 1e-5 relative;
      * --resume auto starts afresh on an empty --save and continues from its latest checkpoint
        once there is one, bit for bit;
      * fp16: the loss scale and the losses after a resume are bit for bit those of the run;
      * --import of the exported file reproduces the exported weights (torch.load, when torch is
        importable);
      * --import-optimizer: the AdamW state of a checkpoint, written as libtorch's
        torch::save(optimizer, path) archive of a plain run (with torch), imported with the
        exported weights, trains the losses of a resume from that checkpoint whose progress was
        reset to step 0 bit for bit (and unlike --import alone);
      * a missing --resume path, a checkpoint of another model, an --import file of another model,
        a missing or wrong --import-optimizer file and an unusable --save directory fail with a
        clear error and a non-zero exit, and train no step.

Exit 0: pass; 77: skipped (no data / no mpirun); anything else: fail.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import (check, error_line, events, launch, losses, max_rel, run_main,  # noqa: E402
                        single_rank_cases_ran_under_mpirun, write_manifest)


def read_sharded_tensor(ckpt, manifest, name):
    """The full tensor `name` of a sharded checkpoint (docs/checkpoints.md: shard file, manifest)."""
    import torch
    e = manifest["tensors"][name]
    assert e["dtype"] == "float32", e["dtype"]
    files = {f["rank"]: os.path.join(ckpt, f["path"]) for f in manifest["files"]}
    rows = []
    for sh in sorted(e["shards"], key=lambda sh: sh["row_begin"]):
        with open(files[sh["rank"]], "rb") as f:
            f.seek(sh["offset"])
            data = bytearray(f.read(sh["rows"] * e["row_numel"] * 4))
        rows.append(torch.frombuffer(data, dtype=torch.float32).reshape(sh["rows"], e["row_numel"]))
    return torch.cat(rows).reshape(e["shape"])


def write_libtorch_adamw(path, groups, state):
    """Writes what libtorch's torch::save(optimizer, path) writes for a torch::optim::AdamW (the
    layout of torch/optim/serialize.h): groups = [(param keys, options)], state = key -> (step,
    exp_avg, exp_avg_sq). Like libtorch's OutputArchive, each archive is a bare TorchScript module
    whose entries are attributes (a scripted nn.Module would add a 'training' entry)."""
    import torch
    cu = torch._C.CompilationUnit()
    T = torch._C

    def node(entries):
        m = T.ScriptModule("__torch__.Module", cu, True)
        for k, v in entries.items():
            if isinstance(v, T.ScriptModule):
                typ = v._type()
            elif isinstance(v, torch.Tensor):
                typ = T.TensorType.get()
            elif isinstance(v, bool):
                typ = T.BoolType.get()
            elif isinstance(v, int):
                typ = T.IntType.get()
            elif isinstance(v, float):
                typ = T.FloatType.get()
            elif isinstance(v, str):
                typ = T.StringType.get()
            elif isinstance(v, tuple):
                typ = T.TupleType([T.FloatType.get()] * len(v))
            else:
                raise TypeError("%s: %r" % (k, v))
            m._register_attribute(k, typ, v)
        return m

    pg = {"param_groups/size": torch.tensor(len(groups))}
    for i, (keys, o) in enumerate(groups):
        g = {"params/size": torch.tensor(len(keys))}
        g.update({"params/%d" % j: k for j, k in enumerate(keys)})
        g["options"] = node(o)
        pg["param_groups/%d" % i] = node(g)
    st = {k: node({"step": int(step), "exp_avg": m, "exp_avg_sq": v})
          for k, (step, m, v) in state.items()}
    root = node({"pytorch_version": "1.5.0", "state": node(st), "param_groups": node(pg)})
    root.save(path)


def checkpoint_as_plain_run(ckpt, weights_out, optimizer_out):
    """A plain run's files from a sharded checkpoint of fsdp-train: its weights (torch.save of a
    dict) and its AdamW (a libtorch archive) with fsdp-train's param groups, decay then no-decay,
    each in the model's named_parameters() order."""
    import torch
    with open(os.path.join(ckpt, "manifest.json")) as f:
        man = json.load(f)
    names = [p["name"] for p in man["params"]]  # unit by unit: the root unit's params first
    module_order = [n for n in names if not n.startswith("ln_f.")] + \
                   [n for n in names if n.startswith("ln_f.")]  # GPT: wte, wpe, h.*, ln_f
    torch.save({n: read_sharded_tensor(ckpt, man, "model/" + n) for n in names}, weights_out)
    shapes = {p["name"]: p["shape"] for p in man["params"]}
    decay = [n for n in module_order
             if len(shapes[n]) >= 2 and not n.startswith(("wte.", "wpe."))]
    no_decay = [n for n in module_order if n not in decay]
    key = {n: str(1000 + i) for i, n in enumerate(module_order)}  # any distinct keys
    opt = man["optimizer"]
    groups = []
    for members in (decay, no_decay):
        saved = [g for g in opt["groups"] if sorted(g["members"]) == sorted(members)]
        assert len(saved) == 1, "group not in the checkpoint"
        o = {k: v["value"] for k, v in saved[0]["options"].items()}
        groups.append(([key[n] for n in members],
                       {"lr": o["lr"], "betas": (o["beta1"], o["beta2"]), "eps": o["eps"],
                        "weight_decay": o["weight_decay"], "amsgrad": bool(o["amsgrad"])}))
    state = {key[n]: (opt["state"][n]["step"],
                      read_sharded_tensor(ckpt, man, "optim/%s/exp_avg" % n),
                      read_sharded_tensor(ckpt, man, "optim/%s/exp_avg_sq" % n))
             for n in names}
    write_libtorch_adamw(optimizer_out, groups, state)


def test_import_optimizer(opts, tmp, ck, full_pt):
    """--import-optimizer against --resume: both start from step 3's weights and AdamW state with a
    fresh schedule and data order (the resumed checkpoint's progress reset to 0)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("  (torch not importable: --import-optimizer parity skipped)")
        return
    src = os.path.join(ck, "step-000000003")
    reset = os.path.join(tmp, "reset-step-3")
    shutil.copytree(src, reset)
    with open(os.path.join(reset, "manifest.json")) as f:
        man = json.load(f)
    for k in ("step", "lr_step", "sampler_pos"):
        man["train_state"]["ints"][k] = 0
    man["train_state"]["ints"]["optimizer_step_offset"] = 3  # AdamW's 3 steps came before step 0
    write_manifest(os.path.join(reset, "manifest.json"), man)
    w3, o3 = os.path.join(tmp, "w3.pt"), os.path.join(tmp, "adamw3.pt")
    checkpoint_as_plain_run(src, w3, o3)
    m_r, m_p, m_w = (os.path.join(tmp, x) for x in ("ro.jsonl", "po.jsonl", "wo.jsonl"))
    launch(["--steps", "3", "--resume", reset, "--metrics", m_r], 2, opts)
    ck_p = os.path.join(tmp, "ck-imported")
    launch(["--steps", "3", "--import", w3, "--import-optimizer", o3, "--metrics", m_p, "--save", ck_p], 2, opts)
    # Its checkpoint (optimizer steps 6 at step 3: 3 of them imported) resumes.
    launch(["--steps", "4", "--resume", ck_p, "--metrics", os.path.join(tmp, "po2.jsonl")], 2, opts)
    launch(["--steps", "3", "--import", w3, "--metrics", m_w], 2, opts)
    r, p, w = losses(m_r), losses(m_p), losses(m_w)
    check(sorted(p) == [1, 2, 3] and all(p[s] == r[s] for s in (1, 2, 3)),
          "--import + --import-optimizer of a plain run's AdamW: losses of steps 1-3 bit for bit "
          "those of the resumed state %s" % [(p.get(s), r[s]) for s in (1, 2, 3)])
    check(p[1] == w[1] and p[2] != w[2], "--import alone restarts Adam (step 2: %r vs %r)" % (w[2], p[2]))
    m_e = os.path.join(tmp, "eo.jsonl")
    bad = launch(["--steps", "1", "--import", w3, "--import-optimizer", w3, "--metrics", m_e], 1,
                 opts, expect_ok=False)
    check(bad.returncode == 1 and "--import-optimizer" in error_line(bad) and
          "not a libtorch archive" in error_line(bad) and not events(m_e, "step"),
          "a weights file as --import-optimizer: exit %d, %r" % (bad.returncode, error_line(bad)))


def test_resume(opts, tmp):
    ck = os.path.join(tmp, "ck")
    full_pt = os.path.join(tmp, "full.pt")
    m_a = os.path.join(tmp, "a.jsonl")
    launch(["--steps", "6", "--save", ck, "--save-every", "1", "--keep", "4", "--export", full_pt,
            "--metrics", m_a], 2, opts)
    a = losses(m_a)
    check(sorted(a) == [1, 2, 3, 4, 5, 6], "uninterrupted run has steps 1-6")
    saves = events(m_a, "checkpoint")
    check([e["step"] for e in saves] == [1, 2, 3, 4, 5, 6], "one checkpoint event per step")
    print("  save_s: " + ", ".join("%.3f" % e["save_s"] for e in saves))
    kept = sorted(d for d in os.listdir(ck) if d.startswith("step-"))
    check(kept == ["step-%09d" % s for s in (3, 4, 5, 6)], "--keep 4 leaves step 3-6: %s" % kept)
    cfg = events(m_a, "config")[0]
    check(cfg["save"] == ck and cfg["save_every"] == 1 and cfg["keep"] == 4 and
          cfg["export"] == full_pt and cfg["forward_prefetch"] is True, "config line records settings")
    check(os.path.isfile(full_pt) and events(m_a, "export"), "export written")

    m_b = os.path.join(tmp, "b.jsonl")
    launch(["--steps", "6", "--resume", os.path.join(ck, "step-000000003"), "--metrics", m_b],
           2, opts)
    b = losses(m_b)
    cfg_b = events(m_b, "config")[0]
    check(sorted(b) == [4, 5, 6] and cfg_b["start_step"] == 3,
          "resumed run trains steps 4-6 (load %.3f s)" % cfg_b["load_s"])
    diff = [(s, a[s], b[s]) for s in (4, 5, 6) if a[s] != b[s]]
    check(not diff, "N=2 -> N=2 resume: losses of steps 4-6 bit for bit %s" % (diff or ""))

    m_c = os.path.join(tmp, "c.jsonl")
    launch(["--steps", "6", "--resume", os.path.join(ck, "step-000000003"), "--metrics", m_c],
           1, opts)
    c = losses(m_c)
    rel = max_rel(a, c, (4, 5, 6))
    check(sorted(c) == [4, 5, 6] and rel <= 1e-5,
          "N=2 -> N=1 resume: max rel diff %.3g <= 1e-5 (%d of 3 bit-equal)" %
          (rel, sum(a[s] == c[s] for s in (4, 5, 6))))

    # --resume latest (the latest in --save): the run is complete, nothing left to train.
    m_l = os.path.join(tmp, "l.jsonl")
    launch(["--steps", "6", "--save", ck, "--resume", "latest", "--metrics", m_l], 1, opts)
    check(events(m_l, "config")[0]["start_step"] == 6 and not events(m_l, "step"),
          "--resume latest picks step 6")

    # --resume auto: a fresh start while --save holds no checkpoint, the latest once it does.
    ck_auto = os.path.join(tmp, "ck_auto")
    m_x = os.path.join(tmp, "x.jsonl")
    launch(["--steps", "6", "--save", ck_auto, "--save-every", "3", "--resume", "auto", "--metrics", m_x], 2, opts)
    x = losses(m_x)
    check(events(m_x, "config")[0]["start_step"] == 0 and x == a,
          "--resume auto without a checkpoint starts afresh (steps 1-6 as run a)")
    shutil.rmtree(os.path.join(ck_auto, "step-000000006"))  # as if the job had died after step 3's save
    os.remove(os.path.join(ck_auto, "latest"))
    m_y = os.path.join(tmp, "y.jsonl")
    launch(["--steps", "6", "--save", ck_auto, "--resume", "auto", "--metrics", m_y], 2, opts)
    y = losses(m_y)
    check(events(m_y, "config")[0]["start_step"] == 3 and sorted(y) == [4, 5, 6] and
          all(y[s] == a[s] for s in (4, 5, 6)), "--resume auto continues from step 3, bit for bit: %s" % y)

    if single_rank_cases_ran_under_mpirun():
        print("  (the one-rank cases of fp16, --import and bad input: run by the mpirun variant)")
    else:
        test_single_rank_cases(opts, tmp, ck, full_pt)
    test_import_optimizer(opts, tmp, ck, full_pt)


def test_single_rank_cases(opts, tmp, ck, full_pt):
    # fp16: the GradScaler state travels with the checkpoint.
    ck16 = os.path.join(tmp, "ck16")
    m_f = os.path.join(tmp, "f.jsonl")
    m_g = os.path.join(tmp, "g.jsonl")
    fp16 = ["--mixed-precision", "fp16", "--steps", "4"]
    launch(fp16 + ["--save", ck16, "--save-every", "2", "--metrics", m_f], 1, opts)
    launch(fp16 + ["--resume", ck16 + "/step-000000002", "--metrics", m_g], 1, opts)
    f = {e["step"]: (e["loss"], e["loss_scale"]) for e in events(m_f, "step")}
    g = {e["step"]: (e["loss"], e["loss_scale"]) for e in events(m_g, "step")}
    check(all(f[s] == g[s] for s in (3, 4)), "fp16 resume: loss and loss_scale of steps 3-4 bit "
          "for bit %s" % [(f[s], g[s]) for s in (3, 4)])

    # --import: the exported weights are loaded (a 1-step run at lr ~0 re-exports them).
    re_pt = os.path.join(tmp, "re.pt")
    m_i = os.path.join(tmp, "i.jsonl")
    launch(["--steps", "1", "--lr", "1e-30", "--min-lr", "0", "--import", full_pt, "--export",
            re_pt, "--metrics", m_i], 1, opts)
    check(events(m_i, "config")[0]["import"] == full_pt, "import recorded")
    try:
        import torch
    except ImportError:
        print("  (torch not importable: export/import content check skipped)")
    else:
        x = torch.load(full_pt, weights_only=True)
        y = torch.load(re_pt, weights_only=True)
        worst = max((x[k] - y[k]).abs().max().item() for k in x)
        check(sorted(x) == sorted(y) and "wte.weight" in x and worst < 1e-6,
              "torch.load of the export: %d tensors; import + 1 step at lr 1e-30 re-exports them "
              "(max abs diff %.3g)" % (len(x), worst))

    # Bad input: a clear error and a non-zero exit, never a silent fresh start.
    m_e = os.path.join(tmp, "e.jsonl")
    p = launch(["--steps", "6", "--resume", os.path.join(tmp, "nope"), "--metrics", m_e], 1, opts,
               expect_ok=False)
    check(p.returncode == 2 and error_line(p).count("nope") == 1 and "no such directory" in error_line(p) and
          not events(m_e, "step"), "missing --resume dir, named once: exit %d, %r" % (p.returncode, error_line(p)))
    p = launch(["--steps", "6", "--n-embd", "32", "--resume", ck, "--metrics", m_e], 1, opts,
               expect_ok=False)
    check(p.returncode != 0 and "another model" in error_line(p) and not events(m_e, "step"),
          "wrong model: exit %d, %r" % (p.returncode, error_line(p)))
    p = launch(["--steps", "6", "--save", os.path.join(full_pt, "ck"), "--metrics", m_e], 1, opts,
               expect_ok=False)
    check(p.returncode == 2 and "--save" in error_line(p) and not events(m_e, "step"),
          "unusable --save dir rejected before training: exit %d, %r" %
          (p.returncode, error_line(p)))
    p = launch(["--steps", "1", "--n-embd", "32", "--import", full_pt], 1, opts, expect_ok=False)
    check(p.returncode != 0 and "--import" in error_line(p),
          "wrong model for --import: exit %d, %r" % (p.returncode, error_line(p)))
    missing = os.path.join(tmp, "no-optimizer.pt")
    p = launch(["--steps", "1", "--import", full_pt, "--import-optimizer", missing, "--metrics", m_e],
               1, opts, expect_ok=False)
    check(p.returncode == 1 and "no-optimizer.pt" in error_line(p) and not events(m_e, "step"),
          "missing --import-optimizer file: exit %d, %r" % (p.returncode, error_line(p)))
    p = launch(["--steps", "1", "--import-optimizer", missing], 1, opts, expect_ok=False)
    usage = error_line(p)  # one line: "fsdp-train: error: --import-optimizer: ... needs --import"
    check(p.returncode == 2 and "--import-optimizer" in usage and "needs --import" in usage,
          "--import-optimizer without --import: exit %d, %r" % (p.returncode, usage))


def main():
    return run_main({"resume": test_resume}, "fsdp-train-checkpoint-e2e-")


if __name__ == "__main__":
    sys.exit(main())
