#!/usr/bin/env bash
# Configures and builds nopfs. Usage: scripts/build.sh [release|asan] [extra cmake args...]
#   release -> build/       (Release, prefix /usr: what the .deb ships; cpack -G DEB packs it)
#   asan    -> build-asan/  (ASan + UBSan)
# Both treat warnings as errors (NOPFS_WERROR; off for a plain `cmake` build, so that a newer or
# older compiler's new warning does not stop someone building a release).
set -euo pipefail
cd "$(dirname "$0")/.."
flavor=${1:-release}
shift || true
scripts/install-deps.sh
jobs=$(nproc)
case "$flavor" in
  release) dir=build; args=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr) ;;
  asan) dir=build-asan; args=(-DCMAKE_BUILD_TYPE=Debug -DNOPFS_SANITIZE=ON -DNOPFS_BUILD_BENCH=OFF) ;;
  *) echo "nopfs: build: unknown flavor '$flavor': write 'release' or 'asan'" >&2; exit 2 ;;
esac
# ccache, where installed, keeps rebuilds (and a second tree of the same sources) short.
if command -v ccache >/dev/null; then
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$dir" -DNOPFS_WERROR=ON "${args[@]}" "$@" >/dev/null
cmake --build "$dir" -j "$jobs"
