#!/usr/bin/env bash
# Two gstore binaries on the same corpus in one run (issue #19: "push and restore speed within
# 10 % of today"): for each round, each binary gets a fresh store, pushes the corpus's base
# and next images (benches/corpus.rs: CRIU-like page images, the next with changed pages, so a
# binary with delta chunks stores some of the next image's chunks as deltas) and restores the
# next image, with the page cache dropped before the restore when it can be (root). Rounds
# alternate the binaries; the medians and their ratios (B / A) are printed, with each
# binary's stored bytes.
# Usage: benches/binary_compare.sh BIN_A BIN_B [SIZE_MIB] [ROUNDS] [CORPUS_BIN]
# (CORPUS_BIN: the gstore-corpus binary, default the one in the warm target directory).
set -euo pipefail
cd "$(dirname "$0")/.."
a=$(realpath "$1"); b=$(realpath "$2"); mib=${3:-1024}; rounds=${4:-3}
corpus_bin=${5:-${CARGO_TARGET_DIR:-$HOME/.cache/gstore-target}/release/gstore-corpus}
work=$(mktemp -d /var/tmp/gstore-compare.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$corpus_bin" "$work/corpus" "$mib"
base="$work/corpus/base"; next="$work/corpus/next"
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; cat "$base"/* "$next"/* >/dev/null; }
declare -A t stored
for r in $(seq "$rounds"); do
  order="a b"; [ $((r % 2)) = 0 ] && order="b a"
  for k in $order; do
    g=${!k}; s="$work/store-$k"; rm -rf "$s" "$work/out"
    "$g" --store "$s" -q init >/dev/null
    t[$k,base]+=" $(secs "$g" --store "$s" -q push "$base" --tag c:base)"
    t[$k,next]+=" $(secs "$g" --store "$s" -q push "$next" --tag c:next)"
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    t[$k,restore]+=" $(secs "$g" --store "$s" -q restore c:next --to "$work/out")"
    diff -rq "$next" "$work/out" >/dev/null || { echo "$k restored a different next image" >&2; exit 1; }
    stored[$k]=$(du -sb "$s/packs" | cut -f1)
    drop
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "corpus $mib MiB, $rounds rounds, $(nproc) CPUs; A = $a, B = $b"
printf '%-22s %-28s %-28s %s\n' step "A runs (s)" "B runs (s)" "B/A (medians)"
for step in base next restore; do
  ma=$(echo "${t[a,$step]}" | median); mb=$(echo "${t[b,$step]}" | median)
  name=$([ $step = restore ] && echo "restore next (cold)" || echo "push $step")
  printf '%-22s %-28s %-28s %.2f\n' "$name" "${t[a,$step]}" "${t[b,$step]}" "$(awk -v x="$mb" -v y="$ma" 'BEGIN { print x / y }')"
done
echo "packs after both pushes: A ${stored[a]} bytes, B ${stored[b]} bytes"
