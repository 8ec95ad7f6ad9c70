#!/usr/bin/env bash
# Encrypted against unencrypted stores in one run (issue #20: "push and restore ≤ 10 % slower"):
# benches/binary_compare.sh with the same binary twice, B behind a wrapper that gives it a key
# file and makes its `init` an `init --encrypt`: each round pushes the corpus's base and next
# images (benches/corpus.rs: CRIU-like page images) into a fresh plain store (A) and a fresh
# encrypted one (B), then restores the next image from each with the page cache dropped (when
# root); rounds alternate which goes first; medians and their ratios (encrypted / plain).
# Usage: benches/encryption.sh [GSTORE_BIN] [SIZE_MIB] [ROUNDS] [CORPUS_BIN]
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-$HOME/.cache/gstore-target}/release
g=$(realpath "${1:-$target/gstore}")
work=$(mktemp -d /var/tmp/gstore-encryption.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$g" key generate "$work/key" >/dev/null
cat >"$work/gstore-encrypted" <<WRAP
#!/bin/sh
export GSTORE_KEY_FILE="$work/key"
for a; do [ "\$a" = init ] && exec "$g" "\$@" --encrypt; done
exec "$g" "\$@"
WRAP
chmod +x "$work/gstore-encrypted"
echo "A: unencrypted store, B: encrypted store (the same binary)"
bash benches/binary_compare.sh "$g" "$work/gstore-encrypted" "${2:-1024}" "${3:-3}" "${4:-$target/gstore-corpus}"
