#!/usr/bin/env bash
# Sets up, builds, and runs gstore's main job on the embedded default store
# ($GSTORE_STORE, else $XDG_DATA_HOME/gstore, else ~/.local/share/gstore): makes a
# checkpoint-like image and a second near-identical one, pushes both, shows the dedup,
# restores and verifies byte for byte, then removes the second image and reclaims its space
# with two gc passes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
source scripts/env.sh
cargo build --release -p gstore-cli -p gstore-benches --bins
G="$GSTORE_BIN"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$CARGO_TARGET_DIR/release/gstore-corpus" "$work/corpus" "${QUICKSTART_MIB:-256}"
"$G" ls >/dev/null 2>&1 || "$G" init
"$G" push "$work/corpus/base" --tag quickstart:base
"$G" push "$work/corpus/next" --tag quickstart:next
"$G" ls
"$G" du
"$G" restore quickstart:next --to "$work/restored"
diff -r "$work/corpus/next" "$work/restored" && echo "quickstart: restored image is byte-identical"
"$G" verify --read-data
# Retire the second image and reclaim what only it used: gc tombstones, the next pass deletes.
"$G" rm quickstart:next
"$G" gc
"$G" gc
"$G" du
"$G" verify
