#!/usr/bin/env bash
# The main job, on a fresh Debian 12 machine as root: installs what is needed, builds nopfs, and
#  1. shows the clairvoyant planner on a synthetic ImageNet-1k-sized job (16 nodes x 4 ranks);
#  2. brings up a throwaway 3-node Slurm cluster on this machine (contrib/slurm/local-cluster)
#     and makes a small synthetic ImageFolder dataset;
#  3. mounts the dataset through an emulated loaded parallel file system (nopfs_pfsemu, as the
#     end-to-end benchmark does: a shared bandwidth of 10-24 MB/s and 2 ms per open), and submits,
#     as the ordinary user nopfs-alice, a 3-node job with --nopfs whose 6 tasks each read their
#     stream epoch by epoch through their node's nopfsd and then the same stream straight from the
#     files; it prints every epoch's time both ways, whether the bytes were the same, what each
#     node's nopfsd served from where, the speed-up after the first epoch and the bytes the PFS
#     served; and that nothing is left behind. Then it takes the cluster down.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh release >/dev/null
repo=$(pwd)
nopfs=$repo/build/bin/nopfs
job=(--seed 42 --epochs 90 --ranks 64 --ranks-per-node 4 --batch 2048 --scheme uniform)

echo "== 1. the planner: node 0 of a 16-node ImageNet-1k job (1,281,167 samples, 90 epochs)"
echo "-- the first 4 samples of rank 0 (nopfs stream -v: epoch step index sample)"
"$nopfs" stream "${job[@]}" --samples 1281167 --rank 0 -v --count 4
echo "-- with a 20 GB RAM tier and a 60 GB SSD tier per node (contrib/config/demo.conf.lua)"
"$nopfs" plan "${job[@]}" --synthetic 1281167:110K --node 0 --config contrib/config/demo.conf.lua \
  --compute-rate 600 | grep -E "^(class|ram|ssd|pfs) |^sources|^model"
echo "-- the same node without a cache (contrib/config/nocache.conf.lua)"
"$nopfs" plan "${job[@]}" --synthetic 1281167:110K --node 0 \
  --config contrib/config/nocache.conf.lua --compute-rate 600 | grep -E "^sources|^model"

echo
echo "== 2. a local Slurm cluster of 3 nodes, and a dataset"
export NOPFS_CLUSTER_DIR=/tmp/nopfs-demo-cluster
pfs=/tmp/nopfs-demo-pfs
pfs_pid=
cleanup() {
  contrib/slurm/local-cluster down >/dev/null 2>&1 || true
  if [[ -n $pfs_pid ]]; then
    kill "$pfs_pid" 2>/dev/null || true
    wait "$pfs_pid" 2>/dev/null || true
  fi
}
trap cleanup EXIT
eval "$(contrib/slurm/local-cluster up 3)"
sinfo

data=/tmp/nopfs-demo-data
if [[ ! -f $data/.complete ]]; then
  rm -rf "$data"
  /usr/bin/python3 - "$data" <<'PY'
import os, random, sys
root = sys.argv[1]
rnd = random.Random(7)
for k in range(3000):
    d = os.path.join(root, f"class{k % 10:02d}")
    os.makedirs(d, exist_ok=True)
    size = min(400_000, int(rnd.lognormvariate(10.3, 0.6)))  # around 35 KB, like small images
    with open(os.path.join(d, f"img{k:05d}.jpg"), "wb") as f:
        f.write(rnd.randbytes(size))
PY
  touch "$data/.complete"
  chmod -R a+rX "$data"
fi
echo "dataset: $data, $(find "$data" -type f -name '*.jpg' | wc -l) files, $(du -sh --apparent-size "$data" | cut -f1)"
dataset_bytes=$(find "$data" -type f -name '*.jpg' -printf '%s\n' | awk '{s += $1} END {print s}')

# The emulated PFS: the job reads the dataset through it, nopfs and the direct reads alike.
mkdir -p "$pfs"
mountpoint -q "$pfs" && umount "$pfs"
build/bin/nopfs_pfsemu --config bench/e2e/pfs.conf "$data" "$pfs" 2>/tmp/nopfs-demo-pfsemu.log &
pfs_pid=$!
for _ in $(seq 100); do
  [[ -e $pfs/.pfsemu_stats ]] && break
  kill -0 "$pfs_pid" 2>/dev/null || { cat /tmp/nopfs-demo-pfsemu.log >&2; exit 1; }
  sleep 0.1
done
[[ -e $pfs/.pfsemu_stats ]] || { echo "demo: the emulated PFS did not mount" >&2; exit 1; }
pfs_read() { awk '$1 == "bytes_read" {print $2}' "$pfs/.pfsemu_stats"; }
echo "emulated PFS: $pfs (bandwidth $(awk -F' = ' '$1 == "bandwidth" {print $2}' bench/e2e/pfs.conf) readers:MB/s, 2 ms per open)"

out=/tmp/nopfs-demo-out
rm -rf "$out" && mkdir -p "$out" && chmod 777 "$out"
cat >"$out/job.sh" <<JOB
#!/bin/bash
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=2
#SBATCH --mem=1000M
#SBATCH --nopfs=$pfs
#SBATCH --nopfs-seed=42
#SBATCH --nopfs-epochs=3
#SBATCH --nopfs-batch=96
#SBATCH --nopfs-ranks-per-node=2
# Each node's cache holds about two thirds of what the node reads: the rest comes from the other
# nodes' tiers (peers over libfabric) or, when no peer has it ready, from the files.
#SBATCH --nopfs-ram=50M
#SBATCH --nopfs-ssd=1M
#SBATCH --output=$out/job-%j.out
export PATH=$repo/build/bin:\$PATH
export PYTHONPATH=$repo/build/python
echo "-- every task reads its stream epoch by epoch through nopfs, then straight from the files"
srun /usr/bin/python3 $repo/contrib/slurm/examples/epoch_task.py | sort -n -k2
echo "-- what each node's nopfsd served"
srun --ntasks=3 --ntasks-per-node=1 bash -c 'nopfs status | grep -E "^(tier|served|pfs read|stall|peers)" | sed "s/^/\$SLURMD_NODENAME: /"' | sort
JOB
chmod 755 "$out/job.sh"

echo
echo "== 3. sbatch --nopfs as nopfs-alice (3 nodes x 2 tasks, 3 epochs)"
start=$(date +%s)
pfs_before=$(pfs_read)
runuser -u nopfs-alice -- env SLURM_CONF="$SLURM_CONF" sbatch --wait --parsable "$out/job.sh" \
  >"$out/jobid" || echo "(the job failed; its output follows)"
jobid=$(cat "$out/jobid")
cat "$out/job-$jobid.out"
echo "-- job $jobid took $(($(date +%s) - start)) s from submission to end"
/usr/bin/python3 - "$out/job-$jobid.out" "$(($(pfs_read) - pfs_before))" "$dataset_bytes" <<'PY'
import re, statistics, sys
text = open(sys.argv[1]).read()
pfs, dataset = int(sys.argv[2]), int(sys.argv[3])
tasks = re.findall(r"epochs nopfs ([\d. /]+) s, files ([\d. /]+) s;", text)
if not tasks:
    sys.exit("demo: no task reported its epochs")
nopfs = [[float(t) for t in a.split(" / ")] for a, _ in tasks]
files = [[float(t) for t in b.split(" / ")] for _, b in tasks]
def mean(rows, first, last=None):
    return statistics.mean(t for r in rows for t in r[first:last])
print(f"-- per task and epoch, mean of {len(tasks)} tasks: epoch 1: nopfs {mean(nopfs, 0, 1):.2f} s,"
      f" files {mean(files, 0, 1):.2f} s; epochs 2+: nopfs {mean(nopfs, 1):.2f} s, files"
      f" {mean(files, 1):.2f} s: {mean(files, 1) / mean(nopfs, 1):.1f}x faster with nopfs")
served = sum(int(b) for b in re.findall(r"^n\d+: pfs read: (\d+) bytes in all", text, re.M))
print(f"-- the nodes' nopfsd read {served / dataset:.2f} datasets from the PFS for {len(nopfs[0])} epochs"
      f" (their status); the direct reads take {len(nopfs[0])} datasets; the emulated PFS served"
      f" {pfs / dataset:.2f} in all")
PY
sleep 2
left=$(pgrep -u nopfs-alice nopfsd || true)
files=$(find "$NOPFS_CLUSTER_DIR/run" "$NOPFS_CLUSTER_DIR/ssd" -mindepth 2 \
  -not -path '*/.ledger*' 2>/dev/null | wc -l)
echo "-- after the job: nopfsd processes of nopfs-alice: ${left:-none}; files left in run and SSD directories: $files"
