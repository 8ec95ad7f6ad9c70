#!/usr/bin/env bash
# VRAM load benchmark (issues #4, #13): images of GIB GiB of safetensors shards — random bits
# (stored raw) and N(0, 0.02) bf16 weights (float lanes, Huffman-coded) — loaded into GPU memory with
# `gstore load --device cuda:0` from a local store, against the pinned and pageable
# host->device copy rates and safetensors' load_file(device="cuda") of the same shards, all
# in the same run. Times are end to end: command start to exit, with every byte checked in VRAM.
# With GSTORE_NVCOMP set, zstd decodes on the GPU (opt-in: nvCOMP decodes valid input only);
# each load also runs once without it.
# With LOAD_BASE=OTHER_GSTORE_BIN the loads also run with that binary (e.g. the previous
# release). With COLD=1 the page cache is dropped before each timed load (and the disk's own
# read rate is printed). KINDS picks the images (default "raw bf16"). LOAD_INIT adds `gstore
# init` flags, e.g. --no-float-codec to store bf16 as zstd (which nvCOMP decodes on the GPU)
# rather than as float lanes, or --zstd-lanes to keep float lanes as zstd frames (with nvCOMP
# decoded by it, without it on the host) rather than Huffman-coded (decoded by gstore's kernel);
# every chunk is checked on the GPU either way.
# With MULTI=1 every image is also loaded onto all GPUs, split (`--device all`) and whole on
# each (`--device all --replicate`: the GB/s printed counts the image once, so multiply by the
# GPU count for the aggregate).
# With ENCRYPTED=1 the images are also pushed into an encrypted store (`init --encrypt`, a key
# file) and loaded from it after each plain load: the two rates side by side.
# With HOLD=1, `gstore hold` keeps every image in pinned memory and each is also loaded with
# `gstore load --held` (the first read back and checked); after the packs are damaged, a new
# holder's loads must fail too.
# Last, a byte in the middle of every pack is flipped: every load must then fail naming a
# corrupt chunk.
# Usage: tests/gpu/load_bench.sh [GSTORE_BIN] [GIB]
set -euo pipefail
cd "$(dirname "$0")/../.."
G=$(realpath "${1:-.device/gstore}")
GIB=${2:-8}
KINDS=${KINDS:-raw bf16}
W=${LOAD_WORK:-/var/tmp/gstore-load-bench}
rm -rf "$W"; mkdir -p "$W"
trap 'rm -rf "$W"' EXIT
export GSTORE_STORE="$W/store"
python3 tests/gpu/load_bench.py make "$W/data" "$GIB" $KINDS
"$G" -q init ${LOAD_INIT:-} >/dev/null
for kind in $KINDS; do
  t0=$(date +%s.%N)
  "$G" -q push "$W/data/$kind" --tag "$kind" >/dev/null
  echo "push $kind: $(awk -v a="$t0" -v b="$(date +%s.%N)" -v g="$GIB" 'BEGIN{printf "%.2f s, %.2f GB/s", b-a, g*1.073741824/(b-a)}')"
done
"$G" du | head -4
df -h "$W" | tail -1
enc() {  # CMD...: runs gstore CMD on the encrypted store
  env GSTORE_KEY_FILE="$W/key" GSTORE_STORE="$W/enc" "$G" "$@"
}
if [ "${ENCRYPTED:-0}" = 1 ]; then
  "$G" key generate "$W/key" >/dev/null
  enc -q init --encrypt ${LOAD_INIT:-} >/dev/null
  for kind in $KINDS; do
    t0=$(date +%s.%N)
    enc -q push "$W/data/$kind" --tag "$kind" >/dev/null
    echo "push $kind, encrypted: $(awk -v a="$t0" -v b="$(date +%s.%N)" -v g="$GIB" 'BEGIN{printf "%.2f s, %.2f GB/s", b-a, g*1.073741824/(b-a)}')"
  done
fi
cool() {
  if [ "${COLD:-0}" = 1 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; fi
}
warm() {  # reads every file under $1 once, into the page cache
  find "$1" -type f -exec cat {} + > /dev/null
}
hold() {  # starts `gstore hold` of every image at $W/hold.sock, waits until it holds them
  rm -f "$W/hold.log"
  "$G" -q hold $KINDS --socket "$W/hold.sock" 2>"$W/hold.log" &
  HOLDER=$!
  local t0; t0=$(date +%s.%N)
  until grep -q holding "$W/hold.log"; do
    kill -0 "$HOLDER" 2>/dev/null || { echo "FAIL: gstore hold: $(cat "$W/hold.log")"; exit 1; }
    sleep 0.1
  done
  echo "hold: ready after $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f s", b-a}'): $(cat "$W/hold.log")"
}
unhold() {  # stops the holder, printing its last loads (where their time went)
  kill "$HOLDER"; wait "$HOLDER" 2>/dev/null || true
  grep "loaded" "$W/hold.log" | tail -4 | cut -c1-200 || true
}
timed() {  # LABEL CMD...: runs CMD, prints its output and the wall time from start to exit
  local label=$1; shift
  local t0; t0=$(date +%s.%N)
  local out; out=$("$@" 2>&1) || { echo "FAIL: $label: $out"; exit 1; }
  local t1; t1=$(date +%s.%N)
  echo "$out" | sed "s/^/$label: /"
  echo "$label: end to end $(awk -v a="$t0" -v b="$t1" -v g="$GIB" 'BEGIN{printf "%.2f s, %.2f GB/s", b-a, g*1.073741824/(b-a)}')"
}
python3 tests/gpu/load_bench.py pinned
if [ "${HOLD:-0}" = 1 ]; then hold; fi
if [ "${COLD:-0}" = 1 ]; then
  cool; f=$(ls "$W"/data/*/shard-00.safetensors | head -1)
  echo "disk: $(dd if="$f" of=/dev/null bs=16M 2>&1 | tail -1)"
fi
for kind in $KINDS; do
  if [ "${COLD:-0}" = 1 ]; then cool; else warm "$W/data/$kind"; fi
  python3 tests/gpu/load_bench.py safetensors "$W/data/$kind"
  if [ "${COLD:-0}" = 1 ]; then cool; else warm "$W/store"; fi
  timed "$kind (first, read back and checked)" "$G" -q load "$kind" --device cuda:0 --check
  for i in 1 2; do
    cool; timed "$kind run $i" "$G" -q load "$kind" --device cuda:0
    if [ "${ENCRYPTED:-0}" = 1 ]; then
      if [ "${COLD:-0}" = 1 ]; then cool; else warm "$W/enc"; fi
      timed "$kind encrypted run $i" enc -q load "$kind" --device cuda:0
    fi
  done
  if [ "${ENCRYPTED:-0}" = 1 ]; then timed "$kind encrypted, read back and checked" enc -q load "$kind" --device cuda:0 --check; fi
  if [ -n "${GSTORE_NVCOMP:-}" ]; then
    cool; timed "$kind without nvCOMP" env GSTORE_NVCOMP=/nonexistent/libnvcomp.so.6 "$G" -q load "$kind" --device cuda:0
  fi
  if [ -n "${LOAD_BASE:-}" ]; then
    for i in 1 2; do cool; timed "$kind base run $i" "$LOAD_BASE" -q load "$kind" --device cuda:0; done
  fi
  if [ "${HOLD:-0}" = 1 ]; then
    timed "$kind held (first, read back and checked)" "$G" -q load "$kind" --device cuda:0 --held "$W/hold.sock" --check
    for i in 1 2 3; do timed "$kind held run $i" "$G" -q load "$kind" --device cuda:0 --held "$W/hold.sock"; done
  fi
  if [ "${MULTI:-0}" = 1 ]; then
    for i in 1 2; do cool; timed "$kind split over all GPUs, run $i" "$G" -q load "$kind" --device all; done
    for i in 1 2; do cool; timed "$kind whole on every GPU, run $i" "$G" -q load "$kind" --device all --replicate; done
  fi
done
if [ "${HOLD:-0}" = 1 ]; then unhold; fi
# A damaged chunk fails the load, naming it; nothing is reported as loaded.
python3 - "$W/store/packs" <<'PY'
import glob, os, sys
for p in glob.glob(os.path.join(sys.argv[1], "*", "*.pack")):
    with open(p, "r+b") as f:
        f.seek(os.path.getsize(p) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x55]))
PY
if [ "${HOLD:-0}" = 1 ]; then hold; fi
for kind in $KINDS; do
  if [ "${HOLD:-0}" = 1 ]; then
    if out=$("$G" -q load "$kind" --device cuda:0 --held "$W/hold.sock" 2>&1); then
      echo "FAIL: $kind loaded from a holder of damaged packs: $out"; exit 1
    fi
    case "$out" in
      *"corrupt chunk"*) echo "PASS: $kind held from damaged packs fails: $(echo "$out" | tail -1 | cut -c1-200)" ;;
      *) echo "FAIL: $kind held from damaged packs: unexpected error: $out"; exit 1 ;;
    esac
  fi
  # GPU decoding off (the default): the damaged chunk is named, nothing is loaded.
  if out=$(env -u GSTORE_NVCOMP "$G" -q load "$kind" --device cuda:0 2>&1); then
    echo "FAIL: $kind loaded from damaged packs: $out"; exit 1
  fi
  case "$out" in
    *"corrupt chunk"*) echo "PASS: $kind from damaged packs fails: $(echo "$out" | tail -1 | cut -c1-200)" ;;
    *) echo "FAIL: $kind from damaged packs: unexpected error: $out"; exit 1 ;;
  esac
  # With nvCOMP (opt-in, for trusted packs) the load must fail too, but nvCOMP decodes valid
  # input only: a damaged frame that passes the host's header checks may fault the GPU.
  if [ -n "${GSTORE_NVCOMP:-}" ]; then
    if out=$("$G" -q load "$kind" --device cuda:0 2>&1); then
      echo "FAIL: $kind loaded from damaged packs with nvCOMP: $out"; exit 1
    fi
    echo "with nvCOMP, damaged packs fail: $(echo "$out" | tail -1 | cut -c1-200)"
  fi
done
if [ "${HOLD:-0}" = 1 ]; then unhold; fi
