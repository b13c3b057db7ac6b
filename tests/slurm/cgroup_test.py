#!/usr/bin/python3
"""The job's cgroup on the local cluster in cgroup v1 mode (docs/admin.md, "The job's cgroup"):
proctrack/cgroup, task/cgroup and PrologFlags=Contain, as Slurm documents them. nopfsd starts in
its job's memory cgroup, so that every byte of its RAM tier is charged to the job's --mem from the
first one; it is never in the extern step that slurmstepd SIGKILLs at the job's end, so it keeps
its SSD tier and the same job submitted again starts warm; a job over its --mem is held inside its
own cgroup; nothing of the job's cgroups is left after its epilog.

Run as root, one cluster test at a time: flock /tmp/nopfs-cluster.lock ctest -L slurm -R cgroup
(ctest sets NOPFS_CLUSTER_CGROUP=1: the cluster comes up in cgroup mode).
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

from clusterlib import (BUILD, DIR, JOBS, REAL_NOPFSD, SSD, ClusterCase, HOLD, daemons,
                        job_status, ledger, output, release, submit, wait_done, wait_state)

MiB = 1 << 20
NOPFS = os.path.join(BUILD, "bin/nopfs")
POLICY = os.path.join(DIR, "etc/policy.lua")
BIG = os.path.join(DIR, "data/big")  # 200 files of 1 MiB: the RAM tier's test
READ = (f"srun bash -c '{NOPFS} cat --verify 2>&1 | tail -n 1 | sed \"s/^/verify: /\"; "
        f"echo \"status: $({NOPFS} status --json)\"'\n")


def uid_of(user):
    return pwd.getpwnam(user).pw_uid


def cgroup_of(pid):
    """{controller: path} of process `pid` (v1: one line per hierarchy)."""
    with open(f"/proc/{pid}/cgroup") as f:
        return {line.split(":")[1]: line.split(":")[2].strip() for line in f.read().splitlines()}


def proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        m = re.search(rf"(?m)^{field}:\s+(\d+) kB", f.read())
    return int(m.group(1)) * 1024 if m else 0


def nopfsd_of(job, node="n1", timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [p for p, (_, argv) in daemons().items() if f"/{node}/{job}" in " ".join(argv)]
        if pids:
            return pids[0]
        time.sleep(0.2)
    raise AssertionError(f"no nopfsd of job {job} on {node}")


def job_cgroups(job):
    return glob.glob(f"/sys/fs/cgroup/*/slurm_n*/uid_*/job_{job}")


@unittest.skipUnless(os.environ.get("NOPFS_CLUSTER_CGROUP") == "1",
                     "NOPFS_CLUSTER_CGROUP=1 runs the cluster with cgroup v1")
class JobCgroupTest(ClusterCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not os.path.isdir(BIG):
            os.makedirs(os.path.join(BIG, "c"))
            for i in range(200):
                with open(os.path.join(BIG, "c", f"{i:04d}.bin"), "wb") as f:
                    f.write(os.urandom(MiB))
            subprocess.run(["chmod", "-R", "a+rX", BIG], check=True)

    def setUp(self):
        super().setUp()
        shutil.copy(os.path.join(os.environ.get("NOPFS_SOURCE_DIR", "."),
                                 "contrib/slurm/policy.lua"), POLICY)

    def assertNoCgroupLeft(self, jobs):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(job_cgroups(j) for j in jobs):
            time.sleep(0.5)
        self.assertEqual([d for j in jobs for d in job_cgroups(j)], [])

    def slurmd_log(self, node):
        with open(os.path.join(DIR, "log", f"slurmd-{node}.log"), errors="replace") as f:
            return f.read()

    def test_nopfsd_starts_in_the_jobs_cgroup_never_its_extern_step(self):
        uid = uid_of("nopfs-alice")
        job = submit("nopfs-alice", f"-w n1 --mem=300 --nopfs={BIG}",
                     HOLD.format(jobs=JOBS))
        wait_state(job, {"RUNNING"})
        pid = nopfsd_of(job)
        want = f"/slurm_n1/uid_{uid}/job_{job}"
        # memory from its first instruction; cpuset once slurmd has set the job's cpus up.
        self.assertEqual(cgroup_of(pid).get("memory"), want)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and cgroup_of(pid).get("cpuset") != want:
            time.sleep(0.2)
        got = cgroup_of(pid)
        self.assertEqual(got.get("cpuset"), want, got)
        # Not in the freezer's extern step: proctrack/cgroup SIGKILLs that at the job's end.
        self.assertNotIn(f"job_{job}", got.get("freezer", ""), got)
        # The kernel holds it to the job's --mem, as every other process of the job.
        with open(f"/sys/fs/cgroup/memory{want}/memory.limit_in_bytes") as f:
            self.assertEqual(int(f.read()), 300 * MiB)
        self.assertRegex(self.slurmd_log("n1"),
                         rf"nopfs: prolog: n1: serving .*cgroup v1 memory:{want}, memory limit")
        release(job)
        self.assertEqual(wait_done(job, 120), "COMPLETED")
        self.assertNothingLeft([job])
        self.assertNoCgroupLeft([job])

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_the_ram_tier_is_charged_to_the_job_from_its_first_byte(self):
        uid = uid_of("nopfs-alice")
        job = submit("nopfs-alice", f"-w n1 --mem=1000 --nopfs-ram=250M --nopfs={BIG}",
                     HOLD.format(jobs=JOBS))
        wait_state(job, {"RUNNING"})
        pid = nopfsd_of(job)
        # Wait until the RAM tier is full (its prefetch done).
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline:
            status = job_status("nopfs-alice", "n1", job)
            ram = [t for t in (status or {}).get("tiers", []) if t["name"] == "ram"]
            if ram and ram[0]["prefetch"] == "done" and ram[0]["ready_samples"] > 0:
                break
            time.sleep(0.5)
        ram = [t for t in status["tiers"] if t["name"] == "ram"]
        self.assertTrue(ram and ram[0]["prefetch"] == "done", status)
        shmem = proc_status(pid, "RssShmem")
        with open(f"/sys/fs/cgroup/memory/slurm_n1/uid_{uid}/job_{job}/memory.usage_in_bytes") as f:
            usage = int(f.read())
        print(f"\nRAM tier: {ram[0]['ready_samples']} samples, nopfsd RssShmem {shmem} B, "
              f"job memory.usage_in_bytes {usage} B", file=sys.stderr)
        self.assertGreater(shmem, 150 * MiB)
        # Everything nopfsd allocated (the tier's shared memory, its heap) is the job's.
        self.assertGreaterEqual(usage, shmem + proc_status(pid, "RssAnon"))
        release(job)
        self.assertEqual(wait_done(job, 120), "COMPLETED")
        self.assertNothingLeft([job])
        self.assertNoCgroupLeft([job])

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_a_job_over_its_mem_is_held_inside_its_own_cgroup(self):
        uid = uid_of("nopfs-alice")
        cg = f"/sys/fs/cgroup/memory/slurm_n1/uid_{uid}/job_$SLURM_JOB_ID"
        # Once the RAM tier (70 MB) is full, a task takes 250 MB: each fits its own limit (the
        # step's is the job's 300 MiB), together they exceed the job's --mem=300, and the
        # kernel kills inside the job's cgroup. The other job on the node goes on.
        hog = os.path.join(JOBS, "hog.py")
        with open(hog, "w") as f:
            f.write("import json, subprocess, sys, time\n"
                    "while True:\n"
                    f"    r = subprocess.run(['{NOPFS}', 'status', '--json'], text=True,\n"
                    "                       capture_output=True)\n"
                    "    tiers = json.loads(r.stdout)['tiers'] if r.returncode == 0 else []\n"
                    "    if any(t['name'] == 'ram' and t['prefetch'] == 'done' for t in tiers):\n"
                    "        break\n"
                    "    time.sleep(0.2)\n"
                    "print('tier full', flush=True)\n"
                    "b = bytearray(250 << 20)\n"
                    "for i in range(0, len(b), 4096):\n"
                    "    b[i] = 1\n"
                    "print('allocated', flush=True)\n")
        os.chmod(hog, 0o644)
        bystander = submit("nopfs-bob", "-w n1 --mem=200 --nopfs-ram=0 "
                           f"--nopfs={BIG}", READ)
        job = submit("nopfs-alice", f"-w n1 --mem=300 --nopfs-ram=70M --nopfs={BIG}",
                     f"srun python3 {hog}\nrc=$?\n"
                     f"sed 's/^/job failcnt: /' {cg}/memory.failcnt\n"
                     f"sed 's/^/max usage: /' {cg}/memory.max_usage_in_bytes\n"
                     "exit $rc\n")
        state = wait_done(job, 180)
        out = output(job)
        self.assertIn("tier full", out)
        self.assertNotIn("allocated", out)
        self.assertIn(state, {"OUT_OF_MEMORY", "FAILED"}, out)
        # What hit its limit was the job's own cgroup (the tier and the task together; the task
        # alone fits the step's), not the node.
        m = re.search(r"job failcnt: (\d+)", out)
        self.assertIsNotNone(m, out)
        self.assertGreaterEqual(int(m.group(1)), 1, out)
        m = re.search(r"max usage: (\d+)", out)
        self.assertLessEqual(int(m.group(1)), 300 * MiB, out)
        self.assertEqual(wait_done(bystander, 180), "COMPLETED", output(bystander))
        self.assertRegex(output(bystander), r"verify: 200 samples, \d+ bytes, 0 mismatches")
        self.assertNothingLeft([job, bystander])
        self.assertNoCgroupLeft([job, bystander])

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd")
    def test_the_same_job_twice_reads_the_pfs_once(self):
        with open(POLICY, "w") as f:
            f.write("function admit(job, node) return {} end\n"
                    "function keep(user, node) return { quota = '1G' } end\n")
        area = os.path.join(SSD, f"nopfs-{uid_of('nopfs-alice')}", "kept")
        shutil.rmtree(area, ignore_errors=True)
        figures = []
        for node in ("n1", "n2"):
            log_before = len(self.slurmd_log(node))
            job = submit("nopfs-alice", f"-w {node} --mem=300 --nopfs-ram=0 "
                         f"--nopfs-ssd=300M --nopfs={BIG} --nopfs-seed=3", READ)
            self.assertEqual(wait_done(job, 180), "COMPLETED", output(job))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (job in ledger(node) or daemons()):
                time.sleep(0.2)
            out = output(job)
            self.assertRegex(out, r"verify: 200 samples, \d+ bytes, 0 mismatches", out)
            status = json.loads(re.search(r"(?m)^status: (\{.*\})$", out).group(1))
            figures.append(status["pfs_bytes"])
            self.assertRegex(self.slurmd_log(node)[log_before:], rf"nopfs: epilog: {node}: .*kept")
            self.assertNothingLeft([job])
            self.assertNoCgroupLeft([job])
        print(f"\nPFS bytes in cgroup mode: first job {figures[0]}, second {figures[1]}",
              file=sys.stderr)
        self.assertGreater(figures[0], 0)
        self.assertLessEqual(figures[1], 0.05 * figures[0], figures)
        shutil.rmtree(area, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
