#!/usr/bin/env python3
"""Sibling jobs end to end (docs/tiers.md, "Sibling jobs"): two jobs of one user on one node and
dataset at once read the PFS once, the second through the first's nopfsd; through `nopfs run`,
`nopfs cat --verify` and the emulated PFS (bench/pfsemu), which counts every byte read from it.

Checked here:
- two jobs at once: every byte right in both, the PFS read about once (<= 1.05 datasets), the
  second job's samples from its sibling;
- with `--share-running=no`: each job reads the whole dataset (>= 1.9 datasets);
- the first job's nopfsd killed (SIGKILL) while the second reads through it: the second completes
  with every byte right, from the PFS;
- another user's job on the same dataset at the same time: it does not find the first job, cannot
  list its registry, and an entry planted in its own registry that names the first job's socket
  gets it nothing (it reads the whole dataset from the PFS, every byte right).

Two `nopfs run` at once need two job ids (they name the shared memory and the SSD directory): each
job runs a copy of `nopfs` next to a `nopfsd` that adds `--job-id` (and other flags) to the real
one's arguments, as a launcher that passes them does.

Usage: sibling_test.py BUILD_BIN_DIR
"""

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import service_test as st  # noqa: E402  (the dataset and config helpers)

BIN = None
OTHER_USER = "daemon"  # a second unprivileged user (the jobs run as `nobody` when run as root)


@unittest.skipUnless(st.AS_ROOT, "mounting the emulated PFS and a second user need root")
class SiblingTest(unittest.TestCase):
    JOB = ["--seed", 5, "--epochs", 2, "--batch", 16]

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="nopfs-sibling-test-")
        os.chmod(cls.tmp, 0o755)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="case-", dir=self.tmp)
        os.chmod(self.work, 0o777)
        self.data = st.Dataset(os.path.join(self.work, "data"), files=300, seed=7)
        self.total = sum(os.path.getsize(f) for f in self.data.files)
        self.scratch = os.path.join(self.work, "scratch")
        os.mkdir(self.scratch)
        os.chmod(self.scratch, 0o777)
        self.conf = os.path.join(self.work, "ssd.conf.lua")
        st.write_config(self.conf, ssd="1GB", ssd_path=self.scratch)
        self.procs = []
        self.addCleanup(self.kill_all)

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def mount_pfs(self, *options):
        """The dataset through nopfs_pfsemu at <work>/pfs; returns the mount point."""
        emu = os.path.join(BIN, "nopfs_pfsemu")
        mnt = os.path.join(self.work, "pfs")
        os.mkdir(mnt, 0o755)
        proc = subprocess.Popen([emu, "--open-latency-us", "0", *options, self.data.root, mnt],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def unmount():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            subprocess.run(["fusermount3", "-u", "-z", mnt], stderr=subprocess.DEVNULL,
                           check=False)
        self.addCleanup(unmount)
        deadline = time.time() + 20
        while not os.path.exists(os.path.join(mnt, ".pfsemu_stats")):
            self.assertIsNone(proc.poll(), "nopfs_pfsemu exited")
            self.assertLess(time.time(), deadline, "nopfs_pfsemu did not mount")
            time.sleep(0.02)
        return mnt

    def pfs_bytes(self, mnt):
        with open(os.path.join(mnt, ".pfsemu_stats")) as fh:
            stats = dict(line.split(" ", 1) for line in fh.read().splitlines())
        return int(stats["bytes_read"])

    def daemons_pfs_bytes(self, mnt, jobs):
        """What the nopfsd read from the PFS, as the PFS counted it: `nopfs cat --verify` reads
        every sample it receives from the PFS itself to compare (each epoch's, 2 epochs per job),
        the daemons read the rest."""
        verify = jobs * 2 * self.total
        got = self.pfs_bytes(mnt)
        self.assertGreaterEqual(got, verify)
        return got - verify

    def launcher(self, name, extra):
        return st.launcher(self.work, name, extra)

    def flag(self, name):
        return os.path.join(self.work, name)

    def wait_for(self, path, proc, timeout=120):
        deadline = time.time() + timeout
        while not os.path.exists(path):
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"job exited {proc.returncode} before {path}\n{out}\n{err}")
            self.assertLess(time.time(), deadline, f"{path} never appeared")
            time.sleep(0.05)

    def start_job(self, name, dataset, extra=(), user="nobody", until=None):
        """`nopfs run` of one rank as `user`: says `<name>.up`, waits for `go`, reads both epochs
        with `nopfs cat --verify`, waits for the SSD tier's prefetch, saves `nopfs status --json`,
        says `<name>.done`, and stays until `until` (another job's flag) exists."""
        out = self.flag(name)
        nopfs_bin = os.path.join(BIN, "nopfs")
        bin_dir = self.launcher(name, ["--job-id", "sib" + name, *extra])
        stay = f"until [ -e {self.flag(until)} ]; do sleep 0.05; done; " if until else ""
        script = (f"touch {out}.up; until [ -e {self.flag('go')} ]; do sleep 0.05; done; "
                  f"{nopfs_bin} cat --verify > {out}.cat 2> {out}.err && "
                  f"until {nopfs_bin} status | grep -q 'tier ssd: .*prefetch done'; "
                  f"do sleep 0.05; done; {nopfs_bin} status --json > {out}.json; "
                  f"touch {out}.done; {stay}")
        argv = [os.path.join(bin_dir, "nopfs"), "run", "--dataset", dataset, "--ranks", "1",
                *map(str, self.JOB), "--config", self.conf, "--run-dir", out + ".rundir",
                "--keep-run-dir", "--", "sh", "-c", script]
        if user != "nobody":
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"] + argv
        else:
            argv = st.demote_argv(argv)
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        self.wait_for(out + ".up", p)
        return p

    def finish(self, name, proc):
        """Waits for the job; returns (status, log) after checking that every byte was right."""
        out, err = proc.communicate(timeout=300)
        path = self.flag(name)
        log = st.read(path + ".rundir/nopfsd.log")
        self.assertEqual(proc.returncode, 0, f"{out}\n{err}\n{log}")
        cat = st.read(path + ".cat")
        self.assertRegex(cat, r"(?m)^\d+ samples, \d+ bytes, 0 mismatches$", cat + log)
        return json.loads(st.read(path + ".json")), log

    def source(self, status, name):
        for s in status["sources"]:
            if s["name"] == name:
                return s
        return None

    def test_two_jobs_at_once_read_the_pfs_once(self):
        mnt = self.mount_pfs()
        a = self.start_job("A", mnt, until="B.done")
        b = self.start_job("B", mnt, until="A.done")
        open(self.flag("go"), "w").close()
        sa, _ = self.finish("A", a)
        sb, log_b = self.finish("B", b)
        pfs = self.daemons_pfs_bytes(mnt, jobs=2)
        print(f"\ntwo jobs at once: PFS read {pfs / self.total:.3f} datasets; job B took "
              f"{self.source(sb, 'sibling')} from its sibling", file=sys.stderr)
        self.assertEqual(pfs, sa["pfs_bytes"] + sb["pfs_bytes"])
        self.assertIn("sibling: job sibA.0", log_b)
        self.assertGreaterEqual(self.source(sb, "sibling")["samples"], 1, sb)
        self.assertLessEqual(sb["pfs_bytes"], 0.05 * self.total, sb)
        self.assertGreaterEqual(pfs, self.total)
        self.assertLessEqual(pfs, 1.05 * self.total, (sa, sb))
        # Nothing is left in the registry, nor anywhere in the scratch directory.
        self.assertEqual(os.listdir(self.scratch), [])

    def test_without_sharing_each_job_reads_the_pfs(self):
        mnt = self.mount_pfs()
        a = self.start_job("A", mnt, ["--share-running", "no"], until="B.done")
        b = self.start_job("B", mnt, ["--share-running", "no"], until="A.done")
        open(self.flag("go"), "w").close()
        sa, _ = self.finish("A", a)
        sb, _ = self.finish("B", b)
        pfs = self.daemons_pfs_bytes(mnt, jobs=2)
        self.assertEqual(pfs, sa["pfs_bytes"] + sb["pfs_bytes"])
        print(f"\ntwo jobs, --share-running=no: PFS read {pfs / self.total:.3f} datasets",
              file=sys.stderr)
        self.assertIsNone(self.source(sb, "sibling"), sb)
        self.assertGreaterEqual(pfs, 1.9 * self.total)

    def test_the_sibling_killed_mid_read_the_second_job_gets_every_byte(self):
        # 3 MB/s: the dataset takes a few seconds to read, the sibling dies part-way.
        mnt = self.mount_pfs("--bandwidth", "3", "--burst-bytes", "0")
        a = self.start_job("A", mnt, until="B.done")
        b = self.start_job("B", mnt)
        open(self.flag("go"), "w").close()
        deadline = time.time() + 120
        while self.pfs_bytes(mnt) < 0.3 * self.total:
            self.assertLess(time.time(), deadline)
            time.sleep(0.02)
        with open(self.flag("A.rundir/nopfsd.pid")) as fh:
            os.kill(int(fh.read().strip()), signal.SIGKILL)
        sb, log_b = self.finish("B", b)
        a.communicate(timeout=60)
        got = self.source(sb, "sibling")
        self.assertIsNotNone(got, sb)
        self.assertGreater(got["samples"], 0, sb)
        self.assertGreater(sb["pfs_bytes"], 0, sb)
        self.assertIn("sibling: a read failed, reading the PFS for it instead", log_b)

    def test_another_users_job_never_reads_through_a_sibling(self):
        mnt = self.mount_pfs()
        a = self.start_job("A", mnt, until="B.done")
        nobody = pwd.getpwnam("nobody").pw_uid
        other = pwd.getpwnam(OTHER_USER).pw_uid
        live_a = os.path.join(self.scratch, f"nopfs-{nobody}", "live")
        entries = os.listdir(live_a)
        self.assertEqual(len(entries), 1, entries)
        self.assertEqual(os.stat(live_a).st_mode & 0o777, 0o700)
        # The other user cannot list alice's registry.
        p = subprocess.run(["setpriv", f"--reuid={OTHER_USER}", f"--regid={OTHER_USER}",
                            "--clear-groups", "--", "ls", live_a], capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0, p.stdout)
        # A copy of alice's entry planted in the other user's own registry (as that user could
        # write it): it names her socket, which that user's nopfsd cannot use.
        own = os.path.join(self.scratch, f"nopfs-{other}")
        os.makedirs(os.path.join(own, "live"))
        for d in (own, os.path.join(own, "live")):
            os.chown(d, other, other)
            os.chmod(d, 0o700)
        with open(os.path.join(live_a, entries[0])) as fh:
            text = fh.read()
        pid_line = [ln for ln in text.splitlines() if ln.startswith("pid ")][0]
        planted = os.path.join(own, "live", entries[0].split(".")[0] + ".planted.0")
        with open(planted, "w") as fh:
            fh.write(text.replace(pid_line, f"pid {os.getpid()}"))  # a live process
        os.chown(planted, other, other)
        b = self.start_job("B", mnt, user=OTHER_USER, until="A.done")
        open(self.flag("go"), "w").close()
        self.finish("A", a)
        sb, log_b = self.finish("B", b)
        self.assertIsNone(self.source(sb, "sibling"), sb)
        self.assertGreaterEqual(sb["pfs_bytes"], self.total, sb)
        self.assertIn("sibling: not reading from job sibA.0: sibling: connecting to "
                      f"{self.flag('A.rundir')}/nopfsd.sock: Permission denied", log_b)
        self.assertNotIn("runs on this dataset", log_b)
        log_a = st.read(self.flag("A.rundir/nopfsd.log"))
        self.assertNotIn("sibling: served", log_a)


if __name__ == "__main__":
    BIN = os.path.abspath(sys.argv.pop(1))
    st.BIN = BIN
    unittest.main(verbosity=2)
