#!/usr/bin/python3
"""A job run twice on the emulated PFS (docs/pfsemu.md), the first with `--keep` (docs/tiers.md,
"The kept area"): per job, the seconds of its first and second epoch (one rank reading its stream
with `nopfs cat`), the PFS bytes, the samples adopted, and how long nopfsd took to keep at exit.
With `--array N`: instead, N jobs of one user on one node and dataset at once (a packed job
array; docs/tiers.md, "Sibling jobs"), with sibling reads and then with `--share-running=no`: the
bytes all N read from the PFS (as pfsemu counts them) and the seconds of the slowest job's epochs.
The first job starts first, the others once it serves; with `--together` all start at the same
moment (the first to register serves the others). All read when every one is up. Each job has
its own `nopfs run --job-id`. Prints figures; never passes or fails.

  sudo bench/keep_bench.py BUILD_DIR [--files N] [--size BYTES] [--bandwidth MBPS]
                           [--getattr-latency-us US] [--second-seed S]
                           [--array N [--together]]

Runs as root (pfsemu mounts with allow_other); the jobs run as `nobody`.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tests/slurm"))
from clusterlib import make_files, pfs_bytes_read, start_pfsemu  # noqa: E402

DEMOTE = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--files", type=int, default=2048)
    ap.add_argument("--size", type=int, default=64 * 1024)
    ap.add_argument("--bandwidth", type=int, default=50, help="pfsemu's flat MB/s")
    ap.add_argument("--getattr-latency-us", type=int, default=200)
    ap.add_argument("--second-seed", type=int, default=3,
                    help="the second job's seed (3, the first's: its SSD tier takes the kept "
                         "files over in place; another: it copies the adopted samples)")
    ap.add_argument("--array", type=int, default=0, help="N concurrent jobs (sibling reads)")
    ap.add_argument("--together", action="store_true",
                    help="with --array: start every job at once, not the first one first")
    a = ap.parse_args()
    bindir = os.path.abspath(os.path.join(a.build, "bin"))
    work = tempfile.mkdtemp(prefix="nopfs-keep-bench-")
    os.chmod(work, 0o777)
    backing, mnt = os.path.join(work, "backing"), os.path.join(work, "mnt")
    make_files(backing, a.files, a.size)
    time.sleep(1)  # the files' ctimes before the jobs' start
    emu = start_pfsemu(bindir, backing, mnt, a.bandwidth, a.getattr_latency_us)
    try:
        scratch = os.path.join(work, "scratch")
        os.mkdir(scratch)
        os.chmod(scratch, 0o777)
        conf = os.path.join(work, "ssd.conf.lua")
        with open(conf, "w") as fh:
            fh.write('staging = { capacity = "64M", threads = 4 }\n'
                     f'classes = {{ ssd {{ path = "{scratch}", capacity = "4G", threads = 4 }} }}\n')
        os.chmod(conf, 0o644)
        if a.array:
            array(a, bindir, work, mnt, conf)
            return
        nopfs = os.path.join(bindir, "nopfs")
        print(f"{a.files} files of {a.size} B ({a.files * a.size / 1e6:.0f} MB) on pfsemu at "
              f"{a.bandwidth} MB/s, getattr {a.getattr_latency_us} us; SSD tier holds it all")
        print("job  epoch0_s  epoch1_s  pfs_MB  adopted  keep_s")
        for job in (1, 2):
            out = os.path.join(work, f"job{job}")
            script = (f"t0=$(date +%s.%N); {nopfs} cat --count {a.files} > /dev/null; "
                      f"t1=$(date +%s.%N); {nopfs} cat --start-epoch 1 > /dev/null; "
                      f"t2=$(date +%s.%N); {nopfs} status --json > {out}.json; "
                      f"echo $t0 $t1 $t2 > {out}.times")
            subprocess.run(DEMOTE + [nopfs, "run", "--dataset", mnt, "--keep",
                                     "--ranks", "1", "--epochs", "2", "--batch", "16", "--seed",
                                     str(a.second_seed if job == 2 else 3), "--config", conf,
                                     "--run-dir", out + ".run",
                                     "--keep-run-dir", "-q", "--", "sh", "-c", script],
                           check=True, capture_output=True)
            t0, t1, t2 = map(float, open(out + ".times").read().split())
            st = json.load(open(out + ".json"))
            log = open(out + ".run/nopfsd.log").read()
            m = re.search(r"kept area: kept \d+ samples .* in ([\d.]+) s", log)
            print(f"{job:3d}  {t1 - t0:8.2f}  {t2 - t1:8.2f}  {st['pfs_bytes'] / 1e6:6.1f}  "
                  f"{st['adopted_samples']:7d}  {m.group(1) if m else '-':>6}")
    finally:
        emu.terminate()
        emu.wait()
        shutil.rmtree(work, ignore_errors=True)


def array(a, bindir, work, mnt, conf):
    """--array N: N jobs at once, with and without sibling reads."""
    nopfs = os.path.join(bindir, "nopfs")
    dataset = a.files * a.size
    start = "together" if a.together else "the first one first"
    print(f"{a.files} files of {a.size} B ({dataset / 1e6:.0f} MB) on pfsemu at {a.bandwidth} "
          f"MB/s, getattr {a.getattr_latency_us} us; {a.array} jobs of one user at once, each "
          f"with an SSD tier that holds it all, started {start}")
    print("share  jobs  pfs_MB  datasets  slowest_epoch0_s  slowest_epoch1_s  from_sibling")
    for share in ("yes", "no"):
        flags = os.path.join(work, f"flags-{share}")
        os.mkdir(flags)
        os.chmod(flags, 0o777)
        before = pfs_bytes_read(mnt)
        procs = []
        for j in range(a.array):
            job_id = str((1000 if share == "yes" else 2000) + j)
            out = os.path.join(flags, f"job{j}")
            # Every job stays until all are done, so that none falls back to the PFS.
            script = (f"touch {out}.up; until [ -e {flags}/go ]; do sleep 0.02; done; "
                      f"t0=$(date +%s.%N); {nopfs} cat --count {a.files} > /dev/null; "
                      f"t1=$(date +%s.%N); {nopfs} cat --start-epoch 1 > /dev/null; "
                      f"t2=$(date +%s.%N); {nopfs} status --json > {out}.json; "
                      f"echo $t0 $t1 $t2 > {out}.times; touch {out}.done; "
                      f"until [ $(ls {flags} | grep -c '\\.done$') -ge {a.array} ]; "
                      "do sleep 0.05; done")
            procs.append(subprocess.Popen(
                DEMOTE + [nopfs, "run", "--dataset", mnt, "--job-id", job_id,
                          "--share-running", share, "--ranks", "1", "--epochs", "2", "--batch",
                          "16", "--seed", str(3 + j), "--config", conf, "--run-dir",
                          out + ".run", "--keep-run-dir", "-q", "--", "sh", "-c", script],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            # The first job serves before the others start (unless --together); they start
            # together.
            while j == 0 and not a.together and not os.path.exists(out + ".up"):
                time.sleep(0.05)
        while sum(os.path.exists(os.path.join(flags, f"job{j}.up"))
                  for j in range(a.array)) < a.array:
            time.sleep(0.05)
        open(os.path.join(flags, "go"), "w").close()
        for p in procs:
            p.wait()
        pfs = pfs_bytes_read(mnt) - before
        e0 = e1 = 0.0
        sibling = 0
        for j in range(a.array):
            t0, t1, t2 = map(float, open(os.path.join(flags, f"job{j}.times")).read().split())
            e0, e1 = max(e0, t1 - t0), max(e1, t2 - t1)
            st = json.load(open(os.path.join(flags, f"job{j}.json")))
            sibling += sum(s["samples"] for s in st["sources"] if s["name"] == "sibling")
        print(f"{share:>5}  {a.array:4d}  {pfs / 1e6:6.1f}  {pfs / dataset:8.2f}  {e0:16.2f}  "
              f"{e1:16.2f}  {sibling:12d}")


if __name__ == "__main__":
    main()
