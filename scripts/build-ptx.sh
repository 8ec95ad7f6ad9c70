#!/usr/bin/env bash
# Builds the PTX of gstore's GPU kernels (gpu-dump/src/cuda/kernels/*.cu) with nvcc; the PTX is
# committed and embedded in the binary, so building gstore needs no CUDA toolkit. Run on a
# machine with nvcc (CUDA 13.0) after changing a kernel; `--check` instead fails when the
# committed PTX differs from what nvcc builds now.
set -euo pipefail
cd "$(dirname "$0")/.."
check=${1:-}
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
