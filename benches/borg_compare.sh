#!/usr/bin/env bash
# Issue #15: gstore's ingest of CRIU images of real processes against borg's (`borg create`,
# zstd level 1 like gstore's default, no encryption), in the same run, with the page cache
# dropped before every ingest (root). Two processes — benches/cpu_holder.py (GIB of memory,
# half pseudo-random, half text-like floats) and benches/weights_holder.py (GIB of N(0, 0.02)
# float32 weights, a few rows changing every second) — are dumped by CRIU (`--leave-running`)
# into one image directory, twice, a few seconds apart. Each tool ingests the first dump into
# a fresh repository, then the second (deduplicated against the first); ROUNDS rounds,
# alternating which tool goes first. borg runs with its default chunker (~2 MiB chunks) and
# with gstore's chunk size (64 KiB average: `--chunker-params buzhash,14,20,16,4095`).
# Prints each ingest's seconds and MB/s (image bytes over wall time) and gstore's rate over
# each borg's, medians.
# Usage: benches/borg_compare.sh [GIB (default 1)] [ROUNDS (default 3)]
# PYTHON names a python3 with NumPy (for weights_holder.py); GSTORE the gstore binary.
set -euo pipefail
cd "$(dirname "$0")/.."
gib=${1:-1}; rounds=${2:-3}
G=${GSTORE:-${CARGO_TARGET_DIR:-$HOME/.cache/gstore-target}/release/gstore}
PY=${PYTHON:-python3}
CRIU=$(command -v criu || echo /opt/criu/sbin/criu)
command -v borg >/dev/null || { echo "borg is not installed (apt-get install borgbackup)"; exit 1; }
work=$(mktemp -d /var/tmp/gstore-borg.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
wait_file() { for _ in $(seq 600); do [ -e "$1" ] && return 0; sleep 0.1; done; echo "timed out waiting for $1" >&2; exit 1; }
start() {  # NAME SCRIPT PYTHON: starts a holder detached from this shell (CRIU dumps it alone)
  mkdir -p "$work/$1"
  sh -c 'setsid "$0" "$1" "$2" "$3" </dev/null >"$4" 2>&1 & echo $! >"$5"' \
    "$3" "$2" "$gib" "$work/$1" "$work/$1.log" "$work/$1.pid"
  wait_file "$work/$1/ready"
  pids+=("$(cat "$work/$1.pid")")
}
start cpu benches/cpu_holder.py python3
start weights benches/weights_holder.py "$PY"
dump() {  # DIR: both processes, left running, one image directory each under DIR
  for n in cpu weights; do
    mkdir -p "$1/$n"
    "$CRIU" dump -t "$(cat "$work/$n.pid")" -D "$1/$n" -o dump.log --leave-running \
      || { tail -5 "$1/$n/dump.log"; exit 1; }
    rm -f "$1/$n/dump.log"
  done
}
dump "$work/img1"; sleep 3; dump "$work/img2"
for d in img1 img2; do echo "$d: $(du -sb --apparent-size "$work/$d" | cut -f1) bytes"; done
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
timed() {  # CMD...: wall seconds of CMD, output discarded
  local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}
export BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes
gstore_run() {  # IMAGE TAG
  timed "$G" --store "$work/gs" push "$work/$1" --tag "$2"
}
borg_run() {  # PARAMS IMAGE ARCHIVE
  local params=$1; shift
  (cd "$work" && timed borg create --compression zstd,1 $params "$work/borg::$2" "$1")
}
declare -A t
run() {  # TOOL: a fresh repository, the first image then the second, each cold
  case $1 in
    gstore) rm -rf "$work/gs"; "$G" --store "$work/gs" init >/dev/null
            cold; a=$(gstore_run img1 p:1); cold; b=$(gstore_run img2 p:2) ;;
    borg*)  rm -rf "$work/borg"; borg init --encryption none "$work/borg" >/dev/null 2>&1
            local params=""; [ "$1" = borg64k ] && params="--chunker-params buzhash,14,20,16,4095"
            cold; a=$(borg_run "$params" img1 a1); cold; b=$(borg_run "$params" img2 a2) ;;
  esac
  t[$1,1]+=" $a"; t[$1,2]+=" $b"
  echo "round $r $1: first dump $a s, second dump $b s"
}
tools=(gstore borg borg64k)
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order=("${tools[@]}"); else order=(borg64k borg gstore); fi
  for tool in "${order[@]}"; do run "$tool"; done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for i in 1 2; do
  bytes=$(du -sb --apparent-size "$work/img$i" | cut -f1)
  g=$(echo "${t[gstore,$i]}" | median)
  for b in borg borg64k; do
    m=$(echo "${t[$b,$i]}" | median)
    awk -v n="$bytes" -v g="$g" -v m="$m" -v i="$i" -v b="$b" 'BEGIN {
      printf "dump %d: gstore %.2f s (%.0f MB/s), %s %.2f s (%.0f MB/s): gstore %.2fx\n", i, g, n / g / 1e6, b, m, n / m / 1e6, m / g }'
  done
done
