#!/usr/bin/env bash
# Page-granular change in a real process (issue #19): a Python process holds MIB MiB (default
# 256) of small-magnitude bf16 weights, is checkpointed with CRIU through `gstore checkpoint
# --leave-running`, rewrites PCT % (default 1) of its 4 KiB pages at scattered places, and is
# checkpointed again into the same store. Prints what the second checkpoint added against the
# page-level ideal in the same run (the rewritten pages alone, `zstd -1`). Run as root, with
# CRIU >= 4 (scripts/criu.sh installs it at /opt/criu/sbin/criu).
# Usage: benches/page_dedup_criu.sh [MIB] [PCT]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mib=${1:-256}
pct=${2:-1}
criu=${CRIU:-/opt/criu/sbin/criu}
work=$(mktemp -d /var/tmp/gstore-criu-pages.XXXXXX)
G="$GSTORE_BIN"
pid=
trap '{ [ -n "$pid" ] && kill -9 "$pid" && wait; } 2>/dev/null; rm -rf "$work"' EXIT
setsid python3 benches/page_holder.py "$work" "$mib" "$pct" </dev/null >/dev/null 2>&1 &
until [ -s "$work/ready" ]; do sleep 0.1; done
pid=$(cat "$work/ready")
"$G" --store "$work/store" init >/dev/null
field() { python3 -c "import json,sys; print(json.load(sys.stdin)[\"push\"][\"$1\"])"; }
first=$("$G" --store "$work/store" --json checkpoint --pid "$pid" --leave-running --criu "$criu" --tag proc:1)
kill -USR1 "$pid"
until [ -s "$work/changed.done" ]; do sleep 0.1; done
second=$("$G" --store "$work/store" --json checkpoint --pid "$pid" --leave-running --criu "$criu" --tag proc:2)
pages=$(cat "$work/changed.done")
ideal=$(zstd -1 -q -c "$work/changed" | wc -c)
echo "$second" > "$work/second.json"
added=$(field new_stored_bytes < "$work/second.json")
printf 'process of %s MiB: first checkpoint stored %s of %s bytes; %s pages (%s %%) rewritten; second added %s bytes (%s delta chunks); ideal %s; added/ideal %s\n' \
  "$mib" "$(echo "$first" | field new_stored_bytes)" "$(echo "$first" | field logical_bytes)" "$pages" "$pct" \
  "$added" "$(field delta_chunks < "$work/second.json")" "$ideal" "$(awk -v a="$added" -v b="$ideal" 'BEGIN { printf "%.2f", a / b }')"
