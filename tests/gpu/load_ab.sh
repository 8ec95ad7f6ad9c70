#!/usr/bin/env bash
# Two gstore binaries side by side (issue #13): each pushes GIB GiB of safetensors shards
# (KINDS: raw random bits, N(0, 0.02) bf16 weights) into a store of its own, made with its own
# defaults, and loads them into cuda:0 ROUNDS times, the two alternating; pushes of bf16 into
# fresh stores alternate PUSH_ROUNDS times first. Pinned and pageable host->device rates and
# safetensors' load_file(device="cuda") are measured in the same run; NEW's first load of each
# image reads VRAM back and checks every chunk. Times are end to end (process start to exit).
# With BASE set to "-" only NEW runs.
# Usage: tests/gpu/load_ab.sh BASE_BIN NEW_BIN [GIB] [ROUNDS] [KINDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=$1; NEW=$(realpath "$2"); GIB=${3:-8}; ROUNDS=${4:-3}; KINDS=${5:-raw bf16}
declare -A BIN=([new]=$NEW)
[ "$BASE" = - ] || BIN[base]=$(realpath "$BASE")
W=${LOAD_WORK:-/var/tmp/gstore-load-ab}
rm -rf "$W"; mkdir -p "$W"
trap 'rm -rf "$W"' EXIT
secs() { awk -v a="$1" -v b="$2" -v g="$GIB" 'BEGIN{printf "%.3f s, %.2f GB/s", b-a, g*1.073741824/(b-a)}'; }
python3 tests/gpu/load_bench.py make "$W/data" "$GIB" $KINDS >/dev/null
find "$W/data" -type f -exec cat {} + >/dev/null
python3 tests/gpu/load_bench.py pinned
if [[ " $KINDS " == *" bf16 "* ]]; then
  for r in $(seq "${PUSH_ROUNDS:-0}"); do for b in "${!BIN[@]}"; do
    rm -rf "$W/fresh"; "${BIN[$b]}" --store "$W/fresh" -q init >/dev/null; sync
    t0=$(date +%s.%N); "${BIN[$b]}" --store "$W/fresh" -q push "$W/data/bf16" --tag bf16 >/dev/null
    echo "push $b bf16: $(secs "$t0" "$(date +%s.%N)"), stored $(du -sb "$W/fresh" | cut -f1) bytes"
  done; done
  rm -rf "$W/fresh"
fi
for b in "${!BIN[@]}"; do
  "${BIN[$b]}" --store "$W/$b" -q init >/dev/null
  for k in $KINDS; do
    t0=$(date +%s.%N); "${BIN[$b]}" --store "$W/$b" -q push "$W/data/$k" --tag "$k" >/dev/null
    echo "push $b $k: $(secs "$t0" "$(date +%s.%N)")"
  done
  echo "stored by $b: $(du -sb "$W/$b" | cut -f1) bytes"
done
find "$W" -type f -exec cat {} + >/dev/null
for k in $KINDS; do python3 tests/gpu/load_bench.py safetensors "$W/data/$k"; done
for k in $KINDS; do
  out=$("$NEW" --store "$W/new" -q load "$k" --device cuda:0 --check) || { echo "FAIL: $k: $out"; exit 1; }
  echo "$out" | sed "s/^/new $k, read back and checked: /"
done
for r in $(seq "$ROUNDS"); do for k in $KINDS; do for b in "${!BIN[@]}"; do
  t0=$(date +%s.%N)
  out=$("${BIN[$b]}" --store "$W/$b" -q load "$k" --device cuda:0 | head -1) || { echo "FAIL: $b $k: $out"; exit 1; }
  echo "$b $k: end to end $(secs "$t0" "$(date +%s.%N)") | $out"
done; done; done
