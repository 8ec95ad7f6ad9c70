# Sourced by the other scripts: one warm target directory outside the clone, shared by every
# checkout on this machine (a cold RocksDB build takes ~20 minutes on 2 cores).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gstore-target}"
export GSTORE_BIN="$CARGO_TARGET_DIR/release/gstore"
