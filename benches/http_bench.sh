#!/usr/bin/env bash
# The HTTP chunk server on loopback: restore of the corpus through `gstore serve` vs from the
# local store (one run), and a bounded wrk load test of 1 MiB range GETs of one pack.
# Usage: benches/http_bench.sh [SIZE_MIB (default 1024)] [SECONDS (default 10)]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mib=${1:-1024}; secs=${2:-10}
command -v wrk >/dev/null || apt-get install -y -qq wrk >/dev/null
work=$(mktemp -d /var/tmp/gstore-httpbench.XXXXXX)
cargo build --release -q -p gstore-cli -p gstore-benches --bins
G="$GSTORE_BIN"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$CARGO_TARGET_DIR/release/gstore-corpus" "$work/corpus" "$mib" 1 --base-only
"$G" -q --store "$work/store" init >/dev/null
"$G" -q --store "$work/store" push "$work/corpus/base" --tag b >/dev/null
"$G" --store "$work/store" serve --listen "127.0.0.1:$port" 2>/dev/null &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
export XDG_CACHE_HOME="$work/client"
now() { date +%s.%N; }
t0=$(now); "$G" -q --store "$work/store" restore b --to "$work/r1"; t1=$(now); rm -rf "$work/r1"
t2=$(now); "$G" -q --store "http://127.0.0.1:$port" restore b --to "$work/r2"; t3=$(now); rm -rf "$work/r2"
awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" 'BEGIN { printf "restore local %.2f s, via server %.2f s (cold client cache): ratio %.2f\n", b-a, d-c, (d-c)/(b-a) }'
pack=$(cd "$work/store" && ls packs/*/*.pack | head -1)
cat > "$work/range.lua" <<'LUA'
local i = 0
request = function()
  i = (i + 1) % 32
  return wrk.format("GET", nil, { ["Range"] = "bytes=" .. (i * 1048576) .. "-" .. (i * 1048576 + 1048575) })
end
LUA
wrk -t2 -c16 -d"${secs}s" --latency -s "$work/range.lua" "http://127.0.0.1:$port/v1/o/$pack" | sed -n '/Latency Distribution/,/Transfer/p'
