#!/usr/bin/env bash
# A tensor-parallel tree on a 2-GPU machine (issue #67): tp_ranks.py (a parent holding no CUDA
# context and 2 NCCL ranks, rank r on cuda:r with MIB of weights, all-reducing in a loop)
# checkpointed and restored by hand (driver API through raw_cr.py + CRIU) and through gstore,
# then restored through gstore onto swapped GPUs (--gpu-map 0=1,1=0). Each restore is timed to
# the ranks' next verified all-reduce (both rank files past the dump's step, state ok).
# For each NCCL setting in TP_VARIANTS ("label:VAR=V,VAR=V ..."; default P2P, SHM and NVLS off,
# then SHM on, then P2P on), prints the times and their ratios and exits non-zero if a check
# fails. The job runs with USE_LIBUV=0 (PyTorch's libuv TCPStore holds an io_uring, which CRIU
# cannot dump). The raw CRIU gets --tcp-established for the ranks' NCCL and TCPStore
# connections; gstore adds it itself (every connection is between the tree's processes).
# TP_BACKEND=gloo runs the same on the CPU (no driver calls, no swapped GPUs), TP_PYTHON names
# the Python with torch (default python3).
# Usage: tests/gpu/tp.sh [GSTORE_BIN] [CRIU_BUNDLE_DIR] [MIB]
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$(realpath "${1:-.device/gstore}")
BUNDLE=$(realpath "${2:-.device/criu}")
MIB=${3:-3072}
HERE=$(realpath tests/gpu)
BACKEND=${TP_BACKEND:-nccl}
PY=${TP_PYTHON:-python3}
W=${TP_WORK:-/var/tmp/gstore-gpu-tp}
VARIANTS=${TP_VARIANTS:-"plain:NCCL_P2P_DISABLE=1,NCCL_SHM_DISABLE=1,NCCL_NVLS_ENABLE=0 shm:NCCL_P2P_DISABLE=1,NCCL_NVLS_ENABLE=0 p2p:NCCL_NVLS_ENABLE=0"}
rm -rf "$W"; mkdir -p "$W"
OUTFILE=${OUT:-$W}/tp.txt
: >"$OUTFILE"
say() { echo "$*" | tee -a "$OUTFILE"; }
fails=0
check() { if eval "$2"; then say "PASS  $1"; else say "FAIL  $1"; fails=$((fails+1)); return 1; fi; }
cat >"$W/criu" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH=$BUNDLE/usr/lib/x86_64-linux-gnu exec $BUNDLE/usr/sbin/criu "\$@"
WRAP
chmod +x "$W/criu"
say "$("$W/criu" --version | head -1); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); $(nvidia-smi -L 2>/dev/null | wc -l) GPUs"
export GSTORE_STORE="$W/store"
"$G" -q init >/dev/null
TCP=--tcp-established

now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# The lowest step of the two ranks; empty when a rank says anything but ok.
step() { awk '$2 != "ok" { bad = 1 } { s = (NR == 1 || $1 < s) ? $1 + 0 : s } END { if (!bad) print s }' "$OUT_DIR"/rank0 "$OUT_DIR"/rank1 2>/dev/null; }
# Waits (up to 2 min) until both ranks stepped past $1 with every all-reduce right.
past() { local s i; for i in $(seq 12000); do s=$(step); [ -z "$s" ] && return 1; [ "$s" -gt "$1" ] && return 0; sleep 0.01; done; return 1; }
gone() { local p i; for p in $PIDS; do for i in $(seq 600); do [ -d "/proc/$p" ] || break; sleep 0.05; done; [ -d "/proc/$p" ] && return 1; done; return 0; }
start() {  # start LABEL ENV -> OUT_DIR, PIDS (parent first), RANKS
  OUT_DIR="$W/$1"
  (env ${2//,/ } USE_LIBUV=0 setsid "$PY" "$HERE/tp_ranks.py" "$OUT_DIR" --mib "$MIB" --backend "$BACKEND" </dev/null >"$OUT_DIR.log" 2>&1 &)
  local i; for i in $(seq 1200); do [ -s "$OUT_DIR/pids" ] && break; sleep 0.1; done
  [ -s "$OUT_DIR/pids" ] || { say "FAIL  $1 did not start:"; tail -20 "$OUT_DIR.log" | tee -a "$OUTFILE"; return 1; }
  PIDS=$(cat "$OUT_DIR/pids"); RANKS=${PIDS#* }
  past 20
}
# The driver API by hand on each rank (raw_cr.py suspend|resume), where the ranks use GPUs.
gpu_calls() { [ "$BACKEND" = nccl ] || return 0; "$PY" "$HERE/raw_cr.py" "$1" $RANKS >/dev/null || say "      raw $1 failed"; }
stop() { kill -9 -- "-${PIDS%% *}" 2>/dev/null; gone; }
# Sets both rank files' steps to 0, in place (the restored ranks write them through descriptors
# CRIU reopens, and it checks their size), so that only the restored ranks' steps count.
unstep() { local f; for f in "$OUT_DIR"/rank0 "$OUT_DIR"/rank1; do printf '%020d' 0 | dd of="$f" conv=notrunc status=none; done; }

for variant in $VARIANTS; do
  label=${variant%%:*}; envs=${variant#*:}
  say "== $label ($envs), $MIB MiB per rank"
  # Raw: driver API by hand on each rank, CRIU on the tree.
  start "$label-raw" "$envs" || { fails=$((fails+1)); continue; }
  img="$W/$label-raw-img"; mkdir -p "$img"
  t0=$(now); gpu_calls suspend
  "$W/criu" dump -t "${PIDS%% *}" -D "$img" -o dump.log $TCP --ghost-limit 1G || tail -5 "$img/dump.log" | tee -a "$OUTFILE"
  t1=$(now); gone; at=$(step)
  "$W/criu" restore -D "$img" --restore-detached -o restore.log $TCP || tail -5 "$img/restore.log" | tee -a "$OUTFILE"
  gpu_calls resume
  past "$at"; ok=$?; t2=$(now)
  check "$label raw: the ranks reduce on after a restore by hand" "[ $ok = 0 ]"
  RAW_CK=$(dt "$t0" "$t1"); RAW_RS=$(dt "$t1" "$t2"); stop; rm -rf "$img"

  # gstore: checkpoint, restore, then a restore onto swapped GPUs.
  start "$label-gstore" "$envs" || { fails=$((fails+1)); continue; }
  t0=$(now); "$G" --json checkpoint --pid "${PIDS%% *}" --tag "tp-$label:1" --criu "$W/criu" >"$W/$label-ck.json" 2>"$W/$label-ck.err"
  ok=$?; t1=$(now)
  check "$label gstore checkpoint" "[ $ok = 0 ]" || tail -8 "$W/$label-ck.err" | tee -a "$OUTFILE"
  gone; at=$(step)
  t2=$(now); "$G" --json restore "tp-$label:1" --run --criu "$W/criu" >"$W/$label-rs.json" 2>"$W/$label-rs.err"
  past "$at"; ok=$?; t3=$(now)
  check "$label gstore restore: the ranks reduce on" "[ $ok = 0 ]" || tail -8 "$W/$label-rs.err" | tee -a "$OUTFILE"
  G_CK=$(dt "$t0" "$t1"); G_RS=$(dt "$t2" "$t3"); G_SW=-; stop; unstep
  [ "$BACKEND" = nccl ] && {
  t2=$(now); "$G" --json restore "tp-$label:1" --run --gpu-map 0=1,1=0 --criu "$W/criu" >"$W/$label-swap.json" 2>"$W/$label-swap.err"
  past "$at"; ok=$?; t3=$(now)
  check "$label gstore restore onto swapped GPUs: the ranks reduce on" "[ $ok = 0 ]" || tail -8 "$W/$label-swap.err" | tee -a "$OUTFILE"
  G_SW=$(dt "$t2" "$t3"); stop; }
  say "      checkpoint: raw $RAW_CK s, gstore $G_CK s ($(ratio "$G_CK" "$RAW_CK")x)"
  say "      restore to the next verified all-reduce: raw $RAW_RS s, gstore $G_RS s ($(ratio "$G_RS" "$RAW_RS")x), swapped GPUs $G_SW s"
done
say "$fails failed"
exit $((fails > 0))
