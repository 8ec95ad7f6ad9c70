#!/usr/bin/env bash
# Checkpoint benchmark on this machine (CPU, real CRIU, root): a process holding GIB of seeded
# memory (benches/cpu_holder.py: half pseudo-random, half compressible text) is checkpointed
# with --leave-running ROUNDS times each way, alternating, in one run:
#   raw:      criu dump --leave-running into a directory (page cache), no store
#   staged:   gstore checkpoint --staging DIR (dump into DIR, then push DIR)
#   streamed: gstore checkpoint (the image streams from CRIU into the store while it dumps)
# Each gstore round starts from a fresh store and checkpoints twice: the first image is all
# new chunks, the second deduplicates against it. Prints the medians of the whole command
# (total) and of the time the process was stopped (paused), with ratios against raw.
# Usage: benches/checkpoint_stream.sh [GIB (default 1)] [ROUNDS (default 3)] [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
gib=${1:-1}
rounds=${2:-3}
work=${3:-$(mktemp -d /var/tmp/gstore-ckpt-bench.XXXXXX)}
cargo build --release -q -p gstore-cli
G="$GSTORE_BIN"
CRIU=$(command -v criu || echo /opt/criu/sbin/criu)
mkdir -p "$work/app"
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
median() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
js() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }

sh -c 'setsid python3 "$0" "$1" "$2" </dev/null >"$3" 2>&1 & echo $! >"$4"' \
  benches/cpu_holder.py "$gib" "$work/app" "$work/app.log" "$work/pid"
pid=$(cat "$work/pid")
for _ in $(seq 1200); do [ -s "$work/app/ready" ] && break; sleep 0.05; done
[ -s "$work/app/ready" ] || { echo "the holder did not start" >&2; exit 1; }

declare -A t
for r in $(seq "$rounds"); do
  rm -rf "$work/raw"; mkdir -p "$work/raw"
  t0=$(now); "$CRIU" dump -t "$pid" -D "$work/raw" -o dump.log --leave-running; t1=$(now)
  t[raw]+=" $(secs "$t0" "$t1")"
  raw_bytes=$(du -sb "$work/raw" | cut -f1); rm -rf "$work/raw"
  for mode in staged streamed; do
    rm -rf "$work/store"; "$G" --store "$work/store" -q init >/dev/null
    for n in first second; do
      flags=(); [ $mode = staged ] && { rm -rf "$work/stage"; flags=(--staging "$work/stage"); }
      "$G" --store "$work/store" --json checkpoint --pid "$pid" --tag "p:$n" --leave-running \
        --criu "$CRIU" "${flags[@]}" >"$work/r.json"
      t[$mode,$n,total]+=" $(js "$work/r.json" "round(d['total_s'], 3)")"
      t[$mode,$n,paused]+=" $(js "$work/r.json" "round(d['paused_s'], 3)")"
    done
  done
  rm -rf "$work/stage"
done
kill -0 "$pid" || { echo "the holder is gone" >&2; exit 1; }
raw=$(echo "${t[raw]}" | median)
echo "process of $gib GiB (image $(awk -v b="$raw_bytes" 'BEGIN { printf "%.2f GB", b / 1e9 }')), $rounds rounds, $(nproc) CPUs"
echo "raw criu dump --leave-running: $raw s (runs:${t[raw]})"
printf '%-10s %-7s %-8s %-28s %-10s %s\n' mode image what "runs (s)" median "x raw dump"
for mode in staged streamed; do
  for n in first second; do
    for what in total paused; do
      m=$(echo "${t[$mode,$n,$what]}" | median)
      printf '%-10s %-7s %-8s %-28s %-10s %s\n' "$mode" "$n" "$what" "${t[$mode,$n,$what]}" "$m" "$(ratio "$m" "$raw")"
    done
  done
done
