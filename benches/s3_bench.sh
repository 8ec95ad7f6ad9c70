#!/usr/bin/env bash
# Push and restore of the corpus against a real S3-compatible server on loopback (s3s-fs)
# vs the local directory store, in one run: cold cache (a fresh machine) and warm cache (the
# same machine again), with the range reads per GB.
# Usage: benches/s3_bench.sh [SIZE_MIB (default 1024)]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mib=${1:-1024}
work=$(mktemp -d /var/tmp/gstore-s3bench.XXXXXX)
cargo build --release -q -p gstore-cli -p gstore-benches --bins
source benches/s3_server.sh
"$CARGO_TARGET_DIR/release/gstore-corpus" "$work/corpus" "$mib" 1 --base-only
G="$GSTORE_BIN"
lb=$(du -sb --apparent-size "$work/corpus/base" | cut -f1)
now() { date +%s.%N; }
run() { local t0; t0=$(now); "$@" >"$work/last.json"; awk -v a="$t0" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }
reads() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["reads"])' "$work/last.json"; }

export XDG_CACHE_HOME="$work/machine-a"
"$G" -q init --store "$work/local" >/dev/null
"$G" -q init --store s3://bench/store >/dev/null
pl=$(run "$G" -q --json push "$work/corpus/base" --tag b --store "$work/local")
ps=$(run "$G" -q --json push "$work/corpus/base" --tag b --store s3://bench/store)
rl=$(run "$G" -q --json restore b --to "$work/r1" --store "$work/local"); rm -rf "$work/r1"
export XDG_CACHE_HOME="$work/machine-b"
rc=$(run "$G" -q --json restore b --to "$work/r2" --store s3://bench/store); n=$(reads); rm -rf "$work/r2"
export XDG_CACHE_HOME="$work/machine-c"
rn=$(GSTORE_CACHE_BYTES=0 run "$G" -q --json restore b --to "$work/r4" --store s3://bench/store); rm -rf "$work/r4"
export XDG_CACHE_HOME="$work/machine-b"
rw=$(run "$G" -q --json restore b --to "$work/r3" --store s3://bench/store); rm -rf "$work/r3"
awk -v lb="$lb" -v pl="$pl" -v ps="$ps" -v rl="$rl" -v rc="$rc" -v rw="$rw" -v rn="$rn" -v n="$n" 'BEGIN {
  printf "corpus %.0f MB\n", lb/1e6
  printf "push     local %.2f s   s3 %.2f s   ratio %.2f\n", pl, ps, ps/pl
  printf "restore  local %.2f s   s3 cold cache %.2f s (ratio %.2f)   s3 warm cache %.2f s (ratio %.2f)\n", rl, rc, rc/rl, rw, rw/rl
  printf "restore  s3 without the cache (GSTORE_CACHE_BYTES=0) %.2f s (ratio %.2f)\n", rn, rn/rl
  printf "range reads: %d for %.2f GB = %.0f per GB\n", n, lb/1e9, n/(lb/1e9)
}'
