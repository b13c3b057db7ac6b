#!/usr/bin/python3
"""Placement on the local cluster (docs/admin.md, "Placement"): a node that holds a user's kept
copy of a dataset carries the copy's mark (an opaque node feature) in Slurm, and
contrib/slurm/job_submit.lua adds the mark to the --prefer of the user's next job on the dataset
(to its --constraint with --nopfs-placement=require). The nodes get an SSD directory each
(NOPFS_CLUSTER_NODE_SSD=1), as separate machines have, so that a copy kept on n2 is on n2 alone.

Run as root, one cluster test at a time: flock /tmp/nopfs-cluster.lock ctest -L slurm -R placement
"""
import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
import unittest

os.environ["NOPFS_CLUSTER_NODE_SSD"] = "1"

from clusterlib import (BUILD, CONF, DATASET, DIR, HOLD, JOBS, NODES, ClusterCase, as_user, env,
                        features, job_nodes, mark_of, marked,
                        output, release, submit, wait_done, wait_state)

POLICY = os.path.join(DIR, "etc/policy.lua")
NOPFS = os.path.join(BUILD, "bin/nopfs")
PLACEMENT_LOG = os.path.join(DIR, "log/placement.log")
MARK = re.compile(r"nopfs_[0-9a-f]{16}")
DATASET_BYTES = None  # set in setUpClass
# Each task reads the whole dataset (verifying it), waits until its node's tiers are staged (so
# that what the job keeps is the whole copy), and prints the first line of its status.
READ = (f"srun bash -c '{NOPFS} cat --verify 2>&1 | tail -n 1 | sed \"s/^/verify: /\"; "
        f"for i in $(seq 100); do {NOPFS} status --json | python3 -c \""
        "import json, sys; s = json.load(sys.stdin); "
        "sys.exit(0 if all(t[\\\"prefetch\\\"] == \\\"done\\\" for t in s[\\\"tiers\\\"] "
        "if t[\\\"planned_samples\\\"]) else 1)\" && break; sleep 0.2; done'\n")


def config(node):
    return os.path.join(DIR, "etc", f"nopfs-{node}.conf.lua")


def write_policy(lifetime=None):
    life = "" if lifetime is None else f", lifetime = {lifetime}"
    with open(POLICY, "w") as f:
        f.write("function admit(job, node) return {} end\n"
                f"function keep(user, node) return {{ quota = 100000000{life} }} end\n")


def pfs_bytes(out, node):
    """What the job's line for `node` says it read from the PFS, in bytes."""
    m = re.search(rf"nopfs: {node}: served .*; read ([\d.]+) (B|KiB|MiB|GiB) from the PFS", out)
    if not m:
        return None
    return float(m.group(1)) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m.group(2)]


class PlacementTest(ClusterCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        global DATASET_BYTES
        DATASET_BYTES = sum(os.path.getsize(p) for p in glob.glob(f"{DATASET}/*/*"))

    def setUp(self):
        super().setUp()
        write_policy()
        # No kept copies, no marks: the placement loop takes them away within its period.
        for d in glob.glob(os.path.join(DIR, "ssd", "n*", "nopfs-*", "kept")):
            shutil.rmtree(d, ignore_errors=True)
        self.wait_marks(lambda: not any(MARK.search(",".join(features(n))) for n in NODES),
                        "no node carries a mark")

    def wait_marks(self, ok, what, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return time.monotonic() - (deadline - timeout)
            time.sleep(0.5)
        self.fail(f"not within {timeout} s: {what}; features: "
                  f"{ {n: sorted(features(n)) for n in NODES} }")

    def run_job(self, user, options, timeout=180):
        """Runs a job reading DATASET to the end; returns (job, its nodes, its output)."""
        job = submit(user, f"--mem=300 --nopfs-ram=0 --nopfs-ssd=100M --nopfs={DATASET} "
                     f"--nopfs-seed=3 {options}", READ)
        state = wait_done(job, timeout)
        nodes = job_nodes(job)
        out = output(job)
        self.assertEqual(state, "COMPLETED", out)
        self.assertRegex(out, r"verify: \d+ samples, \d+ bytes, 0 mismatches")
        return job, nodes, out

    def keep_on(self, user, nodes):
        """A job of `user` pinned to `nodes` keeps its copy there; returns the copy's mark once
        those nodes, and no other, carry it."""
        n = len(nodes)
        self.run_job(user, f"-N{n} -w {','.join(nodes)}")
        mark = mark_of(user, DATASET)
        self.wait_marks(lambda: marked(mark) == set(nodes), f"{mark} on {nodes} alone")
        return mark

    def test_next_jobs_run_where_the_copy_is_and_read_little_from_the_pfs(self):
        mark = self.keep_on("nopfs-alice", ["n2"])
        # The admin's view of the node: whose copy of what, how big, and its mark.
        r = subprocess.run([os.path.join(BUILD, "bin/nopfs-job"), "placement", "--list",
                            "--node=n2", f"--plugstack={DIR}/etc/plugstack.conf"], env=env(),
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, rf"n2 uid \d+ \(nopfs-alice\) {re.escape(DATASET)} "
                         rf"[\d.]+ [KM]iB, last used \w+ ago, {mark}")
        for i in range(5):
            job, nodes, out = self.run_job("nopfs-alice", "")
            self.assertEqual(nodes, ["n2"], f"job {i + 1}:\n{out}")
            pfs = pfs_bytes(out, "n2")
            self.assertIsNotNone(pfs, out)
            self.assertLessEqual(pfs, 0.05 * DATASET_BYTES, out)
            self.assertIn("nopfs: n2: placement: preferred the nodes holding your kept copy of "
                          f"{DATASET}; this node holds one", out)

    def test_a_busy_node_is_only_preferred_and_require_waits_for_it(self):
        mark = self.keep_on("nopfs-alice", ["n2"])
        hold = submit("nopfs-bob", "-w n2 --exclusive", HOLD.format(jobs=JOBS))
        wait_state(hold, {"RUNNING"}, 60)
        # Soft: the job starts at once elsewhere, as it would have without nopfs (keeping nothing
        # there, so that n2 stays the only node with the copy).
        job, nodes, out = self.run_job("nopfs-alice", "--nopfs-keep=no", timeout=90)
        self.assertNotIn("n2", nodes, out)
        self.assertIn("this node holds none", out)
        # Its node carried alice's mark while it ran (a sibling's tiers), until it ended.
        self.wait_marks(lambda: marked(mark) == {"n2"}, f"{mark} on n2 alone again")
        # Hard: the job waits for n2, and runs there once it is free.
        job = submit("nopfs-alice", f"--mem=300 --nopfs-ram=0 --nopfs-ssd=100M "
                     f"--nopfs={DATASET} --nopfs-placement=require", READ)
        time.sleep(15)
        r = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T %r"], env=env(),
                           capture_output=True, text=True)
        self.assertTrue(r.stdout.startswith("PENDING"), r.stdout)
        release(hold)
        self.assertEqual(wait_done(job, 120), "COMPLETED", output(job))
        self.assertEqual(job_nodes(job), ["n2"])
        self.assertIn("placement: required the nodes holding your kept copy", output(job))

    def test_bob_is_not_drawn_and_slurm_names_neither_alice_nor_her_dataset(self):
        mark = self.keep_on("nopfs-alice", ["n2"])
        # bob keeps nothing, so that his own copies draw neither job.
        _, off, _ = self.run_job("nopfs-bob", "--nopfs-keep=no --nopfs-placement=off")
        _, on, out = self.run_job("nopfs-bob", "--nopfs-keep=no")
        self.assertEqual(on, off, out)
        self.assertNotEqual(on, ["n2"])
        # What bob can read about the nodes: the mark, and nothing that names alice, her uid, her
        # dataset or her copy's key.
        alice = pwd.getpwnam("nopfs-alice")
        keys = [os.path.basename(p) for p in
                glob.glob(os.path.join(DIR, "ssd", "n2", f"nopfs-{alice.pw_uid}", "kept", "*"))]
        self.assertTrue(keys)
        seen = ""
        for command in ("sinfo -N -o '%N %f %b %E %H'", "sinfo -N -l", "scontrol show node",
                        "scontrol -o show node n2"):
            r = as_user("nopfs-bob", command)
            self.assertEqual(r.returncode, 0, r.stderr)
            seen += r.stdout
        self.assertIn(mark, seen)
        seen = seen.replace(mark, "<mark>")
        for secret in ["nopfs-alice", "alice", DATASET, *keys]:
            self.assertNotIn(secret, seen, secret)
        for word in (str(alice.pw_uid), os.path.basename(DATASET)):
            self.assertNotRegex(seen, rf"\b{re.escape(word)}\b")

    def test_the_mark_goes_within_a_minute_after_cache_rm_and_expiry(self):
        mark = self.keep_on("nopfs-alice", ["n2"])
        r = as_user("nopfs-alice", f"{NOPFS} cache rm --all --config {config('n2')}")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("removed", r.stdout)
        took = self.wait_marks(lambda: not marked(mark), f"{mark} gone after cache rm")
        self.assertLess(took, 60)
        # A copy whose lifetime ends loses its mark within a minute of its expiry, before any gc
        # removes it (its last use is its job's epilog, before the mark appeared).
        lifetime = 20
        write_policy(lifetime=lifetime)
        mark = self.keep_on("nopfs-alice", ["n2"])
        took = self.wait_marks(lambda: not marked(mark), f"{mark} gone after expiry",
                               timeout=lifetime + 60)
        alice = pwd.getpwnam("nopfs-alice").pw_uid
        self.assertTrue(glob.glob(os.path.join(DIR, "ssd", "n2", f"nopfs-{alice}", "kept", "*")),
                        "the expired copy is still there: the mark went by its expiry, not gc")
        r = subprocess.run([os.path.join(BUILD, "bin/nopfs-job"), "placement", "--list",
                            "--node=n2", f"--plugstack={DIR}/etc/plugstack.conf"], env=env(),
                           capture_output=True, text=True)
        self.assertIn(f"{mark} (expired: not marked; gc removes it)", r.stdout)
        # ... and nopfs gc removes it.
        r = subprocess.run([NOPFS, "gc", "--config", config("n2"), "--policy", POLICY, "--node",
                            "n2"], capture_output=True, text=True, env=env())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("expired", r.stdout)

    def test_where_names_the_nodes_of_the_users_own_copy(self):
        mark = self.keep_on("nopfs-alice", ["n2"])
        # On n2 (its node name given, as one host runs the three nodes here): size and last use.
        r = as_user("nopfs-alice", f"{NOPFS} where {DATASET} --config {config('n2')} --node n2")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, rf"^copies of {re.escape(DATASET)} are on 1 node \(your mark "
                         rf"{mark}\):\n  n2 \([a-z]+\): your kept copy, [\d.]+ [KM]iB, last used "
                         r"\w+ ago\na 1-node job on them could start on n2 at \S+\n$")
        # Elsewhere: the node, and where to ask for the rest; the path as written after --nopfs=.
        r = as_user("nopfs-alice", f"{NOPFS} where {DATASET}/./ --config {config('n1')} --node n1")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("  n2 (idle): your kept copy (size and last use: `nopfs cache ls` on n2)\n",
                      r.stdout)
        # bob learns his own mark, which no node carries, and nothing of alice's.
        r = as_user("nopfs-bob", f"{NOPFS} where {DATASET}")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(f"no node holds your kept copy of {DATASET} (mark "
                      f"{mark_of('nopfs-bob', DATASET)})", r.stdout)
        self.assertNotIn(mark, r.stdout + r.stderr)
        r = as_user("nopfs-bob", f"{NOPFS} where data/ds")
        self.assertEqual(r.returncode, 2)
        self.assertIn("write its absolute path", r.stderr)

    def test_without_job_submit_lua_jobs_and_where_say_placement_is_not_set_up(self):
        """slurmctld without nopfs's job_submit.lua (a no-op script in its place; slurmctld
        loads a changed script at the next submission) while the nodes have the key."""
        script = os.path.join(DIR, "etc/job_submit.lua")
        with open(script) as f:
            ours = f.read()
        try:
            with open(script, "w") as f:
                f.write("function slurm_job_submit(j, p, u) return slurm.SUCCESS end\n"
                        "function slurm_job_modify(j, r, p, u) return slurm.SUCCESS end\n")
            t = int(time.time()) + 2
            os.utime(script, (t, t))
            time.sleep(2)
            _, _, out = self.run_job("nopfs-alice", "--nopfs-keep=no")
            self.assertIn("placement: the job did not ask for the nodes holding your kept copy of "
                          f"{DATASET}: placement is not set up on slurmctld's side "
                          "(docs/admin.md, \"Placement\"); this node holds none", out)
            self.assertNotIn("preferred", out)
            r = as_user("nopfs-alice", f"{NOPFS} where {DATASET}")
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("placement is not set up on this cluster", r.stderr)
        finally:
            with open(script, "w") as f:
                f.write(ours)
            t = int(time.time()) + 4
            os.utime(script, (t, t))
        time.sleep(4)

    def test_a_two_node_job_lands_on_the_two_nodes_of_its_copy(self):
        self.keep_on("nopfs-alice", ["n2", "n3"])
        job, nodes, out = self.run_job("nopfs-alice", "-N2")
        self.assertEqual(nodes, ["n2", "n3"], out)

    def test_jobs_run_as_without_placement_while_slurmctld_is_down(self):
        mark = self.keep_on("nopfs-alice", ["n2"])
        with open(PLACEMENT_LOG) as f:
            before = len(f.read().splitlines())
        pid_file = os.path.join(DIR, "pids", "slurmctld.pid")
        with open(pid_file) as f:
            pid = int(f.read())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.2)

        def failures():
            with open(PLACEMENT_LOG) as f:
                lines = f.read().splitlines()[before:]
            return lines, [l for l in lines
                           if "placement: n2: the node's marks are not in Slurm" in l]
        try:
            # The copy is still there and the marks are as they were: the reconcile asks
            # slurmctld once its verification is a minute old, cannot reach it, says so once,
            # and says nothing more while it retries every 30 s.
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not failures()[1]:
                time.sleep(1)
            # `nopfs where` says that it cannot ask Slurm.
            r = as_user("nopfs-alice", f"{NOPFS} where {DATASET}", timeout=120)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("cannot ask Slurm where your copy is: sbatch --test-only says: ",
                          r.stderr)
            self.assertIn("Unable to contact slurm controller", r.stderr)
            time.sleep(70)
        finally:
            if os.path.exists(os.path.join(DIR, "run-slurm", "slurmctld.pid")):
                os.unlink(os.path.join(DIR, "run-slurm", "slurmctld.pid"))
            subprocess.run(["/usr/sbin/slurmctld", "-f", CONF, "-i"], env=env(), check=True)
            for _ in range(100):
                if os.path.exists(os.path.join(DIR, "run-slurm", "slurmctld.pid")):
                    break
                time.sleep(0.1)
            shutil.copy(os.path.join(DIR, "run-slurm", "slurmctld.pid"), pid_file)
        lines, failed = failures()
        self.assertEqual(len(failed), 1, "\n".join(lines))
        for _ in range(60):
            if subprocess.run(["sinfo", "-h"], env=env(), capture_output=True).returncode == 0:
                break
            time.sleep(1)
        # A job submitted at once runs, whether or not the marks are back yet (bob's: a job of
        # alice's that kept nothing would take her copy with it when it ran on n2, as adopting a
        # kept copy does).
        self.run_job("nopfs-bob", "--nopfs-keep=no")
        # A restarted slurmctld has the features of slurm.conf: the reconcile puts the mark back
        # (its line counts it as added) once 30 s have passed since its last failure, and jobs
        # go to n2 again.
        self.wait_marks(lambda: marked(mark) == {"n2"}, f"{mark} back on n2", timeout=60)
        with open(PLACEMENT_LOG) as f:
            self.assertIn("placement: n2: marks 1 kept copy (1 added, 0 removed); Slurm takes "
                          "the node's marks again", f.read())
        _, nodes, out = self.run_job("nopfs-alice", "")
        self.assertEqual(nodes, ["n2"], out)


if __name__ == "__main__":
    unittest.main()
