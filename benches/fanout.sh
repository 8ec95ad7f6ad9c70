#!/usr/bin/env bash
# Many restore nodes at once (issue #50): an image of MIB MiB (default 256; incompressible) is
# pushed to S3 (s3s-fs on loopback) and restored by N processes at once (each a fresh node: its
# own cache directory), for each N in NS (default "1 8"), along each of PATHS:
#   s3           straight from the bucket
#   serve        `--store http://SERVER`, one `gstore serve` of the bucket
#   serve-cache  `--store http://TIER`, one `gstore serve --cache DIR` (the caching tier)
#   tier         `--store s3://…` with `GSTORE_TIERS=http://TIER`
#   two-tiers    the same through a node tier whose own GSTORE_TIERS names a region tier
#   tier-killed  as `tier`, the tier killed KILL_AFTER seconds (default 0.5) into the restores
#   node-killed  as `two-tiers`, the clients naming both tiers (GSTORE_TIERS=NODE,REGION), the
#                node tier killed KILL_AFTER seconds into the restores (they go on through the
#                region tier)
# The bucket sits behind the fault proxy (RATE, RTT), which counts the bytes it sends: printed
# as a multiple of the image's stored bytes, with the time until the last restore finished
# (every restore is checked byte for byte), and the servers' peak RSS and CPU seconds. Clients reach the
# servers directly. PATHS defaults to all of them. With SINK=cat each node streams the image's
# file to `cmp` against the source (`gstore cat`, the same reads and checks as a restore, no
# disk written): 64 nodes restoring a 1 GiB image need no 64 GiB of disk.
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
proxy=
trap 'kill $server $proxy 2>/dev/null; stop KILL; rm -rf "$work"' EXIT
mkdir -p "$work/src"
head -c $((mib << 20)) /dev/urandom >"$work/src/image.bin"
export GSTORE_CACHE_BYTES=0
XDG_CACHE_HOME="$work/pusher" "$G" -q init --store s3://bench/store >/dev/null
XDG_CACHE_HOME="$work/pusher" "$G" -q push "$work/src" --tag big --store s3://bench/store >/dev/null
stored=$(du -sb "$work/s3data/bench/store/packs" | cut -f1)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.1; done; }
echo "image $mib MiB, stored $stored bytes in packs; bucket behind a $rate bit/s link, RTT $rtt"
printf "%-12s %4s %10s %14s %14s %14s\n" path N seconds bucket_bytes server_rss_MB server_cpu_s
# stop SIGNAL: the servers (each runs under /usr/bin/time, which then reports and exits).
stop() { for p in "${pids[@]}"; do pkill "-$1" -P "$p" 2>/dev/null || true; done; }
# start_tier NAME [UPSTREAM_URL]: a caching tier of the bucket (reading through UPSTREAM_URL
# when given); sets tier_url.
start_tier() {
  local p; p=$(free_port)
  rm -rf "$work/cache-$1"
  AWS_ENDPOINT="http://$paddr" XDG_CACHE_HOME="$work/$1" GSTORE_TIERS="${2:-}" /usr/bin/time -f "%M %U %S" -o "$work/rss-$1" \
    "$G" serve --store s3://bench/store --listen "127.0.0.1:$p" --cache "$work/cache-$1" --cache-bytes 4GiB 2>/dev/null &
  pids+=($!)
  wait_port "$p"
  tier_url="http://127.0.0.1:$p"
}
for n in $ns; do
  for path in ${PATHS:-s3 serve serve-cache tier two-tiers tier-killed node-killed}; do
    "$FN" --to "127.0.0.1:$port" --rtt "$rtt" --rate "$rate" >"$work/proxy.out" &
    proxy=$!
    for _ in $(seq 100); do grep -q listening "$work/proxy.out" 2>/dev/null && break; sleep 0.05; done
    paddr=$(sed -n 's/^listening on //p' "$work/proxy.out")
    url=s3://bench/store; tiers=; pids=(); rm -f "$work"/rss-*
    case $path in
      serve)
        sport=$(free_port)
        AWS_ENDPOINT="http://$paddr" XDG_CACHE_HOME="$work/server" /usr/bin/time -f "%M %U %S" -o "$work/rss-server" \
          "$G" serve --store s3://bench/store --listen "127.0.0.1:$sport" 2>/dev/null &
        pids+=($!); wait_port "$sport"; url="http://127.0.0.1:$sport" ;;
      serve-cache) start_tier node; url=$tier_url ;;
      tier | tier-killed) start_tier node; tiers=$tier_url ;;
      two-tiers) start_tier region; start_tier node "$tier_url"; tiers=$tier_url ;;
      node-killed) start_tier region; region_url=$tier_url; start_tier node "$region_url"; tiers="$tier_url,$region_url" ;;
    esac
    t0=$(date +%s.%N)
    clients=()
    for i in $(seq "$n"); do
      if [ "${SINK:-}" = cat ]; then
        XDG_CACHE_HOME="$work/node$i" AWS_ENDPOINT="http://$paddr" GSTORE_TIERS="$tiers" \
          bash -c 'set -o pipefail; "$0" -q cat big image.bin --store "$1" | cmp -s - "$2"' \
          "$G" "$url" "$work/src/image.bin" >/dev/null 2>"$work/client$i.err" &
      else
        XDG_CACHE_HOME="$work/node$i" AWS_ENDPOINT="http://$paddr" GSTORE_TIERS="$tiers" \
          "$G" -q restore big --to "$work/out$i" --store "$url" >/dev/null 2>"$work/client$i.err" &
      fi
      clients+=($!)
    done
    if [ "$path" = tier-killed ]; then sleep "${KILL_AFTER:-0.5}"; stop KILL; fi
    # The node tier, started last.
    if [ "$path" = node-killed ]; then sleep "${KILL_AFTER:-0.5}"; pkill -KILL -P "${pids[-1]}" 2>/dev/null || true; fi
    for c in "${clients[@]}"; do wait "$c" || { echo "restore failed ($path, N=$n): $(cat "$work"/client*.err)"; exit 1; }; done
    t1=$(date +%s.%N)
    for i in $(seq "$n"); do
      [ "${SINK:-}" = cat ] || cmp -s "$work/src/image.bin" "$work/out$i/image.bin" \
        || { echo "restore $i ($path, N=$n) is not exact"; exit 1; }
      rm -rf "$work/out$i" "$work/node$i"
    done
    stop TERM; for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    kill -TERM $proxy; wait $proxy 2>/dev/null || true
    down=$(tail -1 "$work/proxy.out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes_down"])')
    rss=$(cat "$work"/rss-* 2>/dev/null | awk '{printf "%s%.0f", (NR > 1 ? "+" : ""), $1 / 1024}' || true)
    cpu=$(cat "$work"/rss-* 2>/dev/null | awk '{printf "%s%.1f", (NR > 1 ? "+" : ""), $2 + $3}' || true)
    awk -v p="$path" -v n="$n" -v a="$t0" -v b="$t1" -v d="$down" -v s="$stored" -v r="${rss:--}" -v c="${cpu:--}" \
      'BEGIN{printf "%-12s %4d %10.2f %13.2fx %14s %14s\n", p, n, b - a, d / s, r, c}'
  done
done
