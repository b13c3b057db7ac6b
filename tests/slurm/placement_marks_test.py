#!/usr/bin/python3
"""Placement's marks beyond kept copies, on the local cluster (docs/admin.md, "Placement"):

- a node whose shared copy of a dataset (docs/admin.md, "Shared datasets") holds at least half of
  the dataset's quota carries the dataset's shared mark, the same for every user, and
  job_submit.lua prefers the nodes with the user's own mark or the shared one: a copy filled on n2
  by alice's job draws both alice's and bob's next jobs on the dataset to n2, while Slurm puts a
  job without nopfs on n1, and nothing bob can read in Slurm names alice, bob or the dataset;
- while a job runs whose tiers serve its user's other jobs on the dataset (the sibling link),
  its node carries that user's mark: her next job on the dataset goes to that node (soft: the node
  has room), and the mark goes when the job ends.

Run as root, one cluster test at a time:
  flock /tmp/nopfs-cluster.lock ctest -L slurm -R placement_marks
"""
import os
import pwd
import re
import subprocess
import time
import unittest

from clusterlib import (BUILD, DATASET, DIR, HOLD, JOBS, NODES, ClusterCase, as_user, env,
                        features, job_nodes, mark_of, marked, shared_mark,
                        output, release, submit, wait_done, wait_state)

NOPFS = os.path.join(BUILD, "bin/nopfs")
SHARED = os.path.join(DIR, "data/shared")  # declared shared, with a quota of QUOTA
QUOTA = "4M"  # the dataset is 3.67 MiB: a whole copy is more than half of it
MARK = re.compile(r"nopfs_[0-9a-f]{16}")
READ = (f"srun bash -c '{NOPFS} cat --verify 2>&1 | tail -n 1 | sed \"s/^/verify: /\"'\n")


class PlacementMarksTest(ClusterCase):
    @classmethod
    def setUpClass(cls):
        os.environ["NOPFS_CLUSTER_SHARED"] = SHARED
        os.environ["NOPFS_CLUSTER_SHARED_SSD"] = QUOTA
        try:
            super().setUpClass()
        finally:
            del os.environ["NOPFS_CLUSTER_SHARED"]
            del os.environ["NOPFS_CLUSTER_SHARED_SSD"]
        subprocess.run(["cp", "-a", DATASET, SHARED], check=True)

    def wait_marks(self, ok, what, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return time.monotonic() - (deadline - timeout)
            time.sleep(0.5)
        self.fail(f"not within {timeout} s: {what}; features: "
                  f"{ {n: sorted(features(n)) for n in NODES} }")

    def run_job(self, user, dataset, options, timeout=180):
        """A job reading `dataset` to the end, keeping nothing; returns (its nodes, its output)."""
        job = submit(user, f"--mem=300 --nopfs-ram=0 --nopfs-ssd=100M --nopfs={dataset} "
                     f"--nopfs-keep=no --nopfs-seed=3 {options}", READ)
        state = wait_done(job, timeout)
        out = output(job) if os.path.exists(os.path.join(JOBS, f"job-{job}.out")) else (
            "no output; " + subprocess.run(["scontrol", "show", "job", str(job)], env=env(),
                                           capture_output=True, text=True).stdout)
        self.assertEqual(state, "COMPLETED", out)
        self.assertRegex(out, r"verify: 120 samples, \d+ bytes, 0 mismatches")
        return job_nodes(job), out

    def plain_job_node(self, user):
        """Where Slurm puts a one-node job without nopfs now."""
        job = submit(user, "--mem=300", "hostname\n")
        self.assertEqual(wait_done(job, 60), "COMPLETED", output(job))
        return job_nodes(job)

    def test_a_shared_copy_draws_every_users_jobs_and_names_no_one(self):
        mark = shared_mark(SHARED)
        self.assertNotIn(mark, {mark_of(u, SHARED) for u in ("nopfs-alice", "nopfs-bob")})
        # alice's job pinned to n2 fills n2's shared copy (the whole dataset: above half of the
        # quota); n2 alone carries the shared mark, and her own mark goes with her job.
        self.run_job("nopfs-alice", SHARED, "-w n2")
        self.wait_marks(lambda: marked(mark) == {"n2"}, f"{mark} on n2 alone")
        self.wait_marks(lambda: not marked(mark_of("nopfs-alice", SHARED)),
                        "alice's mark gone with her job")
        r = subprocess.run([os.path.join(BUILD, "bin/nopfs-job"), "placement", "--list",
                            "--node=n2", f"--plugstack={DIR}/etc/plugstack.conf"], env=env(),
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, rf"n2 shared {re.escape(SHARED)} 3\.67 MiB of [\d.]+ MiB "
                         rf"\(120 files\), {mark}")
        # `nopfs where` shows bob the node of the shared copy, and nothing of alice's.
        r = as_user("nopfs-bob", f"{NOPFS} where {SHARED}")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, rf"^copies of {re.escape(SHARED)} are on 1 node \(your mark "
                         rf"{mark_of('nopfs-bob', SHARED)}, the shared copy's {mark}\):\n"
                         r"  n2 \([a-z]+\): the shared copy \(every user's\)\n")
        self.assertNotIn(mark_of("nopfs-alice", SHARED), r.stdout + r.stderr)
        # Slurm puts a job without nopfs on another node; bob's and alice's jobs on the dataset
        # go to n2 and read it from the copy there.
        self.assertNotEqual(self.plain_job_node("nopfs-bob"), ["n2"])
        for user in ("nopfs-bob", "nopfs-alice", "nopfs-bob"):
            nodes, out = self.run_job(user, SHARED, "")
            self.assertEqual(nodes, ["n2"], f"{user}:\n{out}")
            self.assertIn("nopfs: n2: placement: preferred the nodes holding your kept copy or "
                          f"the node's shared copy of {SHARED}; this node holds no kept copy of "
                          "yours (", out)
        self.assertEqual(marked(mark), {"n2"})
        # What bob can read about the nodes: the mark, and nothing that names alice, bob, their
        # uids or the dataset.
        seen = ""
        for command in ("sinfo -N -o '%N %f %b %E %H'", "sinfo -N -l", "scontrol show node",
                        "scontrol -o show node n2"):
            r = as_user("nopfs-bob", command)
            self.assertEqual(r.returncode, 0, r.stderr)
            seen += r.stdout
        self.assertIn(mark, seen)
        for secret in ["nopfs-alice", "nopfs-bob", "alice", "bob", SHARED]:
            self.assertNotIn(secret, seen, secret)
        for user in ("nopfs-alice", "nopfs-bob"):
            self.assertNotRegex(seen, rf"\b{pwd.getpwnam(user).pw_uid}\b")

    def test_a_running_jobs_node_draws_its_users_next_job_until_it_ends(self):
        mark = mark_of("nopfs-alice", DATASET)
        self.assertEqual(marked(mark), set())
        hold = submit("nopfs-alice", f"-w n2 --mem=300 --nopfs-ram=0 --nopfs-ssd=100M "
                      f"--nopfs={DATASET} --nopfs-keep=no", HOLD.format(jobs=JOBS))
        # n1 as busy as n2 (one of its two CPUs), so that Slurm, which packs jobs onto the
        # fullest node that fits, has no reason of its own to pick n2.
        other = submit("nopfs-bob", "-w n1 --mem=300", HOLD.format(jobs=JOBS))
        wait_state(hold, {"RUNNING"}, 60)
        wait_state(other, {"RUNNING"}, 60)
        self.wait_marks(lambda: marked(mark) == {"n2"}, f"{mark} on n2 while the job runs")
        # `nopfs where` tells the running job's tiers from a kept copy: on n2 for sure (its
        # sibling registry), elsewhere as a job of hers running there.
        r = as_user("nopfs-alice", f"{NOPFS} where {DATASET} --node n2 "
                    f"--config {DIR}/etc/nopfs.conf.lua")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, rf"  n2 \([a-z]+\): the tiers of your running job {hold} "
                         r"\(until it ends\)\n")
        self.assertNotIn("kept copy", r.stdout)
        r = as_user("nopfs-alice", f"{NOPFS} where {DATASET} --node n1")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, rf"  n2 \([a-z]+\): your kept copy, or the tiers of your job "
                         rf"{hold} running there, or both \(`nopfs where` on n2 tells\)\n")
        # Slurm puts a job without nopfs on n1; alice's next job on the dataset goes to n2,
        # beside her running job.
        self.assertEqual(self.plain_job_node("nopfs-alice"), ["n1"])
        nodes, out = self.run_job("nopfs-alice", DATASET, "")
        self.assertEqual(nodes, ["n2"], out)
        # bob's job is not drawn.
        self.assertEqual(self.run_job("nopfs-bob", DATASET, "")[0], ["n1"])
        release(other)
        release(hold)
        self.assertEqual(wait_done(hold, 60), "COMPLETED", output(hold))
        took = self.wait_marks(lambda: not marked(mark), f"{mark} gone after the job")
        self.assertLess(took, 30)


if __name__ == "__main__":
    unittest.main()
