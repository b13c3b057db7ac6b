#!/usr/bin/env bash
# Runs every nopfs test on this machine: installs what is missing, builds the release and the
# sanitizer (ASan + UBSan) trees, runs ctest in both and clang's thread-safety analysis over the
# release tree's sources. Exits non-zero on any failure.
# This is the README's test command and exactly what CI (.ci/run) runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

status=0
echo "== release build"
scripts/build.sh release
echo "== release tests"
(cd build && ctest --output-on-failure --timeout 600) || status=1
echo "== thread-safety analysis (clang -Wthread-safety over every translation unit)"
/usr/bin/python3 scripts/thread_safety.py build || status=1

echo "== sanitizer build (ASan + UBSan)"
scripts/build.sh asan
echo "== sanitizer tests"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
# Leaks outside nopfs's code that a test provokes on purpose, each with its reason (tests/lsan.supp).
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Unit tests and the single-node integration test (nopfsd, built with the sanitizers, serving
# real clients); the Slurm cluster test runs in the release tree only.
(cd build-asan && ctest --output-on-failure --timeout 900 -L "unit|integration") || status=1

echo "== fuzz smoke (libFuzzer + ASan + UBSan, a few seconds per target; docs/fuzzing.md)"
# Builds build-fuzz/ (only the fuzz targets) and runs its ctest label fuzz: each target from its
# seed corpus, so that no target rots. scripts/fuzz.sh runs them for 10 M executions each.
scripts/fuzz.sh --build-only
(cd build-fuzz && ctest --output-on-failure -L fuzz) || status=1

if ((status != 0)); then
  echo "nopfs: tests FAILED" >&2
fi
exit $status
