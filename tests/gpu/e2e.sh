#!/usr/bin/env bash
# GPU end-to-end test and benchmark of process checkpoints, for a machine with an NVIDIA GPU
# (driver >= 570), PyTorch, root, and the stripped gstore binary plus the CRIU bundle from
# scripts/criu-bundle.sh (see tests/gpu/README.md).
#
# Workloads (E2E_CASES, default "holder medium large"; also "qwen8b" and "map"):
#   holder  holder.py keeps HOLDER_GIB of seeded random tensors in VRAM and computes; its
#           answer to a request is the tensors' checksum, which must equal the one at start.
#   medium, large, qwen8b
#           serve.py of that size (GPT-2-medium/-large-shaped fp16, Qwen3-8B-shaped bf16;
#           random weights from a fixed seed) generating tokens; its answer to a request is a
#           deterministic greedy generation, which must equal the one computed at start.
#   map     holder.py, restored onto the same GPU through --gpu-map 0=0 and UUID=UUID.
#   swap    (two GPUs) holder.py with HOLDER_GIB spread over both GPUs and 1 GiB more on the
#           first: restored through the raw path onto the same GPUs and swapped (driver GPU
#           pairs), then through gstore with --gpu-map 0=1,1=0, by UUID, and 0=0,1=1; the GPU
#           that holds the extra GiB (nvidia-smi) must follow each map.
#   tree    holder.py with one worker process: two processes with HOLDER_GIB of VRAM each
#           (on GPU 0 and GPU 1 when there are two), both checkpointed and restored; each
#           one's answer must be its own checksum at start.
#   coop-medium, coop-large, coop-qwen8b
#           serve.py of that size whose weights come from a model image in the store
#           (SERVE_SAVE_AS stores it first) and are registered with gstore.serving: gstore's
#           checkpoints leave them out and its restores refill them from the store; the raw
#           path takes the whole process as always. Where instanttensor imports, the raw
#           tools' cooperative path is measured too (raw_coop: the process frees its weights,
#           driver API + CRIU by hand, then reloads them from a safetensors folder of the same
#           weights with InstantTensor), and gstore's lazy answers are given against it.
#   cputree tree with HOLDER_CPU_PARENT=1: the parent maps libcuda but holds no CUDA context
#           (as torchrun's parent does); only its worker is a GPU process, and the checkpoint
#           must say so (gpu_pids = the worker).
# Each workload is checkpointed with the raw path (driver API via ctypes + criu dump/restore
# to a plain directory), then with gstore (--leave-running, then a full checkpoint), killed,
# `gstore restore --run` (lazy, the default), killed and restored lazily again (following the
# restore profile the first restore stored), checkpointed again, and `gstore restore --run
# --no-lazy` (eager). Before each restore a request file is made; the time from the restore
# command's start to the process's verified answer is measured, and the process must run on
# under its pid. For medium a second replica with the same seed is checkpointed and must add
# <= 10 % of its image size to the store.
# Prints a table of raw vs gstore times and exits non-zero if a check fails.
# With E2E_GSTORE_ONLY=1 the coop cases measure gstore's paths only (no raw path).
# With E2E_ENCRYPT=1 the store is encrypted (`init --encrypt`, a key file). E2E_INIT_ARGS are
# passed to `gstore init` (e.g. "--min-saving 20", to see what decoding costs the lazy fill).
# Usage: tests/gpu/e2e.sh [GSTORE_BIN] [CRIU_BUNDLE_DIR] [HOLDER_GIB]
set -uo pipefail
cd "$(dirname "$0")/../.."
G=$(realpath "${1:-.device/gstore}")
BUNDLE=$(realpath "${2:-.device/criu}")
GIB=${3:-4}
CASES=${E2E_CASES:-holder medium large}
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
say "cases: $CASES (holder $GIB GiB); $(nproc) CPUs"
export GSTORE_STORE="$W/store"
if [ -n "${E2E_ENCRYPT:-}" ]; then
  # An encrypted store (docs/SECURITY.md): every gstore command below gets the key file.
  "$G" key generate "$W/store.key" >/dev/null
  export GSTORE_KEY_FILE="$W/store.key"
  "$G" -q init --encrypt ${E2E_INIT_ARGS:-} >/dev/null
  say "encrypted store"
else
  "$G" -q init ${E2E_INIT_ARGS:-} >/dev/null
fi

now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
js() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }
wait_file() { for _ in $(seq 600); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
wait_gone() { for _ in $(seq 300); do [ -d "/proc/$1" ] || return 0; sleep 0.05; done; return 1; }
counter() { cat "$1/counter" 2>/dev/null || echo 0; }
# DIR and the directories of its workers (holder.py with WORKERS > 0): each process's own.
procs() { echo "$1"; for w in "$1"/w*/; do [ -d "$w" ] && echo "${w%/}"; done; }
progressing() {
  local d i a=()
  for d in $(procs "$1"); do  # the first count the process writes (after ask removed it)
    for i in $(seq 1000); do [ -s "$d/counter" ] && break; sleep 0.01; done
    a+=("$(counter "$d")")
  done
  sleep 1.5
  local i=0; for d in $(procs "$1"); do
    if [ "$(counter "$d")" -le "${a[$i]}" ]; then  # says how it stands, for the failure
      sleep 5; say "      counter ($d): ${a[$i]}, after 1.5 s the same, 5 s later $(counter "$d"); state of $PID: $(awk '{print $3}' "/proc/$PID/stat" 2>/dev/null), wchan $(cat "/proc/$PID/wchan" 2>/dev/null)"
      return 1
    fi
    i=$((i+1))
  done
}
# The pids of DIR's process and its workers (holder.py writes DIR/pid).
tree_pids() { local d out=(); for d in $(procs "$1"); do [ -s "$d/pid" ] && out+=("$(cat "$d/pid")"); done; echo "${out[*]}"; }
wait_tree_gone() { local p; for p in $TREE; do wait_gone "$p" || return 1; done; }
kill_tree() { kill -9 -- "-$PID" 2>/dev/null; kill -9 "$PID" 2>/dev/null; wait_tree_gone; }
start() {  # start NAME SCRIPT ARGS... -> sets PID, DIR
  DIR="$W/$1"; mkdir -p "$DIR"; shift
  setsid python3 "$@" </dev/null >"$DIR.log" 2>&1 &
  PID=$!
  wait_file "$DIR/ready" || { say "FAIL  $DIR did not start"; cat "$DIR.log" | tee -a "$OUTFILE"; exit 1; }
  TREE=$(tree_pids "$DIR"); [ -n "$TREE" ] || TREE=$PID
  GTREE=$TREE  # the processes holding GPU state
}
checksum_ok() {  # checksum_ok DIR: ask each holder of the tree to recompute its checksum (SIGUSR1)
  local d; for d in $(procs "$1"); do
    rm -f "$d/checksum"; kill -USR1 "$(cat "$d/pid")"
    wait_file "$d/checksum" && [ "$(cat "$d/checksum")" = "$(cat "$d/ready")" ] || return 1
  done
}
# A request: DIR/ask (and one for each worker), answered by each process in its answer file,
# which must equal its expect file. Made before a restore, it removes the counters too: a
# process restored from an older checkpoint counts again from that checkpoint's count, below
# what its last incarnation wrote, so only the counts its restored self writes say whether it
# computes on.
ask() { local d; for d in $(procs "$1"); do rm -f "$d/answer" "$d/counter"; : >"$d/ask"; done; }
wait_answer() {  # polls every 10 ms, up to ~2 min
  local d i; for d in $(procs "$1"); do
    for i in $(seq 12000); do [ -s "$d/answer" ] && break; sleep 0.01; done
    [ -s "$d/answer" ] || return 1
  done
}
answer_ok() {
  local d; for d in $(procs "$1"); do
    [ -s "$d/answer" ] && [ "$(cat "$d/answer")" = "$(cat "$d/expect")" ] && continue
    say "      answer ($d): $(cat "$d/answer" 2>&1)"; say "      expect: $(cat "$d/expect" 2>&1)"; return 1
  done
}

# raw WORKLOAD DIR: the driver API and CRIU by hand, no gstore. Process ends dumped and back.
raw() {
  local name=$1 dir=$2 img="$W/raw-$1" t0 t1 t2 t3 t4 t5 t6 gpu
  mkdir -p "$img" "$img-live"
  # The app-resumed baseline: suspend, dump --leave-running, resume.
  t0=$(now); python3 "$HERE/raw_cr.py" suspend $GTREE >/dev/null || return 1
  "$W/criu" dump -t "$PID" -D "$img-live" -o dump.log --leave-running || { tail -5 "$img-live/dump.log"; return 1; }
  python3 "$HERE/raw_cr.py" resume $GTREE >/dev/null || return 1
  t1=$(now); RAW_LIVE_S=$(dt "$t0" "$t1"); rm -rf "$img-live"
  t0=$(now); python3 "$HERE/raw_cr.py" suspend $GTREE >/dev/null || return 1
  t1=$(now); "$W/criu" dump -t "$PID" -D "$img" -o dump.log || { tail -5 "$img/dump.log"; return 1; }
  t2=$(now); wait "$PID" 2>/dev/null; wait_tree_gone
  ask "$dir"
  t3=$(now); "$W/criu" restore -D "$img" --restore-detached -o restore.log || { tail -5 "$img/restore.log"; return 1; }
  t4=$(now); gpu=$(python3 "$HERE/raw_cr.py" resume $GTREE ${RAW_PAIRS:+--pairs "$RAW_PAIRS"}) || return 1
  t5=$(now); wait_answer "$dir"
  t6=$(now)
  RAW_CKPT="$(dt "$t0" "$t1") + $(dt "$t1" "$t2")"; RAW_CKPT_S=$(dt "$t0" "$t2")
  RAW_REST="criu $(dt "$t3" "$t4") + GPU $(dt "$t4" "$t5") [driver: $gpu]; $(answer_times "$dir" "$t3")"; RAW_REST_S=$(dt "$t3" "$t5")
  RAW_ANS_S=$(dt "$t3" "$t6")
  RAW_IMG=$(du -sb "$img" | cut -f1)
  rm -rf "$img"
}

# raw_coop NAME DIR: the raw tools' cooperative path (serve.py with SERVE_RAW_DIR): the process
# frees its weights (SIGUSR1), driver API + criu dump by hand; criu restore, driver restore,
# and the process reloads its weights with InstantTensor from the model folder (page cache
# warm) before it answers. Sets RAWCOOP_CKPT_S, RAWCOOP_ANS_S, RAWCOOP_IMG, RAWCOOP_REST.
raw_coop() {
  local name=$1 dir=$2 img="$W/rawcoop-$1" t0 t1 t2 t3 t4 t5 t6 gpu i
  mkdir -p "$img"; rm -f "$dir/released" "$dir/reloaded"
  t0=$(now); kill -USR1 "$PID"
  for i in $(seq 30000); do [ -e "$dir/released" ] && break; sleep 0.001; done
  [ -e "$dir/released" ] || return 1
  python3 "$HERE/raw_cr.py" suspend $GTREE >/dev/null || return 1
  t1=$(now); "$W/criu" dump -t "$PID" -D "$img" -o dump.log || { tail -5 "$img/dump.log"; return 1; }
  t2=$(now); wait "$PID" 2>/dev/null; wait_tree_gone
  ask "$dir"; : >"$dir/reload"
  t3=$(now); "$W/criu" restore -D "$img" --restore-detached -o restore.log || { tail -5 "$img/restore.log"; return 1; }
  t4=$(now); gpu=$(python3 "$HERE/raw_cr.py" resume $GTREE) || return 1
  t5=$(now); wait_answer "$dir"
  t6=$(now)
  RAWCOOP_CKPT_S=$(dt "$t0" "$t2"); RAWCOOP_ANS_S=$(dt "$t3" "$t6")
  RAWCOOP_REST="criu $(dt "$t3" "$t4") + GPU $(dt "$t4" "$t5") [driver: $gpu], reload $(awk '{printf "%.2f", $2 - $1}' "$dir/reloaded") s, $(answer_times "$dir" "$t3")"
  RAWCOOP_IMG=$(du -sb "$img" | cut -f1)
  rm -rf "$img"
}

# answer_times DIR T0: when the process began answering, seconds after T0, how long it took, and
# when the generation steps before it ended.
answer_times() { awk -v t0="$2" '{printf "answer began +%.2f s, took %.2f s (steps before it ended", $1 - t0, $2 - $1; for (i = 3; i <= NF; i++) printf " +%.3f", $i - t0; printf ")"}' "$1/answer.times" 2>/dev/null; }

# grestore NAME DIR TAG MODE: `gstore restore TAG --run` (MODE lazy; relazy: again, with the
# profile the first one stored) or with --no-lazy (MODE eager), a request made before it
# starts; sets ANS_<MODE> (seconds to the verified answer).
grestore() {
  local name=$1 dir=$2 tag=$3 mode=$4 flag= t0 t1 want=$4
  local img="$W/$name-$mode-img" json="$W/$name-$mode.json"
  [ "$mode" = eager ] && flag=--no-lazy
  [ "$mode" = relazy ] && want=lazy
  ask "$dir"
  # The answer is timed by a watcher started with the command: a restored process answers
  # while gstore may still be exiting (freeing the weights it prefetched), and that exit is
  # not the process's restore. The command's own wall time is reported beside it.
  rm -f "$W/$name-$mode.answered"
  (wait_answer "$dir" && now >"$W/$name-$mode.answered") &
  local watcher=$!
  t0=$(now)
  if ! "$G" --json restore "$tag" --run --to "$img" $flag ${GPU_MAP:+--gpu-map "$GPU_MAP"} --criu "$W/criu" >"$json" 2>"$W/$name-$mode.err"; then
    kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null
    say "FAIL  $name: gstore restore --run ($mode) failed:"
    tee -a "$OUTFILE" <"$W/$name-$mode.err"
    say "--- $json:"; tee -a "$OUTFILE" <"$json"
    say "--- tail of $img/restore.log:"; tail -40 "$img/restore.log" 2>&1 | tee -a "$OUTFILE"
    ls -la "$img" 2>&1 | tee -a "$OUTFILE"
    fails=$((fails+1)); return 1
  fi
  local tc; tc=$(now)
  wait "$watcher"
  t1=$(cat "$W/$name-$mode.answered" 2>/dev/null || now)
  eval "ANS_$mode=$(dt "$t0" "$t1")"
  eval "CMD_$mode=$(dt "$t0" "$tc")"
  say "  (gstore $mode json: $(tr -d '\n ' <"$json"))"
  say "  gstore $mode: $(answer_times "$dir" "$t0")"
  check "$name: $mode restore reports mode $want" "[ \"\$(js $json \"d['mode']\")\" = $want ]"
  [ "$mode" = relazy ] && check "$name: the second lazy restore followed the stored profile" "[ \"\$(js $json \"d['profile']\")\" = 'followed the stored profile' ]"
  check "$name: restored under its pid ($mode)" "[ \"\$(js $json \"d['pid']\")\" = $PID ]"
  check "$name: verified answer after the $mode restore" "answer_ok $dir"
  check "$name: computes on after the $mode restore" "progressing $dir"
  # A second request once the restore is long over: what an answer takes on the restored process.
  ask "$dir"; wait_answer "$dir" && say "  gstore $mode: a second request, $(answer_times "$dir" "$(cut -d' ' -f1 "$dir/answer.times")")"
  rm -rf "$img"
}

# With E2E_STAGING=1, gstore checkpoints write the image to a staging directory and push it
# from there (--staging) instead of streaming it from CRIU: the path before streaming.
staging() { [ -n "${E2E_STAGING:-}" ] && { rm -rf "$W/stage"; echo "--staging $W/stage"; }; }

# gstore_paths NAME DIR: leave-running checkpoint, full checkpoint, lazy restore --run, killed
# and restored lazily again (now with a profile), checkpoint again, eager restore --run.
gstore_paths() {
  local name=$1 dir=$2
  "$G" --json checkpoint --pid "$PID" --tag "$name:live" --leave-running --criu "$W/criu" $(staging) >"$W/$name-live.json" || return 1
  check "$name: runs on after a --leave-running checkpoint" "progressing $dir"
  "$G" --json checkpoint --pid "$PID" --tag "$name:full" --criu "$W/criu" $(staging) >"$W/$name-full.json" || return 1
  wait_tree_gone
  if grestore "$name" "$dir" "$name:full" lazy; then
    kill_tree
    grestore "$name" "$dir" "$name:full" relazy || return 1
    "$G" --json checkpoint --pid "$PID" --tag "$name:again" --criu "$W/criu" $(staging) >"$W/$name-again.json" || return 1
    wait_tree_gone
    grestore "$name" "$dir" "$name:again" eager || return 1
  else
    # The lazy restore failed: measure the eager one all the same, from the same checkpoint.
    kill_tree
    grestore "$name" "$dir" "$name:full" eager
    return 1
  fi
}

table_row() {  # NAME
  local n=$1
  local live="$W/$n-live.json" full="$W/$n-full.json" eager="$W/$n-eager.json" lazy mode
  local paused total push phases
  say "$n: image $(awk -v b="${RAW_IMG:-0}" 'BEGIN{printf "%.2f GB", b/1e9}') (raw)"
  say "  raw checkpoint      ${RAW_CKPT_S:-?} s (${RAW_CKPT:-?}: lock+checkpoint, criu dump)"
  say "  raw --leave-running (suspend, dump, resume): app paused ${RAW_LIVE_S:-?} s"
  if [ -s "$live" ]; then
    paused=$(js "$live" "round(d['paused_s'], 2)")
    say "  gstore --leave-running: app paused $paused s  ratio $(ratio "$paused" "${RAW_LIVE_S:-0}") x raw"
  fi
  if [ -s "$full" ]; then
    total=$(js "$full" "round(d['total_s'], 2)")
    push=$(js "$full" "round(d['push']['seconds'], 2)")
    phases=$(js "$full" "'lock %.2f + gpu %.2f + dump %.2f' % (d['capture']['timings']['lock_s'] or 0, d['capture']['timings']['gpu_checkpoint_s'] or 0, d['capture']['timings']['criu_dump_s'])")
    say "  gstore checkpoint   $total s ($phases, store $push)"
  fi
  say "  raw restore         answer ${RAW_ANS_S:-?} s; restored ${RAW_REST_S:-?} s (${RAW_REST:-?})"
  for mode in lazy relazy; do
    lazy="$W/$n-$mode.json"
    [ -s "$lazy" ] || continue
    phases=$(js "$lazy" "'setup %.2f + write %.2f + criu %.2f + gpu %.2f + unlock %.2f, the fill alongside, complete %.2f s after criu; total %.2f; %d faults, %.2f GB lazy; profile: %s' % (d['setup_s'], d['materialize_s'], d['restore']['timings']['criu_restore_s'], d['restore']['timings']['gpu_restore_s'] or 0, d['restore']['timings']['gpu_unlock_s'] or 0, d['fill']['fill_s'], d['total_s'], d['fill']['faults'], d['fill']['lazy_bytes'] / 1e9, d['profile'])")
    local ans cmd; eval "ans=\${ANS_$mode:-0}; cmd=\${CMD_$mode:-?}"
    say "  gstore $mode$( [ $mode = lazy ] && echo '  ' )     answer $ans s  ratio $(ratio "$ans" "${RAW_ANS_S:-0}") x raw (command $cmd s; $phases)"
  done
  if [ -s "$eager" ]; then
    phases=$(js "$eager" "'write %.2f + criu %.2f + gpu %.2f + unlock %.2f; total %.2f' % (d['materialize_s'], d['restore']['timings']['criu_restore_s'], d['restore']['timings']['gpu_restore_s'] or 0, d['restore']['timings']['gpu_unlock_s'] or 0, d['total_s'])")
    say "  gstore --no-lazy    answer ${ANS_eager:-?} s  ratio $(ratio "${ANS_eager:-0}" "${RAW_ANS_S:-0}") x raw (command ${CMD_eager:-?} s; $phases)"
  fi
}

reset_times() { unset RAW_PAIRS RAW_IMG RAW_CKPT RAW_CKPT_S RAW_LIVE_S RAW_REST RAW_REST_S RAW_ANS_S ANS_lazy ANS_relazy ANS_eager; }

# The UUID of the GPU on which PID uses the most memory (nvidia-smi).
busiest_gpu() {
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits |
    awk -F', ' -v p="$1" '$1 == p && $3 > m { m = $3; u = $2 } END { print u }'
}
# GPU memory of PID per GPU, for the log.
gpu_use() {
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits |
    awk -F', ' -v p="$1" '$1 == p { printf "%s %s MiB; ", $2, $3 }'
}

for c in $CASES; do
  reset_times
  if [ "$c" = swap ]; then
    if [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then say "SKIP  swap: needs two GPUs"; continue; fi
    HOLDER_MARK_GIB=1 start swap "$HERE/holder.py" "$GIB" "$W/swap"
    home=$(busiest_gpu "$PID")
    away=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | grep -v "$home" | head -1)
    say "swap: one process, $(gpu_use "$PID")the extra GiB on $home"
    raw swap "$W/swap" || { say "FAIL  raw path on swap"; fails=$((fails+1)); }
    check "swap: tensors intact after the raw path onto the same GPUs" "answer_ok $W/swap"
    say "swap: raw checkpoint $RAW_CKPT_S s ($RAW_CKPT); image $(awk -v b="${RAW_IMG:-0}" 'BEGIN{printf "%.2f GB", b/1e9}')"
    say "swap: raw restore onto the same GPUs: answer $RAW_ANS_S s ($RAW_REST)"
    RAW_SAME=$RAW_ANS_S
    RAW_PAIRS="$home=$away,$away=$home" raw swap "$W/swap" || { say "FAIL  raw swapped path"; fails=$((fails+1)); }
    check "swap: tensors intact after the raw path onto swapped GPUs" "answer_ok $W/swap"
    check "swap: the raw swapped restore moved the extra GiB to $away" "[ \"\$(busiest_gpu $PID)\" = $away ]"
    say "swap: raw restore onto swapped GPUs: answer $RAW_ANS_S s ($RAW_REST)"
    RAW_SWAP=$RAW_ANS_S
    at=$away
    for m in "0=1,1=0" "$home=$away,$away=$home" "0=0,1=1"; do
      case $m in 0=1,1=0) k=index; [ "$at" = "$home" ] && want=$away || want=$home ;;
                 0=0,1=1) k=same; want=$at ;;
                 *) k=uuid; [ "$at" = "$home" ] && want=$away || want=$home ;; esac
      base=$([ $k = same ] && echo "$RAW_SAME" || echo "$RAW_SWAP")
      "$G" --json checkpoint --pid "$PID" --tag "swap:$k" --criu "$W/criu" >"$W/swap-$k.json" || { say "FAIL  swap: checkpoint"; fails=$((fails+1)); break; }
      say "  gstore checkpoint $(js "$W/swap-$k.json" "round(d['total_s'], 2)") s (raw $RAW_CKPT_S s); GPUs recorded: $(js "$W/swap-$k.json" "len(d['capture'].get('gpus', []))")"
      wait_gone "$PID"
      GPU_MAP="$m" grestore "swap-$k" "$W/swap" "swap:$k" lazy || continue
      check "swap: tensors intact after restore --gpu-map $m (SIGUSR1 checksum)" "checksum_ok $W/swap"
      check "swap: the extra GiB is on $want after --gpu-map $m" "[ \"\$(busiest_gpu $PID)\" = $want ]"
      at=$(busiest_gpu "$PID")
      say "  gstore lazy --gpu-map $m: answer $ANS_lazy s  ratio $(ratio "$ANS_lazy" "$base") x raw ($(js "$W/swap-$k-lazy.json" "'gpu %.2f s' % (d['restore']['timings']['gpu_restore_s'] or 0)")); $(gpu_use "$PID")"
    done
    kill -9 "$PID" 2>/dev/null; wait_gone "$PID"
    continue
  fi
  if [ "$c" = map ]; then
    # Restore onto the same GPU through an explicit --gpu-map, by index and by UUID (as
    # nvidia-smi prints it, which must match what the capture recorded).
    start map "$HERE/holder.py" "$GIB" "$W/map"
    raw map "$W/map" || { say "FAIL  raw path on map"; fails=$((fails+1)); }
    check "map: tensors intact after the raw path" "answer_ok $W/map"
    say "map: raw restore answer ${RAW_ANS_S:-?} s (${RAW_REST:-?})"
    uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
    for m in "0=0" "$uuid=$uuid"; do
      k=$([ "$m" = 0=0 ] && echo index || echo uuid)
      "$G" --json checkpoint --pid "$PID" --tag "map:$k" --criu "$W/criu" >"$W/map-$k.json" || { say "FAIL  map: checkpoint"; fails=$((fails+1)); break; }
      wait_gone "$PID"
      GPU_MAP="$m" grestore "map-$k" "$W/map" "map:$k" lazy || continue
      check "map: tensors intact after restore --gpu-map $m (SIGUSR1 checksum)" "checksum_ok $W/map"
      say "  gstore lazy --gpu-map $m: answer $ANS_lazy s  ratio $(ratio "$ANS_lazy" "${RAW_ANS_S:-0}") x raw ($(js "$W/map-$k-lazy.json" "'gpu %.2f s' % (d['restore']['timings']['gpu_restore_s'] or 0)"))"
    done
    kill -9 "$PID" 2>/dev/null; wait_gone "$PID"
    continue
  fi
  if [ "$c" = holder ] || [ "$c" = tree ] || [ "$c" = cputree ]; then
    # GPU memory must come back intact (tree: in both processes).
    HOLDER_CPU_PARENT=$([ "$c" = cputree ] && echo 1) start "$c" "$HERE/holder.py" "$GIB" "$W/$c" "$([ "$c" = holder ] && echo 0 || echo 1)"
    [ "$c" = cputree ] && GTREE=$(echo "$TREE" | tr ' ' '\n' | grep -vx "$PID" | tr '\n' ' ' | sed 's/ $//')
    say "$c: GPU processes $GTREE (of $TREE)"
    raw "$c" "$W/$c" || { say "FAIL  raw path on $c"; fails=$((fails+1)); }
    check "$c: tensors intact after the raw path (answer = checksum at start)" "answer_ok $W/$c"
    gstore_paths "$c" "$W/$c" || { say "FAIL  gstore path on $c"; fails=$((fails+1)); }
    check "$c: the checkpoint names every GPU process and no other ($GTREE)" "[ \"\$(js $W/$c-full.json \"' '.join(map(str, d['capture']['gpu_pids']))\")\" = '$GTREE' ]"
    check "$c: tensors intact after gstore restore --run (SIGUSR1 checksum)" "checksum_ok $W/$c"
    table_row "$c"
    kill_tree
    continue
  fi
  n=serve-$c
  if [ "${c#coop-}" != "$c" ]; then
    size=${c#coop-}
    t0=$(now)
    # The model folder of the raw cooperative path, beside the model image (InstantTensor).
    rawdir=
    [ -z "${E2E_GSTORE_ONLY:-}" ] && python3 -c 'import instanttensor' 2>/dev/null && rawdir="$W/$n-folder"
    SERVE_RAW_DIR=$rawdir SERVE_SAVE_AS="model:$size" python3 "$HERE/serve.py" "$W/$n-save" 7 "$size" >"$W/$n-save.log" 2>&1 || { say "FAIL  $n: storing the model image"; tail -20 "$W/$n-save.log" | tee -a "$OUTFILE"; fails=$((fails+1)); continue; }
    say "$n: model image model:$size stored in $(dt "$t0" "$(now)") s${rawdir:+ (and a safetensors folder for the raw cooperative path)}"
    t0=$(now); SERVE_RAW_DIR=$rawdir SERVE_WEIGHTS_FROM="model:$size" start "$n" "$HERE/serve.py" "$W/$n" 7 "$size"
    say "$n: $(cat "$W/$n/ready") parameters, started in $(dt "$t0" "$(now)") s ($(grep -h 'weights loaded' "$W/$n.log"))"
    ask "$W/$n"; wait_answer "$W/$n"
    check "$n: answers deterministically before any checkpoint" "answer_ok $W/$n"
    say "$n: before any checkpoint, $(answer_times "$W/$n" "$(cut -d' ' -f1 "$W/$n/answer.times")")"
    # gstore's paths first: the raw cooperative path reloads the weights by other means (their
    # versions change), after which gstore.serving rightly keeps them in the image.
    gstore_paths "$n" "$W/$n" || { say "FAIL  gstore path on $n"; fails=$((fails+1)); }
    if [ -n "$rawdir" ]; then
      raw_coop "$n" "$W/$n" || { say "FAIL  raw cooperative path on $n"; fails=$((fails+1)); }
      check "$n: verified answer after the raw cooperative path" "answer_ok $W/$n"
      say "$n: raw cooperative path (free the weights, driver API + criu by hand, InstantTensor reload): checkpoint ${RAWCOOP_CKPT_S:-?} s, image $(awk -v b="${RAWCOOP_IMG:-0}" 'BEGIN{printf "%.2f GB", b/1e9}'); restore: answer ${RAWCOOP_ANS_S:-?} s (${RAWCOOP_REST:-?})"
      rm -rf "$rawdir"
    else
      say "$n: no instanttensor here: the raw cooperative path is not measured"
    fi
    if [ -z "${E2E_GSTORE_ONLY:-}" ]; then
      raw "$n" "$W/$n" || { say "FAIL  raw path on $n"; fails=$((fails+1)); }
      check "$n: verified answer after the raw restore" "answer_ok $W/$n"
    fi
    table_row "$n"
    for k in live full; do
      [ -s "$W/$n-$k.json" ] && say "  gstore $k: weights $(js "$W/$n-$k.json" "d.get('weights')"), image $(js "$W/$n-$k.json" "round(d['push']['logical_bytes'] / 1e9, 2)") GB"
    done
    for k in lazy relazy eager; do
      [ -s "$W/$n-$k.json" ] && say "  gstore $k restore: weights refilled $(js "$W/$n-$k.json" "d.get('weights_refill_s')") s after the GPU state (prefetched and offered $(js "$W/$n-$k.json" "d.get('weights_prefetch_s')") s after the command's start)"
    done
    [ -n "${RAWCOOP_ANS_S:-}" ] && for k in lazy relazy; do
      eval "a=\${ANS_$k:-}"; [ -n "$a" ] && say "  gstore $k answer $a s  ratio $(ratio "$a" "$RAWCOOP_ANS_S") x the raw cooperative path ($RAWCOOP_ANS_S s)"
    done
    unset RAWCOOP_ANS_S
    check "$n: the checkpoint left the weights out" "[ \"\$(js $W/$n-full.json \"(d.get('weights') or {}).get('processes')\")\" = 1 ]"
    kill -9 "$PID" 2>/dev/null; wait_gone "$PID"
    continue
  fi
  t0=$(now); start "$n" "$HERE/serve.py" "$W/$n" 7 "$c"
  say "$n: $(cat "$W/$n/ready") parameters, loaded in $(dt "$t0" "$(now)") s"
  ask "$W/$n"; wait_answer "$W/$n"
  check "$n: answers deterministically before any checkpoint" "answer_ok $W/$n"
  raw "$n" "$W/$n" || { say "FAIL  raw path on $n"; fails=$((fails+1)); }
  check "$n: verified answer after the raw restore" "answer_ok $W/$n"
  check "$n: computes on after the raw restore" "progressing $W/$n"
  gstore_paths "$n" "$W/$n" || { say "FAIL  gstore path on $n"; fails=$((fails+1)); }
  table_row "$n"
  if [ "$c" = medium ]; then
    # Dedup between two replicas of one model.
    SERVE1=$PID
    start serve2 "$HERE/serve.py" "$W/serve2" 7 "$c"
    "$G" --json checkpoint --pid "$PID" --tag serve2:live --leave-running --criu "$W/criu" >"$W/serve2.json"
    added=$(js "$W/serve2.json" "round(d['push']['new_stored_bytes'] / d['push']['logical_bytes'], 4)")
    say "second replica adds $added of its image size ($(js "$W/serve2.json" "d['push']['new_stored_bytes']") of $(js "$W/serve2.json" "d['push']['logical_bytes']") bytes)"
    check "second replica adds <= 10 %" "awk -v a=$added 'BEGIN{exit !(a <= 0.10)}'"
    kill -9 "$PID" 2>/dev/null; wait_gone "$PID"
    PID=$SERVE1
  fi
  kill -9 "$PID" 2>/dev/null; wait_gone "$PID"
done
"$G" du | tee -a "$OUTFILE"
check "store verifies clean" "'$G' -q verify --read-data >/dev/null"
say "$fails failed"
rm -rf "$W/store"
[ "$fails" = 0 ]
