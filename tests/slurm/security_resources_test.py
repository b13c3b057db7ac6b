#!/usr/bin/env python3
"""Cluster tests of docs/security.md's "Per-user directories" and "What a client can make nopfsd
allocate": nopfs-bob attacks, nopfs-alice's job must run unharmed. Run as root (see
clusterlib.py)."""
import glob
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import time
import unittest

from clusterlib import (BUILD, DATASET, DIR, JOBS, REAL_NOPFSD, SSD, ClusterCase, as_user,
                        daemons, env, ledger, output, release, submit, wait_done, wait_file,
                        wait_state)

CACHE = os.path.join(DIR, "cache")
MB = 1000 * 1000
MiB = 1024 * 1024

# What a rank of the job sends: HELLO, then OPEN_STREAM for its rank over and over on one
# connection (docs/wire.md), never keeping the ring descriptors; prints what came back.
FLOOD = r'''
import os, socket, struct, sys
n = int(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["NOPFS_SOCKET"])
def send(rid, mtype, payload):
    s.sendall(b"NPFS" + struct.pack("<HHII", 1, mtype, len(payload), rid) + payload)
def recv():
    head = b""
    while len(head) < 16:
        head += s.recv(16 - len(head))
    _, _, mtype, length, rid = struct.unpack("<4sHHII", head)
    body = b""
    while len(body) < length:
        body += s.recv(length - len(body))
    return mtype, body
send(1, 1, struct.pack("<HI", 1, os.getpid()))
assert recv()[0] == 2
ok = refused = 0
message = ""
for i in range(n):
    send(2 + i, 3, struct.pack("<IIQ", int(os.environ["NOPFS_RANK"]), 0, 0))
    mtype, body = recv()
    if mtype == 4:
        ok += 1
    else:
        refused += 1
        code, mlen = struct.unpack("<II", body[:8])
        message = body[8:8 + mlen].decode()
print(f"flood: {ok} opened, {refused} refused: {message}", flush=True)
open(sys.argv[1], "w").close()
import time
while not os.path.exists(sys.argv[3]):
    time.sleep(0.2)
'''


def read_log(node):
    with open(os.path.join(DIR, f"log/slurmd-{node}.log"), errors="replace") as f:
        return f.read()


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024


class SecurityResourcesTest(ClusterCase):
    def test_squatted_ssd_and_cache_directories_do_not_stop_alices_job(self):
        uid = pwd.getpwnam("nopfs-alice").pw_uid
        bob = pwd.getpwnam("nopfs-bob").pw_uid
        ssd_dir, cache_dir = os.path.join(SSD, f"nopfs-{uid}"), os.path.join(CACHE, str(uid))
        # As the admin guide sets them up, the parents are root's, 0755: bob cannot squat at all.
        for parent in (SSD, CACHE):
            st = os.stat(parent)
            self.assertEqual((st.st_uid, stat.S_IMODE(st.st_mode)), (0, 0o755), parent)
        for path in (ssd_dir, cache_dir):
            if os.path.lexists(path):
                shutil.rmtree(path)  # left by an earlier job of alice's
            r = as_user("nopfs-bob", f"mkdir -m 0755 {path}")
            self.assertNotEqual(r.returncode, 0, path)
            self.assertIn("Permission denied", r.stderr)
        # The old setup (sticky, world-writable parents), with bob's directories in alice's
        # names made before her job: the prolog moves them aside and makes hers.
        try:
            for parent in (SSD, CACHE):
                os.chmod(parent, 0o1777)
            for path in (ssd_dir, cache_dir):
                if os.path.lexists(path):
                    shutil.rmtree(path)
            r = as_user("nopfs-bob", f"mkdir -m 0755 {ssd_dir} && mkdir -m 0777 {cache_dir} && "
                        f"chmod 0777 {cache_dir}")
            self.assertEqual(r.returncode, 0, r.stderr)
            script = ("srun bash -c '"
                      f"echo \"status: $({BUILD}/bin/nopfs status --json)\"; "
                      f"{BUILD}/bin/nopfs cat --verify 2>&1 | tail -n 1 | sed \"s/^/verify: /\"; "
                      f"stat -c \"dir: %n %u %a %F\" {ssd_dir} {cache_dir}'\n")
            job = submit("nopfs-alice", f"-w n1 --mem=300 --nopfs={DATASET} --nopfs-ram=0 "
                         "--nopfs-ssd=100M", script)
            self.assertEqual(wait_done(job, 120), "COMPLETED")
            out = output(job)
            if REAL_NOPFSD:
                self.assertRegex(out, r"verify: 120 samples, \d+ bytes, 0 mismatches", out)
                m = re.search(r"(?m)^status: (\{.*\})$", out)
                self.assertIsNotNone(m, out)
                ssd = [t for t in json.loads(m.group(1))["tiers"] if t["name"] == "ssd"]
                self.assertEqual(len(ssd), 1, out)
                self.assertGreater(ssd[0]["planned_samples"], 0, out)
            # While the job ran, both were alice's (the SSD one goes with her last job).
            for path in (ssd_dir, cache_dir):
                self.assertIn(f"dir: {path} {uid} 700 directory\n", out)
            # bob's directories were moved aside, then removed by root: nothing is left aside.
            log = read_log("n1")
            for parent, name in ((SSD, f"nopfs-{uid}"), (CACHE, str(uid))):
                self.assertEqual(glob.glob(os.path.join(parent, ".squatted.*")), [])
                self.assertRegex(log, rf"moved aside to {re.escape(parent)}/\.squatted\.{name}\."
                                 rf"[0-9.]+; removed {re.escape(parent)}/\.squatted\.{name}\.")
            if REAL_NOPFSD:
                # The catalog was kept in alice's cache directory for her next job.
                self.assertTrue(os.listdir(cache_dir), cache_dir)
            self.assertNothingLeft([job])
        finally:
            for parent in (SSD, CACHE):
                os.chmod(parent, 0o755)
                for p in glob.glob(os.path.join(parent, ".squatted.*")):
                    shutil.rmtree(p)

    def test_two_jobs_at_once_and_a_planted_squatted_tree(self):
        alice = pwd.getpwnam("nopfs-alice")
        bob = pwd.getpwnam("nopfs-bob").pw_uid
        ssd_dir, cache_dir = os.path.join(SSD, f"nopfs-{alice.pw_uid}"), \
            os.path.join(CACHE, str(alice.pw_uid))
        # A tree left under a .squatted. name (as an earlier prolog or the old 1777 setup left
        # them): bob's, deep, with links to a directory of root's and a FIFO.
        target = os.path.join(DIR, "root-only")
        shutil.rmtree(target, ignore_errors=True)
        os.mkdir(target, 0o700)
        with open(os.path.join(target, "precious"), "w") as f:
            f.write("root's")
        planted = os.path.join(SSD, ".squatted.nopfs-9999.1.2.0")
        shutil.rmtree(planted, ignore_errors=True)
        deep = planted
        for i in range(12):
            deep = os.path.join(deep, f"d{i}")
            os.makedirs(deep)
            os.symlink(target, os.path.join(deep, "link"))
            os.mkfifo(os.path.join(deep, "fifo"))
        os.symlink(target, os.path.join(CACHE, ".squatted.link"))
        subprocess.run(["chown", "-hR", f"{bob}:{bob}", planted,
                        os.path.join(CACHE, ".squatted.link")], check=True)
        # Two 1-node jobs of alice's started together on n1, her directories absent: both
        # prologs make them at once.
        for path in (ssd_dir, cache_dir):
            shutil.rmtree(path, ignore_errors=True)
        script = (f"srun bash -c 'stat -c \"dir: %n %u %a %F\" {ssd_dir} {cache_dir}; "
                  f"{BUILD}/bin/nopfs cat --verify 2>&1 | tail -n 1 | sed \"s/^/verify: /\"'\n")
        logs = len(read_log("n1"))
        jobs = [submit("nopfs-alice", f"-w n1 --oversubscribe --mem=300 --hold "
                       f"--nopfs={DATASET} --nopfs-ram=0 --nopfs-ssd=50M", script)
                for _ in range(2)]
        subprocess.run(["scontrol", "release", ",".join(map(str, jobs))], env=env(), check=True)
        for job in jobs:
            self.assertEqual(wait_done(job, 120), "COMPLETED")
            out = output(job)
            for path in (ssd_dir, cache_dir):
                self.assertIn(f"dir: {path} {alice.pw_uid} 700 directory\n", out)
            if REAL_NOPFSD:
                self.assertRegex(out, r"verify: 120 samples, \d+ bytes, 0 mismatches", out)
        log = read_log("n1")[logs:]
        print(log)
        # Nothing aside: neither prolog moved the other's fresh directory away, and the planted
        # tree is gone without root following its links.
        self.assertNotIn("moved aside", log)
        for parent in (SSD, CACHE):
            self.assertEqual(glob.glob(os.path.join(parent, ".squatted.*")), [])
        self.assertIn(f"removed {planted}", log)
        self.assertIn(f"removed {CACHE}/.squatted.link", log)
        with open(os.path.join(target, "precious")) as f:
            self.assertEqual(f.read(), "root's")
        self.assertEqual(os.stat(target).st_uid, 0)
        shutil.rmtree(target)
        self.assertNothingLeft(jobs)

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_a_rank_flooding_open_stream_is_bounded_and_the_other_rank_verifies(self):
        flood = os.path.join(JOBS, "flood.py")
        with open(flood, "w") as f:
            f.write(FLOOD)
        os.chmod(flood, 0o644)
        opts = (f"-w n1 -n2 --mem=1000 --nopfs={DATASET} --nopfs-ranks-per-node=2 "
                "--nopfs-epochs=40")
        # Rank 1 floods its own stream and holds what it got; rank 0 reads the whole stream
        # after the flood, then lets rank 1 go.
        flooded, done = f"{JOBS}/flooded-$SLURM_JOB_ID", f"{JOBS}/release-$SLURM_JOB_ID"
        script = ("srun -n2 bash -c 'if [ $SLURM_PROCID = 1 ]; then "
                  f"python3 {flood} {flooded} 300 {done}; else "
                  f"while [ ! -e {flooded} ]; do sleep 0.2; done; "
                  f"{BUILD}/bin/nopfs cat --verify 2>&1 | tail -n 1 | sed \"s/^/verify: /\"; "
                  f"echo \"status: $({BUILD}/bin/nopfs status --json)\"; touch {done}; fi'\n")
        job = submit("nopfs-alice", opts, script)
        wait_state(job, {"RUNNING"})
        wait_file(f"{JOBS}/flooded-{job}", 90)
        pids = [p for p, (_, argv) in daemons().items() if f"/n1/{job}" in " ".join(argv)]
        self.assertEqual(len(pids), 1)
        rss = rss_bytes(pids[0])  # with the flood's streams held
        ram = int(ledger("n1")[job]["ram"])
        # The grant, the rings the ranks may hold (2 ranks x 32 streams, the default
        # limits.streams_per_rank, x 32 MiB rings: the local cluster's 64 MB of staging split
        # between 2 ranks), and 200 MB of code, catalog, threads.
        bound = ram + 2 * 32 * 32 * MiB + 200 * MB
        print(f"nopfsd RSS after the flood: {rss / MB:.0f} MB (bound {bound / MB:.0f} MB, "
              f"RAM grant {ram / MB:.0f} MB)")
        self.assertLess(rss, bound)
        self.assertEqual(wait_done(job, 120), "COMPLETED")
        out = output(job)
        m = re.search(r"flood: (\d+) opened, (\d+) refused: (.*)", out)
        self.assertIsNotNone(m, out)
        self.assertEqual((int(m.group(1)), int(m.group(2))), (32, 268), out)
        self.assertIn("rank 1 already has 32 streams open, the most one rank may have", m.group(3))
        # The other rank read its whole stream after the flood, byte for byte.
        self.assertRegex(out, r"verify: [1-9]\d* samples, \d+ bytes, 0 mismatches", out)
        m = re.search(r"(?m)^status: (\{.*\})$", out)
        self.assertIsNotNone(m, out)
        refusals = json.loads(m.group(1))["refusals"]
        self.assertEqual((refusals["streams_per_rank"], refusals["streams"]), (32, 268), out)
        self.assertNothingLeft([job])


if __name__ == "__main__":
    unittest.main()
