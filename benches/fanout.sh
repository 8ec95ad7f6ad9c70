#!/usr/bin/env bash
# Many restore nodes at once (issue #50): an image of MIB MiB (default 256; incompressible) is
# pushed to S3 (s3s-fs on loopback) and restored by N processes at once (each a fresh node: its
# own cache directory), for each N in NS (default "1 8"): straight from S3, through one
# `gstore serve` whose store is the bucket, and through one `gstore serve --cache DIR` (the
# caching tier). The bucket sits behind the fault proxy (RATE, RTT), which counts the bytes it
# sends: printed as a multiple of the image's stored bytes, with the time until the last
# restore finished (every restore is checked byte for byte). Clients reach the server directly.
# PATHS picks the paths (default "s3 serve serve-cache").
# Usage: benches/fanout.sh [MIB] [NS] [RATE (bits/s, default 2g)] [RTT (default 10ms)]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mib=${1:-256}; ns=${2:-1 8}; rate=${3:-2g}; rtt=${4:-10ms}
work=$(mktemp -d /var/tmp/gstore-fanout.XXXXXX)
cargo build --release -q -p gstore-cli -p gstore-faultnet
source benches/s3_server.sh
G="$GSTORE_BIN"; FN="$CARGO_TARGET_DIR/release/gstore-faultnet"
pids=()
trap 'kill $server "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT
mkdir -p "$work/src"
head -c $((mib << 20)) /dev/urandom >"$work/src/image.bin"
export GSTORE_CACHE_BYTES=0
XDG_CACHE_HOME="$work/pusher" "$G" -q init --store s3://bench/store >/dev/null
XDG_CACHE_HOME="$work/pusher" "$G" -q push "$work/src" --tag big --store s3://bench/store >/dev/null
stored=$(du -sb "$work/s3data/bench/store/packs" | cut -f1)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; }
echo "image $mib MiB, stored $stored bytes in packs; bucket behind a $rate bit/s link, RTT $rtt"
printf "%-14s %4s %10s %14s\n" path N seconds bucket_bytes
for n in $ns; do
  for path in ${PATHS:-s3 serve serve-cache}; do
    "$FN" --to "127.0.0.1:$port" --rtt "$rtt" --rate "$rate" >"$work/proxy.out" &
    proxy=$!
    for _ in $(seq 100); do grep -q listening "$work/proxy.out" 2>/dev/null && break; sleep 0.05; done
    paddr=$(sed -n 's/^listening on //p' "$work/proxy.out")
    url=s3://bench/store
    if [ "$path" != s3 ]; then
      sport=$(free_port)
      extra=(); [ "$path" = serve-cache ] && extra=(--cache "$work/tier" --cache-bytes 4GiB)
      rm -rf "$work/tier"
      AWS_ENDPOINT="http://$paddr" XDG_CACHE_HOME="$work/server" "$G" serve --store s3://bench/store \
        --listen "127.0.0.1:$sport" "${extra[@]}" 2>"$work/serve.err" &
      serve=$!; pids=("$serve")
      wait_port "$sport"
      url="http://127.0.0.1:$sport"
    fi
    t0=$(date +%s.%N)
    clients=()
    for i in $(seq "$n"); do
      XDG_CACHE_HOME="$work/node$i" AWS_ENDPOINT="http://$paddr" "$G" -q restore big --to "$work/out$i" --store "$url" >/dev/null &
      clients+=($!)
    done
    for c in "${clients[@]}"; do wait "$c"; done
    t1=$(date +%s.%N)
    for i in $(seq "$n"); do
      cmp -s "$work/src/image.bin" "$work/out$i/image.bin" || { echo "restore $i ($path, N=$n) is not exact"; exit 1; }
      rm -rf "$work/out$i" "$work/node$i"
    done
    [ "$path" = s3 ] || { kill "$serve"; wait "$serve" 2>/dev/null || true; pids=(); }
    kill -TERM $proxy; wait $proxy 2>/dev/null || true
    down=$(tail -1 "$work/proxy.out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes_down"])')
    awk -v p="$path" -v n="$n" -v a="$t0" -v b="$t1" -v d="$down" -v s="$stored" \
      'BEGIN{printf "%-14s %4d %10.2f %8.2fx\n", p, n, b - a, d / s}'
  done
done
