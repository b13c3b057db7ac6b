#!/usr/bin/python3
"""Cluster test of the peer protocol's authentication against another user on the same nodes: a
real 3-node Slurm cluster (contrib/slurm/local-cluster), nopfs-alice's two-node job with peers,
and nopfs-bob forging every peer message in the name of both of its nodes with
nopfs_peer_forge (tests/fabric/peer_forge.cc), from before her daemons are ready until her
tasks have verified their bytes.

What a user relies on, checked here: a process without the job's secret changes none of the
job's samples (every rank's `nopfs cat --verify` finds 0 mismatches), makes no node mark a peer
dead, gets nothing back, and is counted as refused by both daemons; the job's peer ports follow
from its secret, which bob cannot read, not from its job id; nothing is left after the job.

Run as root (ctest -L slurm), with nopfs_peer_forge built next to nopfsd.
"""
import hashlib
import hmac
import json
import os
import re
import subprocess
import time
import unittest

from clusterlib import *  # noqa: F401,F403 (the shared helpers and paths)
from clusterlib import ClusterCase

FORGE = os.path.join(BUILD, "bin/nopfs_peer_forge")
PEER_PORT_BASE = 43000  # local-cluster's peer_port
PEER_PORT_RANGE = 4096  # spank/options.h kPeerPortRange


def port_offset(secret):
    """spank/launcher_slurm.cc PeerPortOffset: where a job's ports start, from its secret."""
    d = hmac.new(secret, b"nopfs peer ports v1", hashlib.sha256).digest()
    return (d[0] | d[1] << 8 | d[2] << 16) % PEER_PORT_RANGE


class SecurityPeerTest(ClusterCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() == 0 and not os.path.exists(FORGE):
            raise AssertionError(f"{FORGE} is missing: build nopfs_peer_forge")
        super().setUpClass()

    def job_peers(self, job, timeout=60):
        """The `--peers` of the job's first nopfsd, as soon as one is running (as bob would learn
        them: from the process list on a shared node)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for _, (_, argv) in daemons().items():
                if "--peers" in argv and argv[argv.index("--job-id") + 1] == str(job):
                    return argv[argv.index("--peers") + 1].split(",")
            time.sleep(0.05)
        raise AssertionError(f"no nopfsd of job {job} with --peers within {timeout}s")

    def status(self, node, job):
        """`nopfs status --json` of the job's nopfsd on `node`, asked as alice."""
        sock = f"{RUN}/{node}/{job}/nopfsd.sock"
        r = as_user("nopfs-alice", f"NOPFS_SOCKET={sock} {BUILD}/bin/nopfs status --json")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return json.loads(r.stdout)

    def test_forged_peer_messages_change_nothing(self):
        if not REAL_NOPFSD:
            self.skipTest("needs the real nopfsd")
        job = submit_two_node_job("nopfs-alice", verify=True)
        peers = self.job_peers(job)
        ready = [os.path.exists(f"{RUN}/{node}/{job}/ready") for node in ("n1", "n3")]
        stop = os.path.join(JOBS, f"stop-forge-{job}")
        # bob forges Hellos, Challenges, Auths, AuthResults, pushes of his own bytes (of each
        # sample's length, which he can see in the dataset, with their correct xxh3) for every
        # sample id, read requests, replies, remote replies, exchange rounds of up to 4 MB and
        # ClassDones, to both nodes in the name of both nodes.
        # At least 50 rounds (4 messages of each kind per round: 2 targets, 2 names), however
        # fast the tasks are done.
        forge = [FORGE, "--seconds", "120", "--dataset", DATASET, "--stop-file", stop,
                 "--min-rounds", "50"]
        for p in peers:
            forge += ["--to", p]
        forge += ["--as", "0", "--as", "1"]
        forger = subprocess.Popen(["runuser", "-u", "nopfs-bob", "--", *forge],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            self.assertEqual(ready, [False, False], "the daemons were ready before the attack")
            # The attack goes on while the tasks read and verify every sample.
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and (not os.path.exists(f"{JOBS}/job-{job}.out")
                                                   or output(job).count(" verify: ") < 4):
                self.assertIsNone(forger.poll(), "the forger ended before the tasks verified")
                time.sleep(0.2)
            open(stop, "w").close()
            forged, _ = forger.communicate(timeout=60)
        finally:
            if forger.poll() is None:
                forger.kill()
                forger.wait()
        out = output(job)
        # The forger sent every kind of message and got nothing back.
        m = re.search(r"peer_forge: sent (\d+) messages \((.*)\), (\d+) failed, (\d+) held back; "
                      r"received (\d+) messages", forged)
        self.assertIsNotNone(m, forged)
        kinds = dict((k, int(n)) for k, n in (t.rsplit(" ", 1) for t in m.group(2).split(", ")))
        self.assertEqual(sorted(kinds), sorted(["Hello", "Challenge", "Auth", "AuthResult", "Push",
                                                "ReadRequest", "ReadReply", "RemoteReply",
                                                "Exchange", "ClassDone"]), forged)
        self.assertGreater(min(kinds.values()), 100, forged)
        self.assertEqual(m.group(5), "0", forged)
        self.assertNotIn("peer_forge: received ", forged)
        # Every rank got every sample with the file's bytes.
        verified = re.findall(r"verify: (\d+) samples, (\d+) bytes, (\d+) mismatches", out)
        self.assertEqual(len(verified), 4, out)
        self.assertEqual(sum(int(v[0]) for v in verified), 2 * 120, out)  # 2 epochs, strided
        self.assertTrue(all(v[2] == "0" for v in verified), out)
        for node, index in (("n1", 0), ("n3", 1)):
            seen = statuses(job)[node]["peers"]
            self.assertEqual((seen["node"], seen["nodes"]), (index, 2), out)
            self.assertTrue(seen["state"].startswith("directory of "), out)
        # Both daemons refused and counted the forgeries, and neither gave its peer up.
        for node in ("n1", "n3"):
            seen = self.status(node, job)["peers"]
            self.assertGreater(seen["refused"], 100, f"{node}: {seen}")
            self.assertEqual(seen["dead"], [], f"{node}: {seen}")
        # The ports come from the job's secret, which bob cannot read, not from the job id.
        with open(f"{RUN}/n1/{job}/peer.secret", "rb") as f:
            offset = port_offset(f.read())
        self.assertEqual(peers, [f"127.0.0.1:{PEER_PORT_BASE + (offset + i) % PEER_PORT_RANGE}"
                                 for i in range(2)])
        r = as_user("nopfs-bob", f"cat {RUN}/n1/{job}/peer.secret > /dev/null")
        self.assertNotEqual(r.returncode, 0, "bob read the job's secret")
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED", out)
        self.assertNothingLeft([job])


if __name__ == "__main__":
    unittest.main()
