#!/usr/bin/env bash
# Measures (1) micro tokens/s at N=1 and 2 (fp32), (2) micro fp32 vs bf16 at N=2,
# (3) gpt2 sharded save / load time and per-rank peak bytes at N=2 and 4. Results: out/measure/*.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/measure}
mkdir -p "$OUT"
RUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
COMMON="--progress lines --eval-every 0 --sample-tokens 0"
for n in 1 2; do
  $RUN -n $n build/bin/fsdp-train --model micro --steps 6 --global-batch-size 8 --seq-len 128 \
    $COMMON --metrics $OUT/micro_fp32_n$n.jsonl > $OUT/micro_fp32_n$n.log 2>&1
done
$RUN -n 2 build/bin/fsdp-train --model micro --steps 3 --global-batch-size 2 --seq-len 64 \
  $COMMON --mixed-precision bf16 --metrics $OUT/micro_bf16_n2_small.jsonl > $OUT/micro_bf16_n2_small.log 2>&1
$RUN -n 2 build/bin/fsdp-train --model micro --steps 3 --global-batch-size 2 --seq-len 64 \
  $COMMON --mixed-precision fp32 --metrics $OUT/micro_fp32_n2_small.jsonl > $OUT/micro_fp32_n2_small.log 2>&1
for n in 2 4; do
  rm -rf $OUT/ckpt_gpt2_n$n
  $RUN -n $n build/bin/fsdp-train --model gpt2 --steps 1 --global-batch-size 4 --seq-len 32 $COMMON \
    --save $OUT/ckpt_gpt2_n$n --metrics $OUT/gpt2_save_n$n.jsonl > $OUT/gpt2_save_n$n.log 2>&1
  $RUN -n $n build/bin/fsdp-train --model gpt2 --steps 2 --global-batch-size 4 --seq-len 32 $COMMON \
    --resume $OUT/ckpt_gpt2_n$n --metrics $OUT/gpt2_load_n$n.jsonl > $OUT/gpt2_load_n$n.log 2>&1
  rm -rf $OUT/ckpt_gpt2_n$n
done
python3 - "$OUT" <<'PY'
import json, sys, glob, os
out = sys.argv[1]
def ev(p):
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
for f in sorted(glob.glob(out + "/*.jsonl")):
    e = ev(f)
    steps = [x for x in e if x["event"] == "step"]
    ck = [x for x in e if x["event"] == "checkpoint"]
    cfg = next((x for x in e if x["event"] == "config"), {})
    st = steps[2:] or steps
    tps = sorted(s["tokens_per_s"] for s in st)
    stt = sorted(s["step_time_s"] for s in st)
    peak = max((s["mem"]["peak_bytes"] for s in steps), default=0)
    print(os.path.basename(f), "median tok/s %.0f" % tps[len(tps)//2] if tps else "-",
          "median step s %.2f" % stt[len(stt)//2] if stt else "-", "peak MiB %.0f" % (peak / 2**20),
          "save_s", [round(c["save_s"], 2) for c in ck], "load_s", cfg.get("load_s"))
PY
