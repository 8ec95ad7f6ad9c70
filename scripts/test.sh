#!/usr/bin/env bash
# Runs every test: unit tests and the integration tests in tests/, which drive the real
# release `gstore` binary (kill -9 during push, corruption, concurrency, disk full on a
# small tmpfs: run as root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
cargo nextest run --release --workspace --no-fail-fast "$@"
