#!/usr/bin/env bash
# Images of many small files (issue 61): for each N (default 25000 100000 200000), N files of
# 10 KB in 100 directories are pushed (as a tar on standard input), then restored to a
# directory under `ulimit -n 256` (a restore holds a bounded number of files open, whatever
# N) and written back as a tar with `restore --archive` (each file found through one index of
# the entries: time linear in N). Prints the seconds of each; the directory restore is
# compared byte for byte.
# Usage: benches/many_entries.sh [N...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
work=$(mktemp -d /var/tmp/gstore-many.XXXXXX)
trap 'rm -rf "$work"' EXIT
cargo build --release -q -p gstore-cli
G="$GSTORE_BIN"
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(25000 100000 200000)
for n in "${sizes[@]}"; do
    rm -rf "${work:?}"/*
    python3 - "$work/src" "$n" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"d{i % 100}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i}"), "wb") as f:
        f.write(i.to_bytes(8, "little") * 1250)
PY
    "$G" -q --store "$work/store" init >/dev/null
    tar -C "$work/src" -cf - . | "$G" -q --store "$work/store" push - --tag many >/dev/null
    t0=$(date +%s.%N)
    (ulimit -n 256; "$G" -q --store "$work/store" restore many --to "$work/out")
    t1=$(date +%s.%N)
    "$G" -q --store "$work/store" restore many --archive "$work/out.tar"
    t2=$(date +%s.%N)
    diff -r "$work/src" "$work/out" >/dev/null
    printf '%7d entries: restore to a directory (ulimit -n 256) %.2f s, --archive %.2f s\n' \
        "$n" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)"
done
