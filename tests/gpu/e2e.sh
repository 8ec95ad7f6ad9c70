#!/usr/bin/env bash
# GPU end-to-end test and benchmark of process checkpoints, for a machine with an NVIDIA GPU
# (driver >= 570), PyTorch, root, and the stripped gstore binary plus the CRIU bundle from
# ../shared/device/criu-bundle.sh (see tests/gpu/README.md).
#
# 1. holder.py keeps 4 GiB of seeded random tensors in VRAM and computes. It is checkpointed
#    with the raw path (driver API via ctypes + criu dump/restore to a plain directory), then
#    with gstore (--leave-running, then a full checkpoint), killed, `gstore restore --run`,
#    and its tensors' checksum and progress are checked after each restore.
# 2. serve.py (a GPT-2-medium-sized fp16 decoder, random weights from a fixed seed) goes
#    through the same raw and gstore paths; then a second replica with the same seed is
#    checkpointed and must add <= 10 % of its image size to the store.
# Prints a table of raw vs gstore times and exits non-zero if a check fails.
# Usage: tests/gpu/e2e.sh [GSTORE_BIN] [CRIU_BUNDLE_DIR] [HOLDER_GIB]
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$(realpath "${1:-.device/gstore}")
BUNDLE=$(realpath "${2:-.device/criu}")
GIB=${3:-4}
HERE=$(realpath tests/gpu)
W=${E2E_WORK:-/var/tmp/gstore-gpu-e2e}
rm -rf "$W"; mkdir -p "$W"
OUTFILE=${OUT:-$W}/e2e.txt
: >"$OUTFILE"
say() { echo "$*" | tee -a "$OUTFILE"; }
fails=0
check() { if eval "$2"; then say "PASS  $1"; else say "FAIL  $1"; fails=$((fails+1)); fi; }

cat >"$W/criu" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH=$BUNDLE/usr/lib/x86_64-linux-gnu exec $BUNDLE/usr/sbin/criu "\$@"
WRAP
chmod +x "$W/criu"
"$W/criu" --version | head -1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUTFILE"
export GSTORE_STORE="$W/store"
"$G" -q init >/dev/null

now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
js() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }
wait_file() { for _ in $(seq 600); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
wait_gone() { for _ in $(seq 300); do [ -d "/proc/$1" ] || return 0; sleep 0.05; done; return 1; }
counter() { cat "$1/counter" 2>/dev/null || echo 0; }
progressing() { local a; a=$(counter "$1"); sleep 1.5; [ "$(counter "$1")" -gt "$a" ]; }
start() {  # start NAME SCRIPT ARGS... -> sets PID, DIR
  DIR="$W/$1"; mkdir -p "$DIR"; shift
  setsid python3 "$@" </dev/null >"$DIR.log" 2>&1 &
  PID=$!
  wait_file "$DIR/ready" || { say "FAIL  $DIR did not start"; cat "$DIR.log"; exit 1; }
}
checksum_ok() {  # checksum_ok DIR PID: ask the holder to recompute its checksum
  rm -f "$1/checksum"; kill -USR1 "$2"; wait_file "$1/checksum" && [ "$(cat "$1/checksum")" = "$(cat "$1/ready")" ]
}

# raw WORKLOAD DIR: the driver API and CRIU by hand, no gstore. Process ends dumped and back.
raw() {
  local name=$1 dir=$2 img="$W/raw-$1" t0 t1 t2 t3 t4
  mkdir -p "$img" "$img-live"
  # The app-resumed baseline: suspend, dump --leave-running, resume.
  t0=$(now); python3 "$HERE/raw_cr.py" suspend "$PID" >/dev/null || return 1
  "$W/criu" dump -t "$PID" -D "$img-live" -o dump.log --leave-running || { tail -5 "$img-live/dump.log"; return 1; }
  python3 "$HERE/raw_cr.py" resume "$PID" >/dev/null || return 1
  t1=$(now); RAW_LIVE_S=$(dt "$t0" "$t1"); rm -rf "$img-live"
  t0=$(now); python3 "$HERE/raw_cr.py" suspend "$PID" >/dev/null || return 1
  t1=$(now); "$W/criu" dump -t "$PID" -D "$img" -o dump.log || { tail -5 "$img/dump.log"; return 1; }
  t2=$(now); wait "$PID" 2>/dev/null; wait_gone "$PID"
  t3=$(now); "$W/criu" restore -D "$img" --restore-detached -o restore.log || { tail -5 "$img/restore.log"; return 1; }
  t4=$(now); python3 "$HERE/raw_cr.py" resume "$PID" >/dev/null || return 1
  local t5; t5=$(now)
  RAW_CKPT="$(dt "$t0" "$t1") + $(dt "$t1" "$t2")"; RAW_CKPT_S=$(dt "$t0" "$t2")
  RAW_REST="$(dt "$t3" "$t4") + $(dt "$t4" "$t5")"; RAW_REST_S=$(dt "$t3" "$t5")
  RAW_IMG=$(du -sb "$img" | cut -f1)
  rm -rf "$img"
}

# gstore_paths NAME DIR: leave-running checkpoint, full checkpoint, restore --run.
gstore_paths() {
  local name=$1 dir=$2
  "$G" --json checkpoint --pid "$PID" --tag "$name:live" --leave-running --criu "$W/criu" >"$W/$name-live.json" || return 1
  check "$name: runs on after a --leave-running checkpoint" "progressing $dir"
  "$G" --json checkpoint --pid "$PID" --tag "$name:full" --criu "$W/criu" >"$W/$name-full.json" || return 1
  wait_gone "$PID"
  local before; before=$(counter "$dir")
  "$G" --json restore "$name:full" --run --criu "$W/criu" >"$W/$name-run.json" || return 1
  local pid2; pid2=$(js "$W/$name-run.json" "d['pid']")
  check "$name: restored under its pid" "[ $pid2 = $PID ]"
  check "$name: computes on from where it stopped" "progressing $dir && [ \$(counter $dir) -gt $before ]"
}

table_row() {  # NAME
  local n=$1
  local live="$W/$n-live.json" full="$W/$n-full.json" run="$W/$n-run.json"
  local paused total push rest
  paused=$(js "$live" "round(d['paused_s'], 2)")
  total=$(js "$full" "round(d['total_s'], 2)")
  push=$(js "$full" "round(d['push']['seconds'], 2)")
  rest=$(js "$run" "round(d['total_s'], 2)")
  local mat; mat=$(js "$run" "round(d['materialize_s'], 2)")
  local phases; phases=$(js "$full" "'lock %.2f + gpu %.2f + dump %.2f' % (d['capture']['timings']['lock_s'] or 0, d['capture']['timings']['gpu_checkpoint_s'] or 0, d['capture']['timings']['criu_dump_s'])")
  local rphases; rphases=$(js "$run" "'write %.2f + criu %.2f + gpu %.2f + unlock %.2f' % (d['materialize_s'], d['restore']['timings']['criu_restore_s'], d['restore']['timings']['gpu_restore_s'] or 0, d['restore']['timings']['gpu_unlock_s'] or 0)")
  say "$n: image $(awk -v b="$RAW_IMG" 'BEGIN{printf "%.2f GB", b/1e9}')"
  say "  raw checkpoint      $RAW_CKPT_S s ($RAW_CKPT: lock+checkpoint, criu dump)"
  say "  raw --leave-running (suspend, dump, resume): app paused $RAW_LIVE_S s"
  say "  gstore --leave-running: app paused $paused s  ratio $(awk -v a="$paused" -v b="$RAW_LIVE_S" 'BEGIN{printf "%.2f", a/b}') x raw"
  say "  gstore checkpoint   $total s ($phases, store $push)"
  say "  raw restore         $RAW_REST_S s ($RAW_REST: criu restore, GPU restore+unlock)"
  say "  gstore restore --run $rest s ($rphases)  ratio $(awk -v a="$rest" -v b="$RAW_REST_S" 'BEGIN{printf "%.2f", a/b}') x raw restore"
}

# 1. holder: GPU memory must come back intact.
start holder "$HERE/holder.py" "$GIB" "$W/holder"
raw holder "$W/holder" || { say "FAIL  raw path on holder"; fails=$((fails+1)); }
check "holder: tensors intact after the raw path" "checksum_ok $W/holder $PID"
gstore_paths holder "$W/holder" || { say "FAIL  gstore path on holder"; fails=$((fails+1)); }
check "holder: tensors intact after gstore restore --run" "checksum_ok $W/holder $PID"
table_row holder
kill -9 "$PID" 2>/dev/null; wait_gone "$PID"

# 2. serving replicas: timings, and dedup between two replicas of one model.
start serve "$HERE/serve.py" "$W/serve" 7
raw serve "$W/serve" || { say "FAIL  raw path on serve"; fails=$((fails+1)); }
gstore_paths serve "$W/serve" || { say "FAIL  gstore path on serve"; fails=$((fails+1)); }
table_row serve
SERVE1=$PID
start serve2 "$HERE/serve.py" "$W/serve2" 7
"$G" --json checkpoint --pid "$PID" --tag serve2:live --leave-running --criu "$W/criu" >"$W/serve2.json"
added=$(js "$W/serve2.json" "round(d['push']['new_stored_bytes'] / d['push']['logical_bytes'], 4)")
say "second replica adds $added of its image size ($(js "$W/serve2.json" "d['push']['new_stored_bytes']") of $(js "$W/serve2.json" "d['push']['logical_bytes']") bytes)"
check "second replica adds <= 10 %" "awk -v a=$added 'BEGIN{exit !(a <= 0.10)}'"
kill -9 "$PID" "$SERVE1" 2>/dev/null
"$G" du | tee -a "$OUTFILE"
check "store verifies clean" "'$G' -q verify --read-data >/dev/null"
say "$fails failed"
rm -rf "$W/store"
[ "$fails" = 0 ]
