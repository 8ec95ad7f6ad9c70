#!/usr/bin/env bash
# Peak RSS of a large restore: a SIZE_MIB corpus image (default 16384) pushed to a fresh store,
# then restored to a directory and loaded into host memory, each under GNU time.
# Usage: benches/restore_rss.sh [SIZE_MIB] [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
command -v /usr/bin/time >/dev/null || apt-get install -y -qq time >/dev/null
mib=${1:-16384}
work=${2:-$(mktemp -d /var/tmp/gstore-rss.XXXXXX)}
trap 'rm -rf "$work"' EXIT
cargo build --release -q -p gstore-cli -p gstore-benches --bins
"$CARGO_TARGET_DIR/release/gstore-corpus" "$work/corpus" "$mib" 1 --base-only
export GSTORE_STORE="$work/store"
"$GSTORE_BIN" -q init >/dev/null
"$GSTORE_BIN" -q push "$work/corpus/base" --tag big >/dev/null
rm -rf "$work/corpus"
rss() { /usr/bin/time -f "%M KiB peak RSS, %e s" "$@" 2>&1 >/dev/null | tail -1; }
echo "image: $(du -sh --apparent-size "$work/store" | cut -f1) stored, $mib MiB logical"
echo "restore --to DIR (budget 1 GiB):   $(rss "$GSTORE_BIN" -q restore big --to "$work/out")"
rm -rf "$work/out"
echo "restore --to DIR (budget 64 MiB):  $(rss "$GSTORE_BIN" -q restore big --to "$work/out" --memory-budget 67108864)"
rm -rf "$work/out"
