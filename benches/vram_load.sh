#!/usr/bin/env bash
# VRAM loads straight from the store against the PCIe limit (issue #48). For each size and
# KIND (bf16: N(0, 0.02) weights as 1 GiB safetensors shards; raw: random bits), pushes the
# shards into a fresh local store (the shards are then removed: a 32 GiB pair must fit the
# disk), and loads the image with `gstore load IMAGE --device cuda:0` ROUNDS times with a warm
# page cache and COLD_ROUNDS times after dropping it (root). The pinned host->device rate and
# the disk's read rate of the store's files (page cache dropped) are measured in the same run.
# Each load prints its logical GB/s end to end (process start to exit) and as the load reports
# it, each as a ratio to pinned, with the load's phases and where its workers waited. The first
# load of each image reads VRAM back and checks every chunk. VARIANTS ("|"-separated
# `ENV=V ... -- FLAGS`) adds warm loads under other settings, for diagnosis. PROBE_GIB first
# measures the host path's own rate (tests/gpu/register_probe.py) on that many GiB.
# Usage: benches/vram_load.sh GSTORE_BIN [GIB...]   (default 8)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "$1"); shift
SIZES=${*:-8}; KINDS=${KINDS:-bf16 raw}; ROUNDS=${ROUNDS:-3}; COLD_ROUNDS=${COLD_ROUNDS:-1}
W=${LOAD_WORK:-/var/tmp/gstore-vram-load}
rm -rf "$W"; mkdir -p "$W"
trap 'rm -rf "$W"' EXIT
PINNED=$(python3 tests/gpu/load_bench.py pinned | awk '/^pinned/ {print $3}')
echo "pinned host->device: $PINNED GB/s; THP $(cat /sys/kernel/mm/transparent_hugepage/enabled); $(nproc) cores"
if [ -n "${PROBE_GIB:-}" ]; then
  # The host path's own rate with nothing else (no plan, no checks, no decode): PROBE_GIB of
  # random bytes warm in the page cache, moved to VRAM by 16 threads in 16 MiB slices, read
  # into pinned buffers (gstore's path) and DMA'd straight from registered mappings.
  head -c "$((PROBE_GIB << 30))" /dev/urandom >"$W/probe"
  python3 tests/gpu/register_probe.py "$W/probe" 16 16
  rm -f "$W/probe"
fi
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
# load LABEL BYTES [ENV=V ...] [-- FLAGS...]: one load, timed from process start to exit.
load() {
  local label=$1 bytes=$2; shift 2
  local envs=() flags=()
  while (($#)); do [ "$1" = -- ] && { shift; flags=("$@"); break; }; envs+=("$1"); shift; done
  local t0 t1 out
  t0=$(date +%s.%N)
  out=$(env "${envs[@]}" "$BIN" --store "$W/store" --json load "$IMAGE" --device cuda:0 "${flags[@]}") \
    || { echo "FAIL: $label: $out"; exit 1; }
  t1=$(date +%s.%N)
  python3 - "$label" "$bytes" "$t0" "$t1" "$PINNED" "$out" <<'EOF'
import json, sys
label, n, t0, t1, pinned, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), json.loads(sys.argv[6])
e2e = n / 1e9 / (t1 - t0)
rep = n / 1e9 / out["seconds"]
p, w = out.get("phases", [0, 0, 0]), out.get("waits") or {}
print(f"{label}: end to end {t1 - t0:.3f} s {e2e:.1f} GB/s ({e2e / pinned:.2f}x pinned) | reported {out['seconds']:.3f} s "
      f"{rep:.1f} GB/s ({rep / pinned:.2f}x) | CUDA context up at {out.get('context_s', 0):.3f} s | plan {p[0]:.3f} alloc {p[1]:.3f} transfer {p[2]:.3f} s | per worker: "
      f"reading {w.get('reading_s', 0):.3f} waiting for a buffer's DMA {w.get('copy_s', 0):.3f} planner {w.get('planner_s', 0):.3f} s"
      + (" | checked" if out.get("checked") else ""))
EOF
}
for gib in $SIZES; do
  for kind in $KINDS; do
    rm -rf "$W/store" "$W/data"
    python3 tests/gpu/load_bench.py make "$W/data" "$gib" "$kind" >/dev/null
    "$BIN" --store "$W/store" -q init >/dev/null
    IMAGE=$kind-$gib
    "$BIN" --store "$W/store" -q push "$W/data/$kind" --tag "$IMAGE" >/dev/null
    bytes=$(du -sb "$W/data/$kind" | cut -f1)
    rm -rf "$W/data"
    stored=$(du -sb "$W/store" | cut -f1)
    drop
    t0=$(date +%s.%N); find "$W/store" -type f -print0 | xargs -0 cat >/dev/null; t1=$(date +%s.%N)
    disk=$(awk -v n="$stored" -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", n/1e9/(b-a)}')
    echo "== $kind $gib GiB: $bytes bytes, stored $stored ($(awk -v a="$stored" -v b="$bytes" 'BEGIN{printf "%.3f", a/b}')); disk reads the store at $disk GB/s (cold cat)"
    load "$kind $gib GiB warm, checked" "$bytes" -- --check
    for r in $(seq "$ROUNDS"); do load "$kind $gib GiB warm" "$bytes"; done
    IFS='|' read -ra variants <<<"${VARIANTS:-}"
    for v in "${variants[@]}"; do
      # shellcheck disable=SC2086
      load "$kind $gib GiB warm [$v]" "$bytes" $v
    done
    for r in $(seq "$COLD_ROUNDS"); do drop; load "$kind $gib GiB cold" "$bytes"; done
  done
done
