#!/usr/bin/env bash
# Installs what building and testing gstore needs on a fresh Debian 12 machine (run as root):
# libclang for RocksDB's bindings, zstd for the benchmark baseline, python3 and procps for
# the test processes, podman + runc for the container tests, haproxy and skopeo for the
# replicated server's tests, cargo-nextest, CRIU >= 4 built from
# source (scripts/criu.sh) for the process checkpoint tests, and s3s-fs, the S3 server the S3
# tests start on 127.0.0.1.
# `setup.sh build` installs only what building gstore needs (libclang): the quickstart's
# first contact, without the test machinery's ~10 minutes of source builds.
# Safe to run again: it skips what is already there.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
source "$(dirname "$0")/env.sh"
only_build=false
case "${1:-}" in
  build) only_build=true ;;
  "") ;;
  *) echo "usage: setup.sh [build]" >&2; exit 2 ;;
esac
install_missing() {
  if [ $# -gt 0 ]; then
    echo "setup: installing $*"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  fi
}
if $only_build; then
  dpkg -s libclang-dev >/dev/null 2>&1 || install_missing libclang-dev
  exit 0
fi
need=()
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
command -v zstd >/dev/null || need+=(zstd)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v mkfifo >/dev/null || need+=(coreutils)
command -v python3 >/dev/null || need+=(python3)            # test processes (counters, holders)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)  # the Python package's tests
[ -x /bin/kill ] || [ -x /usr/bin/kill ] || need+=(procps)  # tests signal processes by pid
command -v podman >/dev/null || need+=(podman)              # the container tests
command -v runc >/dev/null || need+=(runc)                  # podman's runtime here (crun fails on hybrid cgroups)
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || need+=(libc6-dev)  # the container tests' static counter
command -v haproxy >/dev/null || need+=(haproxy)            # the replicas behind a load balancer
command -v skopeo >/dev/null || need+=(skopeo)              # a registry client no one here wrote
install_missing ${need[@]+"${need[@]}"}
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest"
  cargo install cargo-nextest --locked
fi
if ! cargo hakari --version >/dev/null 2>&1; then
  echo "setup: installing cargo-hakari"  # checks the workspace-hack crate (scripts/test.sh)
  cargo install cargo-hakari --version 0.9.39 --locked
fi
bash "$(dirname "$0")/criu.sh" >/dev/null
# podman with runc, and ulimits this machine's hard limits allow (docs/CONTAINERS.md); an
# existing configuration is left alone.
if [ ! -e /etc/containers/containers.conf ]; then
  mkdir -p /etc/containers
  printf '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n[engine]\nruntime = "runc"\n' \
    > /etc/containers/containers.conf
fi
# A real S3-compatible server for the S3 tests (honours If-None-Match and checks credentials;
# newer versions need a newer rustc). ~4 minutes to build once; cached in ~/.cargo/bin.
if ! command -v s3s-fs >/dev/null; then
  echo "setup: installing s3s-fs 0.14.1"
  cargo install s3s-fs@0.14.1 --features binary --locked -q || cargo install s3s-fs@0.14.1 --features binary -q
fi
