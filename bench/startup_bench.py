#!/usr/bin/env python3
"""Start-up benchmark: the time from `nopfs run`'s launch to each rank's first sample, and the
metadata operations the job asks of the PFS, against the dataset's file count and the job's node
count (docs/PERFORMANCE.md, "Start-up").

The dataset is a synthetic ImageFolder tree (100 classes, small files) read through the emulated
PFS (bench/pfsemu) with no attribute cache (each node's lookups reach it, as on separate hosts)
and the same latency on every metadata operation (getattr, readdir, open). Each rank runs
`nopfs cat --count 1` and records when its first sample arrived. Every run starts from an empty
run directory: no catalog cache, a full scan.

--ram gives the RAM tier's capacity (a list: one run per size; 0: no tier). With a RAM tier, the
files are sparse and large enough that the dataset fills the largest tier (files x size >= the
size), so that the tier really is that large (its mapped bytes are in the `ram_gb` column, from
nopfsd's log): its memory is committed as its slots are filled, in the background, so the ready
time must not grow with it.

`meta_ops` is getattrs + readdirs, split in the next columns: `ga_files` the getattrs of files
(one per file the job stats or opens), `ga_dirs` those of directories (each directory's lookup,
and the kernel's refreshes of a directory's attributes for the permission checks of the lookups
in it, one per 50 ms of them: what the kernel adds to what the job asks), `readdirs` the
listings. --phases prints node 0's `start-up in` line (docs/service.md) under each row.

Needs root (the emulated PFS mounts with allow_other; the job runs as nobody).

Usage: startup_bench.py BUILD_DIR [--files 10000,30000,100000] [--nodes 1,2,4] [--ram 0,1GB]
                        [--latency-us 1000] [--nopfs-bin DIR[,DIR...]] [--work DIR] [--phases]
                        [--logs DIR]
--nopfs-bin runs another build's nopfs and nopfsd against the same mount; several directories,
comma-separated, run each row once per directory, one after the other on the same tree (e.g.
`--nopfs-bin /tmp/old/bin,build/bin` to compare an older build with this one), and the `bin`
column names which (its index in the list).
"""

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

CLASSES = 100
FILE_BYTES = 512


def make_tree(root, files, file_bytes=FILE_BYTES):
    """`files` files of `file_bytes` (sparse past FILE_BYTES) in CLASSES class directories,
    world-readable."""
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
            if file_bytes > FILE_BYTES:
                fh.truncate(file_bytes)
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


# As Slurm's --mem and nopfs (common/units.h): a bare number is MiB, K/M/G are powers of 1024
# ("GB" and "GiB" too), B is bytes.
SIZE_UNITS = {"": 2**20, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "KB": 2**10, "MB": 2**20,
              "GB": 2**30, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)", text.strip())
    if not m or m.group(2).upper() not in SIZE_UNITS:
        sys.exit(f"startup_bench: --ram: {text!r} is not a size; write e.g. 0,1G,4G,16G")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2).upper()])


def write_conf(path, ram_bytes, file_bytes):
    """No SSD tier; a RAM tier of `ram_bytes` (none at 0); staging for a few files."""
    with open(path, "w") as fh:
        # Without a tier, what the job waits for is the start-up itself, and the only opens are
        # the ranks' first samples and the staging threads' read-ahead.
        staging = max(1 << 20, 4 * file_bytes)
        fh.write(f'staging = {{ capacity = "{staging}B", threads = 1 }}\n'
                 f'classes = {{ ram {{ capacity = "{ram_bytes}B", threads = 1 }} }}\n')
    os.chmod(path, 0o644)


def ram_mapped(run, nodes):
    """The RAM tier's mapped bytes in node 0's nopfsd log (0 without a tier)."""
    log = os.path.join(run, "node0" if nodes > 1 else "", "nopfsd.log")
    m = re.search(r"ram tier \S+: \d+ samples, (\d+) bytes mapped", open(log).read())
    return int(m.group(1)) if m else 0


def startup_phases(run, nodes):
    """Node 0's `start-up in … s: …` line from its nopfsd log (docs/service.md), or ""."""
    log = os.path.join(run, "node0" if nodes > 1 else "", "nopfsd.log")
    m = re.search(r"start-up in (.*)$", open(log).read(), re.M)
    return m.group(1) if m else ""


def run_job(nopfs_bin, mnt, nodes, conf, work, logs=None):
    """One job: returns (seconds from launch to each rank's first sample, counter deltas, the RAM
    tier's mapped bytes, node 0's start-up phases); with `logs`, copies each node's nopfsd log
    there (nodeN.log) before the run directory goes."""
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
         os.path.join(run_parent, "run"), "--keep-run-dir", "-q", "--", "/bin/sh", "-c",
         rank_cmd],
        capture_output=True, text=True, timeout=3600)
    after = counters(mnt)
    if p.returncode != 0:
        sys.exit(f"startup_bench: nopfs run --nodes {nodes} failed:\n{p.stdout}{p.stderr}")
    firsts = []
    for r in range(nodes):
        with open(os.path.join(marks, f"first-{r}")) as fh:
            firsts.append(float(fh.read()) - launched)
    mapped = ram_mapped(os.path.join(run_parent, "run"), nodes)
    phases = startup_phases(os.path.join(run_parent, "run"), nodes)
    if logs is not None:
        os.makedirs(logs, exist_ok=True)
        for n in range(nodes):
            log = os.path.join(run_parent, "run", f"node{n}" if nodes > 1 else "", "nopfsd.log")
            if os.path.exists(log):
                shutil.copy(log, os.path.join(logs, f"node{n}.log"))
    shutil.rmtree(run_parent, ignore_errors=True)
    keys = ("getattrs", "getattrs_files", "getattrs_dirs", "readdirs", "opens")
    return firsts, {k: after[k] - before[k] for k in keys}, mapped, phases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--files", default="10000,30000,100000")
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--ram", default="0")
    ap.add_argument("--latency-us", type=int, default=1000)
    ap.add_argument("--nopfs-bin", default=None)
    ap.add_argument("--work", default=None)
    ap.add_argument("--logs", default=None,
                    help="keep every node's nopfsd log of each row under this directory")
    ap.add_argument("--phases", action="store_true",
                    help="print node 0's start-up phases (its nopfsd log) under each row")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("startup_bench: run as root (the emulated PFS mounts with allow_other)")
    bin_dir = os.path.join(a.build, "bin")
    nopfs_bins = a.nopfs_bin.split(",") if a.nopfs_bin else [bin_dir]
    several = len(nopfs_bins) > 1
    work = tempfile.mkdtemp(prefix="nopfs-startup-", dir=a.work)
    os.chmod(work, 0o755)
    rams = [parse_size(x) for x in a.ram.split(",")]
    conf = os.path.join(work, "node.conf.lua")
    for i, b in enumerate(nopfs_bins):
        print(f"# bin {i}: {b}")
    print(f"# {CLASSES} classes, every metadata operation {a.latency_us} us, no "
          f"attribute cache")
    print(f"{'bin ' if several else ''}{'files':>8} {'file_kb':>8} {'nodes':>5} {'ram_gb':>7} "
          f"{'first_max_s':>11} {'first_med_s':>11} {'meta_ops':>9} {'ops/file':>8} "
          f"{'ga_files':>8} {'ga_dirs':>7} {'readdirs':>8} {'opens':>7}")
    try:
        for files in (int(x) for x in a.files.split(",")):
            # Large enough files that the dataset fills the largest RAM tier (4 KiB pages).
            file_bytes = max(FILE_BYTES, -(-max(rams) // files // 4096) * 4096)
            backing = os.path.join(work, f"tree{files}")
            make_tree(backing, files, file_bytes)
            mnt = os.path.join(work, f"mnt{files}")
            emu = mount(os.path.join(bin_dir, "nopfs_pfsemu"), backing, mnt, a.latency_us)
            try:
                for nodes in (int(x) for x in a.nodes.split(",")):
                    for ram in rams:
                        for b, nopfs_bin in enumerate(nopfs_bins):
                            write_conf(conf, ram, file_bytes)
                            logs = a.logs and os.path.join(
                                a.logs, f"f{files}-n{nodes}-ram{ram}-bin{b}")
                            firsts, ops, mapped, phases = run_job(nopfs_bin, mnt, nodes, conf,
                                                                  work, logs)
                            meta = ops["getattrs"] + ops["readdirs"]
                            print(f"{f'{b:>3} ' if several else ''}"
                                  f"{files:>8} {file_bytes / 1024:>8.1f} {nodes:>5} "
                                  f"{mapped / 1e9:>7.2f} {max(firsts):>11.2f} "
                                  f"{statistics.median(firsts):>11.2f} {meta:>9} "
                                  f"{meta / files:>8.3f} {ops['getattrs_files']:>8} "
                                  f"{ops['getattrs_dirs']:>7} {ops['readdirs']:>8} "
                                  f"{ops['opens']:>7}", flush=True)
                            if a.phases and phases:
                                print(f"#   node 0 start-up in {phases}", flush=True)
            finally:
                unmount(emu, mnt)
            shutil.rmtree(backing, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
