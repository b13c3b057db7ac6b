#!/bin/bash
# One task of the demo job (scripts/demo.sh): reads this rank's stream through nopfs (timed by
# `nopfs cat` itself), reads it again with --verify (every sample compared with its file), then
# reads the same stream straight from the files (read_direct.py), and prints one line.
set -o pipefail
repo=$1
nopfs=$repo/build/bin/nopfs
timed=$("$nopfs" cat 2>&1 >/dev/null | grep -o 'read in [0-9.]* s') || timed="read failed"
verified=$("$nopfs" cat --verify 2>/dev/null | tail -n 1) || verified="verify FAILED: $verified"
direct=$(/usr/bin/python3 "$repo/contrib/slurm/examples/read_direct.py" "$nopfs")
printf 'rank %s on %s: nopfs %s, %s; files directly: %s\n' "$NOPFS_RANK" "$SLURMD_NODENAME" \
  "$timed" "$verified" "$direct"
