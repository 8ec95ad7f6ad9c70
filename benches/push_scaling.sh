#!/usr/bin/env bash
# Push scaling curve: one file of N(0, 0.02) bf16 weights (SIZE_GIB, default 4), or of random
# bytes with DATA=random (incompressible: stored raw), pushed into a fresh store with 1, 2, 4,
# 8, ... rayon threads (RAYON_NUM_THREADS), up to the core count.
# STORE_DIR (default /var/tmp) is where the stores go: on a disk, or /dev/shm to take the disk
# out. GSTORE=PATH picks the binary. Prints GB/s per thread count, the speedup over one, and
# the stored/logical ratio and the push's stage times (which stage sets the pace:
# docs/BENCHMARKS.md).
# SIDE_BY_SIDE=1 adds the machine's own scaling (N single-thread pushes as separate processes).
# Usage: benches/push_scaling.sh [SIZE_GIB] ; e.g. STORE_DIR=/dev/shm benches/push_scaling.sh 4
set -euo pipefail
gib=${1:-4}
G=${GSTORE:-gstore}
dir=${STORE_DIR:-/var/tmp}/gstore-scaling.$$
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
python3 "$(dirname "$0")/make_data.py" "$dir/weights.bin" "$gib" "${DATA:-bf16}"
cat "$dir/weights.bin" > /dev/null
cores=$(nproc)
base=""
for t in 1 2 4 8 16 32 64; do
  [ "$t" -le "$cores" ] || break
  rm -rf "$dir/store"
  "$G" --store "$dir/store" init > /dev/null
  sync
  report=$(RAYON_NUM_THREADS=$t "$G" --store "$dir/store" --json push "$dir/weights.bin" --tag w)
  s=$(echo "$report" | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])')
  stored=$(echo "$report" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.4f" % (d["new_stored_bytes"] / d["logical_bytes"]))')
  stages=$(echo "$report" | python3 -c 'import json,sys; print(" ".join(f"{k} {v:.2f}" for k, v in json.load(sys.stdin).get("stages", {}).items()))')
  gbs=$(python3 -c "print(f'{$gib*2**30/$s/1e9:.2f}')")
  [ -n "$base" ] || base=$gbs
  echo "threads $t: $s s, $gbs GB/s, speedup $(python3 -c "print(f'{$gbs/$base:.2f}')"), stored $stored of logical${stages:+ ($stages)}"
done
# SIDE_BY_SIDE=1: the machine's own scaling for the same work, as a ceiling: N single-thread
# pushes of the whole file at once, as separate processes into separate stores.
if [ "${SIDE_BY_SIDE:-0}" = 1 ]; then
  for n in 1 2 4 8 16 32 64; do
    [ "$n" -le "$cores" ] || break
    for i in $(seq "$n"); do "$G" --store "$dir/side$i" init > /dev/null; done
    sync
    t0=$(date +%s.%N)
    for i in $(seq "$n"); do RAYON_NUM_THREADS=1 "$G" --store "$dir/side$i" push "$dir/weights.bin" --tag w > /dev/null & done
    wait
    t1=$(date +%s.%N)
    python3 -c "n, s = $n, $t1 - $t0; print(f'{n} single-thread pushes side by side: {s:.2f} s, {n * $gib * 2**30 / s / 1e9:.2f} GB/s together')"
    rm -rf "$dir"/side*
  done
fi
