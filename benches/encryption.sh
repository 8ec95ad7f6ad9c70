#!/usr/bin/env bash
# Encrypted against unencrypted stores in one run (issue #20: "push and restore ≤ 10 % slower"):
# each round pushes the corpus's base and next images (benches/corpus.rs: CRIU-like page
# images) into a fresh plain store and a fresh encrypted one (`init --encrypt`, a key file),
# then restores the next image from each with the page cache dropped (when root). Rounds
# alternate which store goes first; medians and their ratios (encrypted / plain) are printed.
# Usage: benches/encryption.sh [GSTORE_BIN] [SIZE_MIB] [ROUNDS] [CORPUS_BIN]
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-$HOME/.cache/gstore-target}/release
g=$(realpath "${1:-$target/gstore}"); mib=${2:-1024}; rounds=${3:-3}
corpus_bin=${4:-$target/gstore-corpus}
work=$(mktemp -d /var/tmp/gstore-encryption.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$corpus_bin" "$work/corpus" "$mib"
base="$work/corpus/base"; next="$work/corpus/next"
"$g" key generate "$work/key" >/dev/null
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
run() {  # KIND CMD...: gstore on KIND's store, with the key for the encrypted one
  local kind=$1; shift
  if [ "$kind" = encrypted ]; then env GSTORE_KEY_FILE="$work/key" "$g" --store "$work/store-$kind" "$@"
  else "$g" --store "$work/store-$kind" "$@"; fi
}
declare -A t
for r in $(seq "$rounds"); do
  order="plain encrypted"; [ $((r % 2)) = 0 ] && order="encrypted plain"
  for k in $order; do
    rm -rf "$work/store-$k" "$work/out"
    if [ "$k" = encrypted ]; then run "$k" -q init --encrypt >/dev/null; else run "$k" -q init >/dev/null; fi
    cat "$base"/* "$next"/* >/dev/null
    t[$k,base]+=" $(secs run "$k" -q push "$base" --tag c:base)"
    t[$k,next]+=" $(secs run "$k" -q push "$next" --tag c:next)"
    drop
    t[$k,restore]+=" $(secs run "$k" -q restore c:next --to "$work/out")"
    diff -rq "$next" "$work/out" >/dev/null || { echo "$k restored a different next image" >&2; exit 1; }
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "corpus $mib MiB, $rounds rounds, $(nproc) CPUs; $g"
printf '%-22s %-28s %-28s %s\n' step "plain runs (s)" "encrypted runs (s)" "encrypted/plain (medians)"
for step in base next restore; do
  ma=$(echo "${t[plain,$step]}" | median); mb=$(echo "${t[encrypted,$step]}" | median)
  name=$([ $step = restore ] && echo "restore next (cold)" || echo "push $step")
  printf '%-22s %-28s %-28s %.2f\n' "$name" "${t[plain,$step]}" "${t[encrypted,$step]}" "$(awk -v x="$mb" -v y="$ma" 'BEGIN { print x / y }')"
done
echo "stored: plain $(du -sb "$work/store-plain/packs" | cut -f1) bytes, encrypted $(du -sb "$work/store-encrypted/packs" | cut -f1) bytes"
