#!/usr/bin/env bash
# Builds the Python package (python/: PyO3 + maturin) as a wheel, installs it into a virtual
# environment with numpy, safetensors, pytest and PyTorch (the torch, serving and DCP
# integrations are tested on the CPU here; their CUDA tests run on a GPU machine), and runs
# its tests (python/tests) against the real gstore binary. The wheel lands in
# $CARGO_TARGET_DIR/wheels; `pip install` it anywhere (Python >= 3.11, x86-64 Linux).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
venv="$HOME/.cache/gstore-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check 'maturin>=1.9.4,<2' numpy safetensors pytest \
  'torch==2.15.0'
rm -f "$CARGO_TARGET_DIR"/wheels/gstore-*.whl
"$venv/bin/maturin" build --release -q -m python/Cargo.toml --compatibility linux --skip-auditwheel \
  -o "$CARGO_TARGET_DIR/wheels"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
  "$CARGO_TARGET_DIR"/wheels/gstore-*.whl
"$venv/bin/python" -m pytest -q python/tests "$@"
