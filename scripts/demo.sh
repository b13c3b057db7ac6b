#!/usr/bin/env bash
# The main job: installs what is needed, builds nopfs, and demonstrates the clairvoyant planner on
# a synthetic ImageNet-1k-sized dataset (1,281,167 samples around 110 KB, 90 epochs, 16 nodes x 4
# ranks). Until the Slurm integration lands this is the demo; it then becomes a job on a local
# Slurm cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh release >/dev/null
nopfs=build/bin/nopfs
job=(--seed 42 --epochs 90 --ranks 64 --ranks-per-node 4 --batch 2048 --scheme uniform)

echo "== the first 8 samples rank 0 reads (nopfs stream, the reference access stream)"
"$nopfs" stream "${job[@]}" --samples 1281167 --rank 0 -v --count 8
echo
echo "== node 0's plan with a 20 GB RAM tier and a 60 GB SSD tier (contrib/config/demo.conf.lua)"
"$nopfs" plan "${job[@]}" --synthetic 1281167:110KB --node 0 --config contrib/config/demo.conf.lua \
  --compute-rate 600
echo
echo "== the same node without any cache: every read goes to the PFS"
"$nopfs" plan "${job[@]}" --synthetic 1281167:110KB --node 0 --config contrib/config/nocache.conf.lua \
  --compute-rate 600
