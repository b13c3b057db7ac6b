#!/usr/bin/python3
"""Cluster tests of what root and slurmstepd do with paths and processes the job's user controls,
and of failing closed (docs/security.md, "Files that root and slurmstepd open" and "Failing
closed"), on a real Slurm cluster (contrib/slurm/local-cluster) as root.

Each test is an attack by a user on a shared node: the job's own user (nopfs-alice) planting a
link or a FIFO in her run directory or rewriting her nopfsd's command line, another user
(nopfs-bob) swapping a directory above the run directory, an admin's broken node config or
policy. Where the attacker must act at a precise moment, a stand-in nopfsd (run as the job's
user, as nopfsd is) does the user's step at that moment, so that the test is deterministic.
Each checks: nothing root-only is shown, nothing outside the job's tree is deleted, the job ends
when asked, no node is drained, and nothing of the job is left behind.
"""
import glob
import os
import pwd
import re
import shutil
import subprocess
import time
import unittest

from clusterlib import *  # noqa: F401,F403 (the shared helpers and paths)
from clusterlib import ClusterCase

STANDIN = os.path.join(DIR, "standin")
SECRET = os.path.join(DIR, "root-only-secret")
SECRET_LINE = "root-only line 5f3c9a: never shown to a user"


def slurmd_log(node):
    with open(os.path.join(DIR, "log", f"slurmd-{node}.log"), errors="replace") as f:
        return f.read()


def standin(name, body):
    """Writes an executable stand-in for nopfsd (a shell script the user runs) and returns it."""
    os.makedirs(STANDIN, mode=0o755, exist_ok=True)
    path = os.path.join(STANDIN, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# run as the job's user, in the job's run directory\n" + body)
    os.chmod(path, 0o755)
    return path


def drained():
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env(), capture_output=True,
                       text=True)
    return re.findall(r"\S+ (?:drain|drng|drained|down)\S*", r.stdout)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class SecurityRootTest(ClusterCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        with open(SECRET, "w") as f:
            f.write("first line\n" + SECRET_LINE + "\n")
        os.chmod(SECRET, 0o600)

    def logs_since(self, marks):
        return {n: slurmd_log(n)[marks[n]:] for n in NODES}

    def log_marks(self):
        return {n: len(slurmd_log(n)) for n in NODES}

    # ---------------------------------------------------------------------------------------
    def test_failed_and_output_linked_to_a_root_file_never_leak(self):
        # The job's user makes `failed` and `nopfsd.out` links to a root-only file while nopfsd
        # starts, and nopfsd fails: the root launcher must not read through them.
        fake = standin("link-failed", f"rm -f failed nopfsd.out\n"
                                      f"ln -s {SECRET} failed\nln -s {SECRET} nopfsd.out\nexit 1\n")
        self.set_plugin_args(f"nopfsd={fake} on_refusal=run")
        marks = self.log_marks()
        job = submit("nopfs-alice", f"-w n1 --nopfs={DATASET}", "echo ran\n")
        self.assertEqual(wait_done(job), "COMPLETED")
        log = self.logs_since(marks)["n1"]
        out = output(job)
        self.assertNotIn("5f3c9a", log)
        self.assertNotIn("5f3c9a", out)
        self.assertRegex(log, rf"nopfs: prolog: n1: nopfsd failed: exited with status 1")
        self.assertIn("ran", out)
        self.assertIn("without the cache", out)
        self.assertNothingLeft([job])
        self.assertEqual(drained(), [])

    def test_fifo_at_ready_blocks_neither_root_nor_the_task(self):
        # nopfsd's run directory gets FIFOs where the launcher and task_init look (ready,
        # failed, refused), and nopfsd never answers: the launcher gives up at its timeout,
        # the task is told, the job ends and can be cancelled, no node is drained.
        fake = standin("fifo-ready", "rm -f ready failed refused\n"
                                     "mkfifo ready failed refused\nexec sleep 600\n")
        self.set_plugin_args(f"nopfsd={fake} timeout=5 on_refusal=run")
        marks = self.log_marks()
        t0 = time.monotonic()
        job = submit("nopfs-alice", f"-w n3 --nopfs={DATASET}", "echo ran\n")
        self.assertEqual(wait_done(job, 60), "COMPLETED")
        self.assertLess(time.monotonic() - t0, 45)
        log = self.logs_since(marks)["n3"]
        self.assertIn("nopfs: prolog: n3: nopfsd failed: not ready within timeout=5 s", log)
        self.assertIn("ran", output(job))
        self.assertNothingLeft([job])
        self.assertEqual(drained(), [])

        # The same with a real nopfsd, the FIFO planted after it is ready: a new step's task_init
        # must not block on it (the step runs, told it has no cache), and scancel ends the job.
        self.set_plugin_args("on_refusal=run")
        job = submit("nopfs-alice", f"-w n3 --nopfs={DATASET}",
                     HOLD.format(jobs=JOBS) +
                     "rm -f $NOPFS_RUN_DIR/ready && mkfifo $NOPFS_RUN_DIR/ready\n"
                     "timeout 30 srun -n1 bash -c 'echo step ran; echo socket=${NOPFS_SOCKET:-none}'"
                     "; echo step rc=$?\n" + HOLD.replace("release-", "release2-").format(jobs=JOBS))
        wait_state(job, {"RUNNING"})
        wait_file(f"{RUN}/n3/{job}/ready", 30)
        release(job)
        wait_file(f"{JOBS}/job-{job}.out", 30)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and "step rc=" not in output(job):
            time.sleep(0.2)
        out = output(job)
        self.assertIn("step ran", out)
        self.assertIn("socket=none", out)
        self.assertIn("step rc=0", out)
        subprocess.run(["scancel", str(job)], env=env(), check=True)
        self.assertIn(wait_done(job, 60), {"CANCELLED", "COMPLETED"})
        self.assertNothingLeft([job])
        self.assertEqual(drained(), [])

    # ---------------------------------------------------------------------------------------
    def test_rundir_under_a_directory_the_attacker_owns(self):
        bobs = os.path.join(DIR, "bobs")
        victim = os.path.join(DIR, "victim")
        shutil.rmtree(bobs, ignore_errors=True)
        shutil.rmtree(victim, ignore_errors=True)
        os.makedirs(os.path.join(bobs, "run"), mode=0o755)
        os.chmod(bobs, 0o755)
        bob = pwd.getpwnam("nopfs-bob")
        uid = pwd.getpwnam("nopfs-alice").pw_uid
        rundir = os.path.join(bobs, "run")
        self.set_plugin_args(f"rundir={rundir} on_refusal=run")
        try:
            # 1. bob owns a directory above rundir from the start: the prolog refuses to work
            # there (naming the directory), the job runs without the cache, nothing is made.
            os.chown(bobs, bob.pw_uid, bob.pw_gid)
            marks = self.log_marks()
            job = submit("nopfs-alice", f"-w n1 --nopfs={DATASET}", "echo ran\n")
            self.assertEqual(wait_done(job), "COMPLETED")
            log = self.logs_since(marks)["n1"]
            self.assertIn(f"rundir: {rundir}/n1: {bobs} belongs to uid {bob.pw_uid}", log)
            self.assertIn("ran", output(job))
            self.assertFalse(os.path.exists(os.path.join(rundir, "n1")))

            # 2. rundir was sound at the prolog; bob gets the directory during the job and swaps
            # rundir for a link to a root-owned tree shaped like it. The epilog deletes nothing
            # through the link and says what it left; once the admin repairs the directory, the
            # next prolog on the node stops the job's nopfsd and cleans its run directory and
            # ledger entry (slurmctld reports the job over).
            os.chown(bobs, 0, 0)
            job1 = submit("nopfs-alice", f"-w n1 --nopfs={DATASET}", HOLD.format(jobs=JOBS))
            wait_state(job1, {"RUNNING"})
            wait_file(f"{rundir}/n1/{job1}/ready", 30)
            with open(f"{rundir}/n1/.ledger/{job1}") as f:
                entry = dict(line.split("=", 1) for line in f.read().split("\n") if line)
            pid = int(entry["pid"])
            self.assertTrue(alive(pid))
            os.makedirs(f"{victim}/n1/{job1}", mode=0o700)
            os.makedirs(f"{victim}/n1/.ledger", mode=0o700)
            for p in (f"{victim}/n1/{job1}/precious", f"{victim}/n1/.ledger/{job1}"):
                with open(p, "w") as f:
                    f.write("root's\n")
            os.chown(bobs, bob.pw_uid, bob.pw_gid)
            r = as_user("nopfs-bob", f"cd {bobs} && mv run run.old && ln -s {victim} run")
            self.assertEqual(r.returncode, 0, r.stderr)
            marks = self.log_marks()
            release(job1)
            wait_done(job1)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and "epilog: n1" not in self.logs_since(marks)["n1"]:
                time.sleep(0.2)
            log = self.logs_since(marks)["n1"]
            self.assertIn("nopfs: epilog: n1: left behind", log)
            self.assertIn(f"{bobs} belongs to uid {bob.pw_uid}", log)
            for p in (f"{victim}/n1/{job1}/precious", f"{victim}/n1/.ledger/{job1}"):
                with open(p) as f:
                    self.assertEqual(f.read(), "root's\n", p)
            # The admin repairs rundir; the next job's prolog on n1 cleans up after job1.
            os.unlink(f"{bobs}/run")
            os.rename(f"{bobs}/run.old", f"{bobs}/run")
            os.chown(bobs, 0, 0)
            job2 = submit("nopfs-alice", f"-w n1 --nopfs={DATASET}", "echo ran\n")
            self.assertEqual(wait_done(job2), "COMPLETED")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and alive(pid):
                time.sleep(0.2)
            self.assertFalse(alive(pid), "job1's nopfsd still runs")
            for job in (job1, job2):
                self.assertFalse(os.path.lexists(f"{rundir}/n1/{job}"), job)
                self.assertFalse(os.path.lexists(f"{rundir}/n1/.ledger/{job}"), job)
            self.assertEqual(
                [p for p in os.listdir(SSD) if p == f"nopfs-{uid}" and
                 any(n.startswith(f"{job1}.") for n in os.listdir(os.path.join(SSD, p)))], [])
            with open(f"{victim}/n1/{job1}/precious") as f:
                self.assertEqual(f.read(), "root's\n")
            self.assertEqual(drained(), [])
        finally:
            for d in glob.glob("/proc/[0-9]*"):
                try:
                    with open(d + "/cmdline", "rb") as f:
                        if f"{bobs}/run".encode() in f.read():
                            os.kill(int(d[6:]), 9)
                except OSError:
                    pass
            if os.path.lexists(f"{bobs}/run") and os.path.islink(f"{bobs}/run"):
                os.unlink(f"{bobs}/run")
            if os.path.exists(f"{bobs}/run.old"):
                os.rename(f"{bobs}/run.old", f"{bobs}/run")
            os.chown(bobs, 0, 0)

    # ---------------------------------------------------------------------------------------
    def test_epilog_stops_nopfsd_whose_argv_was_rewritten(self):
        job = submit("nopfs-alice", f"-w n2 --nopfs={DATASET}", HOLD.format(jobs=JOBS))
        wait_state(job, {"RUNNING"})
        wait_file(f"{RUN}/n2/{job}/ready", 30)
        pid = int(ledger("n2")[job]["pid"])
        # The job's user rewrites her nopfsd's argv through /proc/PID/mem: "--run-dir" and the
        # path no longer say what they did.
        rewrite = ("import sys\n"
                   "pid = sys.argv[1]\n"
                   "stat = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()\n"
                   "start, end = int(stat[45]), int(stat[46])\n"
                   "with open(f'/proc/{pid}/mem', 'r+b', buffering=0) as m:\n"
                   "    m.seek(start); argv = m.read(end - start)\n"
                   "    m.seek(start); m.write(argv.replace(b'--run-dir', b'--xyz-dir')\n"
                   "                           .replace(b'/run/', b'/nur/'))\n")
        r = subprocess.run(["runuser", "-u", "nopfs-alice", "--", "/usr/bin/python3", "-c",
                            rewrite, str(pid)], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        self.assertNotIn(b"--run-dir", cmdline)
        self.assertIn(b"--xyz-dir", cmdline)
        marks = self.log_marks()
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.2)
        self.assertFalse(alive(pid), "the epilog left the rewritten nopfsd running")
        self.assertNothingLeft([job])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "epilog: n2" not in self.logs_since(marks)["n2"]:
            time.sleep(0.2)
        self.assertIn("nopfs: epilog: n2: clean", self.logs_since(marks)["n2"])

    # ---------------------------------------------------------------------------------------
    def test_teardown_is_complete_with_a_broken_config(self):
        conf = os.path.join(DIR, "etc/nopfs.conf.lua")
        with open(conf) as f:
            good = f.read()
        try:
            job = submit("nopfs-alice", f"-w n2 --nopfs={DATASET}", HOLD.format(jobs=JOBS))
            wait_state(job, {"RUNNING"})
            wait_file(f"{RUN}/n2/{job}/ready", 30)
            pid = int(ledger("n2")[job]["pid"])
            self.assertTrue(alive(pid))
            # An admin edits the config on the live node and leaves it broken.
            with open(conf, "w") as f:
                f.write("classes = {  -- unfinished edit\n")
            marks = self.log_marks()
            release(job)
            wait_done(job)
            self.assertNothingLeft([job])
            self.assertFalse(alive(pid))
            # A job that starts under the broken config gets no cache and leaves nothing either.
            self.set_plugin_args("on_refusal=run")
            job2 = submit("nopfs-alice", f"-w n2 --nopfs={DATASET}", "echo ran\n")
            self.assertEqual(wait_done(job2), "COMPLETED")
            self.assertIn("config:", output(job2))
            self.assertNothingLeft([job2])
            log = self.logs_since(marks)["n2"]
            self.assertNotIn("left behind", log)
            self.assertEqual(drained(), [])
        finally:
            with open(conf, "w") as f:
                f.write(good)

    def test_policy_without_admit_refuses(self):
        policy = os.path.join(DIR, "etc/policy-typo.lua")
        with open(policy, "w") as f:
            f.write("-- a typo: Admit is not admit\n"
                    "function Admit(job, node) return nil, 'never asked' end\n")
        self.set_plugin_args(f"policy={policy}")
        job = submit("nopfs-alice", f"-w n1 --nopfs={DATASET}", "echo ran\n")
        self.assertEqual(wait_done(job), "FAILED")
        out = output(job)
        self.assertIn("refused: policy error:", out)
        self.assertIn("defines no function admit", out)
        self.assertNotIn("ran\n", out)
        self.assertNothingLeft([job])


if __name__ == "__main__":
    unittest.main()
