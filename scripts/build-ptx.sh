#!/usr/bin/env bash
# Builds the PTX of gstore's GPU kernels (gpu-dump/src/cuda/kernels/*.cu, which include the
# .cuh beside them) with nvcc; the PTX is committed and embedded in the binary, so building
# gstore needs no CUDA toolkit. Run after changing a kernel; `--check` instead fails when the
# committed PTX differs from what nvcc builds now. Without nvcc on the PATH, NVIDIA's CUDA 13.0
# compiler wheels are fetched from PyPI into ~/.cache/gstore-nvcc (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
check=${1:-}
if ! command -v nvcc >/dev/null; then
  kit="$HOME/.cache/gstore-nvcc"
  if [ ! -x "$kit/nvidia/cu13/bin/nvcc" ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 --python-version 3.12 -d "$kit/wheels" \
      nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
    for w in "$kit"/wheels/*.whl; do python3 -m zipfile -e "$w" "$kit"; done
    chmod +x "$kit"/nvidia/cu13/bin/* "$kit"/nvidia/cu13/nvvm/bin/*
  fi
  PATH="$kit/nvidia/cu13/bin:$PATH"
fi
for cu in gpu-dump/src/cuda/kernels/*.cu; do
  ptx=${cu%.cu}.ptx
  out=$(mktemp)
  nvcc -ptx -arch=compute_75 -O3 -o "$out" "$cu"
  if [ "$check" = --check ]; then
    if cmp -s "$out" "$ptx"; then echo "up to date: $ptx"; else echo "STALE: $ptx (run scripts/build-ptx.sh)"; rm -f "$out"; exit 1; fi
    rm -f "$out"
  else
    mv "$out" "$ptx"; echo "built $ptx"
  fi
done
