#!/usr/bin/env bash
# VRAM load benchmark (issue #4): an image of GIB GiB of random bits (stored raw) and one of
# randn bf16 (zstd-compressible) restored into GPU memory with `gstore load --device cuda:0`
# from a warm local store, against the pinned and pageable host->device copy rates measured
# in the same run and against loading the same bytes with safetensors (or numpy) + .cuda().
# With LOAD_BASE=OTHER_GSTORE_BIN the same loads also run with that binary (e.g. the previous
# release), in the same run. Last, a byte in the middle of every pack is flipped: both loads
# must then fail naming a corrupt chunk.
# Usage: tests/gpu/load_bench.sh [GSTORE_BIN] [GIB]
set -euo pipefail
cd "$(dirname "$0")/../.."
G=$(realpath "${1:-.device/gstore}")
GIB=${2:-8}
W=${LOAD_WORK:-/var/tmp/gstore-load-bench}
rm -rf "$W"; mkdir -p "$W"
trap 'rm -rf "$W"' EXIT
export GSTORE_STORE="$W/store"
python3 tests/gpu/load_bench.py make "$W/data" "$GIB"
"$G" -q init >/dev/null
for kind in raw bf16; do
  t0=$(date +%s.%N)
  "$G" -q push "$W/data/$kind" --tag "$kind" >/dev/null
  echo "push $kind: $(awk -v a="$t0" -v b="$(date +%s.%N)" -v g="$GIB" 'BEGIN{printf "%.2f s, %.2f GB/s", b-a, g*1.073741824/(b-a)}')"
done
"$G" du | head -4
python3 tests/gpu/load_bench.py baselines "$W/data"
for kind in raw bf16; do
  "$G" -q load "$kind" --device cuda:0 --check | sed "s/^/$kind (first, checked): /"
  for i in 1 2; do "$G" -q load "$kind" --device cuda:0 | sed "s/^/$kind run $i: /"; done
done
if [ -n "${LOAD_BASE:-}" ]; then
  for kind in raw bf16; do
    for i in 1 2; do "$LOAD_BASE" -q load "$kind" --device cuda:0 | sed "s/^/$kind base run $i: /"; done
  done
fi
# A damaged chunk fails the load, naming it; nothing is reported as loaded.
python3 - "$W/store/packs" <<'PY'
import glob, os, sys
for p in glob.glob(os.path.join(sys.argv[1], "*", "*.pack")):
    with open(p, "r+b") as f:
        f.seek(os.path.getsize(p) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x55]))
PY
for kind in raw bf16; do
  if out=$("$G" -q load "$kind" --device cuda:0 2>&1); then
    echo "FAIL: $kind loaded from damaged packs: $out"; exit 1
  fi
  case "$out" in
    *"corrupt chunk"*) echo "PASS: $kind from damaged packs fails: $(echo "$out" | tail -1 | cut -c1-160)" ;;
    *) echo "FAIL: $kind from damaged packs: unexpected error: $out"; exit 1 ;;
  esac
done
