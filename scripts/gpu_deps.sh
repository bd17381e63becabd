#!/usr/bin/env bash
# Downloads the Debian packages that a GPU machine without a package registry lacks for the CUDA
# build (Gloo, GoogleTest, nlohmann-json, pkg-config, and fsdp-train's CLI11, toml++, sentencepiece) into
# .gpu-debs/ (git-ignored), so that they travel with the working tree to that machine, where
# scripts/gpu_check.sh unpacks them into a private prefix (nothing is installed system-wide).
# Run it on a Debian machine that has a registry (apt-get download needs no root); ~4 MB.
#
#   scripts/gpu_deps.sh            # then copy or carry .gpu-debs/ with the tree
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(
  libgloo-dev libgloo0 libhiredis-dev libhiredis0.14                       # Gloo (the CPU backend)
  libibverbs-dev libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 # Gloo's transport deps
  libnl-3-dev libnl-route-3-dev
  googletest libgtest-dev nlohmann-json3-dev                                 # tests, manifests
  libcli11-dev libtomlplusplus-dev libtomlplusplus3                          # fsdp-train's flags, config
  libsentencepiece-dev libsentencepiece0                                     # fsdp-train's tokenizer
  pkgconf pkgconf-bin libpkgconf3)                                           # finds sentencepiece
mkdir -p .gpu-debs
cd .gpu-debs
# apt-get drops to the _apt user when it can: give it a folder it may write to, then move the files.
tmp=$(mktemp -d)
chmod 777 "$tmp"
(cd "$tmp" && apt-get download -q "${PACKAGES[@]}")
mv "$tmp"/*.deb .
rmdir "$tmp"
echo "[gpu-deps] $(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in .gpu-debs/"
