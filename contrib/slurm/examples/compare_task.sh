#!/bin/bash
# One task of the demo job (scripts/demo.sh): reads this rank's stream through nopfs with
# --verify, then the same stream straight from the files (read_direct.py), and prints one line.
repo=$1
s=$(date +%s%N)
r=$("$repo/build/bin/nopfs" cat --verify | tail -n 1)
e=$(date +%s%N)
d=$(/usr/bin/python3 "$repo/contrib/slurm/examples/read_direct.py" "$repo/build/bin/nopfs")
printf 'rank %s on %s: nopfs: %s in %d ms; files directly: %s\n' "$NOPFS_RANK" \
  "$SLURMD_NODENAME" "$r" $(((e - s) / 1000000)) "$d"
