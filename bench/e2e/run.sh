#!/usr/bin/env bash
# The end-to-end benchmark (docs/PERFORMANCE.md, "End to end"): mounts the emulated PFS, runs every
# setup side by side, writes docs/e2e/{results.json,table.md,epochs.png,stalls.png}.
#   bench/e2e/run.sh [--quick] [--build DIR] [e2e.py options]     (as root; DIR defaults to build)
# --quick: F = 1500, E = 3 (about 2.5 minutes); without it F = 3000, E = 4 (about 7.5 minutes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec /usr/bin/python3 "$here/e2e.py" "$@"
