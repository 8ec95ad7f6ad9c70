#!/bin/bash
# The first restore after a push against a second one, for one or more gstore binaries taken in
# turn (e.g. the previous build and this one), on a store that already holds an image:
#   bash benches/first_restore.sh STORE ROUNDS BIN [BIN...]
# Each round, each binary pushes a new 1 MB file, then restores it twice; prints the two
# restores' milliseconds (a process each, start to exit).
set -euo pipefail
store=$1 rounds=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Milliseconds the command takes, to a tenth.
ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; return 1; }; t1=$(date +%s%N); awk "BEGIN { printf \"%.1f\", ($t1 - $t0) / 1e6 }"; }
for round in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    tag="first-restore-$$-$round-$(basename "$bin")"
    head -c 1000000 /dev/urandom >"$work/file.bin"
    "$bin" --store "$store" -q push "$work/file.bin" --tag "$tag" >/dev/null
    first=$(ms "$bin" --store "$store" -q restore "$tag" --to "$work/one")
    second=$(ms "$bin" --store "$store" -q restore "$tag" --to "$work/two")
    rm -rf "$work/one" "$work/two"
    echo "$bin round $round: first restore $first ms, second $second ms"
  done
done
