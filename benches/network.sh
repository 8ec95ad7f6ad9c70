#!/usr/bin/env bash
# Restores across a slow link: a 1 GiB image (incompressible, so wire bytes = image bytes)
# restored on a fresh machine from S3 (s3s-fs) and from `gstore serve`, each through the
# fault proxy (gstore-faultnet) at a capped rate and RTT 1, 10 and 50 ms. Prints the achieved
# rate as a fraction of the cap, the most connections open at once (requests in flight) and
# the restore's peak RSS; the plain loopback restore (no proxy) is the baseline of the run.
# For `gstore serve`, the rig's own ceiling is measured too: 16 plain GETs at a time (curl) of
# the store's pack files through the same proxy (plain_of_cap).
# Usage: benches/network.sh [SIZE_MIB (default 1024)] [RATE (default 1g, bits/s)] [RTTS (default "1 10 50")]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mib=${1:-1024}; rate=${2:-1g}; rtts=${3:-1 10 50}
work=$(mktemp -d /var/tmp/gstore-netbench.XXXXXX)
cargo build --release -q -p gstore-cli -p gstore-faultnet
source benches/s3_server.sh
G="$GSTORE_BIN"; FN="$CARGO_TARGET_DIR/release/gstore-faultnet"
mkdir -p "$work/src"
head -c $((mib << 20)) /dev/urandom >"$work/src/image.bin"
bytes=$((mib << 20))
cap=$(python3 -c "
s='$rate'.lower(); m={'k':1e3,'m':1e6,'g':1e9}
print(float(s[:-1])*m[s[-1]]/8 if s[-1] in m else float(s)/8)")
export GSTORE_CACHE_BYTES=0
XDG_CACHE_HOME="$work/pusher" "$G" -q init --store s3://bench/store >/dev/null
XDG_CACHE_HOME="$work/pusher" "$G" -q push "$work/src" --tag big --store s3://bench/store >/dev/null
"$G" -q init --store "$work/local" >/dev/null
XDG_CACHE_HOME="$work/pusher" "$G" -q push "$work/src" --tag big --store "$work/local" >/dev/null
sport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$G" serve --store "$work/local" --listen "127.0.0.1:$sport" 2>/dev/null &
serve=$!
trap 'kill $server $serve 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$sport) 2>/dev/null && break; sleep 0.1; done
n=0
# restore STORE_URL AWS_ENDPOINT: prints seconds and peak RSS (MB).
restore() {
  n=$((n + 1))
  local t0 t1
  t0=$(date +%s.%N)
  XDG_CACHE_HOME="$work/m$n" AWS_ENDPOINT="$2" /usr/bin/time -f '%M' -o "$work/rss" \
    "$G" -q restore big --to "$work/out$n" --store "$1" >/dev/null
  t1=$(date +%s.%N)
  cmp -s "$work/src/image.bin" "$work/out$n/image.bin" || { echo "restore $n is not exact"; exit 1; }
  rm -rf "$work/out$n" "$work/m$n"
  awk -v a="$t0" -v b="$t1" -v r="$(cat "$work/rss")" 'BEGIN{printf "%.2f %.0f\n", b-a, r/1024}'
}
printf "%s MiB image, link cap %s bit/s (%.0f MB/s)\n" "$mib" "$rate" "$(echo "$cap/1000000" | bc -l)"
printf "%-8s %-6s %8s %8s %9s %12s %9s %13s\n" store rtt seconds MB/s of_cap peak_conns rss_MB plain_of_cap
for kind in s3 serve; do
  up=$([ $kind = s3 ] && echo "127.0.0.1:$port" || echo "127.0.0.1:$sport")
  read -r s r < <(restore "$([ $kind = s3 ] && echo s3://bench/store || echo "http://$up")" "http://$up")
  awk -v k=$kind -v s="$s" -v r="$r" -v b="$bytes" 'BEGIN{printf "%-8s %-6s %8.2f %8.0f %9s %12s %9s %13s\n", k, "none", s, b/s/1e6, "-", "-", r, "-"}'
  for rtt in $rtts; do
    "$FN" --to "$up" --rtt "${rtt}ms" --rate "$rate" >"$work/proxy.out" &
    proxy=$!
    for _ in $(seq 100); do grep -q listening "$work/proxy.out" 2>/dev/null && break; sleep 0.05; done
    paddr=$(sed -n 's/^listening on //p' "$work/proxy.out")
    url=$([ $kind = s3 ] && echo s3://bench/store || echo "http://$paddr")
    read -r s r < <(restore "$url" "http://$paddr")
    plain=-
    if [ $kind = serve ]; then
      t0=$(date +%s.%N)
      (cd "$work/local" && find packs -name '*.pack') | xargs -P 16 -I{} curl -sf -o /dev/null "http://$paddr/v1/o/{}"
      t1=$(date +%s.%N)
      plain=$(awk -v a="$t0" -v b="$t1" -v n="$(du -sb "$work/local/packs" | cut -f1)" -v c="$cap" 'BEGIN{printf "%.2f", n/(b-a)/c}')
    fi
    kill -TERM $proxy; wait $proxy 2>/dev/null || true
    conns=$(tail -1 "$work/proxy.out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_open"])')
    awk -v k=$kind -v t="${rtt}ms" -v s="$s" -v r="$r" -v b="$bytes" -v c="$cap" -v pc="$conns" -v p="$plain" \
      'BEGIN{printf "%-8s %-6s %8.2f %8.0f %9.2f %12s %9s %13s\n", k, t, s, b/s/1e6, b/s/c, pc, r, p}'
  done
done
