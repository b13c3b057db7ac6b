#!/usr/bin/env python3
"""Start-up benchmark: the time from `nopfs run`'s launch to each rank's first sample, and the
metadata operations the job asks of the PFS, against the dataset's file count and the job's node
count (docs/PERFORMANCE.md, "Start-up").

The dataset is a synthetic ImageFolder tree (100 classes, small files) read through the emulated
PFS (bench/pfsemu) with no attribute cache (each node's lookups reach it, as on separate hosts)
and the same latency on every metadata operation (getattr, readdir, open). Each rank runs
`nopfs cat --count 1` and records when its first sample arrived. Every run starts from an empty
run directory: no catalog cache, a full scan.

Needs root (the emulated PFS mounts with allow_other; the job runs as nobody).

Usage: startup_bench.py BUILD_DIR [--files 10000,30000,100000] [--nodes 1,2,4]
                        [--latency-us 1000] [--nopfs-bin DIR] [--work DIR]
--nopfs-bin runs another build's nopfs and nopfsd (e.g. to compare with an older one) against
the same mount.
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

CLASSES = 100
FILE_BYTES = 512


def make_tree(root, files):
    """`files` files of FILE_BYTES in CLASSES class directories, world-readable."""
    os.makedirs(root)
    payload = os.urandom(FILE_BYTES)
    for c in range(CLASSES):
        d = os.path.join(root, f"c{c:03d}")
        os.mkdir(d)
        os.chmod(d, 0o755)
    for k in range(files):
        path = os.path.join(root, f"c{k % CLASSES:03d}", f"f{k:07d}.bin")
        with open(path, "wb") as fh:
            fh.write(payload)
        os.chmod(path, 0o644)
    os.chmod(root, 0o755)


def mount(emu, backing, mnt, latency_us):
    os.makedirs(mnt)
    os.chmod(mnt, 0o755)
    lat = str(latency_us)
    proc = subprocess.Popen([emu, "--attr-cache-ms", "0", "--getattr-latency-us", lat,
                             "--readdir-latency-us", lat, "--open-latency-us", lat,
                             "--max-threads", "64", "--burst-bytes", "0", backing, mnt],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(mnt, ".pfsemu_stats")):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"startup_bench: nopfs_pfsemu did not mount {mnt}")
        time.sleep(0.05)
    return proc


def unmount(proc, mnt):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    subprocess.run(["fusermount3", "-u", "-z", mnt], stderr=subprocess.DEVNULL, check=False)


def counters(mnt):
    with open(os.path.join(mnt, ".pfsemu_stats")) as fh:
            fields = (line.split() for line in fh)
            return {f[0]: int(f[1]) for f in fields if len(f) == 2 and f[1].isdigit()}


def run_job(nopfs_bin, mnt, nodes, conf, work):
    """One job: returns (seconds from launch to each rank's first sample, counter deltas)."""
    run_parent = tempfile.mkdtemp(prefix=f"n{nodes}-", dir=work)
    os.chmod(run_parent, 0o755)
    shutil.chown(run_parent, "nobody", "nogroup")
    marks = os.path.join(run_parent, "marks")
    os.mkdir(marks)
    os.chmod(marks, 0o777)
    rank_cmd = (f"{os.path.join(nopfs_bin, 'nopfs')} cat --count 1 >/dev/null && "
                f"date +%s.%N > {marks}/first-$NOPFS_RANK")
    before = counters(mnt)
    launched = time.time()
    p = subprocess.run(
        [os.path.join(nopfs_bin, "nopfs"), "run", "--dataset", mnt, "--nodes", str(nodes),
         "--ranks", str(nodes), "--user", "nobody", "--config", conf, "--run-dir",
         os.path.join(run_parent, "run"), "-q", "--", "/bin/sh", "-c", rank_cmd],
        capture_output=True, text=True, timeout=3600)
    after = counters(mnt)
    if p.returncode != 0:
        sys.exit(f"startup_bench: nopfs run --nodes {nodes} failed:\n{p.stdout}{p.stderr}")
    firsts = []
    for r in range(nodes):
        with open(os.path.join(marks, f"first-{r}")) as fh:
            firsts.append(float(fh.read()) - launched)
    shutil.rmtree(run_parent, ignore_errors=True)
    return firsts, {k: after[k] - before[k] for k in ("getattrs", "readdirs", "opens")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--files", default="10000,30000,100000")
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--latency-us", type=int, default=1000)
    ap.add_argument("--nopfs-bin", default=None)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("startup_bench: run as root (the emulated PFS mounts with allow_other)")
    bin_dir = os.path.join(a.build, "bin")
    nopfs_bin = a.nopfs_bin or bin_dir
    work = tempfile.mkdtemp(prefix="nopfs-startup-", dir=a.work)
    os.chmod(work, 0o755)
    conf = os.path.join(work, "node.conf.lua")
    with open(conf, "w") as fh:
        # No tier to fill: what the job waits for is the start-up itself, and the only opens are
        # the ranks' first samples and the staging threads' read-ahead.
        fh.write('staging = { capacity = "1MB", threads = 1 }\n'
                 'classes = { ram { capacity = "0", threads = 1 } }\n')
    os.chmod(conf, 0o644)
    print(f"# {nopfs_bin}: {CLASSES} classes of {FILE_BYTES}-byte files, every metadata "
          f"operation {a.latency_us} us, no attribute cache")
    print(f"{'files':>8} {'nodes':>5} {'first_max_s':>11} {'first_med_s':>11} "
          f"{'meta_ops':>9} {'ops/file':>8} {'opens':>7}")
    try:
        for files in (int(x) for x in a.files.split(",")):
            backing = os.path.join(work, f"tree{files}")
            make_tree(backing, files)
            mnt = os.path.join(work, f"mnt{files}")
            emu = mount(os.path.join(bin_dir, "nopfs_pfsemu"), backing, mnt, a.latency_us)
            try:
                for nodes in (int(x) for x in a.nodes.split(",")):
                    firsts, ops = run_job(nopfs_bin, mnt, nodes, conf, work)
                    meta = ops["getattrs"] + ops["readdirs"]
                    print(f"{files:>8} {nodes:>5} {max(firsts):>11.2f} "
                          f"{statistics.median(firsts):>11.2f} {meta:>9} {meta / files:>8.3f} "
                          f"{ops['opens']:>7}", flush=True)
            finally:
                unmount(emu, mnt)
            shutil.rmtree(backing, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
