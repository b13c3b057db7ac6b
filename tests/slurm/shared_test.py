#!/usr/bin/python3
"""Shared datasets on the local cluster (docs/admin.md "Shared datasets", docs/security.md
"Shared datasets"): the node config declares two datasets shared (NOPFS_CLUSTER_SHARED); the
node's share service (root) keeps one copy of each and hands it, read-only, to every job whose user
proves, file by file, that they may read the file on the PFS.

- alice's job reads the dataset once (through the service, which reads the PFS itself); bob's job
  on the same node then reads at most 5 % of it from the PFS, with 0 mismatches;
- carol, who cannot read part of it, gets exactly what she gets from an unshared copy with the
  same permissions, and the same errors; with no access at all her job fails as on the unshared
  copy; she can list, open or map nothing of the copy;
- a file made unreadable to bob between two of his jobs is not served to his second job;
- a file changed on the PFS between jobs is read again, its stale bytes never served;
- a job's nopfsd asks for the files ahead of its reads: most reads find their descriptor there;
- on a cluster of its own, a copy whose quota is a quarter of the dataset stays within it,
  evicting the least recently used copies, and every job still reads every sample right;
- `nopfs share warm` fills a copy ahead of the jobs, which then read nothing from the PFS;
- whatever a user does to change the copy fails, with 0 wrong bytes after (tests/slurm/
  shared_probe.py): writing its files (through a descriptor the protocol gave, by name, through
  /proc), forged messages to the service, and links raced under the dataset while it fills.

Run as root, one cluster test at a time: flock /tmp/nopfs-cluster.lock ctest -L slurm -R shared
"""
import glob
import grp
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
import unittest

import clusterlib
from clusterlib import (BUILD, DIR, HOLD, JOBS, RUN, SRC, SSD, ClusterCase, as_user, daemons, env,
                        ledger, make_dataset, output, release, submit, wait_done, wait_state)
from clusterlib import share_service_pids as service_pids

NOPFS = os.path.join(BUILD, "bin/nopfs")
SHARED = os.path.join(DIR, "data/shared")     # declared shared; alice and bob read all of it
SECRET = os.path.join(DIR, "data/secret")     # declared shared; carol may not enter it
UNSHARED = os.path.join(DIR, "data/unshared")  # SHARED's copy, not declared: the baseline
UNSECRET = os.path.join(DIR, "data/unsecret")  # SECRET's copy, not declared
WARM = os.path.join(DIR, "data/warm")          # declared shared; filled by `nopfs share warm`
QUOTA = os.path.join(DIR, "data/quota")        # declared shared with a 1 MiB quota (its own cluster)
READERS = "nopfs-readers"                      # alice and bob, not carol
STORE = os.path.join(SSD, ".nopfs-shared")
SOCKET = os.path.join(RUN, "n1", "share", "socket")
PROBE = os.path.join(SRC, "tests/slurm/shared_probe.py")
# Each task reads its whole stream, verifying every sample against its file; prints the last line,
# the errors (one per line) and the node's status.
# (Into files of a private directory of the job's: a file of another user's job in /tmp must never
# be read instead.)
READ = (f"srun bash -c 't=$(mktemp -d) && {NOPFS} cat --verify > $t/cat 2> $t/err; "
        "tail -n 1 $t/cat | sed \"s/^/verify: /\"; "
        "grep -v \"^nopfs cat: rank\" $t/err | sed \"s/^/error: /\"; rm -rf $t; "
        f"echo \"status: $({NOPFS} status --json)\"'\n")


def dataset_bytes(path):
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(path, "*/*.bin")))


def store_of(node, dataset):
    """The share service's copy of `dataset` on `node`: {copy name: size}, read as root."""
    out = {}
    for d in glob.glob(os.path.join(STORE, node, "*")):
        for p in glob.glob(os.path.join(d, "[0-9a-f]" * 16)):
            out[p] = os.path.getsize(p)
    return out


class SharedCase(ClusterCase):
    @classmethod
    def setUpClass(cls):
        os.environ["NOPFS_CLUSTER_SHARED"] = f"{SHARED}:{SECRET}:{WARM}"
        try:
            super().setUpClass()
        finally:
            del os.environ["NOPFS_CLUSTER_SHARED"]
        subprocess.run(["groupadd", "-f", READERS], check=True)
        for u in ("nopfs-alice", "nopfs-bob"):
            subprocess.run(["usermod", "-aG", READERS, u], check=True)
        for path, seed in ((SHARED, 1), (SECRET, 2), (WARM, 3)):
            make_dataset(path, seed)
        # The secret dataset: alice's and bob's group only.
        os.chown(SECRET, 0, grp.getgrnam(READERS).gr_gid)
        os.chmod(SECRET, 0o750)
        for src, dst in ((SHARED, UNSHARED), (SECRET, UNSECRET)):
            shutil.copytree(src, dst, symlinks=True)
            shutil.copystat(src, dst)
            os.chown(dst, 0, os.stat(src).st_gid)

    def run_job(self, user, dataset, node="n1", expect="COMPLETED"):
        """A one-node job reading `dataset` to its end: (job, output, status or None, verify
        line, error lines), once the epilog has finished."""
        job = submit(user, f"-w {node} --mem=300 --nopfs-ram=0 --nopfs-ssd=100M "
                     f"--nopfs={dataset} --nopfs-seed=3", READ)
        state = wait_done(job, 180)
        out = output(job)
        if expect is not None:
            self.assertEqual(state, expect, out)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (job in ledger(node) or daemons()):
            time.sleep(0.2)
        m = re.search(r"(?m)^status: (\{.*\})$", out)
        status = json.loads(m.group(1)) if m else None
        v = re.search(r"(?m)^verify: (.*)$", out)
        errors = re.findall(r"(?m)^error: (.*)$", out)
        return job, out, status, v.group(1) if v else None, errors

    @staticmethod
    def shared_bytes(status):
        return sum(s["bytes"] for s in status["sources"] if s["name"] == "shared")

    def slurmd_log(self, node):
        with open(os.path.join(DIR, "log", f"slurmd-{node}.log"), errors="replace") as f:
            return f.read()


class SharedTest(SharedCase):
    def test_1_alice_fills_the_copy_once_and_bob_reads_it_from_there(self):
        total = dataset_bytes(SHARED)
        job, out, st, verify, errors = self.run_job("nopfs-alice", SHARED)
        self.assertRegex(verify or "", r"^120 samples, \d+ bytes, 0 mismatches$", out)
        self.assertEqual(errors, [], out)
        self.assertRegex(self.slurmd_log("n1"), rf"serving {re.escape(SHARED)} .*shared copy of")
        # The PFS was read once, by the service: its copy holds the whole dataset, and alice's
        # nopfsd read (almost) nothing itself.
        copies = store_of("n1", SHARED)
        self.assertEqual(sum(copies.values()), total, copies)
        self.assertEqual(len(copies), 120)
        self.assertLessEqual(st["pfs_bytes"], 0.05 * total, st)
        self.assertGreaterEqual(self.shared_bytes(st), 0.95 * total, st)
        # bob on the same node: at most 5 % from the PFS, 0 mismatches, no new copy made.
        job, out, st, verify, errors = self.run_job("nopfs-bob", SHARED)
        self.assertRegex(verify or "", r"^120 samples, \d+ bytes, 0 mismatches$", out)
        self.assertLessEqual(st["pfs_bytes"], 0.05 * total, st)
        self.assertGreaterEqual(self.shared_bytes(st), 0.95 * total, st)
        self.assertEqual(store_of("n1", SHARED), copies)
        # bob's nopfsd asked for the files ahead of its reads, in batches: most reads found their
        # file's descriptor there (its log, kept in the local cluster's job_logs.dir).
        with open(os.path.join(DIR, "log", "jobs", f"nopfsd-{job}-n1.log"), errors="replace") as f:
            log = f.read()
        m = re.search(r"shared: (\d+) files asked for ahead of the reads, (\d+) reads found their "
                      r"descriptor ready, (\d+) files asked for alone", log)
        self.assertIsNotNone(m, log)
        _, ready, alone = map(int, m.groups())
        self.assertGreaterEqual(ready + alone, 120, m.group(0))
        self.assertGreaterEqual(ready, 90, m.group(0))
        # The copies are root's, 0400, in root's 0700 directories.
        for p in copies:
            s = os.stat(p)
            self.assertEqual((s.st_uid, s.st_mode & 0o7777), (0, 0o400), p)
        for d in (STORE, os.path.join(STORE, "n1"), os.path.dirname(next(iter(copies)))):
            s = os.stat(d)
            self.assertEqual((s.st_uid, s.st_mode & 0o777), (0, 0o700), d)
        # The service: root, with CAP_DAC_READ_SEARCH alone, no_new_privs.
        pids = service_pids()
        self.assertEqual(len(pids), 1, pids)
        with open(f"/proc/{pids[0]}/status") as f:
            status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        self.assertEqual(status["Uid"].split()[1], "0")
        for cap in ("CapEff", "CapPrm", "CapBnd"):
            self.assertEqual(int(status[cap], 16), 1 << 2, (cap, status[cap]))
        self.assertEqual(status["NoNewPrivs"].strip(), "1")

    def test_1b_a_job_on_a_shared_dataset_reserves_no_ssd(self):
        job = submit("nopfs-alice", f"-w n1 --mem=300 --nopfs-ram=0 --nopfs-ssd=100M "
                     f"--nopfs={SHARED}", HOLD.format(jobs=JOBS))
        try:
            wait_state(job, {"RUNNING"}, 90)
            argv = None
            deadline = time.monotonic() + 30
            while argv is None and time.monotonic() < deadline:
                argv = next((a for _, (_, a) in daemons().items() if f"{RUN}/n1/{job}" in a), None)
                time.sleep(0.2)
            self.assertIsNotNone(argv)
            self.assertEqual(argv[argv.index("--shared-socket") + 1], SOCKET)
            self.assertEqual(argv[argv.index("--shared-dataset") + 1], SHARED)
            self.assertEqual(argv[argv.index("--ssd") + 1], "0")
            self.assertEqual(ledger("n1")[job]["ssd"], "0")
        finally:
            release(job)
            wait_done(job, 120)

    def test_2_carol_gets_exactly_what_the_pfs_gives_her(self):
        # Ten files of class1 in alice's and bob's group only, in both trees.
        gid = grp.getgrnam(READERS).gr_gid
        for tree in (SHARED, UNSHARED):
            for i in range(10):
                p = os.path.join(tree, "class1", f"{i:04d}.bin")
                os.chown(p, 0, gid)
                os.chmod(p, 0o640)
        self.run_job("nopfs-alice", SHARED)  # the copy holds every file
        _, out_u, st_u, verify_u, errors_u = self.run_job("nopfs-carol", UNSHARED, expect=None)
        _, out_s, st_s, verify_s, errors_s = self.run_job("nopfs-carol", SHARED, expect=None)
        self.assertEqual(verify_s, verify_u, (out_u, out_s))
        self.assertEqual(len(errors_s), len(errors_u), (out_u, out_s))
        self.assertEqual(len(errors_s), 10, out_s)
        self.assertEqual([e.replace(UNSHARED, SHARED) for e in errors_u], errors_s)
        for e in errors_s:
            self.assertIn("Permission denied", e)
        self.assertEqual(self.shared_bytes(st_s),
                         dataset_bytes(SHARED) - sum(os.path.getsize(os.path.join(
                             SHARED, "class1", f"{i:04d}.bin")) for i in range(10)), st_s)
        for tree in (SHARED, UNSHARED):
            subprocess.run(["chmod", "-R", "a+rX", tree], check=True)
            subprocess.run(["chgrp", "-R", "root", tree], check=True)

    def test_3_carol_without_access_fails_as_without_nopfs_and_reaches_nothing(self):
        self.run_job("nopfs-alice", SECRET)
        self.assertEqual(len(store_of("n1", SECRET)) > 0, True)
        job_u, out_u, _, _, _ = self.run_job("nopfs-carol", UNSECRET, expect=None)
        job_s, out_s, _, _, _ = self.run_job("nopfs-carol", SECRET, expect=None)
        self.assertEqual(clusterlib.job_state(job_s), clusterlib.job_state(job_u))
        self.assertIn("Permission denied", out_u)
        self.assertEqual(out_s.replace(SECRET, UNSECRET).count("Permission denied"),
                         out_u.count("Permission denied"), (out_u, out_s))
        # Nothing of the copy: not the store, a copy by its name, the service's descriptors.
        targets = [STORE, os.path.join(STORE, "n1")] + list(store_of("n1", SECRET))[:5]
        targets += glob.glob(os.path.join(STORE, "n1", "*"))
        for pid in service_pids():
            targets += [f"/proc/{pid}/fd", f"/proc/{pid}/mem", f"/proc/{pid}/map_files"]
            targets += [f"/proc/{pid}/fd/{n}" for n in range(3, 40)]
        probe = ("import os, sys, mmap\n"
                 "ok = []\n"
                 "for t in sys.argv[1:]:\n"
                 "    try:\n"
                 "        if os.path.isdir(t):\n"
                 "            os.listdir(t)\n"
                 "        else:\n"
                 "            fd = os.open(t, os.O_RDONLY)\n"
                 "            mmap.mmap(fd, 1, prot=mmap.PROT_READ)\n"
                 "        ok.append(t)\n"
                 "    except (OSError, ValueError) as e:\n"
                 "        pass\n"
                 "print('reached:', ok)\n")
        path = os.path.join(JOBS, "probe.py")
        with open(path, "w") as f:
            f.write(probe)
        r = as_user("nopfs-carol", f"python3 {path} " + " ".join(targets))
        self.assertIn("reached: []", r.stdout, r.stdout + r.stderr)

    def test_4_a_file_made_unreadable_to_bob_is_not_served_to_his_next_job(self):
        p = os.path.join(SHARED, "class0", "0005.bin")
        _, out, st, verify, errors = self.run_job("nopfs-bob", SHARED)
        self.assertRegex(verify or "", r"^120 samples, \d+ bytes, 0 mismatches$", out)
        alice = pwd.getpwnam("nopfs-alice")
        os.chown(p, alice.pw_uid, alice.pw_gid)
        os.chmod(p, 0o600)
        try:
            _, out, st, verify, errors = self.run_job("nopfs-bob", SHARED, expect=None)
            self.assertRegex(verify or "", r"^119 samples, \d+ bytes, 0 mismatches$", out)
            self.assertEqual(len(errors), 1, out)
            self.assertIn("0005.bin", errors[0])
            self.assertIn("Permission denied", errors[0])
            self.assertEqual(self.shared_bytes(st), dataset_bytes(SHARED) - os.path.getsize(p), st)
            # alice still reads it, from the copy.
            _, out, st, verify, errors = self.run_job("nopfs-alice", SHARED)
            self.assertRegex(verify or "", r"^120 samples, \d+ bytes, 0 mismatches$", out)
        finally:
            os.chown(p, 0, 0)
            os.chmod(p, 0o644)

    def test_5_a_file_changed_on_the_pfs_is_read_again_never_stale(self):
        self.run_job("nopfs-alice", SHARED)
        before = store_of("n1", SHARED)
        p = os.path.join(SHARED, "class2", "0007.bin")
        size = os.path.getsize(p)
        with open(p, "r+b") as f:  # rewritten in place, same size
            f.write(os.urandom(size))
        _, out, st, verify, errors = self.run_job("nopfs-bob", SHARED)
        self.assertRegex(verify or "", r"^120 samples, \d+ bytes, 0 mismatches$", out)
        self.assertEqual(errors, [], out)
        after = store_of("n1", SHARED)
        self.assertEqual(len(after), len(before))
        self.assertEqual(len(set(after) - set(before)), 1, "one new copy for the changed file")
        new = (set(after) - set(before)).pop()
        with open(new, "rb") as a, open(p, "rb") as b:
            self.assertEqual(a.read(), b.read())

    def probe(self, user, *args):
        r = as_user(user, f"python3 {PROBE} " + " ".join(args), timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def test_6_attack_writing_the_copy_fails(self):
        self.run_job("nopfs-alice", SHARED)
        before = {}
        for p in store_of("n1", SHARED):
            with open(p, "rb") as f:
                before[p] = f.read()
        got = self.probe("nopfs-bob", "write", SOCKET, SHARED, "class0/0001.bin")
        self.assertTrue(got["copy"].startswith(STORE), got)
        self.assertEqual(got["worked"], [], got)
        for target in (STORE, os.path.join(STORE, "n1"), os.path.join(STORE, "planted")):
            r = as_user("nopfs-bob", f"touch {target}/x || mkdir {target}/y; ln -s / {target}/z")
            self.assertNotEqual(r.returncode, 0)
        for p, data in before.items():
            with open(p, "rb") as f:
                self.assertEqual(f.read(), data, p)
        _, out, st, verify, errors = self.run_job("nopfs-alice", SHARED)
        self.assertRegex(verify or "", r"^120 samples, \d+ bytes, 0 mismatches$", out)

    def test_7_attack_forged_messages_get_nothing(self):
        self.run_job("nopfs-alice", SHARED)
        before = store_of("n1", SHARED)
        secret = os.path.join(SHARED, "class1", "0001.bin")
        os.chmod(secret, 0o600)  # root's alone now
        own = os.path.join(JOBS, "carol-own.bin")
        try:
            as_user("nopfs-carol", f"head -c {os.path.getsize(secret)} /dev/urandom > {own}",
                    check=True)
            got = self.probe("nopfs-carol", "forge", SOCKET, SHARED, "class1/0001.bin", own)
            for what, answer in got.items():
                if what == "ping after":
                    self.assertEqual(answer, [0, [], 0], got)
                    continue
                if isinstance(answer, str):
                    continue  # the service closed the connection
                status, outcomes, fds = answer
                self.assertEqual(fds, 0, (what, got))
                self.assertNotIn("ready", outcomes, (what, got))
                self.assertIn(status, (0, 1, 2), (what, got))
            self.assertEqual(store_of("n1", SHARED), before)
        finally:
            os.chmod(secret, 0o644)
        _, out, st, verify, errors = self.run_job("nopfs-alice", SHARED)
        self.assertRegex(verify or "", r"^120 samples, \d+ bytes, 0 mismatches$", out)
        self.assertTrue(service_pids())

    def test_8_attack_links_raced_under_the_dataset_serve_nothing_else(self):
        self.run_job("nopfs-alice", SHARED)
        scratch = os.path.join(SHARED, "scratch")
        os.makedirs(scratch, exist_ok=True)
        os.chmod(scratch, 0o1777)  # a directory users may write inside the dataset
        try:
            got = self.probe("nopfs-bob", "race", SOCKET, SHARED, "scratch/x", "/etc/shadow", "6")
            self.assertGreater(got["asked"], 10, got)
            self.assertGreater(got["swaps"], 10, got)
            # Only bob's own bytes ever came back (what he could read anyway), never the target's.
            self.assertEqual(set(got["copies"]) - {got["mine"]}, set(), got)
            for p in store_of("n1", SHARED):
                with open(p, "rb") as f, open("/etc/shadow", "rb") as t:
                    self.assertNotEqual(f.read(), t.read())
        finally:
            shutil.rmtree(scratch)
        _, out, st, verify, errors = self.run_job("nopfs-alice", SHARED)
        self.assertRegex(verify or "", r"^120 samples, \d+ bytes, 0 mismatches$", out)

    def test_9_share_warm_fills_the_copy_before_any_job(self):
        self.run_job("nopfs-alice", SHARED)  # the service runs
        before = store_of("n1", SHARED)
        r = subprocess.run([NOPFS, "share", "warm", WARM, "--rundir", RUN, "--node", "n1"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("120 files in the copy", r.stdout)
        added = set(store_of("n1", SHARED)) - set(before)
        self.assertEqual(len(added), 120)
        self.assertEqual(sum(os.path.getsize(p) for p in added), dataset_bytes(WARM))
        _, out, st, verify, errors = self.run_job("nopfs-bob", WARM)
        self.assertRegex(verify or "", r"^120 samples, \d+ bytes, 0 mismatches$", out)
        self.assertEqual(st["pfs_bytes"], 0, st)
        self.assertEqual(self.shared_bytes(st), dataset_bytes(WARM), st)
        self.assertEqual(set(store_of("n1", SHARED)) - set(before), added)

    def test_9b_the_copy_outlives_the_service(self):
        self.run_job("nopfs-alice", SHARED)
        before = store_of("n1", SHARED)
        for pid in service_pids():
            os.kill(pid, 15)
        deadline = time.monotonic() + 20
        while service_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(service_pids(), [])
        # The next job's prolog starts it again; it takes the copy over as it was.
        _, out, st, verify, errors = self.run_job("nopfs-bob", SHARED)
        self.assertRegex(verify or "", r"^120 samples, \d+ bytes, 0 mismatches$", out)
        self.assertLessEqual(st["pfs_bytes"], 0.05 * dataset_bytes(SHARED), st)
        self.assertEqual(store_of("n1", SHARED), before)
        self.assertEqual(len(service_pids()), 1)


class SharedQuotaTest(SharedCase):
    """A copy bounded by its quota (docs/admin.md, "Quota and eviction"), on a cluster whose one
    shared dataset, about 4 MB, may take 1 MiB of each node's SSD."""
    @classmethod
    def setUpClass(cls):
        os.environ["NOPFS_CLUSTER_SHARED"] = QUOTA
        os.environ["NOPFS_CLUSTER_SHARED_SSD"] = "1M"
        try:
            ClusterCase.setUpClass.__func__(cls)
        finally:
            del os.environ["NOPFS_CLUSTER_SHARED"]
            del os.environ["NOPFS_CLUSTER_SHARED_SSD"]
        make_dataset(QUOTA, 4)

    def test_the_copy_stays_within_its_quota_evicting_the_least_recently_used(self):
        quota, total = 1 << 20, dataset_bytes(QUOTA)
        self.assertGreater(total, 3 * quota)
        stored = []
        for user in ("nopfs-alice", "nopfs-bob"):
            job, out, st, verify, errors = self.run_job(user, QUOTA)
            # Every sample read, byte for byte, each from the copy or the PFS.
            self.assertRegex(verify or "", r"^120 samples, \d+ bytes, 0 mismatches$", out)
            self.assertEqual(errors, [], out)
            self.assertEqual(st["pfs_bytes"] + self.shared_bytes(st), total, st)
            self.assertGreater(self.shared_bytes(st), 0, st)
            # The copies on the SSD stay within the quota, and the copy stays full: what a
            # fill evicts is only what makes room for it.
            copies = store_of("n1", QUOTA)
            self.assertLessEqual(sum(copies.values()), quota, copies)
            self.assertGreater(sum(copies.values()), quota // 2, copies)
            stored.append(set(copies))
        # bob's job read the files in alice's order from the start: every copy alice's job left
        # was used before any bob's job filled, so they went first.
        self.assertEqual(stored[0] & stored[1], set())


if __name__ == "__main__":
    unittest.main()
