#!/usr/bin/env bash
# gc on a store of N images (default 100), 10 % of them removed, on the local directory store
# and on S3 (s3s-fs on loopback): three gc runs, the passes, time and requests of each, what
# the first run alone freed against what all three did, and the bytes reclaimed against the
# bytes that only the removed images referenced (`du`'s per-image unique stored bytes); on the
# local store also with `gc --reclaim-copies` (local-rc).
# Each image is a shared 8 MiB base file plus UNIQUE_KIB (default 2048) of its own data.
# Usage: benches/gc_bench.sh [IMAGES (default 100)] [UNIQUE_KIB (default 2048)]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
images=${1:-100}
unique_kib=${2:-2048}
work=$(mktemp -d /var/tmp/gstore-gcbench.XXXXXX)
cargo build --release -q -p gstore-cli
source benches/s3_server.sh
G="$GSTORE_BIN"
export XDG_CACHE_HOME="$work/machine-a"

# The images: one shared base, and a file of its own per image (seeded, incompressible).
python3 - "$work/src" "$images" "$unique_kib" <<'EOF'
import os, random, sys
root, n, kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(root, exist_ok=True)
base = random.Random(1).randbytes(8 << 20)
for i in range(n):
    d = os.path.join(root, f"img{i:03}")
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "base.img"), "wb").write(base)
    open(os.path.join(d, "own.img"), "wb").write(random.Random(1000 + i).randbytes(kib << 10))
EOF

field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d[sys.argv[2]])' "$1" "$2"; }

bench() {
  local name=$1 store=$2
  "$G" -q init --store "$store" >/dev/null
  for i in $(seq 0 $((images - 1))); do
    "$G" -q push "$work/src/img$(printf %03d "$i")" --tag "img$(printf %03d "$i")" --store "$store" >/dev/null
  done
  "$G" -q --json du --store "$store" >"$work/du-before.json"
  # Remove every tenth image; what only they referenced is what gc should give back.
  local removed=()
  for i in $(seq 0 10 $((images - 1))); do removed+=("img$(printf %03d "$i"):latest"); done
  python3 - "$work/du-before.json" "${removed[@]}" >"$work/expected" <<'EOF'
import json, sys
du = json.load(open(sys.argv[1]))
gone = set(sys.argv[2:])
print(sum(i["unique_stored_bytes"] for i in du["images"] if i["tag"] in gone))
EOF
  for t in "${removed[@]}"; do "$G" -q rm "$t" --store "$store" >/dev/null; done
  for run in 1 2 3; do
    "$G" -q --json gc ${GC_FLAGS:-} --store "$store" >"$work/gc$run.json"
    printf "%-6s run %d: %d passes, %6.2f s, %5d requests, %9d bytes reclaimed, %9d left tombstoned, %9d deferred, %d packs rewritten\n" "$name" "$run" \
      "$(field "$work/gc$run.json" passes)" "$(field "$work/gc$run.json" seconds)" "$(field "$work/gc$run.json" requests)" \
      "$(field "$work/gc$run.json" bytes_reclaimed)" "$(field "$work/gc$run.json" bytes_tombstoned)" \
      "$(field "$work/gc$run.json" bytes_deferred)" "$(field "$work/gc$run.json" packs_repacked)"
  done
  "$G" -q --json du --store "$store" >"$work/du-after.json"
  # Net: pack bytes before minus after (a rewritten pack's deletion counts, its copy does not).
  local before after one
  before=$(field "$work/du-before.json" pack_bytes)
  after=$(field "$work/du-after.json" pack_bytes)
  one=$(field "$work/gc2.json" pack_bytes)  # listed by run 2's first pass: what run 1 left
  printf "%-6s one run freed %d bytes of the %d all three freed (%.2f %%)\n" "$name" "$((before - one))" "$((before - after))" \
    "$(python3 -c "print(100*($before-$one)/max(1,$before-$after))")"
  printf "%-6s %d images, %d removed: packs %d -> %d bytes; %d bytes freed of %d only the removed images referenced (%.1f %%)\n" \
    "$name" "$images" "${#removed[@]}" "$before" "$after" "$((before - after))" "$(cat "$work/expected")" \
    "$(python3 -c "print(100*($before-$after)/max(1,$(cat "$work/expected")))")"
  "$G" -q verify --store "$store" >/dev/null && echo "$name verify: ok"
}

bench local "$work/local"
GC_FLAGS=--reclaim-copies bench local-rc "$work/local-rc"  # the old copies of rewritten packs too
bench s3 s3://bench/store
# A machine that never ran gc on this bucket: every footer and manifest is read once.
export XDG_CACHE_HOME="$work/machine-b"
"$G" -q --json gc --store s3://bench/store >"$work/gc-fresh.json"
printf "s3     fresh machine (no cache): %6.2f s, %5d requests\n" "$(field "$work/gc-fresh.json" seconds)" "$(field "$work/gc-fresh.json" requests)"
