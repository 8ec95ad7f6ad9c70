#!/usr/bin/env bash
# Container checkpoints (issue #46): a container holding MIB MiB (default 1024) of known memory
# that changes one 4 KiB page every 50 ms (tests/containers/counter.c) is checkpointed N times
# (default 10), SLEEP seconds apart (default 5), three ways in each round, all with the
# container left running:
#   gstore    `gstore checkpoint --container` into a local store
#   archives  `podman container checkpoint --export` (zstd, podman's default), kept on disk
#   registry  `podman container checkpoint --create-image` pushed to Debian's docker-registry
#   gstore registry  the same image pushed to `gstore serve` (its registry, another store)
# then prints the bytes each keeps for all N, as ratios to the registry's, and the time from
# `restore` to the container's next count: gstore `restore --container` vs `podman container
# restore --import` of the last archive vs a pull of the last image from the registry (and
# from gstore's) and a restore of it. Run as root with podman, runc, docker-registry and CRIU >= 4
# (scripts/setup.sh, apt-get install docker-registry).
# Usage: benches/containers.sh [MIB] [N] [SLEEP]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mib=${1:-1024}
n=${2:-10}
pause=${3:-5}
export PATH=/opt/criu/sbin:$PATH
G="$GSTORE_BIN"
work=$(mktemp -d /var/tmp/gstore-containers.XXXXXX)
name=gstore-bench-$$
port=5055
gport=5056
reg=
greg=
trap '{ podman rm -f $name; [ -n "$reg" ] && kill $reg; [ -n "$greg" ] && kill $greg; podman rmi -f $(podman images -q --filter reference="*ckpt-$$*") ; } >/dev/null 2>&1; rm -rf "$work"' EXIT

mkdir -p "$work/rootfs/state" "$work/rootfs/tmp" "$work/state" "$work/archives"
cc -O2 -static -o "$work/rootfs/counter" tests/containers/counter.c
tar -C "$work/rootfs" -cf "$work/rootfs.tar" .
podman import -q "$work/rootfs.tar" localhost/gstore-bench-counter:1 >/dev/null
printf 'version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\n' \
  "$work/registry" "$port" > "$work/registry.yml"
docker-registry serve "$work/registry.yml" > "$work/registry.log" 2>&1 &
reg=$!
"$G" --store "$work/store" init >/dev/null
"$G" --store "$work/gstore-registry" init >/dev/null
"$G" --store "$work/gstore-registry" serve --listen "127.0.0.1:$gport" > "$work/gstore-registry.log" 2>&1 &
greg=$!
while ! curl -sf "http://127.0.0.1:$gport/v2/" >/dev/null; do sleep 0.2; done

count() { cat "$work/state/count" 2>/dev/null || echo 0; }
podman run -d --name "$name" -v "$work/state:/state" localhost/gstore-bench-counter:1 /counter "$mib" >/dev/null
while [ "$(count)" -lt 3 ]; do sleep 0.2; done

for i in $(seq 1 "$n"); do
  t0=$(date +%s.%N)
  "$G" --store "$work/store" --json checkpoint --container "$name" --tag "bench:$i" --leave-running > "$work/ck-$i.json"
  t1=$(date +%s.%N)
  podman container checkpoint --leave-running --export="$work/archives/ck-$i.tar.zst" "$name" >/dev/null
  t2=$(date +%s.%N)
  podman container checkpoint --leave-running --create-image "localhost/ckpt-$$:$i" "$name" >/dev/null
  podman push -q --tls-verify=false "localhost/ckpt-$$:$i" "127.0.0.1:$port/ckpt:$i" >/dev/null
  t3=$(date +%s.%N)
  podman push -q --tls-verify=false "localhost/ckpt-$$:$i" "127.0.0.1:$gport/ckpt:$i" >/dev/null
  t4=$(date +%s.%N)
  podman rmi -f "localhost/ckpt-$$:$i" >/dev/null
  python3 - "$work/ck-$i.json" "$i" "$t0" "$t1" "$t2" "$t3" "$t4" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = [float(x) for x in sys.argv[3:]]
print(f"checkpoint {sys.argv[2]}: gstore {t[1]-t[0]:.1f} s, +{r['push']['new_stored_bytes']/2**20:.1f} MiB "
      f"of {r['push']['logical_bytes']/2**20:.0f} MiB; archive {t[2]-t[1]:.1f} s; image + push {t[3]-t[2]:.1f} s; "
      f"push to gstore's registry {t[4]-t[3]:.1f} s")
PY
  sleep "$pause"
done

bytes() { du -sb "$1" | cut -f1; }
store=$(bytes "$work/store"); archives=$(bytes "$work/archives"); registry=$(bytes "$work/registry")
gregistry=$(bytes "$work/gstore-registry")
python3 - "$store" "$archives" "$registry" "$gregistry" "$n" <<'PY'
import sys
s, a, r, g, n = (int(x) for x in sys.argv[1:])
print(f"stored for {n} checkpoints: gstore {s/2**20:.1f} MiB, gstore registry {g/2**20:.1f} MiB, "
      f"archives {a/2**20:.1f} MiB, registry {r/2**20:.1f} MiB")
print(f"ratios to the registry: gstore {s/r:.3f}, gstore registry {g/r:.3f}, archives {a/r:.3f}")
PY

# Restore to the next count, three ways, the container removed before each.
first_answer() {  # command...; seconds until the count passes the value it had when stopped
  local before; before=$(count)
  local t0; t0=$(date +%s.%N)
  "$@" >/dev/null
  while [ "$(count)" -le "$before" ]; do sleep 0.01; done
  python3 -c "import sys,time; print(f'{time.time()-float(sys.argv[1]):.2f}')" "$t0"
}
podman container checkpoint --export="$work/last.tar.zst" "$name" >/dev/null
podman rm -f "$name" >/dev/null
sync; echo 3 > /proc/sys/vm/drop_caches
local_s=$(first_answer podman container restore --import="$work/last.tar.zst")
podman container checkpoint --leave-running --create-image "localhost/ckpt-$$:last" "$name" >/dev/null
podman push -q --tls-verify=false "localhost/ckpt-$$:last" "127.0.0.1:$port/ckpt:last" >/dev/null
"$G" --store "$work/store" checkpoint --container "$name" --tag bench:last >/dev/null
podman rm -f "$name" >/dev/null
podman rmi -f "localhost/ckpt-$$:last" >/dev/null
sync; echo 3 > /proc/sys/vm/drop_caches
gstore_s=$(first_answer "$G" --store "$work/store" restore bench:last --container)
podman container checkpoint "$name" >/dev/null
podman rm -f "$name" >/dev/null
sync; echo 3 > /proc/sys/vm/drop_caches
registry_s=$(first_answer sh -c "podman pull -q --tls-verify=false 127.0.0.1:$port/ckpt:last >/dev/null && podman container restore 127.0.0.1:$port/ckpt:last")
# From gstore's registry: the image gstore checkpointed (bench:last), pulled as a checkpoint image.
podman container checkpoint "$name" >/dev/null
podman rm -f "$name" >/dev/null
"$G" --store "$work/store" serve --listen "127.0.0.1:5057" > "$work/serve-store.log" 2>&1 &
sreg=$!
while ! curl -sf "http://127.0.0.1:5057/v2/" >/dev/null; do sleep 0.2; done
sync; echo 3 > /proc/sys/vm/drop_caches
gregistry_s=$(first_answer sh -c "podman pull -q --tls-verify=false 127.0.0.1:5057/bench:last >/dev/null && podman container restore 127.0.0.1:5057/bench:last")
kill $sreg
podman rmi -f 127.0.0.1:5057/bench:last "127.0.0.1:$port/ckpt:last" >/dev/null 2>&1 || true
python3 - "$local_s" "$gstore_s" "$registry_s" "$gregistry_s" <<'PY'
import sys
l, g, r, gr = (float(x) for x in sys.argv[1:])
print(f"restore to the next count: local archive {l:.2f} s, gstore {g:.2f} s ({g/l:.2f}x), registry pull + restore "
      f"{r:.2f} s ({r/l:.2f}x), gstore registry pull + restore {gr:.2f} s ({gr/l:.2f}x)")
PY
