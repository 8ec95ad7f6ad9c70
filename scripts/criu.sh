#!/usr/bin/env bash
# Installs CRIU >= 4.2 at /opt/criu/sbin/criu on Debian 12 (run as root), by building the
# upstream source from the Debian pool. Debian 12's own criu 3.17 fails on kernels >= 6.13
# (their split [vvar]/vDSO layout is only handled from CRIU 4.1 on), and CRIU 4.1 cannot dump
# a process holding an inet socket on kernels >= 6.16 (they refuse SO_PASSCRED and SO_PASSSEC
# on such sockets; CRIU 4.2 reads them only where the kernel has them).
# Safe to run again: when a criu >= 4.2 is already on PATH or at /opt/criu/sbin/criu it prints
# that path and does nothing else. Prints the installed path on its last line.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

PREFIX=/opt/criu
CACHE="${HOME:-/root}/.cache/gstore-criu"
# version and the sha256 of its orig tarball (trixie's and sid's Sources index); first one wins.
CANDIDATES=(
  "4.2.1 29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9"
)
BUILD_DEPS=(build-essential pkg-config libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler
  protobuf-compiler libnl-3-dev libnet1-dev libcap-dev uuid-dev libbsd-dev libgnutls28-dev
  libnftables-dev curl xz-utils ca-certificates)

log() { echo "criu.sh: $*" >&2; }

# Prints the version of the criu binary $1 as major*100+minor (empty when it does not run).
criu_version() {
  "$1" --version 2>/dev/null | sed -n 's/^Version: *\([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p' | head -n1 |
    awk '{ print $1 * 100 + $2 }'
}

# True when $1 is an executable criu of version 4.2 or newer.
is_new_enough() {
  local version
  [ -x "$1" ] || return 1
  version="$(criu_version "$1")"
  [ -n "$version" ] && [ "$version" -ge 402 ]
}

for existing in "$(command -v criu || true)" "$PREFIX/sbin/criu"; do
  if [ -n "$existing" ] && is_new_enough "$existing"; then
    echo "$existing"
    exit 0
  fi
done

if [ "$(id -u)" -ne 0 ]; then
  log "must run as root (installs packages and writes $PREFIX)"
  exit 1
fi

mirror=""
if [ -r /etc/apt/sources.list.d/debian.sources ]; then
  mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources | head -n1)"
fi
if [ -z "$mirror" ] && [ -r /etc/apt/sources.list ]; then
  mirror="$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' /etc/apt/sources.list)"
fi
mirror="${mirror%/}"
if [ -z "$mirror" ]; then
  log "no Debian mirror found in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list"
  exit 1
fi

log "installing build dependencies"
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${BUILD_DEPS[@]}" >/dev/null

mkdir -p "$CACHE"
tarball="" version=""
for candidate in "${CANDIDATES[@]}"; do
  read -r v sha <<<"$candidate"
  file="$CACHE/criu_${v}.orig.tar.xz"
  if [ ! -s "$file" ] || ! echo "$sha  $file" | sha256sum -c --quiet >/dev/null 2>&1; then
    log "fetching criu $v from $mirror"
    if ! curl -fsSL -o "$file.part" "$mirror/pool/main/c/criu/criu_${v}.orig.tar.xz"; then
      log "criu $v is not in the pool any more; trying the next version"
      rm -f "$file.part"
      continue
    fi
    if ! echo "$sha  $file.part" | sha256sum -c --quiet >/dev/null 2>&1; then
      log "criu_${v}.orig.tar.xz has the wrong sha256 (expected $sha); refusing it"
      rm -f "$file.part"
      continue
    fi
    mv "$file.part" "$file"
  fi
  tarball="$file" version="$v"
  break
done
if [ -z "$tarball" ]; then
  log "could not fetch any of: ${CANDIDATES[*]%% *} from $mirror/pool/main/c/criu/"
  exit 1
fi

work="$(mktemp -d /tmp/gstore-criu-build.XXXXXX)"
trap 'rm -rf "$work"' EXIT
tar -xf "$tarball" -C "$work"
src="$work/criu-$version"
build_log="$CACHE/criu-$version-build.log"
log "building criu $version (log: $build_log)"
if ! make -C "$src" -j"$(nproc)" criu >"$build_log" 2>&1; then
  log "build failed; last lines of $build_log:"
  tail -n 40 "$build_log" >&2
  exit 1
fi
if ! make -C "$src" install-criu PREFIX="$PREFIX" >>"$build_log" 2>&1; then
  log "install failed; last lines of $build_log:"
  tail -n 40 "$build_log" >&2
  exit 1
fi

# `criu check` also prints a harmless "Can't setup RLIMIT_NOFILE" error line on machines whose
# capability bounding set lacks CAP_SYS_RESOURCE; only its exit status counts.
if ! "$PREFIX/sbin/criu" check; then
  log "$PREFIX/sbin/criu check failed: this kernel lacks something CRIU needs"
  exit 1
fi
echo "$PREFIX/sbin/criu"
