#!/usr/bin/python3
"""Load on one node of the local cluster (docs/admin.md, "Memory of nopfsd"): 64 clients of one
job, 4 jobs at once, 1,000 connections held open against one nopfsd. Every rank verifies every
byte it gets (`nopfs cat --verify`, or verify_reader.py where it must stop half-way), and each
nopfsd's peak resident memory (VmHWM) stays under its RAM grant plus the node's staging capacity
plus 200 MB; the figures are printed (`ctest -R slurm_load -V`).

Run as root (ctest -L slurm).
"""
import os
import re
import subprocess
import time
import unittest

from clusterlib import *  # noqa: F401,F403 (the shared helpers and paths)
from clusterlib import ClusterCase
from faults_test import go, reader_job, results, stream_length, wait_gate

MB = 1000 * 1000
STAGING = 64 << 20  # the local cluster's staging.capacity: every ring of a node together
CAT = (f"{BUILD}/bin/nopfs cat --verify 2>&1 | tail -n 1 | "
       "sed \"s/^/$SLURMD_NODENAME $NOPFS_RANK: verify: /\"")

# As the job's user: opens N connections to nopfsd, says HELLO on each, holds them until the
# file in argv[3] exists, and prints how many nopfsd kept and what it said to the others.
HOLDER = r'''
import os, resource, socket, struct, sys, time
n, sock, until = int(sys.argv[1]), sys.argv[2], sys.argv[3]
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
conns, kept, refused, said = [], 0, 0, set()
for i in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    try:
        s.sendall(b"NPFS" + struct.pack("<HHII", 1, 1, 6, 1) + struct.pack("<HI", 1, os.getpid()))
    except OSError:
        pass  # refused and closed already: its ERROR is still to be read
    conns.append(s)
time.sleep(1)
for s in conns:
    s.setblocking(False)
    try:
        head = s.recv(16)
    except BlockingIOError:
        head = b""
    if len(head) == 16 and struct.unpack("<4sHHII", head)[2] == 2:
        kept += 1  # HELLO_OK: an idle connection nopfsd keeps
    elif head:
        refused += 1
        s.setblocking(True)
        body = s.recv(struct.unpack("<4sHHII", head)[3])
        said.add(body[8:].decode(errors="replace").split(";")[0])
print(f"connections: {n} opened, {kept} kept, {refused} refused: {sorted(said)}", flush=True)
open(until + ".held", "w").close()
while not os.path.exists(until):
    time.sleep(0.1)
'''


def nopfsd_pid(node, job):
    return int(ledger(node)[job]["pid"])


def peak_rss(pid):
    """VmHWM and threads of a living process."""
    with open(f"/proc/{pid}/status") as f:
        text = f.read()
    return (int(re.search(r"VmHWM:\s+(\d+) kB", text).group(1)) * 1024,
            int(re.search(r"Threads:\s+(\d+)", text).group(1)))


class LoadTest(ClusterCase):
    def assertBounded(self, what, node, job):
        pid = nopfsd_pid(node, job)
        rss, threads = peak_rss(pid)
        ram = int(ledger(node)[job]["ram"])
        bound = ram + STAGING + 200 * MB
        print(f"{what}: nopfsd of job {job} peak RSS {rss / MB:.0f} MB, {threads} threads "
              f"(bound {bound / MB:.0f} MB = RAM grant {ram / MB:.0f} MB + staging "
              f"{STAGING / MB:.0f} MB + 200 MB)")
        self.assertLess(rss, bound, what)
        return rss

    def test_64_clients_on_one_node(self):
        epochs = 20
        job = submit("nopfs-alice", f"-w n1 -n64 --overcommit --mem=600 --nopfs={DATASET} "
                     f"--nopfs-epochs={epochs} --nopfs-batch=64 --nopfs-ranks-per-node=64",
                     f"srun -n64 --overcommit bash -c '{CAT}'\n" + HOLD.format(jobs=JOBS))
        wait_state(job, {"RUNNING"})
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and (not os.path.exists(f"{JOBS}/job-{job}.out") or
                                               output(job).count(" verify: ") < 64):
            time.sleep(0.5)
        out = output(job)
        verified = re.findall(r"n1 (\d+): verify: (\d+) samples, \d+ bytes, (\d+) mismatches", out)
        self.assertEqual(sorted(int(v[0]) for v in verified), list(range(64)), out)
        for rank, samples, mismatches in verified:
            self.assertEqual((int(samples), mismatches),
                             (stream_length(int(rank), 64, 64, epochs, batch=64), "0"), out)
        self.assertBounded("64 clients", "n1", job)
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED")
        self.assertNothingLeft([job])

    def test_4_jobs_on_one_node(self):
        jobs = [submit(user, f"-w n2 -n2 --oversubscribe --mem=300 --nopfs={DATASET} "
                       "--nopfs-epochs=10 --nopfs-ranks-per-node=2 --nopfs-batch=8",
                       f"srun -n2 bash -c '{CAT}'\n" + HOLD.format(jobs=JOBS))
                for user in ("nopfs-alice", "nopfs-bob", "nopfs-alice", "nopfs-bob")]
        deadline = time.monotonic() + 240
        for job in jobs:
            while time.monotonic() < deadline and (not os.path.exists(f"{JOBS}/job-{job}.out")
                                                   or output(job).count(" verify: ") < 2):
                time.sleep(0.5)
        self.assertEqual(sorted(ledger("n2")), sorted(jobs))
        for job in jobs:
            out = output(job)
            verified = re.findall(r"verify: (\d+) samples, \d+ bytes, (\d+) mismatches", out)
            self.assertEqual(len(verified), 2, out)
            self.assertEqual(sum(int(v[0]) for v in verified), 120 * 10, out)
            self.assertTrue(all(v[1] == "0" for v in verified), out)
            self.assertBounded("4 jobs on one node", "n2", job)
        for job in jobs:
            release(job)
        for job in jobs:
            self.assertEqual(wait_done(job), "COMPLETED")
        self.assertNothingLeft(jobs)

    def test_1000_connections_held_against_one_nopfsd(self):
        # The rank is half-way through its stream when 1,000 connections come, each saying
        # HELLO and then nothing; it reads the rest while they are held.
        epochs = 20
        job = reader_job(f"-w n3 --mem=300 --nopfs={DATASET} --nopfs-epochs={epochs}",
                         gate_after=100)
        wait_gate(job, (0,))
        holder = os.path.join(JOBS, "holder.py")
        with open(holder, "w") as f:
            f.write(HOLDER)
        until = os.path.join(JOBS, f"let-go-{job}")
        r_proc = subprocess.Popen(
            ["runuser", "-u", "nopfs-alice", "--", "/usr/bin/python3", holder, "1000",
             f"{RUN}/n3/{job}/nopfsd.sock", until], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        try:
            wait_file(until + ".held", 60)
            self.assertBounded("1,000 connections", "n3", job)
            go(job)
            got = results(job, (0,), 120)
            self.assertEqual(got[0], (stream_length(0, 1, 1, epochs, batch=1), got[0][1], 0, 0,
                                      None), got)
        finally:
            open(until, "w").close()
            held, _ = r_proc.communicate(timeout=60)
        print(held)
        m = re.search(r"connections: 1000 opened, (\d+) kept, (\d+) refused: (.*)", held)
        self.assertIsNotNone(m, held)
        kept, refused = int(m.group(1)), int(m.group(2))
        # One rank: 32 streams (the default limits.streams_per_rank) + 16 connections + 32 for
        # sibling jobs, one of them the rank's own.
        self.assertEqual((kept, refused), (79, 921), held)
        self.assertIn("connections are open, the most this job's service takes", m.group(3))
        # Then the job's other steps connect again as before.
        r = as_user("nopfs-alice", f"NOPFS_SOCKET={RUN}/n3/{job}/nopfsd.sock NOPFS_RANK=0 "
                    f"{BUILD}/bin/nopfs cat --verify", timeout=120)
        self.assertRegex(r.stdout, rf"{stream_length(0, 1, 1, epochs, batch=1)} samples, \d+ "
                         r"bytes, 0 mismatches", r.stdout + r.stderr)
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED")
        self.assertNothingLeft([job])


if __name__ == "__main__":
    unittest.main()
