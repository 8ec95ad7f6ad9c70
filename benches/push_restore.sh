#!/usr/bin/env bash
# Push/restore benchmark on the checkpoint-like corpus, with baselines measured in the same
# run: `tar | zstd -1 -T0` for push and `cp -r` for restore.
# Usage: benches/push_restore.sh [SIZE_MIB (default 1024)] [WORKDIR]
# RESTORE_TO=DIR restores (and copies) into DIR instead of WORKDIR, e.g. /dev/shm to take the
# destination disk out of the comparison.
# Prints MB/s per core, GB/s, stored/logical and the ratios against the baselines.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mib=${1:-1024}
work=${2:-$(mktemp -d /var/tmp/gstore-bench.XXXXXX)}
cargo build --release -q -p gstore-cli -p gstore-benches --bins
G="$GSTORE_BIN"
cores=$(nproc)
dest=${RESTORE_TO:-$work}/gstore-bench-out.$$
mkdir -p "$work" "$dest"
trap 'rm -rf "$work" "$dest"' EXIT

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
bytes() { du -sb --apparent-size "$1" | cut -f1; }

"$CARGO_TARGET_DIR/release/gstore-corpus" "$work/corpus" "$mib"
base="$work/corpus/base"; next="$work/corpus/next"
lb=$(bytes "$base"); ln=$(bytes "$next")
cat "$base"/* "$next"/* >/dev/null   # both images in page cache, as for every run below

t0=$(now); tar -C "$base" -cf - . | zstd -1 -T0 -q -o "$work/base.tar.zst"; t1=$(now)
zstd_s=$(secs "$t0" "$t1"); zstd_bytes=$(stat -c %s "$work/base.tar.zst"); rm "$work/base.tar.zst"
t0=$(now); cp -r "$base" "$dest/cp-base"; t1=$(now); cp_s=$(secs "$t0" "$t1"); rm -rf "$dest/cp-base"

export GSTORE_STORE="$work/store"
"$G" init -q >/dev/null
t0=$(now); "$G" -q push "$base" --tag bench:base >/dev/null; t1=$(now); push1_s=$(secs "$t0" "$t1")
t0=$(now); "$G" -q --json push "$next" --tag bench:next >"$work/next.json"; t1=$(now); push2_s=$(secs "$t0" "$t1")
added=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["new_stored_bytes"])' "$work/next.json")
stored=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["pack_bytes"])' < <("$G" --json du))
t0=$(now); "$G" -q restore bench:base --to "$dest/r-base" >/dev/null; t1=$(now); rest_s=$(secs "$t0" "$t1")
diff -rq "$base" "$dest/r-base" >/dev/null || { echo "restored image differs!"; exit 1; }
rm -rf "$dest/r-base"

awk -v lb="$lb" -v ln="$ln" -v c="$cores" -v p1="$push1_s" -v p2="$push2_s" -v r="$rest_s" \
    -v z="$zstd_s" -v zb="$zstd_bytes" -v cp="$cp_s" -v st="$stored" -v ad="$added" -v mib="$mib" 'BEGIN {
  printf "corpus: base %.0f MB, next %.0f MB (%d MiB requested), %d cores\n", lb/1e6, ln/1e6, mib, c
  printf "push base        %6.2f s  %7.0f MB/s  %6.0f MB/s per core   (tar|zstd -1 -T0: %.2f s, %.0f MB/s; gstore/zstd time ratio %.2f)\n", p1, lb/1e6/p1, lb/1e6/p1/c, z, lb/1e6/z, p1/z
  printf "push next        %6.2f s  %7.0f MB/s  %6.0f MB/s per core\n", p2, ln/1e6/p2, ln/1e6/p2/c
  printf "restore base     %6.2f s  %7.2f GB/s                       (cp -r: %.2f s, %.2f GB/s; gstore/cp time ratio %.2f)\n", r, lb/1e9/r, cp, lb/1e9/cp, r/cp
  printf "stored/logical   %6.3f   (both images; zstd -1 of base alone: %.3f of base)\n", st/(lb+ln), zb/lb
  printf "next image adds  %6.3f of its size\n", ad/ln
}'
