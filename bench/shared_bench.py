#!/usr/bin/python3
"""Four users' jobs on one node reading one dataset at once, on the local Slurm cluster
(contrib/slurm/local-cluster) over the emulated PFS (docs/pfsemu.md): with the dataset declared
shared (docs/admin.md, "Shared datasets": one copy per node, filled by the node's share service)
and, as the baseline, an identical dataset that is not. Per run: the bytes the four jobs together
read from the PFS (pfsemu's count, so the share service's reads are in it), in datasets, and the
slowest job's read time (`nopfs cat`'s). Runs alternate baseline and shared; before each shared
run the share service is stopped and its copy removed, so every shared run starts cold; a second
shared run follows on the copy the first left (warm). With --compare-nopfsd PATH the shared runs
are made with that nopfsd too (another build's), interleaved with this build's. Prints figures;
never passes or fails.

  sudo bench/shared_bench.py BUILD_DIR [--files N] [--size BYTES] [--bandwidth MBPS] [--runs R]
                             [--compare-nopfsd PATH]

Runs as root; uses the cluster tests' directory (take /tmp/nopfs-cluster.lock first).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
USERS = ["nopfs-alice", "nopfs-bob", "nopfs-carol", "nopfs-dave"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--files", type=int, default=1024)
    ap.add_argument("--size", type=int, default=64 * 1024)
    ap.add_argument("--bandwidth", type=int, default=50, help="pfsemu's flat MB/s")
    ap.add_argument("--runs", type=int, default=2, help="runs of each (alternating)")
    ap.add_argument("--compare-nopfsd", help="another build's nopfsd, for the shared runs too")
    a = ap.parse_args()
    os.environ["NOPFS_BINARY_DIR"] = os.path.abspath(a.build)
    sys.path.insert(0, os.path.join(HERE, "../tests/slurm"))
    import clusterlib as cl

    mnt = os.path.join(cl.DIR, "data/pfs")
    shared, unshared = os.path.join(mnt, "shared"), os.path.join(mnt, "unshared")
    os.environ["NOPFS_CLUSTER_SHARED"] = shared
    os.environ["NOPFS_CLUSTER_SHARED_SSD"] = "512M"
    r = cl.cluster("up", "1")
    if r.returncode != 0:
        raise SystemExit("local-cluster up failed:\n" + r.stderr)
    for u in USERS:
        if subprocess.run(["id", u], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", u], check=True)
    backing = os.path.join(cl.DIR, "data/backing")
    for tree in ("shared", "unshared"):
        cl.make_files(os.path.join(backing, tree), a.files, a.size)
    time.sleep(1)
    emu = cl.start_pfsemu(os.path.join(a.build, "bin"), backing, mnt, a.bandwidth)
    try:
        dataset = a.files * a.size
        load = os.getloadavg()[0]
        print(f"4 users' jobs at once on one node; {a.files} files of {a.size} B "
              f"({dataset / 1e6:.0f} MB) on pfsemu at {a.bandwidth} MB/s; load {load:.1f}")
        mine = cl.NOPFSD
        daemons = [("this", mine)] + ([("other", a.compare_nopfsd)] if a.compare_nopfsd else [])
        print("dataset  copy  nopfsd  run  pfs_MB  datasets  slowest_read_s  from_shared_MB")
        for run in range(a.runs):
            cases = [("unshared", "-", "this", mine)]
            for label, nopfsd in daemons if run % 2 == 0 else daemons[::-1]:
                cases += [("shared", "cold", label, nopfsd), ("shared", "warm", label, nopfsd)]
            for name, copy, label, nopfsd in cases:
                cl.NOPFSD = nopfsd
                cl.cluster("plugstack")
                if copy == "cold":
                    reset_share(cl)
                pfs, slowest, from_shared = four_jobs(
                    cl, mnt, shared if name == "shared" else unshared)
                print(f"{name:8} {copy:5} {label:6} {run + 1:4}  {pfs / 1e6:6.0f}  "
                      f"{pfs / dataset:8.2f}  {slowest:14.2f}  {from_shared / 1e6:14.0f}")
        print(f"load at the end {os.getloadavg()[0]:.1f}")
    finally:
        emu.terminate()
        emu.wait()
        cl.cluster("down")


def reset_share(cl):
    """Stops the node's share service and removes its copies: the next job starts cold."""
    for pid in cl.share_service_pids():
        subprocess.run(["kill", "-KILL", str(pid)])
    time.sleep(0.5)
    shutil.rmtree(os.path.join(cl.SSD, ".nopfs-shared"), ignore_errors=True)


def four_jobs(cl, mnt, path):
    before = cl.pfs_bytes_read(mnt)
    script = (f"srun bash -c '{cl.BUILD}/bin/nopfs cat 2>&1 >/dev/null | grep \"read in\"; "
              f"echo \"status: $({cl.BUILD}/bin/nopfs status --json)\"'\n")
    jobs = [cl.submit(u, f"-w n1 --oversubscribe --mem=300 --nopfs-ram=0 --nopfs-ssd=200M "
                      f"--nopfs={path} --nopfs-seed={3 + i}", script)
            for i, u in enumerate(USERS)]
    slowest, from_shared = 0.0, 0
    for j in jobs:
        state = cl.wait_done(j, 600)
        out = cl.output(j)
        if state != "COMPLETED":
            raise SystemExit(f"job {j}: {state}\n{out}")
        m = re.search(r"read in ([\d.]+) s", out)
        slowest = max(slowest, float(m.group(1)) if m else 0.0)
        import json
        s = re.search(r"(?m)^status: (\{.*\})$", out)
        if s:
            from_shared += sum(x["bytes"] for x in json.loads(s.group(1))["sources"]
                               if x["name"] == "shared")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and cl.daemons():
        time.sleep(0.2)
    return cl.pfs_bytes_read(mnt) - before, slowest, from_shared


if __name__ == "__main__":
    main()
