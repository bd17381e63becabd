#!/usr/bin/env bash
# The benchmarks' own Python packages beyond PyTorch (scripts/setup.sh installs torch and the build):
# DeepSpeed for bench/compare.py --peers ...,deepspeed, without its compiled ops (it runs on the CPU
# over gloo with DS_ACCELERATOR=cpu and torch.optim.AdamW; the CPU Adam extension is not used), and
# matplotlib for the pictures (scripts/report.py, bench/compare.py's bar chart).
set -euo pipefail
python3 -c 'import deepspeed' 2>/dev/null || DS_BUILD_OPS=0 python3 -m pip install --quiet "deepspeed==0.19.8"
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install --quiet "matplotlib>=3.7"
python3 -c 'import deepspeed, matplotlib; print("deepspeed", deepspeed.__version__, "and matplotlib", matplotlib.__version__, "installed")'
