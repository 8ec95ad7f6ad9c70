#!/usr/bin/env bash
# runc container restores to the first answer (issue #46): a runc container holding MIB MiB
# (default 1024) of known memory (tests/containers/counter.c: it counts every 50 ms, checks one
# page per count and all of it every 20) is checkpointed into a local store with
# `gstore checkpoint --container --runtime runc`, and by `runc checkpoint` into a directory on
# disk (the baseline, page cache warm). Each of ROUNDS rounds (default 3) restores it three ways
# and times each from the command's start to the container's first count, and to the count
# after its first full self-check (every page read):
#   runc   `runc restore --detach` from the directory
#   lazy   `gstore restore TAG --container` (memory served from the store while it runs)
#   eager  `gstore restore TAG --container --no-lazy` (CRIU's images written out first)
# Run as root with runc and CRIU >= 4 (scripts/setup.sh).
# Usage: benches/runc_restore.sh [MIB] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mib=${1:-1024}
rounds=${2:-3}
CRIU=${CRIU:-/opt/criu/sbin/criu}
export PATH=$(dirname "$CRIU"):$PATH
G="$GSTORE_BIN"
work=$(mktemp -d /var/tmp/gstore-runc-restore.XXXXXX)
id=gstore-bench-runc-$$
trap 'runc delete -f $id >/dev/null 2>&1; rm -rf "$work"' EXIT

mkdir -p "$work/bundle/rootfs/state" "$work/state"
cc -O2 -static -o "$work/bundle/rootfs/counter" tests/containers/counter.c
(cd "$work/bundle" && runc spec)
python3 - "$work" "$mib" <<'EOF'
import json, sys
work, mib = sys.argv[1], sys.argv[2]
p = f"{work}/bundle/config.json"
c = json.load(open(p))
c["process"]["terminal"] = False
c["process"]["args"] = ["/counter", mib]
c["root"]["readonly"] = True
c["mounts"].append({"destination": "/state", "type": "bind", "source": f"{work}/state", "options": ["rbind", "rw"]})
json.dump(c, open(p, "w"))
EOF
count() { cat "$work/state/count" 2>/dev/null || echo 0; }
start() { (cd "$work/bundle" && runc run -d "$id" </dev/null >/dev/null 2>&1); }
wait_above() { # wait_above N: until the count passes N
  while [ "$(count)" -le "$1" ] 2>/dev/null; do
    case "$(count)" in BAD*) echo "FAIL: the counter found its memory wrong: $(count)"; exit 1 ;; esac
    sleep 0.005
  done
}
start
wait_above 25
"$G" --store "$work/store" -q init >/dev/null
runc checkpoint --image-path "$work/raw" --work-path "$work/raw-work" --leave-running "$id"
"$G" --store "$work/store" -q --json checkpoint --container "$id" --runtime runc --tag bench:1 --criu "$CRIU" >/dev/null
echo "runc container, $mib MiB; image on disk $(du -sh "$work/raw" | cut -f1), store $(du -sh "$work/store" | cut -f1); $(nproc) cores"
# at_next CMD...: runs CMD (in the background: a lazy restore returns once its fill is done),
# prints seconds to the container's first count, to the count after its first full self-check
# (21 counts on) and to CMD's end; then ends the container.
at_next() {
  runc delete -f "$id" >/dev/null 2>&1 || true
  rm -f "$work/state/count"
  local first t0 t1 t2 t3 cmd
  t0=$(date +%s.%N)
  "$@" >/dev/null &
  cmd=$!
  wait_above 0
  t1=$(date +%s.%N)
  first=$(count)
  wait_above $((first + 21))
  t2=$(date +%s.%N)
  wait "$cmd"
  t3=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" 'BEGIN{printf "%.3f %.3f %.3f\n", b-a, c-a, d-a}'
}
runc delete -f "$id" >/dev/null 2>&1 || true
for r in $(seq "$rounds"); do
  raw=$(at_next runc restore --image-path "$work/raw" --work-path "$work/raw-work" --bundle "$work/bundle" --detach "$id")
  lazy=$(at_next "$G" --store "$work/store" -q restore bench:1 --container --criu "$CRIU")
  eager=$(at_next "$G" --store "$work/store" -q restore bench:1 --container --no-lazy --criu "$CRIU")
  python3 - "$r" "$raw" "$lazy" "$eager" <<'EOF'
import sys
r, raw, lazy, eager = sys.argv[1], *(list(map(float, a.split())) for a in sys.argv[2:])
print(f"round {r}: first count: runc {raw[0]:.2f} s | gstore lazy {lazy[0]:.2f} s ({lazy[0]/raw[0]:.2f}x) | "
      f"eager {eager[0]:.2f} s ({eager[0]/raw[0]:.2f}x); after the first full check: runc {raw[1]:.2f} s | "
      f"lazy {lazy[1]:.2f} s ({lazy[1]/raw[1]:.2f}x) | eager {eager[1]:.2f} s ({eager[1]/raw[1]:.2f}x); "
      f"lazy fill done {lazy[2]:.2f} s")
EOF
done
