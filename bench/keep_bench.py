#!/usr/bin/python3
"""A job run twice on the emulated PFS (docs/pfsemu.md), the first with `--keep` (docs/tiers.md,
"The kept area"): per job, the seconds of its first and second epoch (one rank reading its stream
with `nopfs cat`), the PFS bytes, the samples adopted, and how long nopfsd took to keep at exit.
Prints figures; never passes or fails.

  sudo bench/keep_bench.py BUILD_DIR [--files N] [--size BYTES] [--bandwidth MBPS]
                           [--getattr-latency-us US]

Runs as root (pfsemu mounts with allow_other); the jobs run as `nobody`.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

DEMOTE = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--files", type=int, default=2048)
    ap.add_argument("--size", type=int, default=64 * 1024)
    ap.add_argument("--bandwidth", type=int, default=50, help="pfsemu's flat MB/s")
    ap.add_argument("--getattr-latency-us", type=int, default=200)
    a = ap.parse_args()
    bindir = os.path.abspath(os.path.join(a.build, "bin"))
    work = tempfile.mkdtemp(prefix="nopfs-keep-bench-")
    os.chmod(work, 0o777)
    backing, mnt = os.path.join(work, "backing"), os.path.join(work, "mnt")
    os.makedirs(mnt)
    for k in range(a.files):
        d = os.path.join(backing, f"class{k % 10}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"img{k:06d}.bin"), "wb") as fh:
            fh.write(os.urandom(a.size))
    subprocess.run(["chmod", "-R", "a+rX", backing], check=True)
    time.sleep(1)  # the files' ctimes before the jobs' start
    emu = subprocess.Popen([os.path.join(bindir, "nopfs_pfsemu"), "--bandwidth",
                            str(a.bandwidth), "--getattr-latency-us", str(a.getattr_latency_us),
                            backing, mnt], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(mnt):
            if time.monotonic() > deadline:
                raise SystemExit("pfsemu did not mount")
            time.sleep(0.1)
        scratch = os.path.join(work, "scratch")
        os.mkdir(scratch)
        os.chmod(scratch, 0o777)
        conf = os.path.join(work, "ssd.conf.lua")
        with open(conf, "w") as fh:
            fh.write('staging = { capacity = "64MB", threads = 4 }\n'
                     f'classes = {{ ssd {{ path = "{scratch}", capacity = "4GB", threads = 4 }} }}\n')
        os.chmod(conf, 0o644)
        launcher = os.path.join(work, "bin")
        os.mkdir(launcher)
        shutil.copy2(os.path.join(bindir, "nopfs"), launcher)
        with open(os.path.join(launcher, "nopfsd"), "w") as fh:
            fh.write(f'#!/bin/sh\nexec {bindir}/nopfsd "$@" --keep\n')
        os.chmod(os.path.join(launcher, "nopfsd"), 0o755)
        os.chmod(launcher, 0o755)
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
            subprocess.run(DEMOTE + [os.path.join(launcher, "nopfs"), "run", "--dataset", mnt,
                                     "--ranks", "1", "--epochs", "2", "--batch", "16", "--seed",
                                     "3", "--config", conf, "--run-dir", out + ".run",
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


if __name__ == "__main__":
    main()
