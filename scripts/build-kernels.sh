#!/usr/bin/env bash
# Builds gstore's GPU kernels (gpu-dump/src/cuda/kernels/*.cu, which include the .cuh beside
# them) with nvcc into one fatbin each: machine code for the GPUs gstore is mostly run on
# (compute capability 8.0, 9.0, 10.0: loaded as they are, no compiling at load time) and PTX
# for 7.5, which the driver compiles for any other GPU. The fatbins are committed and embedded
# in the binary, so building gstore needs no CUDA toolkit. Run after changing a kernel;
# `--check` instead fails when a committed fatbin differs from what nvcc builds now. Without nvcc on the PATH, NVIDIA's CUDA 13.0
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
  fatbin=${cu%.cu}.fatbin
  out=$(mktemp)
  nvcc -fatbin -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -gencode arch=compute_100,code=sm_100 -gencode arch=compute_75,code=compute_75 -o "$out" "$cu"
  if [ "$check" = --check ]; then
    if cmp -s "$out" "$fatbin"; then echo "up to date: $fatbin"; else echo "STALE: $fatbin (run scripts/build-kernels.sh)"; rm -f "$out"; exit 1; fi
    rm -f "$out"
  else
    mv "$out" "$fatbin"; echo "built $fatbin"
  fi
done
