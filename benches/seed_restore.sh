#!/usr/bin/env bash
# A restore node that already holds an earlier version (issue #48): MIB MiB (default 512) of
# N(0, 0.02) bf16 weights in four files named as CRIU page images (pages-N.img, so changed
# chunks are stored as deltas against v1's), pushed to S3 (s3s-fs on loopback) as v1; the
# node restores v1. Then two next versions, each restored with and without `--seed` (the v1
# restore) through the fault proxy (RATE bits/s, default 1g; RTT, default 20ms):
#   pages     1 % of every shard's 4 KiB pages rewritten (a process or training state moving
#             page by page)
#   shard     one shard of four replaced, the other three moved to another directory (a
#             fine-tune of some layers, a model re-laid out)
#   same      v1 itself again (a node restoring the image it already has)
# Prints, per version, the time of each restore and the bytes the proxy carried, and the
# seeded restore's ratio to the plain one; every restore is compared byte for byte.
# PYTHON names a python3 with NumPy (default python3).
# Usage: benches/seed_restore.sh [MIB] [RATE] [RTT]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mib=${1:-512}; rate=${2:-1g}; rtt=${3:-20ms}
work=$(mktemp -d /var/tmp/gstore-seed.XXXXXX)
cargo build --release -q -p gstore-cli -p gstore-faultnet
source benches/s3_server.sh
G="$GSTORE_BIN"; FN="$CARGO_TARGET_DIR/release/gstore-faultnet"
proxy=
trap 'kill $server $proxy 2>/dev/null; rm -rf "$work"' EXIT
export GSTORE_CACHE_BYTES=0
"${PYTHON:-python3}" - "$work" "$mib" <<'EOF'
import os, sys
import numpy as np
work, mib = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
def weights(n):
    return ((rng.standard_normal(n // 2, dtype=np.float32) * 0.02).view(np.uint32) >> 16).astype(np.uint16).tobytes()
shard = (mib << 20) // 4
v1 = [weights(shard) for _ in range(4)]
def write(version, files):
    for rel, data in files.items():
        path = os.path.join(work, version, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
write("v1", {f"pages-{i}.img": d for i, d in enumerate(v1)})
pages = []
for d in v1:
    b = bytearray(d)
    for p in range(0, len(b) // 4096, 100):
        b[p * 4096:(p + 1) * 4096] = weights(4096)
    pages.append(bytes(b))
write("pages", {f"pages-{i}.img": d for i, d in enumerate(pages)})
write("shard", {"pages-0.img": weights(shard), **{f"layers/pages-{i}.img": v1[i] for i in range(1, 4)}})
write("same", {f"pages-{i}.img": d for i, d in enumerate(v1)})
EOF
# proxied CMD...: runs CMD with the bucket behind a fresh fault proxy; sets $down to the bytes
# the proxy carried to the client.
proxied() {
  "$FN" --to "127.0.0.1:$port" --rtt "$rtt" --rate "$rate" >"$work/proxy.out" &
  proxy=$!
  for _ in $(seq 100); do grep -q listening "$work/proxy.out" 2>/dev/null && break; sleep 0.05; done
  AWS_ENDPOINT="http://$(sed -n 's/^listening on //p' "$work/proxy.out")" "$@"
  kill -TERM $proxy; wait $proxy 2>/dev/null || true
  down=$(tail -1 "$work/proxy.out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes_down"])')
}
gs() { XDG_CACHE_HOME="$work/node" "$G" -q --store s3://bench/store "$@"; }
XDG_CACHE_HOME="$work/pusher" "$G" -q init --store s3://bench/store >/dev/null
for v in v1 pages shard same; do
  XDG_CACHE_HOME="$work/pusher" "$G" -q push "$work/$v" --tag "m:$v" --store s3://bench/store >/dev/null
done
gs restore m:v1 --to "$work/node-v1" >/dev/null
echo "$mib MiB in four shards; bucket behind a $rate bit/s link, RTT $rtt; seeded / plain:"
printf "%-6s %10s %12s %10s %12s %8s %8s\n" version plain_s plain_bytes seeded_s seeded_bytes time bytes
for v in pages shard same; do
  for how in plain seeded; do
    seed=(); [ "$how" = seeded ] && seed=(--seed "$work/node-v1")
    rm -rf "$work/out" "$work/node"
    sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
    t0=$(date +%s.%N)
    proxied gs restore "m:$v" --to "$work/out" "${seed[@]}" >/dev/null
    t1=$(date +%s.%N)
    diff -r "$work/$v" "$work/out" >/dev/null || { echo "restore of $v ($how) is not exact"; exit 1; }
    declare "${how}_s=$(echo "$t1 - $t0" | bc)" "${how}_b=$down"
  done
  printf "%-6s %10.2f %12d %10.2f %12d %8.2f %8.3f\n" "$v" "$plain_s" "$plain_b" "$seeded_s" "$seeded_b" \
    "$(echo "$seeded_s / $plain_s" | bc -l)" "$(echo "$seeded_b / $plain_b" | bc -l)"
done
