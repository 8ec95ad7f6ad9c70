#!/usr/bin/env bash
# Process restore benchmark on this machine (CPU, real CRIU, root), with the raw paths measured
# in the same run: a process holding GIB of seeded memory (benches/cpu_holder.py: half
# pseudo-random, half compressible text) is dumped and restored ROUNDS times each way:
#   raw:    criu dump -D DIR, then criu restore -D DIR --restore-detached (DIR page-cache warm)
#   lazy:   the same dump, restored with CRIU's own `criu lazy-pages` daemon serving DIR
#           (`criu restore --lazy-pages`): the process runs while the daemon fills its memory
#   gstore: gstore checkpoint --pid, then gstore restore IMAGE --run (store page-cache warm):
#           lazy (the default: gstore serves the memory from the store while the process
#           runs) and eager (--no-lazy: the whole image written out before criu restore)
# For each restore: seconds until the process answers a request (made before the restore
# starts), and until all its memory is back (eager paths: when the restore command returns;
# lazy: when the daemon exits, or gstore returns); the memory's checksum is checked after every
# restore. Prints each round and the medians, with ratios against raw.
# HOLDER_ARGS=arrays PYTHON=(a python with NumPy): the holder keeps float and integer arrays and
# reads all its memory before it answers (issue #48), so its first answer needs every page.
# INIT_ARGS are passed to `gstore init` (e.g. "--min-saving 30").
# Usage: benches/process_restore.sh [GIB (default 2)] [ROUNDS (default 3)] [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
gib=${1:-2}
rounds=${2:-3}
work=${3:-$(mktemp -d /var/tmp/gstore-proc-bench.XXXXXX)}
cargo build --release -q -p gstore-cli
G="$GSTORE_BIN"
CRIU=$(command -v criu || echo /opt/criu/sbin/criu)
mkdir -p "$work"
export GSTORE_STORE="$work/store"
"$G" -q init ${INIT_ARGS:-} >/dev/null
pid=""
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
median() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
wait_file() { for _ in $(seq 1200); do [ -s "$1" ] && return 0; sleep 0.05; done; echo "no $1" >&2; return 1; }
wait_gone() { for _ in $(seq 600); do [ -d "/proc/$1" ] || return 0; sleep 0.02; done; echo "pid $1 still there" >&2; return 1; }
js() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@"; }
ask() { rm -f "$work/app/pong"; touch "$work/app/ask"; }  # a request, answered once the process runs
answered() { wait_file "$work/app/pong"; secs "$1" "$(now)"; }  # seconds from $1 until the answer
intact() {
  rm -f "$work/app/checksum"; kill -USR1 "$pid"; wait_file "$work/app/checksum"
  [ "$(cat "$work/app/checksum")" = "$(cat "$work/app/ready")" ] || { echo "memory differs after restore" >&2; exit 1; }
}

mkdir -p "$work/app"
# Started through a shell that exits at once, so the holder is re-parented to PID 1 (as a
# daemon would be) and is gone, not a zombie of ours, once a dump ends it.
sh -c 'setsid "$0" "$1" "$2" "$3" ${6:+"$6"} </dev/null >"$4" 2>&1 & echo $! >"$5"' \
  "${PYTHON:-python3}" benches/cpu_holder.py "$gib" "$work/app" "$work/app.log" "$work/pid" "${HOLDER_ARGS:-}"
pid=$(cat "$work/pid")
wait_file "$work/app/ready"
echo "holder: pid $pid, $(awk -v k="$(grep VmRSS /proc/$pid/status | awk '{print $2}')" 'BEGIN{printf "%.2f GB", k*1024/1e9}') resident"

raw_dump() {  # a plain CRIU dump of the holder into $work/raw (which ends it)
  img="$work/raw"; rm -rf "$img"; mkdir -p "$img"
  "$CRIU" dump -t "$pid" -D "$img" -o dump.log || { tail -5 "$img/dump.log"; exit 1; }
  wait_gone "$pid"
}

raw_all=""; raw_ans=""; l_ret=""; l_ans=""; l_all=""; g_all=""; g_ans=""; g_write=""; g_criu=""; g_fill=""
e_all=""; e_ans=""
for r in $(seq "$rounds"); do
  raw_dump
  ask; t0=$(now); "$CRIU" restore -D "$img" --restore-detached -o restore.log || { tail -5 "$img/restore.log"; exit 1; }
  all=$(secs "$t0" "$(now)"); ans=$(answered "$t0"); intact
  raw_all+=" $all"; raw_ans+=" $ans"
  echo "round $r raw:         all memory back $all s, answered $ans s (image $(du -sb "$img" | awk '{printf "%.2f GB", $1/1e9}'))"

  raw_dump
  ask; t0=$(now)
  "$CRIU" lazy-pages -D "$img" -o lazy-pages.log &
  daemon=$!
  for _ in $(seq 500); do [ -S "$img/lazy-pages.socket" ] && break; sleep 0.01; done
  "$CRIU" restore -D "$img" --lazy-pages --restore-detached -o restore.log || { tail -5 "$img/restore.log"; exit 1; }
  ret=$(secs "$t0" "$(now)"); ans=$(answered "$t0")
  wait "$daemon" || { tail -5 "$img/lazy-pages.log"; exit 1; }
  all=$(secs "$t0" "$(now)"); intact
  l_ret+=" $ret"; l_ans+=" $ans"; l_all+=" $all"
  echo "round $r criu lazy:   restore returned $ret s, answered $ans s, all memory back $all s"
  rm -rf "$img"

  "$G" --json checkpoint --pid "$pid" --tag "proc:$r" --criu "$CRIU" >"$work/ckpt.json"
  wait_gone "$pid"
  ask; t0=$(now); "$G" --json restore "proc:$r" --run --criu "$CRIU" >"$work/run.json" &
  runner=$!
  ans=$(answered "$t0"); wait "$runner"; all=$(secs "$t0" "$(now)"); intact
  [ "$(js "$work/run.json" "d['mode']")" = lazy ] || { echo "gstore restored eagerly: $(js "$work/run.json" "d['eager_reason']")" >&2; exit 1; }
  w=$(js "$work/run.json" "round(d['materialize_s'], 2)"); c=$(js "$work/run.json" "round(d['restore']['timings']['criu_restore_s'], 2)")
  f=$(js "$work/run.json" "round(d['fill']['fill_s'], 2)")
  g_all+=" $all"; g_ans+=" $ans"; g_write+=" $w"; g_criu+=" $c"; g_fill+=" $f"
  echo "round $r gstore lazy: answered $ans s, all memory back $all s (write-out $w + criu $c + fill $f)"

  "$G" --json checkpoint --pid "$pid" --tag "proc:$r-e" --criu "$CRIU" >"$work/ckpt.json"
  wait_gone "$pid"
  ask; t0=$(now); "$G" --json restore "proc:$r-e" --run --no-lazy --criu "$CRIU" >"$work/run.json"
  all=$(secs "$t0" "$(now)"); ans=$(answered "$t0"); intact
  e_all+=" $all"; e_ans+=" $ans"
  echo "round $r gstore eager: all memory back $all s, answered $ans s"
done

mr=$(echo "$raw_all" | median); ma=$(echo "$raw_ans" | median)
ga=$(echo "$g_ans" | median); gl=$(echo "$g_all" | median)
ea=$(echo "$e_ans" | median); el=$(echo "$e_all" | median)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
echo "medians of $rounds rounds, $gib GiB holder, $(nproc) cores:"
echo "  raw criu restore:         answers $ma s, all memory back $mr s"
echo "  criu lazy-pages:          returns $(echo "$l_ret" | median) s, answers $(echo "$l_ans" | median) s, all memory back $(echo "$l_all" | median) s"
echo "  gstore restore --run:     answers $ga s, all memory back $gl s (write-out $(echo "$g_write" | median) + criu $(echo "$g_criu" | median) + fill $(echo "$g_fill" | median))"
echo "  gstore --run --no-lazy:   answers $ea s, all memory back $el s"
echo "  gstore lazy / raw:        $(ratio "$ga" "$ma") x to the first answer, $(ratio "$gl" "$mr") x to all memory"
echo "  gstore eager / raw:       $(ratio "$ea" "$ma") x to the first answer, $(ratio "$el" "$mr") x to all memory"
