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

And the peer ports against a user who binds every port he can (docs/security.md): bob holds
every port of the unprivileged range the peers used to have and may bind none of the privileged
peer_ports, and alice's two nodes still serve each other, with nopfsd holding no capability once
its port is bound; a peer link that cannot start (root holds one node's port) is explained in
the job's output and in slurmd's log, which never claims a port nopfsd did not bind.

Run as root (ctest -L slurm), with nopfs_peer_forge built next to nopfsd.
"""
import glob
import hashlib
import hmac
import json
import os
import re
import socket
import subprocess
import time
import unittest

from clusterlib import *  # noqa: F401,F403 (the shared helpers and paths)
from clusterlib import ClusterCase

FORGE = os.path.join(BUILD, "bin/nopfs_peer_forge")
PEER_PORT_LOW, PEER_PORT_HIGH = 600, 987  # local-cluster's peer_ports (the default)
PEER_PORT_COUNT = PEER_PORT_HIGH - PEER_PORT_LOW + 1


# Bob's attack: hold every port of `--hold LOW-HIGH` that he can (each bound on every address and
# listening), try to bind each of `--try LOW-HIGH`, say what he got, and keep the ports until his
# standard input closes.
HOLDER = r"""
import errno, resource, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
def ports(arg):
    lo, hi = map(int, arg.split("-"))
    return range(lo, hi + 1)
held, refused, bound, other = [], 0, 0, 0
for p in ports(sys.argv[1]):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", p)); s.listen(1); held.append(s)
    except OSError:
        s.close()
for p in ports(sys.argv[2]):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", p)); bound += 1
    except PermissionError:
        refused += 1
    except OSError:
        other += 1
    s.close()
print(f"held {len(held)} of {len(ports(sys.argv[1]))}; privileged: {refused} refused, "
      f"{bound} bound, {other} other", flush=True)
sys.stdin.read()
"""


def read_text(path):
    with open(path, errors="replace") as f:
        return f.read()


def caps_of(pid):
    """{tid: {CapPrm, CapEff, CapAmb, CapInh, CapBnd, NoNewPrivs}} of every thread of `pid`."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        fields = {}
        try:
            for line in read_text(task + "/status").splitlines():
                key, _, value = line.partition(":")
                if key.startswith("Cap") or key == "NoNewPrivs":
                    fields[key] = value.strip()
        except OSError:
            continue
        out[int(task.rsplit("/", 1)[1])] = fields
    return out


def port_offset(secret):
    """spank/launcher_slurm.cc PeerPortOffset: where a job's ports start, from its secret."""
    d = hmac.new(secret, b"nopfs peer ports v1", hashlib.sha256).digest()
    return (d[0] | d[1] << 8 | d[2] << 16) % PEER_PORT_COUNT


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
                                                "Exchange", "ClassDone", "Leave", "LeaveAck"]),
                         forged)
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
        self.assertEqual(peers, [f"127.0.0.1:{PEER_PORT_LOW + (offset + i) % PEER_PORT_COUNT}"
                                 for i in range(2)])
        r = as_user("nopfs-bob", f"cat {RUN}/n1/{job}/peer.secret > /dev/null")
        self.assertNotEqual(r.returncode, 0, "bob read the job's secret")
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED", out)
        self.assertNothingLeft([job])

    def test_bob_holding_every_port_he_can_keeps_no_job_from_its_peers(self):
        if not REAL_NOPFSD:
            self.skipTest("needs the real nopfsd")
        # bob holds the 4,096 ports peers had before they were privileged (peer_port=43000) and
        # tries every port of the privileged peer_ports.
        holder = subprocess.Popen(
            ["runuser", "-u", "nopfs-bob", "--", "/usr/bin/python3", "-c", HOLDER,
             "43000-47095", f"{PEER_PORT_LOW}-{PEER_PORT_HIGH}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            said = holder.stdout.readline()
            m = re.match(r"held (\d+) of 4096; privileged: (\d+) refused, (\d+) bound, "
                         r"(\d+) other", said)
            self.assertIsNotNone(m, said + (holder.stdout.read() if holder.poll() else ""))
            self.assertGreater(int(m.group(1)), 4000, said)  # all but what others hold
            self.assertEqual(int(m.group(2)), PEER_PORT_COUNT, said)
            self.assertEqual((m.group(3), m.group(4)), ("0", "0"), said)
            logs = {n: len(read_text(f"{DIR}/log/slurmd-{n}.log")) for n in NODES}
            job = submit_two_node_job("nopfs-alice", verify=True)
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and (not os.path.exists(f"{JOBS}/job-{job}.out")
                                                   or output(job).count(" verify: ") < 4):
                self.assertIsNone(holder.poll(), "bob's holder ended early")
                time.sleep(0.2)
            out = output(job)
            # Both nodes' nopfsd run with no capability in any thread, and listen on their port.
            pids = [pid for pid, (user, argv) in daemons().items()
                    if argv[argv.index("--job-id") + 1] == str(job)]
            self.assertEqual(len(pids), 2, daemons())
            for pid in pids:
                threads = caps_of(pid)
                self.assertGreater(len(threads), 1, pid)
                for tid, caps in threads.items():
                    for key in ("CapPrm", "CapEff", "CapAmb", "CapInh"):
                        self.assertEqual(caps[key], "0000000000000000", f"{pid}/{tid}: {caps}")
                    self.assertEqual(caps["NoNewPrivs"], "1", f"{pid}/{tid}: {caps}")
                    # Only what nopfs-job kept may stay in the bounding set (nothing can raise it).
                    self.assertIn(caps["CapBnd"], ("0000000000000000", "0000000000000400"), caps)
            # Every rank got every sample with the file's bytes, and the nodes served each other.
            verified = re.findall(r"verify: (\d+) samples, (\d+) bytes, (\d+) mismatches", out)
            self.assertEqual(len(verified), 4, out)
            self.assertEqual(sum(int(v[0]) for v in verified), 2 * 120, out)
            self.assertTrue(all(v[2] == "0" for v in verified), out)
            seen = {node: job_status("nopfs-alice", node, job)["peers"] for node in ("n1", "n3")}
            for node, index in (("n1", 0), ("n3", 1)):
                self.assertEqual((seen[node]["node"], seen[node]["nodes"]), (index, 2), seen)
                self.assertTrue(seen[node]["state"].startswith("directory of "), seen)
                self.assertEqual(seen[node]["dead"], [], seen)
            served = sum(p["served_samples"] + p["pushes_sent"] for p in seen.values())
            self.assertGreater(served, 0, seen)
            self.assertNotIn("no peers", out)
            with open(f"{RUN}/n1/{job}/peer.secret", "rb") as f:
                offset = port_offset(f.read())
            for node, index in (("n1", 0), ("n3", 1)):
                port = PEER_PORT_LOW + (offset + index) % PEER_PORT_COUNT
                line = [x for x in read_text(f"{DIR}/log/slurmd-{node}.log")[logs[node]:]
                        .splitlines() if "nopfs: prolog: " in x and "serving " in x]
                self.assertEqual(len(line), 1, line)
                self.assertIn(f"peers: 2 nodes, listening on 127.0.0.1:{port}; every other node "
                              "answered in ", line[0])
        finally:
            holder.stdin.close()
            holder.wait(timeout=30)
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED", out)
        self.assertNothingLeft([job])

    def test_a_peer_link_that_cannot_start_says_why(self):
        if not REAL_NOPFSD:
            self.skipTest("needs the real nopfsd")
        # Two peer ports: the job's two nodes get one each, in an order only its secret says.
        # Root (a service of the node) holds one of them. The other node waits for it at most
        # half of timeout= (5 s): a prolog that outlasts srun's message timeout on the node that
        # does not run the batch script would fail the step's launch.
        self.set_plugin_args("peer_ports=700-701 timeout=10")
        held = hold_port(701)
        try:
            logs = {n: len(read_text(f"{DIR}/log/slurmd-{n}.log")) for n in NODES}
            job = submit_two_node_job("nopfs-alice", verify=True)
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and (not os.path.exists(f"{JOBS}/job-{job}.out")
                                                   or output(job).count(" verify: ") < 4):
                time.sleep(0.2)
            out = output(job)
        finally:
            held.close()
        # The job ran, every byte right, from the PFS where the peer would have served.
        verified = re.findall(r"verify: (\d+) samples, (\d+) bytes, (\d+) mismatches", out)
        self.assertEqual(len(verified), 4, out)
        self.assertTrue(all(v[2] == "0" for v in verified), out)
        with open(f"{RUN}/n1/{job}/peer.secret", "rb") as f:
            offset = port_offset(f.read())
        blocked = next(n for n, i in (("n1", 0), ("n3", 1)) if 700 + (offset + i) % 2 == 701)
        other = "n3" if blocked == "n1" else "n1"
        lines = {}
        for node in ("n1", "n3"):
            found = [x for x in read_text(f"{DIR}/log/slurmd-{node}.log")[logs[node]:]
                     .splitlines() if "nopfs: prolog: " in x and "serving " in x]
            self.assertEqual(len(found), 1, found)
            lines[node] = found[0]
        # The node whose port was taken: slurmd's log and the job's output say so, and what to do.
        self.assertNotIn("listening on", lines[blocked])
        self.assertIn("no peers: this node does not listen on 127.0.0.1:701 (", lines[blocked])
        self.assertIn("another process holds that port", lines[blocked])
        self.assertIn("ss -tlnp 'sport = :701'", lines[blocked])
        self.assertIn("peer_ports= in plugstack.conf (now 700-701)", lines[blocked])
        self.assertIn(f"nopfs: {blocked}: no peers: this node does not listen on 127.0.0.1:701",
                      out)
        # The other listened, and says that its peer did not answer, and what the admin checks.
        self.assertIn("peers: 2 nodes, listening on 127.0.0.1:700; peer node(s) ", lines[other])
        self.assertIn("did not answer the handshake by the start-up deadline (5000 ms)", lines[other])
        self.assertIn("must be open between the compute nodes", lines[other])
        self.assertIn(f"nopfs: {other}: peers: 2 nodes, listening on 127.0.0.1:700; peer node(s) ",
                      out)
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED", out)
        self.assertNothingLeft([job])

    def test_peer_ports_any_user_can_bind_are_warned_about(self):
        if not REAL_NOPFSD:
            self.skipTest("needs the real nopfsd")
        # A range that reaches net.ipv4.ip_unprivileged_port_start (1024 here): the peers work,
        # and slurmd's log warns that any user could take those ports.
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as f:
            start = int(f.read())
        self.set_plugin_args(f"peer_ports={start - 1}-{start}")
        logs = {n: len(read_text(f"{DIR}/log/slurmd-{n}.log")) for n in NODES}
        job = submit_two_node_job("nopfs-alice", verify=False)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not os.path.exists(f"{JOBS}/job-{job}.out")
                                               or output(job).count("NOPFS_SOCKET=") < 4):
            time.sleep(0.2)
        for node in ("n1", "n3"):
            line = [x for x in read_text(f"{DIR}/log/slurmd-{node}.log")[logs[node]:]
                    .splitlines() if "nopfs: prolog: " in x and "serving " in x]
            self.assertEqual(len(line), 1, line)
            self.assertIn(f"warning: peer_ports={start - 1}-{start} reaches "
                          f"net.ipv4.ip_unprivileged_port_start={start}, so any user can bind "
                          f"those ports", line[0])
            self.assertIn("every other node answered", line[0])
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED", output(job))
        self.assertNothingLeft([job])


if __name__ == "__main__":
    unittest.main()
