#!/usr/bin/python3
"""Kept datasets on the local cluster (issue 20, docs/admin.md "Kept datasets"): the policy's
keep(user, node) hook and --nopfs-keep decide what nopfsd keeps at exit; the second job of a user
on the same dataset reads almost nothing from the PFS; another user reads it in full and cannot
list, open or adopt the first user's kept data; quota and space evict the least recently used;
`nopfs gc` removes an expired dataset; what a crash leaves is removed, never trusted; two jobs of
one user at once on one node read the PFS once (the second through the first's nopfsd).

The local cluster's three nodes share one SSD directory (one machine), so a dataset kept on one
node is found on every node: the tests pin jobs to nodes only to keep them apart in time.

With NOPFS_CLUSTER_CGROUP=1 (ctest's slurm_keep_cgroup) the jobs run in cgroup v1 with
PrologFlags=Contain, nopfsd in the job's cgroup: the same tests hold there.

Run as root, one cluster test at a time: flock /tmp/nopfs-cluster.lock ctest -L slurm -R keep
"""
import glob
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
import unittest

from clusterlib import (BUILD, DATASET, DIR, JOBS, REAL_NOPFSD, SSD, ClusterCase, as_user,
                        daemons, job_status, ledger, output, sbatch, submit, wait_done, HOLD,
                        release, wait_state)

POLICY = os.path.join(DIR, "etc/policy.lua")
CONFIG = os.path.join(DIR, "etc/nopfs.conf.lua")
NOPFS = os.path.join(BUILD, "bin/nopfs")
DATASET2 = os.path.join(DIR, "data/ds2")
KEY = re.compile(r"^[0-9a-f]{16}$")
# Each task reads its whole stream (verifying every sample) and then prints its node's status.
READ = (f"srun bash -c '{NOPFS} cat --verify 2>&1 | tail -n 1 | sed \"s/^/verify: /\"; "
        f"echo \"status: $({NOPFS} status --json)\"'\n")


def write_policy(quota=None, lifetime=None):
    """The cluster's policy: admits what was asked; with quota, keeps up to it per user."""
    text = "function admit(job, node) return {} end\n"
    if quota is not None:
        life = "" if lifetime is None else f", lifetime = {lifetime}"
        # A number in Lua is MiB (as --mem): the quota, in bytes, goes as a size in bytes.
        text += f"function keep(user, node) return {{ quota = '{quota}B'{life} }} end\n"
    with open(POLICY, "w") as f:
        f.write(text)


def uid_of(user):
    return pwd.getpwnam(user).pw_uid


def kept_dir(user):
    return os.path.join(SSD, f"nopfs-{uid_of(user)}", "kept")


def kept(user):
    """{name: has MANIFEST} of the user's kept area."""
    d = kept_dir(user)
    if not os.path.isdir(d):
        return {}
    return {n: os.path.exists(os.path.join(d, n, "MANIFEST")) for n in os.listdir(d)}


def tiers_staged(status):
    """Whether every tier with samples planned has them all (its prefetch is done)."""
    return status is not None and all(
        t["prefetch"] == "done" and t["ready_samples"] >= t["planned_samples"]
        for t in status["tiers"] if t["planned_samples"] > 0)


def record_samples(path):
    """The sample count of the keep record at `path` (kept/area.h: "NOPFSKRC" u32 version, then
    the MANIFEST as a le32-length-prefixed string: "NOPFSKPT" u32 version, str key, str dataset,
    i64 created, i64 last_used, u64 samples, ...), or None when there is none."""
    try:
        with open(path, "rb") as f:
            b = f.read()
    except OSError:
        return None
    if b[:8] != b"NOPFSKRC":
        return None
    at = 16 + 12  # record magic, version, manifest length; manifest magic, version
    for _ in range(2):  # key, dataset
        at += 4 + int.from_bytes(b[at:at + 4], "little")
    return int.from_bytes(b[at + 16:at + 24], "little")


def disk_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


# Run as bob: forges the MANIFEST of every kept dataset in his kept area (argv[1]) to say it was
# last used ten years ahead, resealed with the xxh3 anyone can recompute; prints the keys.
FORGE = r"""
import ctypes, os, struct, sys, time
xx = ctypes.CDLL("libxxhash.so.0")
xx.XXH3_64bits.restype = ctypes.c_uint64
xx.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
kept = sys.argv[1]
for key in sorted(os.listdir(kept)):
    path = os.path.join(kept, key, "MANIFEST")
    if len(key) != 16 or not os.path.exists(path):
        continue
    body = open(path, "rb").read()[:-8]
    off = 12 + 4 + struct.unpack_from("<I", body, 12)[0]
    off += 4 + struct.unpack_from("<I", body, off)[0]
    future = int(time.time()) + 10 * 365 * 86400
    body = body[:off] + struct.pack("<qq", future, future) + body[off + 16:]
    with open(path + ".new", "wb") as f:
        f.write(body + struct.pack("<Q", xx.XXH3_64bits(body, len(body))))
    os.rename(path + ".new", path)
    print(key)
"""


def removed_mb(log, uid, name, why):
    """The size in MB (10^6 bytes) a removal line of root's gave `name` of uid `uid` removed for
    `why`, or None when there is none. Sizes are printed in binary units (KiB, MiB, GiB)."""
    m = re.search(rf"uid {uid} {re.escape(name)} \((?:[^()]*, )?([\d.]+) (B|KiB|MiB|GiB), {why}\)",
                  log)
    if not m:
        return None
    return float(m.group(1)) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m.group(2)] / 1e6


class KeepTest(ClusterCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not os.path.isdir(DATASET2):
            shutil.copytree(DATASET, DATASET2)
            subprocess.run(["chmod", "-R", "a+rX", DATASET2], check=True)

    def setUp(self):
        super().setUp()
        for user in ("nopfs-alice", "nopfs-bob"):
            shutil.rmtree(kept_dir(user), ignore_errors=True)
        write_policy()

    def run_job(self, user, node, dataset=DATASET, extra="", ssd="100M"):
        """Runs a one-node job reading `dataset` to the end; returns (job, output, status), after
        the epilog has finished on the node (nopfsd has kept what it keeps)."""
        job = submit(user, f"-w {node} --mem=300 --nopfs-ram=0 --nopfs-ssd={ssd} "
                     f"--nopfs={dataset} --nopfs-seed=3 {extra}", READ)
        state = wait_done(job, 180)
        out = output(job)
        self.assertEqual(state, "COMPLETED", out)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (job in ledger(node) or daemons()):
            time.sleep(0.2)
        self.assertNotIn(job, ledger(node))
        m = re.search(r"(?m)^status: (\{.*\})$", out)
        status = json.loads(m.group(1)) if m else None
        if REAL_NOPFSD:
            self.assertRegex(out, r"verify: 120 samples, \d+ bytes, 0 mismatches", out)
            self.assertIsNotNone(status, out)
        return job, out, status

    def output_so_far(self, job):
        path = os.path.join(JOBS, f"job-{job}.out")
        return output(job) if os.path.exists(path) else ""

    def slurmd_log(self, node):
        with open(os.path.join(DIR, "log", f"slurmd-{node}.log"), errors="replace") as f:
            return f.read()

    def held_daemon_argv(self, options, ssd="100M"):
        """The argv of the nopfsd of a held job of alice's on n2."""
        job = submit("nopfs-alice", f"-w n2 --mem=300 --nopfs-ram=0 --nopfs-ssd={ssd} "
                     f"--nopfs={DATASET} {options}",
                     HOLD.format(jobs=JOBS))
        wait_state(job, {"RUNNING"}, 90)
        deadline = time.monotonic() + 30
        argv = None
        while time.monotonic() < deadline and argv is None:
            for _, (user, a) in daemons().items():
                if f"{DIR}/run/n2/{job}" in a:
                    argv = a
            time.sleep(0.2)
        release(job)
        wait_done(job, 120)
        self.assertIsNotNone(argv, f"no nopfsd of job {job}")
        return job, argv

    def test_policy_and_option_decide_what_nopfsd_may_keep(self):
        write_policy(quota=6_000_000)
        job, argv = self.held_daemon_argv("")
        self.assertIn("--keep", argv)
        self.assertEqual(argv[argv.index("--keep-max-bytes") + 1], "6000000")
        self.assertRegex(self.slurmd_log("n2"),
                         r"nopfs: prolog: n2: serving .*keeps up to 5\.72 MiB")  # 6,000,000 B
        # The grant bounds it too: an SSD tier of 4M keeps at most 4 MiB.
        _, argv = self.held_daemon_argv("", ssd="4M")
        self.assertEqual(argv[argv.index("--keep-max-bytes") + 1], str(4 << 20))
        # The user asks to keep nothing.
        _, argv = self.held_daemon_argv("--nopfs-keep=no")
        self.assertNotIn("--keep", argv)
        self.assertIn("keeps nothing (--nopfs-keep=no)", self.slurmd_log("n2"))
        # No keep hook in the policy: nothing is kept.
        write_policy()
        _, argv = self.held_daemon_argv("--nopfs-keep=yes")
        self.assertNotIn("--keep", argv)
        self.assertNotIn("--keep-max-bytes", argv)

    def test_a_bad_keep_value_stops_sbatch_with_what_to_write(self):
        for bad in ("maybe", "YES", "1"):
            r = sbatch("nopfs-alice", f"--nopfs={DATASET} --nopfs-keep={bad}", "true\n")
            self.assertNotEqual(r.returncode, 0, bad)
            self.assertIn("write --nopfs-keep=yes", r.stderr, bad)
        r = sbatch("nopfs-alice", "--nopfs-keep=no", "true\n")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("needs --nopfs=DATASET", r.stderr)

    def test_what_a_crash_leaves_is_removed_by_the_next_prolog(self):
        """A SIGKILLed keep leaves a .tmp.* entry (its lock file no longer held), a crash before
        MANIFEST a directory without one; a garbage MANIFEST is as good as none. The next job's
        prolog removes all of them; none is ever listed as usable."""
        write_policy(quota=50_000_000)
        user = "nopfs-alice"
        area = kept_dir(user)
        # The user directory as the prolog makes it.
        os.makedirs(os.path.dirname(area), mode=0o700, exist_ok=True)
        os.chown(os.path.dirname(area), uid_of(user), pwd.getpwnam(user).pw_gid)
        r = as_user(user, f"mkdir -p -m 0700 {area} && cd {area} && "
                    "mkdir .tmp.4242.1 && head -c 100000 /dev/urandom > .tmp.4242.1/data.0 && "
                    ": > .tmp.4242.1/lock && "
                    "mkdir 00000000000000aa && head -c 5000 /dev/urandom > 00000000000000aa/data.0"
                    " && mkdir 00000000000000bb && echo garbage > 00000000000000bb/MANIFEST && "
                    "echo stray > stray")
        self.assertEqual(r.returncode, 0, r.stderr)
        # As the user sees them: nothing complete.
        r = as_user(user, f"{NOPFS} cache ls --config {CONFIG} --json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(all(not e["complete"] for e in json.loads(r.stdout)), r.stdout)
        self.run_job(user, "n1", extra="--nopfs-keep=no")
        left = set(kept(user))
        self.assertEqual(left & {".tmp.4242.1", "00000000000000aa", "00000000000000bb", "stray"},
                         set(), left)
        self.assertRegex(self.slurmd_log("n1"), r"kept datasets removed: .*incomplete")

    # The rest needs nopfsd's keep and adopt (--keep).

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_second_job_starts_warm_and_another_user_gets_nothing_of_it(self):
        write_policy(quota=50_000_000)
        _, _, first = self.run_job("nopfs-alice", "n1")
        names = kept("nopfs-alice")
        keys = [n for n, complete in names.items() if complete and KEY.match(n)]
        self.assertEqual(len(keys), 1, names)
        key = keys[0]
        area = kept_dir("nopfs-alice")
        st = os.stat(area)
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (uid_of("nopfs-alice"), 0o700))
        # The user sees it.
        r = as_user("nopfs-alice", f"{NOPFS} cache ls --config {CONFIG} --json")
        self.assertEqual(r.returncode, 0, r.stderr)
        listed = json.loads(r.stdout)
        self.assertEqual([e["key"] for e in listed], [key], r.stdout)
        self.assertEqual(listed[0]["dataset"], DATASET)
        self.assertTrue(listed[0]["complete"])
        self.assertGreater(listed[0]["samples"], 0)

        # The same job again: its PFS bytes are at most 5 % of the first's.
        _, _, second = self.run_job("nopfs-alice", "n2")
        self.assertGreater(first["pfs_bytes"], 0, first)
        self.assertLessEqual(second["pfs_bytes"], 0.05 * first["pfs_bytes"],
                             (first["pfs_bytes"], second["pfs_bytes"]))
        print(f"\nPFS bytes: first job {first['pfs_bytes']}, second {second['pfs_bytes']}",
              file=sys.stderr)

        # Another user: cannot list, open or read alice's kept data...
        before = disk_bytes(area)
        manifest = os.path.join(area, key, "MANIFEST")
        for cmd in (f"ls {area}", f"cat {manifest}", f"ls {area}/{key}",
                    f"{NOPFS} cache rm --config {CONFIG} {key}"):
            r = as_user("nopfs-bob", cmd)
            self.assertNotEqual(r.returncode, 0, cmd)
        r = as_user("nopfs-bob", f"{NOPFS} cache ls --config {CONFIG} --json")
        self.assertEqual(json.loads(r.stdout), [], r.stdout)
        # ... and the same job of his reads the PFS in full, adopting nothing of hers.
        _, _, bobs = self.run_job("nopfs-bob", "n3")
        print(f"PFS bytes: the other user's job {bobs['pfs_bytes']}", file=sys.stderr)
        self.assertGreaterEqual(bobs["pfs_bytes"], 0.95 * first["pfs_bytes"],
                                (first["pfs_bytes"], bobs["pfs_bytes"]))
        self.assertIn(key, kept("nopfs-alice"))
        self.assertGreater(disk_bytes(area), 0.5 * before)

        # nopfs cache rm removes it.
        r = as_user("nopfs-alice", f"{NOPFS} cache rm --config {CONFIG} --all")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"removed {key}", r.stdout)
        self.assertEqual(kept("nopfs-alice"), {})

    def two_jobs_at_once(self, extra_b=""):
        """Job A (alice, n1) serves before job B (alice, n1, `extra_b`) starts; B reads (through
        A's nopfsd: docs/tiers.md, "Sibling jobs"); A reads only once B is done, and stays until
        released. Returns A's and B's statuses, after checking every byte of both."""
        go = os.path.join(JOBS, "go-$SLURM_JOB_ID")
        a = submit("nopfs-alice", f"-w n1 --mem=300 --nopfs-ram=0 --nopfs-ssd=100M "
                   f"--nopfs={DATASET} --nopfs-seed=3",
                   f"while [ ! -e {go} ]; do sleep 0.2; done\n" + READ + HOLD.format(jobs=JOBS))
        try:
            wait_state(a, {"RUNNING"}, 90)
            live = os.path.join(SSD, f"nopfs-{uid_of('nopfs-alice')}", "live")
            deadline = time.monotonic() + 60
            while not (os.path.isdir(live) and [n for n in os.listdir(live)
                                                if n.endswith(f".{a}.0")]):
                self.assertLess(time.monotonic(), deadline, "job A's nopfsd never registered")
                time.sleep(0.2)
            st = os.stat(live)
            self.assertEqual((st.st_uid, st.st_mode & 0o777), (uid_of("nopfs-alice"), 0o700))
            self.assertNotEqual(as_user("nopfs-bob", f"ls {live}").returncode, 0)
            # B starts once A has staged its tiers: what B may read from the PFS is then only
            # what A could not hold, not what A's prefetcher had not reached yet.
            deadline = time.monotonic() + 120
            while not tiers_staged(job_status("nopfs-alice", "n1", a)):
                self.assertLess(time.monotonic(), deadline, "job A's tiers were never staged")
                time.sleep(0.2)
            b = submit("nopfs-alice", f"-w n1 --mem=300 --nopfs-ram=0 --nopfs-ssd=100M "
                       f"--nopfs={DATASET} --nopfs-seed=4 {extra_b}", READ)
            self.assertEqual(wait_done(b, 180), "COMPLETED", self.output_so_far(b))
            out_b = output(b)
            self.assertRegex(out_b, r"verify: 120 samples, \d+ bytes, 0 mismatches", out_b)
            second = json.loads(re.search(r"(?m)^status: (\{.*\})$", out_b).group(1))
            open(os.path.join(JOBS, f"go-{a}"), "w").close()
            deadline = time.monotonic() + 120
            while "status: " not in self.output_so_far(a):
                self.assertLess(time.monotonic(), deadline, self.output_so_far(a))
                time.sleep(0.2)
        finally:
            release(a)
        self.assertEqual(wait_done(a, 120), "COMPLETED", self.output_so_far(a))
        out_a = output(a)
        self.assertRegex(out_a, r"verify: 120 samples, \d+ bytes, 0 mismatches", out_a)
        first = json.loads(re.search(r"(?m)^status: (\{.*\})$", out_a).group(1))
        deadline = time.monotonic() + 60
        while daemons() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertFalse(os.path.exists(live) and os.listdir(live), "entries left behind")
        return first, second

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_two_jobs_of_one_user_at_once_read_the_pfs_once(self):
        first, second = self.two_jobs_at_once()
        sibling = [s for s in second["sources"] if s["name"] == "sibling"]
        print(f"\ntwo jobs of one user at once: PFS bytes {first['pfs_bytes']} (first), "
              f"{second['pfs_bytes']} (second); the second took {sibling} from the first",
              file=sys.stderr)
        self.assertEqual(len(sibling), 1, second)
        self.assertGreater(sibling[0]["samples"], 0, second)
        self.assertGreater(first["pfs_bytes"], 0, first)
        self.assertLessEqual(second["pfs_bytes"], 0.05 * first["pfs_bytes"],
                             (first["pfs_bytes"], second["pfs_bytes"], second["sources"],
                              second.get("siblings"), second.get("tiers")))

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_share_running_no_reads_alone(self):
        first, second = self.two_jobs_at_once("--nopfs-share-running=no")
        self.assertEqual([s for s in second["sources"] if s["name"] == "sibling"], [], second)
        self.assertGreaterEqual(second["pfs_bytes"], 0.95 * first["pfs_bytes"],
                                (first["pfs_bytes"], second["pfs_bytes"]))

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_keep_no_keeps_nothing(self):
        write_policy(quota=50_000_000)
        self.run_job("nopfs-alice", "n1", extra="--nopfs-keep=no")
        self.assertEqual([n for n in kept("nopfs-alice") if KEY.match(n)], [])

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_a_job_that_keeps_nothing_leaves_the_kept_copy_kept(self):
        """A --nopfs-keep=no job on a node with its user's kept copy of its dataset reads from
        the copy and leaves it kept, byte for byte as it was, its last use updated: the job
        after it starts warm too."""
        write_policy(quota=50_000_000)
        user = "nopfs-alice"
        _, _, first = self.run_job(user, "n1")
        keys = [n for n, c in kept(user).items() if c and KEY.match(n)]
        self.assertEqual(len(keys), 1, kept(user))
        entry = os.path.join(kept_dir(user), keys[0])

        def contents():
            found = {}
            for name in sorted(os.listdir(entry)):
                if name == "index" or name.startswith("data."):
                    with open(os.path.join(entry, name), "rb") as f:
                        found[name] = f.read()
            return found

        def listed():
            r = as_user(user, f"{NOPFS} cache ls --config {CONFIG} --json")
            self.assertEqual(r.returncode, 0, r.stderr)
            return {e["key"]: e for e in json.loads(r.stdout)}

        before, listed_before = contents(), listed()[keys[0]]
        self.assertIn("data.0", before)
        time.sleep(1.1)  # last use is in seconds
        log_before = len(self.slurmd_log("n2"))
        _, _, second = self.run_job(user, "n2", extra="--nopfs-keep=no")
        log = self.slurmd_log("n2")[log_before:]
        self.assertIn("keeps nothing (--nopfs-keep=no); reads ", log)
        self.assertIn(" kept and leaves it kept", log)
        # It read the copy, not the PFS...
        self.assertLessEqual(second["pfs_bytes"], 0.05 * first["pfs_bytes"],
                             (first["pfs_bytes"], second["pfs_bytes"]))
        # ... and the copy is still kept, as it was, last used by that job.
        self.assertEqual([n for n, c in kept(user).items() if c and KEY.match(n)], keys)
        self.assertEqual(contents(), before)
        after = listed()[keys[0]]
        self.assertTrue(after["complete"], after)
        self.assertEqual((after["created"], after["samples"]),
                         (listed_before["created"], listed_before["samples"]))
        self.assertGreater(after["last_used"], listed_before["last_used"], after)
        _, _, third = self.run_job(user, "n3")
        self.assertLessEqual(third["pfs_bytes"], 0.05 * first["pfs_bytes"],
                             (first["pfs_bytes"], third["pfs_bytes"]))

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_quota_and_space_evict_the_least_recently_used(self):
        _, _, first = self.run_job("nopfs-alice", "n1")  # nothing kept: no keep hook
        self.assertEqual(kept("nopfs-alice"), {})
        # A quota that holds one dataset: the second dataset's keep evicts the first.
        write_policy(quota=int(first["pfs_bytes"] * 1.5) + 2_000_000)
        self.run_job("nopfs-alice", "n1")
        one = [n for n, c in kept("nopfs-alice").items() if c]
        self.assertEqual(len(one), 1, kept("nopfs-alice"))
        time.sleep(1.1)  # last use is in seconds
        self.run_job("nopfs-alice", "n1", dataset=DATASET2)
        two = [n for n, c in kept("nopfs-alice").items() if c]
        self.assertEqual(len(two), 1, kept("nopfs-alice"))
        self.assertNotEqual(one, two)
        self.assertRegex(self.slurmd_log("n1"), r"kept datasets removed: .*over quota")
        # A job of another user that needs the node's whole SSD evicts alice's kept dataset.
        self.run_job("nopfs-bob", "n1", extra="--nopfs-keep=no", ssd="1G")
        self.assertEqual([n for n, c in kept("nopfs-alice").items() if c], [])
        self.assertRegex(self.slurmd_log("n1"), r"kept datasets removed: .*space")

    def bob_leaves(self, nested_in=None):
        """As bob: 30 MB twelve levels down in kept dataset `nested_in`, 30 MB in a loose file and
        30 MB in a renamed job directory of his SSD directory."""
        user = os.path.dirname(kept_dir("nopfs-bob"))
        cmds = [f"head -c 30000000 /dev/urandom > {user}/junk",
                f"mkdir -p {user}/77.0.renamed/a/b",
                f"head -c 30000000 /dev/urandom > {user}/77.0.renamed/a/b/data.0",
                f"ln -s {kept_dir('nopfs-alice')} {user}/77.0.renamed/to-alice"]
        if nested_in:
            deep = os.path.join(kept_dir("nopfs-bob"), nested_in,
                                *[str(i) for i in range(1, 13)])
            cmds += [f"mkdir -p {deep}", f"head -c 30000000 /dev/urandom > {deep}/big"]
        r = as_user("nopfs-bob", " && ".join(cmds))
        self.assertEqual(r.returncode, 0, r.stderr)

    def bob_forges(self):
        script = os.path.join(JOBS, "forge.py")
        with open(script, "w") as f:
            f.write(FORGE)
        os.chmod(script, 0o644)
        r = as_user("nopfs-bob", f"python3 {script} {kept_dir('nopfs-bob')}")
        self.assertEqual(r.returncode, 0, r.stderr)
        forged = r.stdout.split()
        # nopfs accepts the forgery as a valid MANIFEST: bob's view shows the forged time.
        r = as_user("nopfs-bob", f"{NOPFS} cache ls --json --config {CONFIG}")
        self.assertEqual(r.returncode, 0, r.stderr)
        for e in json.loads(r.stdout):
            if e["key"] in forged:
                self.assertTrue(e["complete"], e)
                self.assertGreater(e["last_used"], time.time() + 9 * 365 * 86400, e)
        return forged

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_what_bob_leaves_counts_against_bob_and_his_forged_times_change_nothing(self):
        """bob leaves 30 MB twelve levels deep in a kept dataset, a loose file, a renamed job
        directory (with a link to alice's kept area in it) and a MANIFEST that says he used it
        ten years ahead. The next prolog counts all of it against bob, removes the strays, and
        evicts bob's dataset before alice's (root's record: alice used hers last); a lifetime
        expires bob's forged dataset all the same; a quota counts the nested bytes."""
        bob, alice = uid_of("nopfs-bob"), uid_of("nopfs-alice")
        bob_dir = os.path.dirname(kept_dir("nopfs-bob"))
        write_policy(quota=100_000_000, lifetime=600)
        jobs = [self.run_job("nopfs-bob", "n1", dataset=DATASET2)[0]]
        (b_key,) = [n for n, c in kept("nopfs-bob").items() if c]
        time.sleep(1.1)  # root's record is in seconds: alice's use is the later one
        jobs.append(self.run_job("nopfs-alice", "n1")[0])
        (a_key,) = [n for n, c in kept("nopfs-alice").items() if c]
        a_bytes = disk_bytes(os.path.join(kept_dir("nopfs-alice"), a_key))
        self.assertEqual(self.bob_forges(), [b_key])
        self.bob_leaves(nested_in=b_key)
        # A job of alice's that needs all of the SSD but what her kept dataset and 10 MB leave:
        # one of the two kept datasets must go, and root's record says bob's is the older.
        ssd_mb = ((1 << 30) - a_bytes - 10_000_000) // 1_000_000  # the SSD class: "1G"
        log_before = len(self.slurmd_log("n1"))
        jobs.append(self.run_job("nopfs-alice", "n1", dataset=DATASET2,
                                 extra="--nopfs-keep=no", ssd=f"{ssd_mb * 10**6}B")[0])
        log = self.slurmd_log("n1")[log_before:]
        self.assertGreaterEqual(removed_mb(log, bob, f"nopfs-{bob}/junk", "stray") or 0, 29, log)
        self.assertGreaterEqual(removed_mb(log, bob, f"nopfs-{bob}/77.0.renamed", "stray") or 0,
                                29, log)
        self.assertGreaterEqual(removed_mb(log, bob, b_key, "space") or 0, 30,
                                "bob's dataset with its nested 30 MB, evicted first\n" + log)
        self.assertIsNone(removed_mb(log, alice, a_key, "space"), log)
        self.assertEqual(kept("nopfs-alice"), {a_key: True}, "alice's evicted before bob's")
        self.assertEqual(os.listdir(bob_dir), ["kept"])
        self.assertEqual(os.listdir(kept_dir("nopfs-bob")), [])

        # The lifetime: bob's forged dataset expires 1 s after root last saw it used.
        jobs.append(self.run_job("nopfs-bob", "n1", dataset=DATASET2)[0])
        self.assertEqual(len(self.bob_forges()), 1)
        write_policy(quota=100_000_000, lifetime=1)
        time.sleep(2.1)
        r = subprocess.run([NOPFS, "gc", "--config", CONFIG, "--policy", POLICY, "--node", "n1"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, rf"removed {re.escape(kept_dir('nopfs-bob'))}/[0-9a-f]{{16}} "
                         rf"\(uid {bob}, .*, expired\)")
        self.assertEqual(kept("nopfs-bob"), {})

        # The quota: 20 MB each. bob's new dataset with 30 MB nested in it is over it; alice's
        # is not, and the next prolog (a job of alice's) says so.
        write_policy(quota=20_000_000)
        jobs.append(self.run_job("nopfs-bob", "n1", dataset=DATASET2)[0])
        (b_key,) = [n for n, c in kept("nopfs-bob").items() if c]
        self.bob_leaves(nested_in=b_key)
        log_before = len(self.slurmd_log("n1"))
        jobs.append(self.run_job("nopfs-alice", "n1")[0])
        log = self.slurmd_log("n1")[log_before:]
        self.assertGreaterEqual(removed_mb(log, bob, b_key, "over quota") or 0, 30, log)
        self.assertGreaterEqual(removed_mb(log, bob, f"nopfs-{bob}/junk", "stray") or 0, 29, log)
        self.assertNotIn("nested too deep", log)
        self.assertEqual(os.listdir(bob_dir), ["kept"])
        self.assertEqual(os.listdir(kept_dir("nopfs-bob")), [])
        self.assertNotIn(f"uid {alice} ", log.split("kept datasets removed:", 1)[-1]
                         if "kept datasets removed:" in log else "", log)
        self.assertEqual(list(kept("nopfs-alice").values()), [True], kept("nopfs-alice"))
        # Root's record lives beside the users' directories, root's alone.
        st = os.stat(os.path.join(SSD, ".nopfs-root"))
        self.assertEqual((st.st_uid, st.st_mode & 0o7777), (0, 0o700))
        self.assertNothingLeft(jobs)

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_gc_removes_an_expired_dataset(self):
        write_policy(quota=50_000_000, lifetime=3600)
        self.run_job("nopfs-alice", "n2")
        names = [n for n, c in kept("nopfs-alice").items() if c]
        self.assertEqual(len(names), 1)
        r = subprocess.run([NOPFS, "gc", "--config", CONFIG, "--policy", POLICY, "--node", "n2"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("removed", r.stdout)
        self.assertIn(names[0], kept("nopfs-alice"))
        write_policy(quota=50_000_000, lifetime=1)
        time.sleep(2.1)
        r = subprocess.run([NOPFS, "gc", "--config", CONFIG, "--policy", POLICY, "--node", "n2"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, rf"removed .*/kept/{names[0]} \(uid {uid_of('nopfs-alice')}, "
                         r".*, expired\)")
        self.assertEqual(kept("nopfs-alice"), {})
        # As a user, gc refuses and says what to use instead.
        r = as_user("nopfs-alice", f"{NOPFS} gc --config {CONFIG} --policy {POLICY}")
        self.assertEqual(r.returncode, 2)
        self.assertIn("nopfs cache rm", r.stderr)

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_a_kept_copy_damaged_after_a_crash_is_never_trusted(self):
        """A kept dataset whose bytes were changed (a torn write, a crash mid-keep that left a
        complete-looking directory) is verified sample by sample: the job delivers the right
        bytes (verify: 0 mismatches, run_job) and reads the damaged samples from the PFS."""
        write_policy(quota=50_000_000)
        _, _, first = self.run_job("nopfs-alice", "n1")
        key = [n for n, c in kept("nopfs-alice").items() if c][0]
        for data in glob.glob(os.path.join(kept_dir("nopfs-alice"), key, "data.*")):
            with open(data, "r+b") as f:
                size = os.fstat(f.fileno()).st_size
                for off in range(0, size, 4096):
                    f.seek(off)
                    f.write(b"\xff")
        _, _, second = self.run_job("nopfs-alice", "n1")
        self.assertGreater(second["pfs_bytes"], 0.5 * first["pfs_bytes"],
                           (first["pfs_bytes"], second["pfs_bytes"]))

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_sigkill_mid_keep_leaves_nothing_a_later_job_trusts(self):
        """nopfsd is told to stop (it starts keeping) and killed a moment later, at a different
        moment each round; whatever that leaves, the next job delivers the dataset's bytes, and
        its prolog removes every incomplete entry no live nopfsd holds."""
        write_policy(quota=50_000_000)
        user = "nopfs-alice"
        for delay in (0.0, 0.005, 0.02, 0.05, 0.2):
            job = submit(user, f"-w n1 --mem=300 --nopfs-ram=0 --nopfs-ssd=100M "
                         f"--nopfs={DATASET} --nopfs-seed=3",
                         READ + HOLD.format(jobs=JOBS))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and "status: " not in self.output_so_far(job):
                time.sleep(0.2)
            pids = [pid for pid, (_, a) in daemons().items() if f"{DIR}/run/n1/{job}" in a]
            self.assertEqual(len(pids), 1, output(job))
            os.kill(pids[0], 15)
            time.sleep(delay)
            try:
                os.kill(pids[0], 9)
            except ProcessLookupError:
                pass
            release(job)
            wait_done(job, 120)
            _, out, _ = self.run_job(user, "n2", extra="--nopfs-keep=no")
            self.assertRegex(out, r"verify: 120 samples, \d+ bytes, 0 mismatches", out)
            # Left: complete datasets, or a .tmp.* that its lock (or, when killed before it had
            # one, its first minute) still protects; nothing under a key without a MANIFEST.
            for name, complete in kept(user).items():
                self.assertTrue((complete and KEY.match(name)) or name.startswith(".tmp."),
                                (delay, kept(user)))
                if name.startswith(".tmp."):
                    self.assertFalse(os.path.exists(os.path.join(kept_dir(user), name, "lock")),
                                     (delay, name))

    def test_a_killed_nopfsd_is_kept_by_the_epilog(self):
        """nopfsd killed with SIGKILL once its SSD tier is full (by the job's user here; the OOM
        killer or a crash the same way): it never keeps at exit, and the epilog keeps from the
        keep record it committed as the tier filled. The same
        job again reads at most 5 % of the dataset from the PFS, every byte right."""
        write_policy(quota=50_000_000)
        user = "nopfs-alice"
        job = submit(user, f"-w n1 --mem=300 --nopfs-ram=0 --nopfs-ssd=100M "
                     f"--nopfs={DATASET} --nopfs-seed=3", READ + HOLD.format(jobs=JOBS))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "status: " not in self.output_so_far(job):
            time.sleep(0.2)
        out = output(job)
        self.assertRegex(out, r"verify: 120 samples, \d+ bytes, 0 mismatches", out)
        first = json.loads(re.search(r"(?m)^status: (\{.*\})$", out).group(1))
        self.assertTrue(tiers_staged(first), first)
        # The record is committed within moments of the fill's end (the committer looks every
        # second); wait until it holds every sample the tier holds.
        record = os.path.join(SSD, f"nopfs-{uid_of(user)}", f"{job}.0", "keep")
        ready = sum(t["ready_samples"] for t in first["tiers"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (record_samples(record) or 0) < ready:
            time.sleep(0.2)
        self.assertEqual(record_samples(record), ready, record)
        r = as_user(user, f"kill -9 {first['pid']}")
        self.assertEqual(r.returncode, 0, r.stderr)
        release(job)
        wait_done(job, 120)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (job in ledger("n1") or daemons()):
            time.sleep(0.2)
        self.assertNotIn(job, ledger("n1"))
        log = self.slurmd_log("n1")
        line = re.search(r"(?m)^.*nopfs: epilog: n1: kept area: .*finished by the epilog.*$", log)
        self.assertRegex(log, r"nopfs: epilog: n1: kept area: \d+ samples \(.*\) in .*/kept/"
                         r"[0-9a-f]{16}, finished by the epilog from nopfsd's keep record; .*clean")
        print(f"\n{line.group(0) if line else ''}", file=sys.stderr)
        names = kept(user)
        keys = [n for n, complete in names.items() if complete and KEY.match(n)]
        self.assertEqual(len(keys), 1, names)
        self.assertFalse(os.path.exists(os.path.join(SSD, f"nopfs-{uid_of(user)}", f"{job}.0")))

        _, _, second = self.run_job(user, "n2")
        self.assertGreater(first["pfs_bytes"], 0, first)
        self.assertLessEqual(second["pfs_bytes"], 0.05 * first["pfs_bytes"],
                             (first["pfs_bytes"], second["pfs_bytes"]))
        print(f"PFS bytes: the killed job {first['pfs_bytes']}, the next {second['pfs_bytes']}",
              file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
