#!/usr/bin/python3
"""Cluster tests of broken parts while a job reads (docs/security.md, "Faults on the cluster"): a
real 3-node Slurm cluster (contrib/slurm/local-cluster) as root, nopfs-alice's jobs, and in their
tasks a verifying rank (verify_reader.py) that compares every sample with its file and stops at a
gate half-way through its stream, where the test does the damage: scancel, SIGKILL of one node's
nopfsd or of a rank, the SSD directory full or read-only, dataset files changed, truncated and
removed, slurmd restarted.

Each test ends with 0 wrong bytes delivered (a clear error is allowed, a wrong byte never) and
nothing left (no process, no file in the run and SSD directories, no ledger entry, no metrics
file), and the next job on the node starts clean and verifies its whole stream.

Run as root (ctest -L slurm); NOPFS_BINARY_DIR names the build (with its Python package).
"""
import glob
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
import unittest

from clusterlib import *  # noqa: F401,F403 (the shared helpers and paths)
from clusterlib import ClusterCase

READER = os.path.join(SRC, "tests/slurm/verify_reader.py")
RESULT = re.compile(r"^rank (\d+): (\d+) samples, (\d+) bytes, (\d+) mismatches, (\d+) errors"
                    r"(?:; stopped: (.*))?$")


def reader(gate_after=-1, extra=""):
    """The task's command: the verifying rank, its last line in JOBS/verify-JOB-RANK.txt."""
    return (f"PYTHONPATH={BUILD}/python /usr/bin/python3 {READER} "
            f"{JOBS}/verify-$SLURM_JOB_ID-$NOPFS_RANK.txt --gate-after {gate_after} "
            f"--gate {JOBS} {extra}")


def reader_job(options, gate_after=-1, extra="", then=""):
    """A held job of nopfs-alice whose tasks run the verifying rank, then `then`."""
    script = f"srun bash -c '{reader(gate_after, extra)}'\n{then}" + HOLD.format(jobs=JOBS)
    return submit("nopfs-alice", options, script)


def wait_gate(job, ranks, timeout=90):
    for rank in ranks:
        wait_file(os.path.join(JOBS, f"at-{job}-{rank}"), timeout)


def go(job):
    open(os.path.join(JOBS, f"go-{job}"), "w").close()


def results(job, ranks, timeout=90):
    """{rank: (samples, bytes, mismatches, errors, stopped)} from each rank's last line."""
    out = {}
    for rank in ranks:
        path = os.path.join(JOBS, f"verify-{job}-{rank}.txt")
        wait_file(path, timeout)
        with open(path) as f:
            m = RESULT.match(f.read().strip())
        if m is None:
            raise AssertionError(f"{path}: not a reader's last line")
        out[rank] = tuple(int(g) for g in m.groups()[1:5]) + (m.group(6),)
    return out


def stream_length(rank, ranks, per_node, epochs, scheme="strided", batch=8):
    r = subprocess.run([f"{BUILD}/bin/nopfs", "stream", "--samples", "120", "--ranks", str(ranks),
                        "--ranks-per-node", str(per_node), "--batch", str(batch), "--scheme",
                        scheme, "--seed", "0", "--epochs", str(epochs), "--rank", str(rank)],
                       capture_output=True, text=True, check=True)
    return len(r.stdout.split())


def readers_alive(also=""):
    """Pids of the processes still running whose command line holds verify_reader.py (and
    `also`): the readers and the shells and sruns that started them."""
    found = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(d + "/cmdline", "rb") as f:
                argv = f.read()
        except OSError:
            continue
        if READER.encode() in argv and also.encode() in argv:
            found.append(int(d[6:]))
    return found


def shm_of_test_users():
    uids = {pwd.getpwnam(u).pw_uid for u in ("nopfs-alice", "nopfs-bob")}
    return [p for p in glob.glob("/dev/shm/*") if os.lstat(p).st_uid in uids]


class FaultsTest(ClusterCase):
    def assertClean(self, jobs):
        """Nothing of `jobs` is left (clusterlib), no reader still runs, no shared memory file of
        the test users."""
        self.assertNothingLeft(jobs)
        deadline = time.monotonic() + 20
        while readers_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(readers_alive(), [], "verifying ranks left running")
        self.assertEqual(shm_of_test_users(), [])

    def assertNextJobStartsClean(self, nodes):
        """A job on `nodes` (one task each) finds only itself in each ledger and SSD directory,
        reads its whole stream with 0 mismatches and leaves nothing."""
        job = reader_job(f"-N{len(nodes)} -w {','.join(nodes)} --ntasks-per-node=1 --mem=300 "
                         f"--nopfs={DATASET} --nopfs-ssd=50M")
        wait_state(job, {"RUNNING"})
        for node in nodes:
            wait_file(f"{RUN}/{node}/{job}/ready", 30)
            self.assertEqual(sorted(ledger(node)), [job], node)
            for d in glob.glob(os.path.join(SSD, "nopfs-*")):
                self.assertEqual([n for n in os.listdir(d)
                                  if not n.startswith(f"{job}.") and n != "live"], [], d)
                # The registry of running jobs (docs/tiers.md, "Sibling jobs"): this job's entry
                # only, `<key>.<job>.<node>`.
                live = os.path.join(d, "live")
                if os.path.isdir(live):
                    self.assertEqual([n for n in os.listdir(live) if f".{job}." not in n], [],
                                     live)
        got = results(job, range(len(nodes)))
        for rank, (samples, _, mismatches, errors, stopped) in got.items():
            self.assertEqual((samples, mismatches, errors, stopped),
                             (stream_length(rank, len(nodes), 1, 1, batch=1), 0, 0, None), got)
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED")
        self.assertClean([job])

    # ---------------------------------------------------------------------------------------
    def test_scancel_during_staging(self):
        # Two ranks on n1, half-way through 20 epochs: rings and tiers staging, samples held.
        job = reader_job(f"-w n1 -n2 --mem=600 --nopfs={DATASET} --nopfs-ranks-per-node=2 "
                         "--nopfs-epochs=20 --nopfs-seed=0 --nopfs-scheme=strided --nopfs-batch=8",
                         gate_after=100)
        wait_gate(job, (0, 1))
        status = job_status("nopfs-alice", "n1", job)
        self.assertIsNotNone(status)
        subprocess.run(["scancel", str(job)], env=env(), check=True)
        self.assertEqual(wait_done(job), "CANCELLED")
        # Each rank was told (SIGTERM) and had read 100 right samples.
        got = results(job, (0, 1))
        for rank in (0, 1):
            self.assertEqual(got[rank][:4], (100, got[rank][1], 0, 0), got)
            self.assertEqual(got[rank][4], "SIGTERM", got)
        self.assertClean([job])
        self.assertNextJobStartsClean(["n1"])

    def test_sigkill_of_one_nodes_nopfsd_mid_read(self):
        # A 2-node job with peers, 2 ranks a node; n3's nopfsd is killed while every rank is
        # half-way. n3's ranks get what was published, then a clear error; n1's ranks read
        # their whole streams (from the PFS where n3 would have served), all with 0 wrong bytes.
        # 100 epochs: more than a rank's ring holds, so n3's ranks are mid-stream at the kill.
        epochs = 100
        job = reader_job(f"-N2 -w n1,n3 --ntasks-per-node=2 --mem=600 --nopfs={DATASET} "
                         f"--nopfs-seed=0 --nopfs-epochs={epochs} --nopfs-batch=8 "
                         "--nopfs-ranks-per-node=2 --nopfs-scheme=strided", gate_after=40)
        wait_gate(job, range(4))
        pid = int(ledger("n3")[job]["pid"])
        os.kill(pid, signal.SIGKILL)
        go(job)
        got = results(job, range(4), 120)
        for rank in (0, 1):
            self.assertEqual(got[rank], (stream_length(rank, 4, 2, epochs), got[rank][1], 0, 0,
                                         None), got)
        for rank in (2, 3):
            samples, _, mismatches, errors, stopped = got[rank]
            self.assertEqual(mismatches, 0, got)
            self.assertGreaterEqual(samples, 40, got)
            self.assertLess(samples, stream_length(rank, 4, 2, epochs), got)
            self.assertIn("nopfsd is gone", stopped or "", got)
        release(job)
        wait_done(job)
        self.assertClean([job])
        self.assertNextJobStartsClean(["n1", "n3"])

    def test_sigkill_of_a_rank_mid_read(self):
        # Rank 1 is killed half-way; rank 0 reads on, and a new reader of rank 1 then gets its
        # whole stream from the same nopfsd.
        epochs = 4
        job = reader_job(f"-w n2 -n2 --mem=600 --nopfs={DATASET} --nopfs-ranks-per-node=2 "
                         f"--nopfs-epochs={epochs} --nopfs-seed=0 --nopfs-scheme=strided "
                         "--nopfs-batch=8", gate_after=50)
        wait_gate(job, (0, 1))
        victim = readers_alive(f"verify-{job}-1.txt")  # the task's shell names $NOPFS_RANK
        self.assertEqual(len(victim), 1, victim)
        os.kill(victim[0], signal.SIGKILL)
        go(job)
        got = results(job, (0,))
        self.assertEqual(got[0], (stream_length(0, 2, 2, epochs), got[0][1], 0, 0, None), got)
        self.assertFalse(os.path.exists(f"{JOBS}/verify-{job}-1.txt"))
        # Rank 1 again, from the start, as a restarted rank would (its stream was closed when
        # its client died).
        again = f"{JOBS}/again-{job}.txt"
        r = as_user("nopfs-alice", f"NOPFS_SOCKET={RUN}/n2/{job}/nopfsd.sock NOPFS_RANK=1 "
                    f"NOPFS_SAMPLES=120 NOPFS_DATASET={DATASET} SLURM_JOB_ID={job} "
                    f"PYTHONPATH={BUILD}/python /usr/bin/python3 {READER} {again}", timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.strip(), f"rank 1: {stream_length(1, 2, 2, epochs)} samples, "
                         f"{r.stdout.split()[4]} bytes, 0 mismatches, 0 errors")
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED")
        self.assertClean([job])
        self.assertNextJobStartsClean(["n2"])

    # ---------------------------------------------------------------------------------------
    def ssd_job(self):
        """A job of one rank on n1 whose plan puts every sample on the SSD tier (1 KB of RAM,
        100 MB of SSD); returns its final state and output."""
        job = reader_job(f"-w n1 --mem=300 --nopfs={DATASET} --nopfs-ram=0 --nopfs-ssd=100M "
                         "--nopfs-epochs=3 --nopfs-seed=0")
        state = wait_done(job, 120)
        out = output(job)
        self.assertClean([job])
        return state, out

    def test_ssd_directory_full_and_read_only(self):
        # A 1 MiB file system at the SSD path: the tier's 4 MB of data files do not fit. nopfsd
        # refuses to start rather than fail writes mid-job, and the job is told what to do.
        # (Nothing of the job is left by each: ssd_job.)
        mounted = False
        try:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", SSD],
                           check=True)
            mounted = True
            state, out = self.ssd_job()
            self.assertEqual(state, "FAILED", out)
            self.assertRegex(out, r"nopfs: prolog: n1: class ssd: ssd tier: \S+ needs \d+ bytes "
                             r"for its data files but the file system has only 1048576 bytes free")
            self.assertIn(f"lower the SSD capacity or free space in {SSD}", out)
            self.assertNotIn(" mismatches", out)  # no task ran
            # The same file system read-only (as the kernel remounts a disk after errors).
            subprocess.run(["mount", "-o", "remount,ro", SSD], check=True)
            state, out = self.ssd_job()
            self.assertEqual(state, "FAILED", out)
            self.assertIn(f"nopfs: prolog: n1: class ssd: ssd tier: creating {SSD}/nopfs-", out)
            self.assertIn("Read-only file system", out)
            subprocess.run(["umount", SSD], check=True)
            mounted = False
            # Room for the tier (16 MiB), filled up by somebody else while the rank is half-way:
            # the tier has preallocated its files' space (docs/tiers.md) and goes on serving.
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "tmpfs", SSD],
                           check=True)
            mounted = True
            job = reader_job(f"-w n1 --mem=300 --nopfs={DATASET} --nopfs-ram=0 "
                             "--nopfs-ssd=10M --nopfs-epochs=40 --nopfs-seed=0", gate_after=100,
                             then=f"echo \"status: $({BUILD}/bin/nopfs status --json)\"\n")
            wait_gate(job, (0,))
            r = subprocess.run(["dd", "if=/dev/zero", f"of={SSD}/filler", "bs=1M"],
                               capture_output=True, text=True)
            self.assertIn("No space left on device", r.stderr)
            go(job)
            got = results(job, (0,), 120)
            release(job)
            self.assertEqual(wait_done(job), "COMPLETED")
            out = output(job)
            self.assertEqual(got[0], (stream_length(0, 1, 1, 40, batch=1), got[0][1], 0, 0, None),
                             (got, out))
            m = re.search(r"(?m)^status: (\{.*\})$", out)
            self.assertIsNotNone(m, out)
            ssd = [src for src in json.loads(m.group(1))["sources"] if src["name"] == "ssd"]
            self.assertGreater(ssd[0]["samples"], 0, out)  # the full tier served
            self.assertClean([job])
        finally:
            if mounted:
                # Lazily if a job still holds it (a failed test): never left under the cluster.
                if subprocess.run(["umount", SSD]).returncode != 0:
                    subprocess.run(["umount", "-l", SSD], check=True)
        self.assertNextJobStartsClean(["n1"])

    # ---------------------------------------------------------------------------------------
    def test_dataset_files_changed_truncated_and_removed_mid_job(self):
        ds = os.path.join(DIR, "data/mut")
        orig = os.path.join(DIR, "data/orig")
        for d in (ds, orig):
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(DATASET, d)
            subprocess.run(["chmod", "-R", "a+rX", d], check=True)
        # Two ranks, 40 epochs (longer than their rings hold: most samples are staged after the
        # damage), RAM for a third of the dataset and 1 KB of SSD: samples come from the tier
        # (first bytes) and from the PFS (the bytes at the time).
        epochs = 40
        job = reader_job(f"-w n3 -n2 --mem=600 --nopfs={ds} --nopfs-ranks-per-node=2 "
                         f"--nopfs-epochs={epochs} --nopfs-seed=0 --nopfs-scheme=strided "
                         "--nopfs-batch=8 --nopfs-ram=1300K --nopfs-ssd=0", gate_after=30,
                         extra=f"--original {orig}",
                         then=f"echo \"status: $({BUILD}/bin/nopfs status --json)\"\n")
        wait_gate(job, (0, 1))
        # The readers wait at the gate; nopfsd fills their rings in milliseconds and then waits
        # too. Damage only after that: a PFS read that overlaps an in-place rewrite can return
        # bytes of neither version (POSIX makes no read atomic against a write), which no reader
        # can tell from a file that was written so.
        time.sleep(2)
        # Every third file of each class, small and large ones, so that some are in the tier
        # and some are read from the PFS after the damage.
        damaged = {"changed": [], "truncated": [], "removed": []}
        for i in range(0, 37, 3):
            changed = os.path.join(ds, "class0", f"{i:04d}.bin")
            with open(changed, "r+b") as f:  # in place, same size, other bytes
                f.write(os.urandom(os.path.getsize(changed)))
            damaged["changed"].append(changed)
            truncated = os.path.join(ds, "class1", f"{i + 1:04d}.bin")
            os.truncate(truncated, os.path.getsize(truncated) // 2)
            damaged["truncated"].append(truncated)
            removed = os.path.join(ds, "class2", f"{i + 2:04d}.bin")
            os.unlink(removed)
            damaged["removed"].append(removed)
        go(job)
        got = results(job, (0, 1), 120)
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED")
        out = output(job)
        for rank in (0, 1):
            samples, _, mismatches, errors, stopped = got[rank]
            self.assertEqual(mismatches, 0, (got, out))
            self.assertEqual(samples + errors, stream_length(rank, 2, 2, epochs), (got, out))
            self.assertIsNone(stopped, got)
        # Each error names a truncated or removed file.
        errors = re.findall(r"sample error: (.*)", out)
        self.assertEqual(len(errors), got[0][3] + got[1][3], out)
        for e in errors:
            self.assertTrue(any(p in e for p in damaged["truncated"] + damaged["removed"]), e)
        # Damaged files were read from the PFS after the damage: the missing ones are errors, the
        # rewritten ones are logged and counted.
        self.assertGreater(len(errors), 0, out)
        m = re.search(r"(?m)^status: (\{.*\})$", out)
        self.assertIsNotNone(m, out)
        status = json.loads(m.group(1))
        self.assertGreater(status["changed"], 0, out)
        print(f"damaged mid-job: {sum(g[0] for g in got.values())} samples right, "
              f"{len(errors)} clear errors, {status['changed']} PFS reads found a file "
              "rewritten, 0 wrong")
        self.assertClean([job])
        self.assertNextJobStartsClean(["n3"])

    # ---------------------------------------------------------------------------------------
    def test_slurmd_restarted_while_a_job_reads(self):
        epochs = 3
        job = reader_job(f"-w n2 -n2 --mem=600 --nopfs={DATASET} --nopfs-ranks-per-node=2 "
                         f"--nopfs-epochs={epochs} --nopfs-seed=0 --nopfs-scheme=strided "
                         "--nopfs-batch=8", gate_after=40)
        wait_gate(job, (0, 1))
        pidfile = os.path.join(DIR, "pids/slurmd-n2.pid")
        with open(pidfile) as f:
            old = int(f.read())
        os.kill(old, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and os.path.exists(f"/proc/{old}"):
            time.sleep(0.1)
        self.assertFalse(os.path.exists(f"/proc/{old}/cmdline") and
                         open(f"/proc/{old}/cmdline", "rb").read(), "slurmd did not stop")
        live = os.path.join(DIR, "run-slurm/slurmd-n2.pid")
        if os.path.exists(live):
            os.unlink(live)
        subprocess.run(["/usr/sbin/slurmd", "-f", CONF, "-N", "n2"], env=env(), check=True)
        wait_file(live, 30)
        shutil.copy(live, pidfile)
        go(job)
        got = results(job, (0, 1), 120)
        for rank in (0, 1):
            self.assertEqual(got[rank], (stream_length(rank, 2, 2, epochs), got[rank][1], 0, 0,
                                         None), got)
        release(job)
        self.assertEqual(wait_done(job, 120), "COMPLETED")
        self.assertClean([job])
        self.assertNextJobStartsClean(["n2"])


if __name__ == "__main__":
    unittest.main()
