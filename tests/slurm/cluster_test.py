#!/usr/bin/python3
"""Cluster tests of the nopfs SPANK plugin against a real Slurm: slurmctld, three slurmd, MUNGE
and ordinary users, brought up once by contrib/slurm/local-cluster and torn down at the end.

Run as root (ctest -L slurm). NOPFS_BINARY_DIR names the build (plugin in lib/, nopfs-job,
nopfsd and nopfs in bin/). Each test submits jobs as nopfs-alice / nopfs-bob and checks what a
user and an admin rely on: options validated at submission, nopfsd as the user on exactly the
job's nodes, NOPFS_* in every task and correct bytes, a policy refusal shown to the user,
isolation between users, capacity never oversubscribed, and nothing left behind afterwards.
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


class ClusterTest(ClusterCase):
    # ---------------------------------------------------------------------------------------
    def test_bad_options_are_refused_at_submission(self):
        table = [
            ("--nopfs=relative/path", "absolute path"),
            ("--nopfs=/data/../etc", "'..'"),
            (f"--nopfs={DATASET} --nopfs-seed=abc", "--nopfs-seed=abc: is not a whole number"),
            (f"--nopfs={DATASET} --nopfs-epochs=0", "write a number from 1"),
            (f"--nopfs={DATASET} --nopfs-scheme=random", "--nopfs-scheme=uniform"),
            (f"--nopfs={DATASET} --nopfs-ram=lots", "is not a size"),
            # Sizes follow --mem: 16K is 16 KiB, too small for any cache, and said so.
            (f"--nopfs={DATASET} --nopfs-ram=16K", "--nopfs-ram=16K: is 16.0 KiB, too small for a "
             "cache (the least is 1M); sizes follow --mem (a bare number is MiB; K, M, G, T are "
             "powers of 1024): write --nopfs-ram=16G for 16 GiB, or --nopfs-ram=0 for no RAM "
             "cache"),
            (f"--nopfs={DATASET} --nopfs-ssd=512B", "is 512 B, too small for a cache"),
            (f"--nopfs={DATASET} --nopfs-ram=0 --nopfs-ssd=0", "leaves no cache"),
            (f"--nopfs={DATASET} --nopfs-ranks-per-node=99999", "out of range"),
            (f"--nopfs={DATASET} --nopfs-scheme=uniform --nopfs-batch=2 "
             "--nopfs-ranks-per-node=4", "write --nopfs-scheme=strided"),
            ("--nopfs-seed=3", "needs --nopfs=DATASET"),
            ("'--nopfs=/data/a\tb'", "control"),
            ("'--nopfs=/data/\x1b[31mred'", "control"),
        ]
        for options, says in table:
            r = sbatch("nopfs-alice", options, "true\n")
            self.assertNotEqual(r.returncode, 0, options)
            self.assertIn("nopfs: option:", r.stderr, options)
            self.assertIn(says, r.stderr, options)
        # and good ones are accepted (then cancelled): a bare number is MiB, as --mem=16
        for options in ("--nopfs-seed=1", "--nopfs-ram=16", "--nopfs-ram=0 --nopfs-ssd=1GB"):
            job = submit("nopfs-alice", f"--nopfs={DATASET} {options} --hold", "true\n")
            subprocess.run(["scancel", str(job)], env=env(), check=True)

    def test_ranks_per_node_come_from_the_jobs_tasks(self):
        # Jobs that give nopfs only the dataset (and the DistributedSampler scheme, valid for
        # every batch size) in four shapes, nodes x tasks per node, written the ways users write
        # them. Every task reads a non-empty stream, exactly what `nopfs stream` says for its
        # rank, and the tasks together read each of the 120 samples once.
        shapes = [(1, 1, "-N1"), (2, 1, "-N2 --ntasks-per-node=1"),
                  (2, 2, "-N2 --ntasks-per-node=2"), (3, 2, "-N3 -n6")]
        task = ("echo \"$NOPFS_RANK env $NOPFS_RANKS $NOPFS_RANKS_PER_NODE $NOPFS_BATCH "
                "$NOPFS_SCHEME $NOPFS_SEED $NOPFS_EPOCHS $NOPFS_SAMPLES\"; "
                f"{BUILD}/bin/nopfs cat --print --verify 2>&1 | sed \"s/^/$NOPFS_RANK: /\"")
        jobs = [submit("nopfs-alice", f"{opts} --mem=300 --nopfs={DATASET} "
                       "--nopfs-scheme=strided", f"srun bash -c '{task}'\n")
                for _, _, opts in shapes]
        for (nodes, per_node, opts), job in zip(shapes, jobs):
            self.assertEqual(wait_done(job), "COMPLETED", output(job))
            out = output(job)
            ranks = nodes * per_node
            seen = []
            for rank in range(ranks):
                env_line = re.search(rf"^{rank} env (.*)$", out, re.M)
                self.assertIsNotNone(env_line, f"{opts}: rank {rank}\n{out}")
                got_ranks, got_per_node, batch, scheme, seed, epochs, samples = \
                    env_line.group(1).split()
                self.assertEqual((int(got_ranks), int(got_per_node)), (ranks, per_node), opts)
                self.assertEqual(samples, "120", opts)
                stream = re.findall(rf"^{rank}: (\d+) -?\d+ \d+$", out, re.M)
                self.assertTrue(stream, f"{opts}: rank {rank} read nothing\n{out}")
                self.assertRegex(out, rf"\n{rank}: {len(stream)} samples, \d+ bytes, 0 mismatches",
                                 opts)
                want = subprocess.run(
                    [f"{BUILD}/bin/nopfs", "stream", "--samples", samples, "--ranks", got_ranks,
                     "--ranks-per-node", got_per_node, "--batch", batch, "--scheme", scheme,
                     "--seed", seed, "--epochs", epochs, "--rank", str(rank)],
                    capture_output=True, text=True, check=True).stdout.split()
                self.assertEqual(stream, want, f"{opts}: rank {rank}")
                seen += stream
            self.assertEqual(sorted(seen, key=int), [str(i) for i in range(120)], opts)
        self.assertNothingLeft(jobs)

    def test_a_layout_nopfs_cannot_serve_is_refused_with_its_message(self):
        cases = [
            # -n3 on two nodes: 2 tasks on one, 1 on the other.
            ("-N2 -n3", "echo TASK-RAN\n",
             "the job's 3 tasks do not spread evenly over its 2 nodes"),
            # ranks per node that are neither the tasks per node nor a multiple of them
            ("-N2 --ntasks-per-node=2 --nopfs-ranks-per-node=3", "echo TASK-RAN\n",
             "--nopfs-ranks-per-node=3: the job runs 2 tasks per node"),
            # a step that runs more tasks a node than the job was planned for
            ("-N2", "srun --overcommit --ntasks-per-node=2 echo TASK-RAN\n",
             "this step runs 2 tasks on each node, but the job's ranks per node is 1"),
        ]
        jobs = [submit("nopfs-alice", f"{opts} --mem=300 --nopfs={DATASET}", script)
                for opts, script, _ in cases]
        for (opts, _, says), job in zip(cases, jobs):
            self.assertEqual(wait_done(job), "FAILED", opts)
            out = output(job)
            self.assertIn(says, out, opts)
            self.assertIn("nopfs: task: the job fails", out, opts)
            self.assertNotIn("TASK-RAN", out, opts)
        self.assertNothingLeft(jobs)

    def test_options_that_leave_a_rank_without_samples_are_refused_with_their_message(self):
        # uniform with a global batch of 2 over 4 ranks: ranks 2 and 3 would read nothing.
        job = submit("nopfs-alice", f"-N2 --ntasks-per-node=2 --mem=300 --nopfs={DATASET} "
                     "--nopfs-scheme=uniform --nopfs-batch=2", "srun echo TASK-RAN\n")
        self.assertEqual(wait_done(job), "FAILED")
        out = output(job)
        self.assertIn("leaves rank 3 without a sample in every step", out)
        self.assertIn("write --scheme strided", out)
        self.assertNotIn("TASK-RAN", out)
        self.assertNothingLeft([job])

    def test_job_gets_its_cache_on_every_node_and_nothing_is_left(self):
        job = submit_two_node_job("nopfs-alice", verify=REAL_NOPFSD)
        wait_state(job, {"RUNNING"})
        # nopfsd as the user, one on each node of the allocation, none on n2.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(daemons()) < 2:
            time.sleep(0.2)
        found = {}
        for pid, (user, argv) in daemons().items():
            run_dir = argv[argv.index("--run-dir") + 1]
            self.assertEqual(user, "nopfs-alice")
            found[run_dir] = argv
        self.assertEqual(sorted(found), [f"{RUN}/n1/{job}", f"{RUN}/n3/{job}"])
        self.assertFalse(os.path.exists(f"{RUN}/n2/{job}"))
        argv = found[f"{RUN}/n3/{job}"]
        for flag, value in [("--node", "1"), ("--ranks", "4"), ("--ranks-per-node", "2"),
                            ("--seed", "7"), ("--epochs", "2"), ("--batch", "8"),
                            ("--scheme", "strided"), ("--job-id", str(job))]:
            self.assertEqual(argv[argv.index(flag) + 1], value, flag)
        # The two nodes serve each other: each nopfsd knows both peers and listens on its own
        # entry, with the job's secret in its private run directory (the user's, 0600).
        peers = argv[argv.index("--peers") + 1].split(",")
        self.assertEqual(len(peers), 2)
        self.assertEqual(argv[argv.index("--peer-listen") + 1], peers[1])
        self.assertEqual(found[f"{RUN}/n1/{job}"][found[f"{RUN}/n1/{job}"].index("--peers") + 1],
                         ",".join(peers))
        for node in ("n1", "n3"):
            st = os.stat(f"{RUN}/{node}/{job}/peer.secret")
            self.assertEqual(st.st_mode & 0o777, 0o600)
            self.assertEqual(st.st_size, 32)
            self.assertEqual(pwd.getpwuid(st.st_uid).pw_name, "nopfs-alice")
        with open(f"{RUN}/n1/{job}/peer.secret", "rb") as a, open(f"{RUN}/n3/{job}/peer.secret",
                                                                    "rb") as b:
            self.assertEqual(a.read(), b.read())
        for node in ("n1", "n3"):
            st = os.stat(f"{RUN}/{node}/{job}")
            self.assertEqual(st.st_mode & 0o777, 0o700)
            self.assertEqual(pwd.getpwuid(st.st_uid).pw_name, "nopfs-alice")
            e = ledger(node)[job]
            # --mem=600 (MiB): the policy grants a quarter of it, capped at 256 MB (debug).
            self.assertEqual(int(e["ram"]), min(600 * MiB // 4, 256_000_000))
        wait_file(f"{JOBS}/job-{job}.out")
        deadline = time.monotonic() + 60
        # Every task prints its environment, then (with a real nopfsd) its verify line.
        def complete(text):
            return text.count("NOPFS_RANK=") >= 4 and (not REAL_NOPFSD or
                                                       text.count(" verify: ") >= 4)
        while time.monotonic() < deadline and not complete(output(job)):
            time.sleep(0.2)
        out = output(job)
        for node, index in (("n1", 0), ("n3", 1)):
            for local in (0, 1):
                self.assertIn(f"{node}: NOPFS_RANK={index * 2 + local}\n", out)
                self.assertIn(f"{node}: NOPFS_LOCAL_RANK={local}\n", out)
            self.assertIn(f"{node}: NOPFS_SOCKET={RUN}/{node}/{job}/nopfsd.sock\n", out)
            self.assertIn(f"{node}: NOPFS_NODE={index}\n", out)
            self.assertIn(f"{node}: NOPFS_RANKS=4\n", out)
            self.assertIn(f"{node}: NOPFS_SEED=7\n", out)
            self.assertIn(f"{node}: NOPFS_SCHEME=strided\n", out)
            self.assertIn(f"{node}: NOPFS_DATASET={DATASET}\n", out)
        if REAL_NOPFSD:
            verified = re.findall(r"verify: (\d+) samples, (\d+) bytes, (\d+) mismatches", out)
            self.assertEqual(len(verified), 4, out)
            self.assertEqual(sum(int(v[0]) for v in verified), 2 * 120, out)  # 2 epochs, strided
            self.assertTrue(all(v[2] == "0" for v in verified), out)
            # The nodes authenticated each other and built the peer directory together; every
            # task knows the catalog's size.
            for node, index in (("n1", 0), ("n3", 1)):
                self.assertEqual(out.count(f"{node}: NOPFS_SAMPLES=120\n"), 2, out)
                peers = statuses(job)[node]["peers"]
                self.assertEqual((peers["node"], peers["nodes"]), (index, 2), out)
                self.assertTrue(peers["state"].startswith("directory of "), out)
            # While the job runs, its nopfsd write its metrics (the epilog removes the file:
            # assertNothingLeft).
            with open(os.path.join(METRICS, f"nopfs_{job}.prom")) as fh:
                prom = fh.read()
            self.assertIn(f'nopfs_pfs_read_bytes_total{{slurm_job_id="{job}",slurm_user="nopfs-alice",',
                          prom)
            # The batch script's output starts with the first node's plan.
            self.assertRegex(out, r"(?m)^nopfs: plan: node 0 of 2, dataset .*; tiers: ram .* "
                             r"to stage; predicted stall ", out)
        release(job)
        self.assertEqual(wait_done(job), "COMPLETED", out)
        self.assertNothingLeft([job])

    @unittest.skipUnless(REAL_NOPFSD, "needs the real nopfsd (its summary)")
    def test_each_nodes_peers_line_is_printed_once(self):
        # Root holds one of the job's two peer ports, so each node has a line on its peers for
        # the job's output (security_peer_test checks what they say). The first node runs the
        # batch script and two steps, the other node the two steps: each node's line appears
        # once.
        self.set_plugin_args("peer_ports=700-701 timeout=10")
        held = hold_port(701)
        step = f"srun --ntasks-per-node=2 bash -c '{TASK.format(build=BUILD, jobs=JOBS)}'\n"
        try:
            job = submit("nopfs-alice",
                         f"-N2 -w n1,n3 --ntasks-per-node=2 --mem=600 --nopfs={DATASET} "
                         "--nopfs-seed=7 --nopfs-ranks-per-node=2",
                         "export VERIFY=0\n" + step + step)
            state = wait_done(job, 150)
            out = output(job)
        finally:
            held.close()
        self.assertEqual(state, "COMPLETED", out)
        self.assertEqual(out.count("n3: NOPFS_RANK=3\n"), 2, out)  # both steps ran
        for node in ("n1", "n3"):
            lines = [x for x in out.splitlines() if x.startswith(f"nopfs: {node}: ")
                     and "peers" in x]
            self.assertEqual(len(lines), 1, out)
        self.assertNothingLeft([job])

    def test_every_job_leaves_its_record(self):
        """After any job: each node's summary line in slurmd's log and in the job's output; a
        job that staged but read nothing through nopfs is told so, with what to change."""
        def slurmd_log(node):
            with open(os.path.join(DIR, "log", f"slurmd-{node}.log"), errors="replace") as f:
                return f.read()
        nopfs = os.path.join(BUILD, "bin/nopfs")
        logs = os.path.join(DIR, "log", "jobs")  # the local cluster's job_logs.dir
        os.makedirs(logs, mode=0o755, exist_ok=True)
        old = os.path.join(logs, "nopfsd-999999-n1.log")
        open(old, "w").close()
        os.utime(old, (time.time() - 15 * 86400,) * 2)  # past job_logs.days = 14
        job = submit("nopfs-alice", f"-w n1 --mem=300 --nopfs={DATASET} --nopfs-seed=3",
                     f"srun {nopfs} cat --verify 2>&1 | tail -n 1\n")
        self.assertEqual(wait_done(job, 120), "COMPLETED")
        self.assertNothingLeft([job])
        # nopfsd's log is kept for the admin (root's) and the job's user, no one else.
        kept = os.path.join(logs, f"nopfsd-{job}-n1.log")
        st = os.stat(kept)
        self.assertEqual((st.st_uid, st.st_mode & 0o777), (0, 0o640))
        r = as_user("nopfs-alice", f"cat {kept}")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("stopped; nothing staged remains", r.stdout)
        r = as_user("nopfs-bob", f"cat {kept}")
        self.assertIn("Permission denied", r.stderr)
        self.assertFalse(os.path.exists(old), "a log past job_logs.days stayed")
        self.assertIn(f"nopfs: epilog: n1: job {job}: nopfsd's log kept as {kept}\n",
                      slurmd_log("n1"))
        line = rf"served 120 samples \(ram \d+, .*pfs \d+\); read \d.* from the PFS; stall median "
        self.assertRegex(slurmd_log("n1"), rf"nopfs: epilog: n1: job {job}: {line}")
        out = output(job)
        self.assertRegex(out, rf"(?m)^nopfs: n1: {line}.*errors: 0 staging, 0 corrupt, 0 changed$")
        self.assertNotIn("warning", out)
        # The script reads the files itself: the cache staged them for nothing.
        idle = submit("nopfs-alice", f"-w n1 --mem=300 --nopfs={DATASET}",
                      f"cat {DATASET}/class0/0000.bin > /dev/null; sleep 3\n")
        self.assertEqual(wait_done(idle, 120), "COMPLETED")
        self.assertNothingLeft([idle])
        out = output(idle)
        self.assertRegex(out, r"(?m)^nopfs: n1: served 0 samples ")
        self.assertRegex(out, r"(?m)^nopfs: n1: warning: this job staged .* but read nothing "
                         r"through nopfs .*The three-line change")
        self.assertRegex(slurmd_log("n1"), rf"nopfs: epilog: n1: job {idle}: served 0 samples")

    def test_scancel_while_starting_leaves_nothing(self):
        job = submit("nopfs-alice", f"-N3 --mem=300 --nopfs={DATASET} --nopfs-epochs=50",
                     HOLD.format(jobs=JOBS))
        wait_state(job, {"CONFIGURING", "RUNNING"})
        subprocess.run(["scancel", str(job)], env=env(), check=True)
        wait_done(job)
        self.assertNothingLeft([job])

    def test_crashed_nopfsd_is_cleaned_by_the_epilog(self):
        job = submit("nopfs-alice", f"-N2 --mem=300 --nopfs={DATASET}", HOLD.format(jobs=JOBS))
        wait_state(job, {"RUNNING"})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(daemons()) < 2:
            time.sleep(0.2)
        for pid in daemons():
            os.kill(pid, 9)
        release(job)
        wait_done(job)
        self.assertNothingLeft([job])

    def test_policy_refusal_reaches_the_user(self):
        # on_refusal=fail (the default): the job fails and says why.
        job = submit("nopfs-alice", f"-p interactive --nopfs={DATASET}", "echo ran\n")
        self.assertEqual(wait_done(job), "FAILED")
        out = output(job)
        self.assertIn("refused: nopfs is not offered on partition interactive", out)
        self.assertNotIn("ran", out.replace("refused", ""))
        # on_refusal=run: the job runs without the cache and is told so.
        self.set_plugin_args("on_refusal=run")
        job2 = submit("nopfs-alice", f"-p interactive --nopfs={DATASET}",
                      "echo ran; echo socket=${NOPFS_SOCKET:-none}\n")
        self.assertEqual(wait_done(job2), "COMPLETED")
        out = output(job2)
        self.assertIn("refused: nopfs is not offered on partition interactive", out)
        self.assertIn("without the cache", out)
        self.assertIn("socket=none", out)
        self.assertNothingLeft([job, job2])
        # Refusals never drain a node.
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env(), capture_output=True,
                           text=True)
        self.assertNotRegex(r.stdout, r"drain|drng|down")

    def test_two_users_are_isolated(self):
        opts = f"-N2 -w n1,n2 --oversubscribe --mem=300 --nopfs={DATASET}"
        a = submit("nopfs-alice", opts, HOLD.format(jobs=JOBS))
        b = submit("nopfs-bob", opts, HOLD.format(jobs=JOBS))
        wait_state(a, {"RUNNING"})
        wait_state(b, {"RUNNING"})
        for node in ("n1", "n2"):
            wait_file(f"{RUN}/{node}/{a}/ready", 30)
            wait_file(f"{RUN}/{node}/{b}/ready", 30)
        owners = {user for user, _ in daemons().values()}
        self.assertEqual(owners, {"nopfs-alice", "nopfs-bob"})
        probe = ("import socket,sys\n"
                 "d=sys.argv[1]\n"
                 "for what, f in (('connect', lambda: socket.socket(socket.AF_UNIX).connect(d + '/nopfsd.sock')),\n"
                 "                ('read', lambda: open(d + '/ready').read()),\n"
                 "                ('list', lambda: __import__('os').listdir(d))):\n"
                 "    try:\n        f(); print(what, 'ALLOWED')\n"
                 "    except PermissionError: print(what, 'denied')\n"
                 "    except OSError as e: print(what, 'error', e)\n")
        for user, other in (("nopfs-bob", a), ("nopfs-alice", b)):
            r = subprocess.run(["runuser", "-u", user, "--", "/usr/bin/python3", "-c", probe,
                                f"{RUN}/n1/{other}"], capture_output=True, text=True)
            self.assertEqual(r.stdout.split("\n")[:3],
                             ["connect denied", "read denied", "list denied"], r.stdout + r.stderr)
        if REAL_NOPFSD:
            uid = pwd.getpwnam("nopfs-alice").pw_uid
            user_ssd = os.path.join(SSD, f"nopfs-{uid}")
            if os.path.exists(user_ssd):
                self.assertEqual(os.stat(user_ssd).st_mode & 0o077, 0)
        release(a)
        release(b)
        wait_done(a)
        wait_done(b)
        self.assertNothingLeft([a, b])

    def test_stale_reservations_are_reclaimed(self):
        # What a crashed epilog or a reboot leaves: entries holding the whole node's RAM.
        ledger_dir = os.path.join(RUN, "n1", ".ledger")
        os.makedirs(ledger_dir, mode=0o700, exist_ok=True)
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        alice = pwd.getpwnam("nopfs-alice")
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = {900001: "an-earlier-boot", 900002: boot}
        for job, b in stale.items():
            with open(os.path.join(ledger_dir, str(job)), "w") as f:
                f.write(f"job={job}\nuid={alice.pw_uid}\nnode_index=0\nram={RAM_CAPACITY}\n"
                        f"ssd=0\nboot={b}\npid={dead.pid}\nstart=1\n")
        leftover_run = os.path.join(RUN, "n1", "900002")
        leftover_ssd = os.path.join(SSD, f"nopfs-{alice.pw_uid}", "900002.0")
        for d in (leftover_run, leftover_ssd):
            os.makedirs(d, exist_ok=True)
            os.chown(d, alice.pw_uid, alice.pw_gid)
        os.chown(os.path.dirname(leftover_ssd), alice.pw_uid, alice.pw_gid)
        job = submit("nopfs-alice", f"-w n1 --mem=500 --nopfs={DATASET} --nopfs-ram=200M",
                     HOLD.format(jobs=JOBS))
        wait_state(job, {"RUNNING"})
        wait_file(f"{RUN}/n1/{job}/ready", 30)
        entries = ledger("n1")
        self.assertEqual(sorted(entries), [job])  # both stale entries reclaimed
        self.assertEqual(int(entries[job]["ram"]), 200 << 20)  # 200M, as --mem: MiB
        # slurmd's line prints sizes in the units of --mem: --mem=500 is 500 MiB.
        self.assertRegex(slurmd_log("n1"), rf"nopfs: prolog: n1: serving {re.escape(DATASET)} "
                         r"\(partition \w+, job memory 500 MiB\) with RAM 200 MiB, SSD ")
        self.assertFalse(os.path.exists(leftover_run))
        self.assertFalse(os.path.exists(leftover_ssd))
        release(job)
        wait_done(job)
        self.assertNothingLeft([job, 900001, 900002])

    def test_reservations_never_exceed_capacity(self):
        # Three jobs at once on n2 asking for 200 + 200 + 128 MiB (bob's cap in the policy) of
        # RAM; the node offers 512 MiB.
        jobs = [submit(user, f"-w n2 --oversubscribe --mem=500 --nopfs={DATASET} "
                             "--nopfs-ram=200M", HOLD.format(jobs=JOBS))
                for user in ("nopfs-alice", "nopfs-bob", "nopfs-alice")]
        for j in jobs:
            wait_state(j, {"RUNNING"})
        for j in jobs:
            wait_file(f"{RUN}/n2/{j}/ready", 30)
        entries = ledger("n2")
        self.assertEqual(sorted(entries), sorted(jobs))
        total = sum(int(e["ram"]) for e in entries.values())
        # Demand (528 MiB) exceeds the capacity: the last job got exactly what was left.
        self.assertEqual(total, RAM_CAPACITY)
        grants = sorted(int(e["ram"]) for e in entries.values())
        self.assertEqual(grants[-1], 200 << 20)
        self.assertGreater(grants[0], 0)
        for pid, (_, argv) in daemons().items():
            j = int(argv[argv.index("--job-id") + 1])
            self.assertEqual(size_bytes(argv[argv.index("--ram") + 1]), int(entries[j]["ram"]))
        for j in jobs:
            release(j)
        for j in jobs:
            wait_done(j)
        self.assertNothingLeft(jobs)


if __name__ == "__main__":
    unittest.main()
