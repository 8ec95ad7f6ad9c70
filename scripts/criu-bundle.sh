#!/usr/bin/env bash
# Bundles the CRIU that scripts/criu.sh builds (4.2.1) with the shared libraries it loads, for a
# machine that has no CRIU and no package registry (the lent GPU machines). Same layout as
# ../shared/device/criu-bundle.sh's trixie bundle (4.1.1, which cannot dump inet sockets on
# kernels >= 6.16):
#   scripts/criu-bundle.sh OUTDIR      then on the other machine:
#   LD_LIBRARY_PATH=OUTDIR/usr/lib/x86_64-linux-gnu OUTDIR/usr/sbin/criu check
# The libraries are this machine's (Debian 12, glibc 2.36): any glibc >= 2.36 runs them. libc
# and the dynamic loader are not bundled.
set -euo pipefail
out=$(realpath -m "${1:?usage: criu-bundle.sh OUTDIR}")
criu=$(bash "$(dirname "$0")/criu.sh" | tail -n1)
mkdir -p "$out/usr/sbin" "$out/usr/lib/x86_64-linux-gnu"
install -m 0755 "$criu" "$out/usr/sbin/criu"
strip "$out/usr/sbin/criu"
ldd "$criu" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|ld-linux*) ;;
    *) cp -L "$lib" "$out/usr/lib/x86_64-linux-gnu/" ;;
  esac
done
LD_LIBRARY_PATH="$out/usr/lib/x86_64-linux-gnu" "$out/usr/sbin/criu" --version
