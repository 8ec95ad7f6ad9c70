#!/usr/bin/env bash
# `gstore hold` of an image whose chunks are deltas (a second process checkpoint, whose
# changed pages are stored against the first's): the holder reads the deltas' bases while
# it has the index and serves loads without it, so `gstore load --held --check` must load
# the image and read it back right; and a load straight from the store, the same.
# Usage: tests/gpu/hold_deltas.sh [GSTORE_BIN]
set -euo pipefail
cd "$(dirname "$0")/../.."
G=$(realpath "${1:-.device/gstore}")
W=${HOLD_WORK:-/var/tmp/gstore-hold-deltas}
rm -rf "$W"; mkdir -p "$W"
HOLDER=
trap '[ -n "$HOLDER" ] && kill "$HOLDER" 2>/dev/null; rm -rf "$W"' EXIT
export GSTORE_STORE="$W/store"
python3 - "$W" <<'EOF'
import os, random, sys
w = sys.argv[1]
random.seed(5)
pages = [os.urandom(4096) for _ in range(16384)]  # 64 MiB
for name in ("v1", "v2"):
    os.makedirs(f"{w}/{name}")
    with open(f"{w}/{name}/pages-1.img", "wb") as f:
        f.write(b"".join(pages))
    with open(f"{w}/{name}/core-1.img", "wb") as f:
        f.write(name.encode() * 100)
    for i in random.sample(range(len(pages)), 200):  # the next image changes 200 pages
        pages[i] = os.urandom(4096)
EOF
"$G" -q init >/dev/null
"$G" -q push "$W/v1" --tag app:v1 >/dev/null
deltas=$("$G" -q push "$W/v2" --tag app:v2 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["delta_chunks"])')
echo "app:v2 holds $deltas delta chunks"
[ "$deltas" -gt 10 ] || { echo "FAIL: expected delta chunks in app:v2"; exit 1; }
"$G" -q load app:v2 --device cuda:0 --check
echo "ok: app:v2 loaded from the store and read back"
"$G" -q hold app:v2 --socket "$W/hold.sock" 2>"$W/hold.log" &
HOLDER=$!
until grep -q holding "$W/hold.log"; do
  kill -0 "$HOLDER" 2>/dev/null || { echo "FAIL: gstore hold: $(cat "$W/hold.log")"; exit 1; }
  sleep 0.2
done
echo "hold: $(cat "$W/hold.log")"
if ! out=$("$G" -q load app:v2 --device cuda:0 --held "$W/hold.sock" --check 2>&1); then
  echo "FAIL: a held image of delta chunks did not load: $out"; cat "$W/hold.log"; exit 1
fi
echo "ok: app:v2 loaded from the holder and read back"
