#!/usr/bin/env bash
# Installs what fsdp-cpp needs on a Debian machine, idempotently: Debian packages (compiler, CMake,
# OpenMPI, test and app libraries, the default corpus) and the PyTorch CPU wheel (libtorch + peers).
set -euo pipefail
APT_PACKAGES=(build-essential cmake git pkg-config python3 python3-pip
  libopenmpi-dev openmpi-bin libgloo-dev libgtest-dev libbenchmark-dev
  libsentencepiece-dev sentencepiece libcli11-dev nlohmann-json3-dev libtomlplusplus-dev
  bible-kjv-text bible-kjv r-cran-janeaustenr r-base-core
  clang-14 libclang-rt-14-dev llvm-14  # clang: the sanitizer and fuzz builds (scripts/sanitize.sh)
  ninja-build)  # the builds' generator (scripts/build.sh, scripts/sanitize.sh): no idle core between targets
TORCH_VERSION=${FSDP_TORCH_VERSION:-2.13.0}
TRANSFORMERS_VERSION=${FSDP_TRANSFORMERS_VERSION:-4.57.6}
PEFT_VERSION=${FSDP_PEFT_VERSION:-0.21.2}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A machine may carry its own python3/pip/cmake outside Debian's packages: don't reinstall those.
command -v python3 >/dev/null && missing=("${missing[@]/python3}")
python3 -m pip --version >/dev/null 2>&1 && missing=("${missing[@]/python3-pip}")
command -v cmake >/dev/null && missing=("${missing[@]/cmake}")
filtered=(); for p in "${missing[@]}"; do [ -n "$p" ] && filtered+=("$p"); done
if [ ${#filtered[@]} -gt 0 ]; then
  echo "[setup] installing Debian packages: ${filtered[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${filtered[@]}"
fi

have_torch=$(python3 -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
if [ -z "$have_torch" ]; then
  echo "[setup] installing torch==${TORCH_VERSION} (CPU wheel)"
  python3 -m pip install -q "torch==${TORCH_VERSION}" ||
    python3 -m pip install -q --break-system-packages "torch==${TORCH_VERSION}"
fi
# Test-time Python clients: transformers writes and reads the Hugging Face checkpoints the
# interop tests exchange with fsdp-cpp; safetensors is its weight format.
if ! python3 -c 'import transformers, safetensors' 2>/dev/null; then
  echo "[setup] installing transformers==${TRANSFORMERS_VERSION} and safetensors (test clients)"
  python3 -m pip install -q "transformers==${TRANSFORMERS_VERSION}" safetensors ||
    python3 -m pip install -q --break-system-packages "transformers==${TRANSFORMERS_VERSION}" safetensors
fi
# peft loads the LoRA adapters fsdp-train exports (--export-adapter) over their base, in the tests.
if ! python3 -c 'import peft' 2>/dev/null; then
  echo "[setup] installing peft==${PEFT_VERSION} (test client)"
  python3 -m pip install -q "peft==${PEFT_VERSION}" ||
    python3 -m pip install -q --break-system-packages "peft==${PEFT_VERSION}"
fi
# matplotlib draws scripts/report.py's picture of a run's --metrics file.
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  echo "[setup] installing matplotlib (scripts/report.py)"
  python3 -m pip install -q "matplotlib>=3.7" ||
    python3 -m pip install -q --break-system-packages "matplotlib>=3.7"
fi
echo "[setup] ok: torch $(python3 -c 'import torch; print(torch.__version__)'), $(mpirun --version | head -n 1)"
