# Sourced by the other scripts: one warm target directory outside the clone, shared by every
# checkout on this machine (a cold RocksDB build takes ~20 minutes on 2 cores).
export HOME="${HOME:-/root}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gstore-target}"
# cargo-installed tools (cargo-nextest, s3s-fs) on PATH.
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
export GSTORE_BIN="${GSTORE_BIN:-$CARGO_TARGET_DIR/release/gstore}"
