#!/usr/bin/env python3
"""Multi-host tests of fsdp-cpp on test hosts of this machine (scripts/hosts.sh), run by ctest.

  multi_host_e2e.py --bin build/bin/fsdp-train --mpi-tests build/bin/fsdp_mpi_tests \
      --data-dir ./data --hosts scripts/hosts.sh

Two hosts (network namespaces with their own address and host name, joined by a bridge), two
ranks each: shared memory inside a host, TCP between hosts (docs/multi_host.md).
  * every collective (closed form, bf16/fp16 included) across the hosts, and MPI's host layout
    (ranks 0,1 on host 0, ranks 2,3 on host 1);
  * fsdp-train full_shard, no_shard and hybrid_shard (--hybrid-shard-group-size host): the losses
    of 6 steps equal those of the same run on one host (4 ranks, shared memory) within 1e-5
    relative; the host split of the metrics: hybrid_shard's all-gathers and reduce-scatters stay
    inside a host, its all-reduce crosses; full_shard's all-gathers cross;
  * the bytes that really crossed the hosts' links (interface counters) for 4 steps against the
    formula of the metrics (inter_host_bytes of the ranks of a host);
  * a sharded checkpoint written on 2 hosts resumes on 1 host (2 ranks), and one written on 1 host
    (4 ranks) resumes on 2 hosts, within 1e-5 relative of the uninterrupted runs;
  * hybrid_shard with one shard group per host and 3 + 1 ranks per host is rejected (exit 2) with
    the layout in the message.

Exit 0: pass; 77: skipped (not root, no network namespaces, no mpirun, no data); else: fail.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_common import events, losses, max_rel  # noqa: E402

TINY = ["--model", "nano", "--n-layer", "2", "--n-embd", "64", "--global-batch-size", "4",
        "--seq-len", "32", "--eval-every", "0", "--eval-batches", "1", "--progress", "lines",
        "--warmup-steps", "2"]
PREFIX = "fsdpt"  # host names of this test: fsdpt0, fsdpt1 (manual runs use hosts.sh's default)


def check(cond, msg):
    if not cond:
        raise SystemExit("FAIL: " + msg)
    print("  ok: " + msg, flush=True)


class Hosts:
    def __init__(self, script, tmp):
        self.script = script
        self.env = dict(os.environ, FSDP_HOSTS_PREFIX=PREFIX,
                        FSDP_HOSTS_DIR=os.path.join(tmp, "hosts"), OMP_NUM_THREADS="1")
        self.dir = self.env["FSDP_HOSTS_DIR"]

    def run(self, *args):
        return subprocess.run(["bash", self.script] + list(args), env=self.env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)

    def up(self, k):
        p = self.run("up", str(k))
        if p.returncode != 0:
            raise SystemExit("FAIL: hosts.sh up %d: %s" % (k, p.stdout))
        with open(os.path.join(self.dir, "mpirun_args")) as f:
            self.mpirun_args = f.read().split()

    def down(self):
        self.run("down")

    def counters(self):
        """{host: (rx_bytes, tx_bytes)} of each host's link."""
        p = self.run("counters")
        out = {}
        for line in p.stdout.split("\n"):
            if line.strip():
                h, rx, tx = line.split()
                out[h] = (int(rx), int(tx))
        return out

    def mpirun(self, placement, cmd, expect_ok=True, what=""):
        """mpirun from inside host 0; placement: mpirun options that place the ranks."""
        full = ["bash", self.script, "exec", PREFIX + "0", "mpirun", "--allow-run-as-root",
                "--bind-to", "none", "-x", "OMP_NUM_THREADS"] + self.mpirun_args + placement + cmd
        return run(full, self.env, expect_ok, what)


def run(cmd, env, expect_ok, what):
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       timeout=300)
    if expect_ok and p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        raise SystemExit("FAIL: exit %d: %s" % (p.returncode, " ".join(cmd)))
    print("  %.1fs rc=%d: %s" % (time.time() - t0, p.returncode, what or " ".join(cmd[-6:])),
          flush=True)
    return p


def one_host(n, cmd, env, what):
    """n ranks on this machine outside the test hosts: one host, shared memory only."""
    return run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n",
                str(n), "-x", "OMP_NUM_THREADS"] + cmd, env, True, what)


def test_collectives(opts, hosts):
    hosts.mpirun(["-npernode", "2"], [opts.mpi_tests, "--gtest_filter=MpiCollectives.*:MpiHosts.*"],
                 what="fsdp_mpi_tests MpiCollectives.* MpiHosts.* on 2 hosts x 2 ranks")
    check(True, "every collective (closed form) and the host layout across 2 hosts x 2 ranks")


def train_cmd(opts, extra):
    return [opts.bin, "--data-dir", opts.data_dir] + TINY + extra


def test_training(opts, hosts, tmp):
    env = hosts.env
    runs = {}
    qgz = ["--reduce-scatter-codec", "int8"]
    for label, ref_extra, hosts_extra in (
            ("full_shard", [], []),
            ("no_shard", [], []),
            ("hybrid_shard", ["--hybrid-shard-group-size", "2"],
             ["--hybrid-shard-group-size", "host"]),
            # Host-aware collectives over pairs of ranks do the same arithmetic on one host.
            ("full_shard+host+qgz", ["--host-aware-collectives", "2"] + qgz,
             ["--host-aware-collectives", "host"] + qgz)):
        strategy = label.split("+")[0]
        m1 = os.path.join(tmp, "%s-1host.jsonl" % label)
        m2 = os.path.join(tmp, "%s-2hosts.jsonl" % label)
        save1 = ["--save", os.path.join(tmp, "ck-1host"), "--save-every", "3"] \
            if label == "full_shard" else []
        save2 = ["--save", os.path.join(tmp, "ck-2hosts"), "--save-every", "3"] \
            if label == "full_shard" else []
        base = ["--steps", "6", "--strategy", strategy]
        one_host(4, train_cmd(opts, base + ref_extra + save1 + ["--metrics", m1]), env,
                 "%s, 1 host x 4 ranks" % label)
        c0 = hosts.counters()
        hosts.mpirun(["-npernode", "2"], train_cmd(opts, base + hosts_extra + save2 +
                                                   ["--metrics", m2]),
                     what="%s, 2 hosts x 2 ranks" % label)
        c1 = hosts.counters()
        a, b = losses(m1), losses(m2)
        check(sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6], "%s: 6 steps each" % label)
        rel = max_rel(a, b, range(1, 7))
        check(rel <= 1e-5, "%s: 2 hosts vs 1 host, max rel loss diff over 6 steps %.3g <= 1e-5 "
              "(%d of 6 bit-equal)" % (label, rel, sum(a[s] == b[s] for s in a)))
        cfg1, cfg2 = events(m1, "config")[0], events(m2, "config")[0]
        check(cfg1["num_hosts"] == 1 and cfg2["num_hosts"] == 2 and
              cfg2["host_of_ranks"] == [0, 0, 1, 1],
              "%s: config sees 1 host, then 2 hosts with ranks [0,0,1,1]" % label)
        if strategy == "hybrid_shard":
            check(cfg2["hybrid_shard_group_size"] == 2, "hybrid_shard: 'host' resolves to 2 ranks")
        if "host" in label:
            check(cfg1["collective_host_size"] == cfg2["collective_host_size"] == 2,
                  "%s: 'host' resolves to 2 ranks, as 2 on one host" % label)
        steps1 = events(m1, "step")
        steps2 = events(m2, "step")
        check(all(e["comm"]["inter_host_bytes"] == 0 for e in steps1),
              "%s: 1 host: inter_host_bytes 0 every step" % label)
        runs[label] = (steps2, c0, c1)
    # Host split of the metrics (rank 0, step 6).
    full, hyb, ddp = (runs[s][0][-1]["comm"] for s in ("full_shard", "hybrid_shard", "no_shard"))
    check(full["all_gather_inter_host_bytes"] > 0 and
          full["all_gather_inter_host_bytes"] == full["all_gather_bytes"] // 2,
          "full_shard: half the all-gather bytes come from the other host (%d of %d)" %
          (full["all_gather_inter_host_bytes"], full["all_gather_bytes"]))
    check(hyb["all_gather_inter_host_bytes"] == 0 and hyb["reduce_scatter_inter_host_bytes"] == 0
          and hyb["all_gather_bytes"] > 0 and hyb["reduce_scatter_bytes"] > 0,
          "hybrid_shard: all-gathers and reduce-scatters stay inside the host")
    check(hyb["all_reduce_inter_host_bytes"] > 0 and
          hyb["inter_host_bytes"] == hyb["all_reduce_inter_host_bytes"] and
          hyb["inter_host_bytes"] < full["inter_host_bytes"],
          "hybrid_shard crosses hosts only with its all-reduce: %d B vs full_shard %d B per step" %
          (hyb["inter_host_bytes"], full["inter_host_bytes"]))
    check(ddp["all_reduce_inter_host_bytes"] > 0, "no_shard's all-reduce crosses hosts")
    # Host-aware: the all-gathers send half of full_shard's bytes across (each byte once per host
    # pair), the reduce-scatter's host stage stays inside, its int8 stage crosses as an all-to-all of
    # one byte per element of the 2 of 4 blocks plus a 4-byte scale per block of 256 (per param:
    # more for this tiny model's 16-element bias shards): 1/8 of full_shard's fp32 reduce-scatter
    # and a little more.
    ha = runs["full_shard+host+qgz"][0][-1]["comm"]
    check(2 * ha["all_gather_inter_host_bytes"] == full["all_gather_inter_host_bytes"],
          "host-aware all-gathers: %d B across, full_shard %d B" % (ha["all_gather_inter_host_bytes"],
                                                                   full["all_gather_inter_host_bytes"]))
    ratio = ha["all_to_all_inter_host_bytes"] / full["reduce_scatter_inter_host_bytes"]
    check(ha["reduce_scatter_inter_host_bytes"] == 0 and 1 / 8 < ratio < 0.16,
          "host-aware int8 reduce-scatter: only its int8 stage crosses, %.4f of full_shard's" % ratio)
    return runs


def test_link_bytes(opts, hosts, tmp, runs):
    """Interface counters of 6-step runs minus those of 2-step runs: 4 steps of traffic per host."""
    for strategy, extra in (("full_shard", []), ("hybrid_shard", ["--hybrid-shard-group-size", "host"])):
        steps6, c0, c1 = runs[strategy]  # (the host-aware run's bytes: bench/hosts/link_traffic.py)
        m = os.path.join(tmp, "%s-2steps.jsonl" % strategy)
        d0 = hosts.counters()
        hosts.mpirun(["-npernode", "2"], train_cmd(opts, ["--steps", "2", "--strategy", strategy]
                                                   + extra + ["--metrics", m]),
                     what="%s, 2 hosts x 2 ranks, 2 steps" % strategy)
        d1 = hosts.counters()
        # What host 1 (ranks 2, 3) received per step, against rank 0's inter_host_bytes per step
        # (f; ranks are symmetric). Each byte a rank needs from the other host crosses the link
        # at least once per host (>= f) and at most once per rank (<= 2 f, pairwise exchange);
        # rings and trees fall in between. TCP/IP headers and acknowledgements add a few percent.
        h = PREFIX + "1"
        measured = ((c1[h][0] - c0[h][0]) - (d1[h][0] - d0[h][0])) / 4.0
        f = sum(e["comm"]["inter_host_bytes"] for e in steps6[2:]) / 4.0
        print("  %s: %s received %.0f B per step (interface counters); formula %.0f B per rank, "
              "measured / (2 ranks x formula) = %.2f" % (strategy, h, measured, f, measured / (2 * f)))
        check(0.95 * f <= measured <= 2 * 1.15 * f,
              "%s: link bytes per step between 1x and 2x (+15%%) the per-rank formula" % strategy)


def test_checkpoints(opts, hosts, tmp):
    env = hosts.env
    a = losses(os.path.join(tmp, "full_shard-2hosts.jsonl"))
    m = os.path.join(tmp, "resume-1host.jsonl")
    one_host(2, train_cmd(opts, ["--steps", "6", "--resume",
                                 os.path.join(tmp, "ck-2hosts", "step-000000003"),
                                 "--metrics", m]), env, "resume the 2-host checkpoint on 1 host x 2")
    b = losses(m)
    rel = max_rel(a, b, (4, 5, 6)) if sorted(b) == [4, 5, 6] else float("inf")
    check(rel <= 1e-5, "written on 2 hosts x 2, resumed on 1 host x 2: steps 4-6 max rel %.3g"
          % rel)
    a = losses(os.path.join(tmp, "full_shard-1host.jsonl"))
    m = os.path.join(tmp, "resume-2hosts.jsonl")
    hosts.mpirun(["-npernode", "2"], train_cmd(opts, [
        "--steps", "6", "--resume", os.path.join(tmp, "ck-1host", "step-000000003"),
        "--metrics", m]), what="resume the 1-host checkpoint on 2 hosts x 2")
    b = losses(m)
    rel = max_rel(a, b, (4, 5, 6)) if sorted(b) == [4, 5, 6] else float("inf")
    check(rel <= 1e-5, "written on 1 host x 4, resumed on 2 hosts x 2: steps 4-6 max rel %.3g"
          % rel)


def test_uneven(opts, hosts):
    p = hosts.mpirun(["-n", "4", "--host", "%s0:3,%s1:1" % (PREFIX, PREFIX)],
                     train_cmd(opts, ["--steps", "1", "--strategy", "hybrid_shard",
                                      "--hybrid-shard-group-size", "host"]),
                     expect_ok=False, what="hybrid_shard host, 3 + 1 ranks")
    line = next((l for l in p.stderr.splitlines() if "fsdp-train: error:" in l), "")
    check(p.returncode == 2 and "host 0: ranks 0 1 2; host 1: ranks 3" in line,
          "3 + 1 ranks per host rejected for one shard group per host: exit %d, %r" %
          (p.returncode, line[:300]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--mpi-tests", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--hosts", required=True, help="scripts/hosts.sh")
    opts = ap.parse_args()
    opts.bin, opts.mpi_tests, opts.data_dir = (os.path.abspath(p) for p in
                                              (opts.bin, opts.mpi_tests, opts.data_dir))
    if shutil.which("mpirun") is None:
        print("SKIP: no mpirun")
        return 77
    if not os.path.isfile(os.path.join(opts.data_dir, "spm_8192.model")):
        print("SKIP: no data in %s (run scripts/prepare_data.sh %s)" % (opts.data_dir, opts.data_dir))
        return 77
    p = subprocess.run(["bash", opts.hosts, "check"], stdout=subprocess.PIPE, text=True,
                       env=dict(os.environ, FSDP_HOSTS_PREFIX=PREFIX))
    if p.returncode != 0:
        print("SKIP: cannot make test hosts on this machine: %s" % p.stdout.strip())
        return 77
    tmp = tempfile.mkdtemp(prefix="fsdp-multi-host-")
    hosts = Hosts(opts.hosts, tmp)
    try:
        t0 = time.time()
        hosts.up(2)
        test_collectives(opts, hosts)
        runs = test_training(opts, hosts, tmp)
        test_link_bytes(opts, hosts, tmp, runs)
        test_checkpoints(opts, hosts, tmp)
        test_uneven(opts, hosts)
        print("PASS (%.1f s)" % (time.time() - t0))
        return 0
    finally:
        hosts.down()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
