#!/usr/bin/env bash
# Cold restores of process images against `cp -r` (issue #48): a Python process holds MIB MiB
# (default 512) of small-magnitude bf16 weights; `gstore checkpoint --leave-running` stores it
# (proc:1), PCT % (default 1) of its pages are rewritten and it is checkpointed again (proc:2,
# page-level deltas against proc:1). Each image is restored once warm to a directory (the
# "dump" cp -r copies), then ROUNDS times, alternating, with the page cache dropped before each
# command: `cp -r DUMP` and `gstore restore IMAGE --to DIR`, command to command (and, with
# BASE_BIN set, the same restore by that binary, e.g. the previous release). Prints the times
# and each restore's ratio to cp -r. Run as root (drop_caches, CRIU >= 4 at $CRIU).
# INIT_ARGS are passed to `gstore init` (e.g. "--min-saving 30").
# Usage: benches/cold_restore.sh [MIB] [PCT] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mib=${1:-512}; pct=${2:-1}; rounds=${3:-3}
criu=${CRIU:-/opt/criu/sbin/criu}
work=$(mktemp -d /var/tmp/gstore-cold.XXXXXX)
G="$GSTORE_BIN"
pid=
trap '{ [ -n "$pid" ] && kill -9 "$pid" && wait; } 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
setsid python3 benches/page_holder.py "$work" "$mib" "$pct" </dev/null >/dev/null 2>&1 &
until [ -s "$work/ready" ]; do sleep 0.1; done
pid=$(cat "$work/ready")
S="$work/store"
"$G" --store "$S" -q init ${INIT_ARGS:-} >/dev/null
"$G" --store "$S" -q checkpoint --pid "$pid" --leave-running --criu "$criu" --tag proc:1 >/dev/null
kill -USR1 "$pid"
until [ -s "$work/changed.done" ]; do sleep 0.1; done
"$G" --store "$S" -q checkpoint --pid "$pid" --leave-running --criu "$criu" --tag proc:2 >/dev/null
kill -9 "$pid"; wait 2>/dev/null || true; pid=
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
for image in proc:1 proc:2; do
  dump="$work/dump-${image#proc:}"
  "$G" --store "$S" -q restore "$image" --to "$dump" >/dev/null
  bytes=$(du -sb "$dump" | cut -f1)
  for r in $(seq "$rounds"); do
    rm -rf "$work/out"; drop; t0=$(now); cp -r "$dump" "$work/out"; t1=$(now)
    line=$(awk -v i="$image" -v n="$bytes" -v a="$t0" -v b="$t1" 'BEGIN { printf "%s (%.0f MB): cp -r %.3f s", i, n / 1e6, b - a }')
    for bin in "$G" ${BASE_BIN:+"$BASE_BIN"}; do
      rm -rf "$work/out"; drop; t2=$(now); "$bin" --store "$S" -q restore "$image" --to "$work/out" >/dev/null; t3=$(now)
      name=gstore; [ "$bin" = "$G" ] || name=base
      line+=$(awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v w="$name" 'BEGIN { printf ", %s restore %.3f s (%.2fx)", w, d - c, (d - c) / (b - a) }')
    done
    echo "$line"
  done
done
