#!/usr/bin/env bash
# Two gstore binaries pushing the same file in one run, alternating: 8 GiB (SIZE_GIB) of
# N(0, 0.02) bf16 weights (DATA=bf16) or random bytes (DATA=random), each push into a fresh
# store in STORE_DIR (default /dev/shm, to take the disk out), with each thread count given
# (RAYON_NUM_THREADS). Prints seconds, GB/s and the writers' summed time per push.
# COLD=1: the data file lives in DATA_DIR (default /var/tmp: on a disk) and the page cache is
# dropped before every push (root), so each push reads it from the disk.
# Usage: benches/push_compare.sh BIN_A BIN_B [DATA] [SIZE_GIB] [ROUNDS] [THREADS...]
#   e.g. benches/push_compare.sh gstore-old gstore bf16 8 3 16 1
set -euo pipefail
a=$(realpath "$1"); b=$(realpath "$2"); data=${3:-bf16}; gib=${4:-8}; rounds=${5:-3}
shift $(( $# < 5 ? $# : 5 ))
threads=("$@"); [ ${#threads[@]} -gt 0 ] || threads=("$(nproc)")
w=$(mktemp -d "${STORE_DIR:-/dev/shm}/gstore-push-compare.XXXXXX")
d=$w; [ "${COLD:-0}" = 1 ] && d=$(mktemp -d "${DATA_DIR:-/var/tmp}/gstore-push-data.XXXXXX")
trap 'rm -rf "$w" "$d"' EXIT
python3 "$(dirname "$0")/make_data.py" "$d/f.bin" "$gib" "$data"
for t in "${threads[@]}"; do
  for _ in $(seq "$rounds"); do
    for bin in "$a" "$b"; do
      rm -rf "$w/s"
      "$bin" --store "$w/s" init > /dev/null
      [ "${COLD:-0}" = 1 ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
      report=$(RAYON_NUM_THREADS=$t "$bin" --store "$w/s" --json push "$d/f.bin" --tag x)
      echo "$report" | python3 -c 'import json, sys
d = json.load(sys.stdin)
print("%s threads %s %s: %.2f s, %.2f GB/s, writers %.1f s" % (sys.argv[1], sys.argv[2], sys.argv[3], d["seconds"], d["logical_bytes"] / d["seconds"] / 1e9, d["stages"]["write_s"]))' "$data" "$t" "$(basename "$bin")"
    done
  done
done
