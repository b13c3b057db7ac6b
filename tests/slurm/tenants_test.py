#!/usr/bin/python3
"""Cluster tests of two users on the same node at the same time (docs/security.md, "Two users on
one node"): a real 3-node Slurm cluster (contrib/slurm/local-cluster) as root; nopfs-alice's job
reads and verifies its samples (verify_reader.py) while nopfs-bob, from a job of his own on the
same node, tries to reach it: her socket; her nopfsd's and her rank's memory and descriptors
(the RAM tier is a memfd: /proc/PID/fd, pidfd_getfd, /proc/PID/mem, process_vm_readv, ptrace);
/dev/shm; her SSD files, catalog cache, log and run directory; links planted where root's prolog
and epilog create or remove files (tenant_probe.py); and a `--nopfs=` directory only she can read.

Every attempt fails, and her job reads its whole stream with 0 wrong bytes and leaves nothing.
What other files already prove is not repeated here (docs/security.md's table: the socket and
run directory in cluster_test.py, forged and guessed-key peer messages in
security_peer_test.py, squatted SSD and cache directories in security_resources_test.py).

Run as root (ctest -L slurm).
"""
import ctypes
import glob
import os
import pwd
import re
import stat
import struct
import subprocess
import time
import unittest

from clusterlib import *  # noqa: F401,F403 (the shared helpers and paths)
from clusterlib import ClusterCase
from faults_test import go, reader, reader_job, readers_alive, results, stream_length, wait_gate

PROBE = os.path.join(SRC, "tests/slurm/tenant_probe.py")
CACHE = os.path.join(DIR, "cache")
IN_ACCESS, IN_OPEN = 0x1, 0x20


def rewritten_at(path):
    """When the metrics file was last rewritten (its mtime, ns)."""
    return os.stat(path).st_mtime_ns


def read_text(path):
    with open(path, errors="replace") as f:
        return f.read()


def probe_job(args):
    """nopfs-bob's job on n1 running tenant_probe.py with `args`; returns its output."""
    job = submit("nopfs-bob", "-w n1 --oversubscribe --mem=100",
                 f"/usr/bin/python3 {PROBE} {args}\n")
    wait_done(job)
    return output(job)


class Inotify:
    """Counts opens and reads of the directories watched (whoever makes them, root included)."""

    def __init__(self, dirs):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0
        for d in dirs:
            assert self.libc.inotify_add_watch(self.fd, d.encode(), IN_OPEN | IN_ACCESS) >= 0, d

    def events(self):
        n = 0
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return n
            off = 0
            while off < len(buf):
                _, _, _, length = struct.unpack_from("iIII", buf, off)
                off += 16 + length
                n += 1

    def close(self):
        os.close(self.fd)


class TenantsTest(ClusterCase):
    def alice_reading(self, extra_options=""):
        """nopfs-alice's job on n1, its one rank held half-way through 100 epochs (1 MB of RAM,
        the rest of the plan on the SSD tier); returns the job id."""
        job = reader_job(f"-w n1 --oversubscribe --mem=300 --nopfs={DATASET} --nopfs-ram=1M "
                         f"--nopfs-ssd=50M --nopfs-epochs=100 {extra_options}", gate_after=50)
        wait_gate(job, (0,))
        return job

    def alice_verified(self, job, epochs=100):
        go(job)
        got = results(job, (0,), 120)
        self.assertEqual(got[0], (stream_length(0, 1, 1, epochs, batch=1), got[0][1], 0, 0, None),
                         got)
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED")

    # ---------------------------------------------------------------------------------------
    def test_bob_on_the_same_node_reaches_nothing_of_alices_job(self):
        alice = pwd.getpwnam("nopfs-alice")
        job = self.alice_reading()
        run = f"{RUN}/n1/{job}"
        daemon = int(ledger("n1")[job]["pid"])
        rank = readers_alive(f"verify-{job}-")
        rank = [p for p in rank if read_text(f"/proc/{p}/comm").startswith("python")]
        self.assertEqual(len(rank), 1, rank)
        # What root sees of her job, by name, for bob to try.
        files = [p for p in glob.glob(f"{run}/*") if os.path.isfile(p)]
        ssd_dir = os.path.join(SSD, f"nopfs-{alice.pw_uid}")
        ssd_files = [p for p in glob.glob(f"{ssd_dir}/**", recursive=True) if os.path.isfile(p)]
        self.assertTrue(ssd_files, "the SSD tier holds no file")
        cache_files = [p for p in glob.glob(f"{CACHE}/{alice.pw_uid}/**", recursive=True)
                       if os.path.isfile(p)][:8]
        self.assertTrue(any(f.endswith("/nopfsd.out") for f in files), files)
        dirs = [run, ssd_dir, f"{ssd_dir}/{job}.0", f"{CACHE}/{alice.pw_uid}"]
        # Links where root's prolog and epilog make or remove files of her next job.
        nxt = job + 1
        plants = [f"{RUN}/n1/{nxt}", f"{RUN}/n1/.ledger/{nxt}", f"{ssd_dir}/{nxt}.0",
                  f"{CACHE}/{alice.pw_uid}/{nxt}", f"{SSD}/nopfs-{alice.pw_uid}.x"]
        args = (f"--socket {run}/nopfsd.sock --pid {daemon} --pid {rank[0]} --shm-uid "
                f"{alice.pw_uid} " + " ".join(f"--read {p}" for p in files + ssd_files[:8] +
                                               cache_files) +
                " " + " ".join(f"--list {d}" for d in dirs) + " " +
                " ".join(f"--plant {p}" for p in plants))
        out = probe_job(args)
        print(out)
        m = re.search(r"attempts: (\d+), allowed: (\d+)", out)
        self.assertIsNotNone(m, out)
        self.assertEqual(m.group(2), "0", out)
        self.assertNotIn("ALLOWED", out)
        self.assertGreaterEqual(int(m.group(1)), 2 * 11 + 1 + len(files) + len(dirs) +
                                len(plants), out)
        for p in plants:
            self.assertFalse(os.path.lexists(p), p)
        # Her job read on, unharmed.
        self.alice_verified(job)
        self.assertNothingLeft([job])

    def test_bob_can_put_nothing_in_the_metrics_directory(self):
        from prometheus_client.parser import text_string_to_metric_families
        alice = pwd.getpwnam("nopfs-alice")
        # The directory is root's, 0755: only root creates, renames or removes in it.
        st = os.stat(METRICS)
        self.assertEqual((st.st_uid, stat.S_IMODE(st.st_mode)), (0, 0o755))
        job = reader_job(f"-w n1 --oversubscribe --mem=300 --nopfs={DATASET} --hold "
                         "--nopfs-epochs=100", gate_after=50)
        prom = os.path.join(METRICS, f"nopfs_{job}.prom")
        fake = os.path.join(JOBS, "bobs-figures.prom")
        figures = (f'nopfs_pfs_read_bytes_total{{slurm_job_id="{job}",slurm_user="nopfs-alice"}} '
                   '1e+18\n')
        with open(fake, "w") as f:
            f.write(figures)
        os.chown(fake, pwd.getpwnam("nopfs-bob").pw_uid, -1)
        os.chmod(fake, 0o644)
        # bob sees her pending job in squeue: before it starts he tries her file's name (a link,
        # a file, a FIFO that would hang node_exporter) and a file of his own with her labels.
        attempts = [f"ln -s {fake} {prom}", f"cp {fake} {prom}", f"mkfifo {prom}",
                    f"cp {fake} {METRICS}/bobs.prom", f"mkdir {METRICS}/d.prom"]
        for cmd in attempts:
            r = as_user("nopfs-bob", cmd)
            self.assertNotEqual(r.returncode, 0, cmd)
            self.assertIn("Permission denied", r.stderr, cmd)
        self.assertFalse(os.path.lexists(prom))
        self.assertFalse(os.path.lexists(os.path.join(METRICS, "bobs.prom")))
        subprocess.run(["scontrol", "release", str(job)], env=env(), check=True)
        wait_gate(job, (0,))
        # While she reads: her job's file, made by root for her, holds her nopfsd's figures and
        # parses as Prometheus text, every series under her job's labels.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "nopfs_build_info" not in read_text(prom):
            time.sleep(0.5)
        st = os.lstat(prom)
        self.assertTrue(stat.S_ISREG(st.st_mode))
        self.assertEqual((st.st_uid, stat.S_IMODE(st.st_mode)), (alice.pw_uid, 0o644))
        families = list(text_string_to_metric_families(read_text(prom)))
        self.assertGreater(len(families), 10)
        for fam in families:
            for smp in fam.samples:
                self.assertEqual((smp.labels["slurm_job_id"], smp.labels["slurm_user"]),
                                 (str(job), "nopfs-alice"), smp)
        self.assertNotIn("1e+18", read_text(prom))
        # bob can neither write, replace nor remove it, nor add a file beside it.
        attempts = [f"echo '{figures.strip()}' >> {prom}", f"ln -sf {fake} {prom}",
                    f"mv -f {fake} {prom}", f"rm -f {prom}", f"cp {fake} {METRICS}/bobs.prom",
                    f"mkfifo {METRICS}/fifo.prom"]
        for cmd in attempts:
            r = as_user("nopfs-bob", cmd)
            self.assertNotEqual(r.returncode, 0, cmd)
        # Her figures go on: the same file, rewritten in place, nothing else made beside it.
        first = rewritten_at(prom)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and rewritten_at(prom) < first + 4_000_000_000:
            time.sleep(0.5)
        self.assertGreaterEqual(rewritten_at(prom), first + 4_000_000_000, "her metrics stopped")
        self.assertEqual(os.lstat(prom).st_ino, st.st_ino)
        self.assertEqual([n for n in os.listdir(METRICS) if str(job) in n], [f"nopfs_{job}.prom"])
        self.assertNotIn("bobs.prom", os.listdir(METRICS))
        self.alice_verified(job)
        self.assertNothingLeft([job])  # the epilog removed her file
        self.assertFalse(os.path.lexists(prom))
        with open(fake) as f:
            self.assertEqual(f.read(), figures)

    def test_bob_asks_for_a_dataset_only_alice_can_read(self):
        alice = pwd.getpwnam("nopfs-alice")
        private = os.path.join(DIR, "data/alice-private")
        subprocess.run(["rm", "-rf", private], check=True)
        os.makedirs(os.path.join(private, "class0"))
        names = [f"secret-7f3a-{i:02d}.bin" for i in range(12)]
        for n in names:
            with open(os.path.join(private, "class0", n), "wb") as f:
                f.write(os.urandom(4096 + 1000 * len(n)))
        subprocess.run(["chown", "-R", f"{alice.pw_uid}:{alice.pw_gid}", private], check=True)
        os.chmod(private, 0o700)
        watch = Inotify([private, os.path.join(private, "class0")])
        try:
            logs = {n: len(read_text(f"{DIR}/log/slurmd-{n}.log")) for n in NODES}
            job = submit("nopfs-bob", f"-w n1 --mem=300 --nopfs={private}",
                         f"srun bash -c '{reader()}'\n")
            self.assertEqual(wait_done(job), "FAILED")
            out = output(job)
            print(out)
            # Told why, naming the path he gave, and nothing about what is inside.
            self.assertIn(private, out)
            self.assertIn("Permission denied", out)
            logs_now = {n: read_text(f"{DIR}/log/slurmd-{n}.log")[logs[n]:] for n in NODES}
            for text in [out] + list(logs_now.values()):
                self.assertNotIn("secret-7f3a", text)
                self.assertNotIn("class0", text)
                self.assertNotRegex(text, r"dataset \d")  # no size or count of it
            # Nobody (root included) opened or listed the directory on his behalf.
            self.assertEqual(watch.events(), 0)
            self.assertNothingLeft([job])
            # The watch sees what alice's own job does there.
            job2 = submit("nopfs-alice", f"-w n1 --mem=300 --nopfs={private}",
                          f"srun bash -c '{reader()}'\n")
            self.assertEqual(wait_done(job2), "COMPLETED", output(job2))
            got = results(job2, (0,))
            self.assertEqual(got[0][0], len(names), got)
            self.assertEqual(got[0][2:], (0, 0, None), got)
            self.assertGreater(watch.events(), 0)
            self.assertNothingLeft([job2])
        finally:
            watch.close()
            subprocess.run(["rm", "-rf", private], check=True)


if __name__ == "__main__":
    unittest.main()
