"""Peer trainer for the fsdp-cpp benchmarks: the same GPT (bench/peer_gpt.py) trained by stock PyTorch.

    python3 -m torch.distributed.run --nproc_per_node N bench/peer_train.py --impl fsdp2 \
        --model nano --global-batch-size 16 --seq-len 128 --steps 12 --threads 1 --metrics out.jsonl

--impl
  fsdp2  torch.distributed.fsdp.fully_shard on every Block, then on the root (FSDP2, per-parameter
         dim-0 sharding, DTensor). The root unit owns wte (tied head), wpe and ln_f, as in fsdp-train.
  ddp    DistributedDataParallel (all-reduce of gradients, default 25 MiB buckets).
  zero   DistributedDataParallel + ZeroRedundancyOptimizer(AdamW) (ZeRO-1: Adam state sharded).
  ds1, ds2, ds3  DeepSpeed ZeRO stage 1, 2, 3 (deepspeed.initialize with torch.optim.AdamW over the
         same param groups, gradient_clipping, gradient_accumulation_steps = G/(N*m); run with
         DS_ACCELERATOR=cpu; bench/setup.sh installs DeepSpeed with DS_BUILD_OPS=0). Each stage
         gets the zero_optimization settings DeepSpeed's ZeRO tutorial and configuration page
         recommend (DS_RECOMMENDED below: contiguous_gradients, overlap_comm, reduce_scatter and
         500M-element buckets for stages 1-2; for stage 3 also sub_group_size, max live parameters
         and reuse distance of 1e9); --ds-defaults runs it with the stage alone (DeepSpeed's
         defaults).
Backend: gloo (CPU).
--mixed-precision bf16 matches fsdp-train --mixed-precision bf16: fsdp2 gets
  MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16) on every unit and output_dtype=fp32 on
  the root (fsdp-train's root returns fp32 logits); ddp and zero run forward and loss under
  torch.autocast("cpu", dtype=torch.bfloat16) (bf16 matmuls, fp32 params, grads and all-reduce);
  DeepSpeed gets its own bf16 mode ({"bf16": {"enabled": true}}: bf16 params and gradients, fp32
  master weights and AdamW state in its optimizer), the closest to fsdp-train's policy.
  Master weights and AdamW state stay fp32 everywhere. Default fp32.

Step = what fsdp-train times (apps/train/main.cpp): for each of the G/(N*m) micro-batches a forward,
cross-entropy, backward (gradient sync only on the last micro-batch: FSDP2
set_requires_gradient_sync / DDP no_sync) and loss.item(); then clip_grad_norm_(1.0), AdamW step,
zero_grad. Same optimizer setup as fsdp-train: AdamW(betas 0.9/0.95, eps 1e-8), weight decay 0.1 on
the Linear weight matrices only, linear warmup then cosine lr. Data: random token ids (uniform over
the vocabulary, seeded per step and rank), batch shape (G/N, T+1) per rank like fsdp-train's sampler;
the data does not change the cost of a step.

Metrics (--metrics PATH, JSON lines, rank 0), same names as fsdp-train where the quantity exists:
  {"event":"config", ...}
  {"event":"step", "step", "loss" (mean over ranks), "lr", "grad_norm", "tokens" (= G*T),
   "step_time_s" (rank 0 wall clock of the step as above), "tokens_per_s" (= tokens/step_time_s),
   "mem": {"param_shard_bytes", "grad_shard_bytes", "optim_state_bytes" (MAX over ranks of this
           rank's local parameter / gradient / optimizer-state tensor bytes after optimizer.step(),
           before zero_grad; for fsdp2 the local DTensor shards),
           "peak_bytes": null (stock PyTorch has no CPU allocator counter; fsdp-train's is its
           counting allocator),
           "rss_peak_bytes" (MAX over ranks of getrusage(RUSAGE_SELF).ru_maxrss * 1024: the
           process's high-water resident set so far, which includes the Python interpreter and the
           torch libraries)},
   "comm": {} (not measured for the peer)}
  {"event":"end", "train_time_s", "mean_tokens_per_s", "rss_start_bytes" (MAX over ranks of
   ru_maxrss before the first step: interpreter + torch + model + optimizer set-up)}
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_gpt import GPT, gpt_loss, gpt_preset  # noqa: E402


# zero_optimization as DeepSpeed's ZeRO tutorial and configuration reference recommend (stage 1
# ignores the gradient settings; DeepSpeed's own defaults differ: overlap_comm off below stage 3).
_DS_STAGE_1_2 = {"contiguous_gradients": True, "overlap_comm": True, "reduce_scatter": True,
                 "allgather_partitions": True, "allgather_bucket_size": int(5e8), "reduce_bucket_size": int(5e8)}
DS_RECOMMENDED = {
    1: _DS_STAGE_1_2,
    2: _DS_STAGE_1_2,
    3: {"contiguous_gradients": True, "overlap_comm": True, "sub_group_size": int(1e9),
        "reduce_bucket_size": int(5e8), "stage3_prefetch_bucket_size": int(5e7),
        "stage3_param_persistence_threshold": int(1e5), "stage3_max_live_parameters": int(1e9),
        "stage3_max_reuse_distance": int(1e9)},
}


def lr_at(step, total, warmup, lr, min_lr):
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    if total <= warmup:
        return lr
    progress = min(1.0, max(0.0, (step - warmup) / (total - warmup)))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def local_bytes(t: torch.Tensor) -> int:
    if hasattr(t, "to_local"):  # DTensor (FSDP2)
        t = t.to_local()
    return t.numel() * t.element_size()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", choices=["fsdp2", "ddp", "zero", "ds1", "ds2", "ds3"], required=True)
    ap.add_argument("--model", default="nano")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--global-batch-size", type=int, default=32)
    ap.add_argument("--micro-batch-size", type=int, default=0, help="per rank; 0 = G/N")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=3e-4)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--metrics", default="")
    ap.add_argument("--ds-defaults", action="store_true",
                    help="ds1-3: zero_optimization with the stage alone (DeepSpeed's defaults), not DS_RECOMMENDED")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--mixed-precision", choices=["fp32", "bf16"], default="fp32")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.global_batch_size % world:
        raise SystemExit(f"--global-batch-size {a.global_batch_size} not divisible by {world} ranks")
    rows = a.global_batch_size // world
    micro = a.micro_batch_size or rows
    if rows % micro:
        raise SystemExit(f"--micro-batch-size {micro} does not divide {rows} rows per rank")
    accum = rows // micro
    T = a.seq_len

    cfg = gpt_preset(a.model, a.vocab_size)
    torch.manual_seed(a.seed)
    model = GPT(cfg)
    num_params = sum(p.numel() for p in model.parameters())
    assert num_params == cfg.num_params()

    def groups(named):
        decay, no_decay = [], []
        for n, p in named:
            emb = n.startswith("wte.") or n.startswith("wpe.")
            (decay if p.dim() >= 2 and not emb else no_decay).append(p)
        return [{"params": decay, "weight_decay": a.weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]

    adam_kw = dict(lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    bf16 = a.mixed_precision == "bf16"
    if a.impl == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        kw, root_kw = {}, {}
        if bf16:
            kw = dict(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                     reduce_dtype=torch.bfloat16))
            root_kw = dict(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                          reduce_dtype=torch.bfloat16,
                                                          output_dtype=torch.float32))
        for block in model.h:
            fully_shard(block, **kw)
        fully_shard(model, **root_kw)
        train_model = model
        opt = torch.optim.AdamW(groups(model.named_parameters()), **adam_kw)
        state_owner = opt
    elif a.impl.startswith("ds"):
        import deepspeed
        stage = int(a.impl[2])
        zero = {"stage": stage} if a.ds_defaults else dict(DS_RECOMMENDED[min(stage, 3)], stage=stage)
        ds_config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
                     "gradient_clipping": a.grad_clip, "zero_optimization": zero,
                     "bf16": {"enabled": bf16}, "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}
        train_model, opt, _, _ = deepspeed.initialize(
            model=model, optimizer=torch.optim.AdamW(groups(model.named_parameters()), **adam_kw),
            config=ds_config)
        state_owner = None  # DeepSpeed keeps its fp32 partitions and Adam state to itself
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP
        train_model = DDP(model)
        if a.impl == "ddp":
            opt = torch.optim.AdamW(groups(model.named_parameters()), **adam_kw)
            state_owner = opt
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            g = groups(model.named_parameters())
            opt = ZeroRedundancyOptimizer(g[0]["params"], optimizer_class=torch.optim.AdamW,
                                          weight_decay=a.weight_decay, **adam_kw)
            opt.add_param_group({"params": g[1]["params"], "weight_decay": 0.0})
            state_owner = opt.optim  # this rank's local AdamW

    def autocast():
        if bf16 and a.impl != "fsdp2":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return _Null()

    def sync_ctx(last: bool):
        if a.impl.startswith("ds"):  # the engine accumulates and reduces at its boundary itself
            return _Null()
        if a.impl == "fsdp2":
            train_model.set_requires_gradient_sync(last)
            return _Null()
        return _Null() if last else train_model.no_sync()

    out = open(a.metrics, "w") if (a.metrics and rank == 0) else None

    def emit(obj):
        if out:
            out.write(json.dumps(obj) + "\n")
            out.flush()

    emit({"event": "config", "impl": a.impl, "model": a.model, "n_layer": cfg.n_layer,
          "n_head": cfg.n_head, "n_embd": cfg.n_embd, "block_size": cfg.block_size,
          "vocab_size": cfg.vocab_size, "strategy": a.impl, "mixed_precision": a.mixed_precision,
          "threads": a.threads, "global_batch_size": a.global_batch_size, "micro_batch_size": micro,
          "accumulation_steps": accum, "seq_len": T, "tokens_per_step": a.global_batch_size * T,
          "steps": a.steps, "backend": "gloo", "world_size": world, "num_params": num_params,
          "torch_version": torch.__version__, "data": "random tokens"})

    def all_max(vals):
        t = torch.tensor(vals, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [int(v) for v in t.tolist()]

    rss_start = all_max([rss_bytes()])[0]
    dist.barrier()
    tokens = a.global_batch_size * T
    train_s = 0.0
    for step in range(1, a.steps + 1):
        lr = lr_at(step, a.steps, a.warmup_steps, a.lr, a.min_lr)
        for g in opt.param_groups:
            g["lr"] = lr
        gen = torch.Generator().manual_seed(a.seed * 1000003 + step * 1009 + rank)
        batch = torch.randint(0, cfg.vocab_size, (rows, T + 1), generator=gen)

        t0 = time.perf_counter()
        local_loss = 0.0
        for k in range(accum):
            mb = batch[k * micro:(k + 1) * micro]
            if a.impl.startswith("ds"):  # backward scales by 1/accum; step() acts at the boundary
                loss = gpt_loss(train_model(mb[:, :T]).float(), mb[:, 1:])
                train_model.backward(loss)
                train_model.step()
                local_loss += loss.item() / accum
                continue
            with sync_ctx(k == accum - 1):
                with autocast():
                    logits = train_model(mb[:, :T])
                    loss = gpt_loss(logits.float(), mb[:, 1:])
                (loss / accum).backward()
            local_loss += loss.item() / accum
        if a.impl.startswith("ds"):
            grad_norm = float(train_model.get_global_grad_norm() or 0.0)
            pbytes = gbytes = obytes = 0  # not exposed by the engine: the table shows "-"
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
            grad_norm = float(grad_norm)
            opt.step()
            pbytes = sum(local_bytes(p) for p in model.parameters())
            gbytes = sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
            obytes = sum(local_bytes(v) for st in state_owner.state.values() for v in st.values()
                         if torch.is_tensor(v))
            opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        train_s += dt

        lt = torch.tensor([local_loss], dtype=torch.float64)
        dist.all_reduce(lt)
        loss_mean = lt.item() / world
        mem = all_max([pbytes, gbytes, obytes, rss_bytes()])
        emit({"event": "step", "step": step, "loss": loss_mean, "lr": lr, "grad_norm": grad_norm,
              "tokens": tokens, "step_time_s": dt, "tokens_per_s": tokens / dt,
              "mem": {"param_shard_bytes": mem[0], "grad_shard_bytes": mem[1],
                      "optim_state_bytes": mem[2], "peak_bytes": None, "rss_peak_bytes": mem[3]},
              "comm": {}})
        if rank == 0 and not a.quiet:
            print(f"step {step}/{a.steps} | loss {loss_mean:.4f} | {tokens / dt:,.0f} tok/s | "
                  f"{dt * 1e3:.0f} ms | rss {mem[3] / 2**20:.0f} MiB", flush=True)
    emit({"event": "end", "steps": a.steps, "train_time_s": train_s,
          "mean_tokens_per_s": tokens * a.steps / train_s, "rss_start_bytes": rss_start})
    if out:
        out.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
