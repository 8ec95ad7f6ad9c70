#!/usr/bin/env bash
# Fuzzes every parser that reads bytes from outside (fuzz/fuzz_targets: pack, manifest, chunk,
# records, criu, server) with cargo fuzz and AddressSanitizer. Each target first replays its
# regressions (fuzz/regressions/TARGET: inputs that once crashed it) and its corpus
# (fuzz/corpus/TARGET, kept in the repository), then runs for FUZZ_SECS seconds (default 10).
# A crash fails the script and leaves the input in fuzz/artifacts/TARGET.
#   bash scripts/fuzz.sh                      # every target, 10 s each (CI)
#   FUZZ_SECS=600 bash scripts/fuzz.sh chunk  # one target, longer, by hand
#   FUZZ_KEEP=1 FUZZ_SECS=600 bash scripts/fuzz.sh  # and keep the new inputs in the corpus
# scripts/fuzz-seeds.sh makes the seed corpus from real objects.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz"
  cargo install cargo-fuzz --locked -q
fi
# RocksDB's C++ library is linked from the main build (scripts/test.sh builds it first) rather
# than compiled again with the sanitizer's flags: the targets fuzz gstore's parsers, not
# RocksDB, and that compile was most of a cold CI's time (~20 min on 2 cores, more than an
# hour when loaded).
rocksdb_lib="$(find "$CARGO_TARGET_DIR/release/build" -path '*librocksdb-sys-*/out/librocksdb.a' -printf '%T@ %h\n' 2>/dev/null \
  | sort -rn | head -1 | cut -d' ' -f2-)"
if [ -z "$rocksdb_lib" ]; then
  echo "fuzz: no librocksdb.a under $CARGO_TARGET_DIR/release/build: run 'cargo build --release -p gstore-cli' first" >&2
  exit 1
fi
export ROCKSDB_LIB_DIR="$rocksdb_lib" ROCKSDB_STATIC=1
# A target directory of its own: the sanitizer flags rebuild every Rust crate.
export CARGO_TARGET_DIR="$HOME/.cache/gstore-fuzz-target"
# cargo fuzz passes -Zsanitizer=address; the stable toolchain accepts it this way.
export RUSTC_BOOTSTRAP=1
secs="${FUZZ_SECS:-10}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list --fuzz-dir fuzz)
fi
cargo fuzz build --fuzz-dir fuzz
bash scripts/prune-target.sh "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/deps"
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/regressions/$t"
  if compgen -G "fuzz/regressions/$t/*" >/dev/null; then
    echo "fuzz: $t: replaying $(ls "fuzz/regressions/$t" | wc -l) regression inputs"
    cargo fuzz run --fuzz-dir fuzz "$t" "fuzz/regressions/$t"/* -- -runs=1 >/dev/null 2>&1 \
      || { echo "fuzz: $t: a regression input fails again"; cargo fuzz run --fuzz-dir fuzz "$t" "fuzz/regressions/$t"/* -- -runs=1; exit 1; }
  fi
  echo "fuzz: $t: ${secs}s from $(ls "fuzz/corpus/$t" | wc -l) corpus inputs"
  log="$(mktemp)"
  # New inputs go to a scratch directory (the first one named), not into the kept corpus:
  # FUZZ_KEEP=1 merges what a long run found into it afterwards.
  found="$(mktemp -d)"
  if ! cargo fuzz run --fuzz-dir fuzz "$t" "$found" "fuzz/corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=4096 -max_len=1048576 >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $t: crashed; the input is in fuzz/artifacts/$t"
    exit 1
  fi
  grep -E "^Done [0-9]+ runs" "$log" | sed "s/^/fuzz: $t: /" || tail -1 "$log"
  if [ "${FUZZ_KEEP:-0}" = 1 ]; then
    # libFuzzer's merge adds the found inputs that reach new code.
    cargo fuzz run --fuzz-dir fuzz "$t" "fuzz/corpus/$t" "$found" -- -merge=1 >/dev/null 2>&1
  fi
  rm -rf "$log" "$found"
done
