#!/usr/bin/env bash
# Runs every test: unit tests and the integration tests in tests/, which drive the real
# release `gstore` binary (kill -9 during push, corruption, concurrency, disk full on a
# small tmpfs: run as root) and replay every kept fuzz input (tests/fuzz_replay.rs), the
# doctests and the workspace-hack check, then the Python package's tests (scripts/python.sh).
# Coverage-guided fuzzing under AddressSanitizer (scripts/fuzz.sh) needs a second build of
# every crate and runs by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
# The integration tests drive the release binary: build it first (`cargo test` builds a
# package's binaries only for that package's own tests). Built with the whole workspace
# selected, so that its crates get the features the tests' build gives them (gstore-tests
# turns on the store's `simulation`) and are compiled once, not once per feature set.
cargo build --release --workspace --bins
bash scripts/prune-target.sh "$CARGO_TARGET_DIR/release/deps"
cargo nextest run --release --workspace --no-fail-fast "$@"
# nextest runs no doctests: compile (and run) them here; and the workspace-hack crate must
# still unify every crate's features (`cargo hakari generate` rewrites it when not).
cargo test --doc --release --workspace
cargo hakari verify
# No crate's modules import one another in a circle (docs/ARCHITECTURE.md).
for src in */src; do python3 scripts/import-circles.py "$src"; done
# The Python package: its wheel built and tested with pytest.
bash scripts/python.sh
