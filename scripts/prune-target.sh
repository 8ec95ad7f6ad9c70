#!/usr/bin/env bash
# Removes this project's superseded build outputs from a cargo deps directory, keeping the
# newest of each: every change of the workspace's dependencies or flags gives its test
# binaries, fuzz binaries (~0.8 GB each with AddressSanitizer) and libraries a new hash, and
# cargo never removes the old ones. Third-party libraries are left alone (two versions of a
# crate can both be in use).
#   bash scripts/prune-target.sh DEPS_DIR
set -euo pipefail
deps="$1"
[ -d "$deps" ] || exit 0
# Executables (test, bench and fuzz binaries) and the workspace's own libraries, grouped by
# their name without the hash; newest first within a group.
find "$deps" -maxdepth 1 -type f \( -perm -u+x ! -name "*.*" -o -name "libgstore*" \) -printf '%T@ %f\n' \
  | sort -rn \
  | sed -E 's/^[^ ]+ (.*)$/\1 \1/; s/-[0-9a-f]{16}([^ ]*)$/\1/' \
  | awk '{ if (seen[$2]++) print $1 }' \
  | while read -r old; do
      rm -f "$deps/$old" "$deps/${old%%.*}.d"
    done
