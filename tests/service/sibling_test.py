#!/usr/bin/env python3
"""Sibling jobs end to end (docs/tiers.md, "Sibling jobs"): two jobs of one user on one node and
dataset at once read the PFS once, the second through the first's nopfsd; through `nopfs run`,
`nopfs cat --verify` and the emulated PFS (bench/pfsemu), which counts every byte read from it.

Checked here:
- two jobs at once: every byte right in both, the PFS read about once (<= 1.05 datasets), the
  second job's samples from its sibling;
- two jobs started at the same instant (neither waits for the other's registry entry): one reads
  through the other and never the other way, the PFS read about once, and the figures of
  `nopfs status` and of the metrics file equal what was read (served by one = read by the other);
- a stop (SIGTERM) while reads through a sibling are in flight and the sibling does not answer
  (stopped with SIGSTOP) takes well under the 10 s a sibling's answer may take;
- with `--share-running=no`: each job reads the whole dataset (>= 1.9 datasets);
- the first job's nopfsd killed (SIGKILL) while the second reads through it: the second completes
  with every byte right, from the PFS;
- another user's job on the same dataset at the same time: it does not find the first job, cannot
  list its registry, and an entry planted in its own registry that names the first job's socket
  gets it nothing (it reads the whole dataset from the PFS, every byte right).

Two `nopfs run` at once need two job ids (they name the shared memory and the SSD directory):
`nopfs run --job-id`.

Usage: sibling_test.py BUILD_BIN_DIR
"""

import json
import os
import re
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
        st.write_config(self.conf, ssd="1G", ssd_path=self.scratch)
        # As on a node: a directory only root writes, where root makes each job's file for its
        # user before nopfsd starts (spawn_job); nopfsd makes no file of its own there.
        self.metrics = os.path.join(self.work, "metrics")
        os.mkdir(self.metrics)
        os.chmod(self.metrics, 0o755)
        with open(self.conf, "a") as fh:
            fh.write(f'metrics_dir = "{self.metrics}"\n')
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

    JOB_IDS = {"A": "101", "B": "102"}

    def spawn_job(self, name, dataset, extra=(), user="nobody", until=None):
        """`nopfs run --job-id` of one rank as `user`: says `<name>.up`, waits for `go`, reads both
        epochs with `nopfs cat --verify`, waits for the SSD tier's prefetch, saves `nopfs status
        --json`, says `<name>.done`, stays until `until` (another job's flag) exists, and saves
        the status once more (`<name>.final.json` and `.final.txt`: nothing is read after that)."""
        out = self.flag(name)
        nopfs_bin = os.path.join(BIN, "nopfs")
        stay = (f"until [ -e {self.flag(until)} ]; do sleep 0.05; done; "
                f"{nopfs_bin} status --json > {out}.final.json; "
                f"{nopfs_bin} status > {out}.final.txt; " if until else "")
        script = (f"touch {out}.up; until [ -e {self.flag('go')} ]; do sleep 0.05; done; "
                  f"{nopfs_bin} cat --verify > {out}.cat 2> {out}.err && "
                  f"until {nopfs_bin} status | grep -q 'tier ssd: .*prefetch done'; "
                  f"do sleep 0.05; done; {nopfs_bin} status --json > {out}.json; "
                  f"touch {out}.done; {stay}")
        argv = [nopfs_bin, "run", "--dataset", dataset, "--ranks", "1", *map(str, self.JOB),
                "--config", self.conf, "--run-dir", out + ".rundir", "--keep-run-dir",
                "--job-id", self.JOB_IDS[name], *extra, "--", "sh", "-c", script]
        prom = os.path.join(self.metrics, f"nopfs_{self.JOB_IDS[name]}.prom")
        open(prom, "w").close()
        if os.geteuid() == 0:
            pw = pwd.getpwnam(user)
            os.chown(prom, pw.pw_uid, pw.pw_gid)
        if user != "nobody":
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"] + argv
        else:
            argv = st.demote_argv(argv)
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def start_job(self, name, dataset, extra=(), user="nobody", until=None):
        """spawn_job, then waits until the job's nopfsd serves (and is registered)."""
        p = self.spawn_job(name, dataset, extra, user, until)
        self.wait_for(self.flag(name) + ".up", p)
        return p

    def prom_figures(self, name):
        """The sibling figures of the job's metrics file (written last at its exit)."""
        text = st.read(os.path.join(self.metrics, f"nopfs_{self.JOB_IDS[name]}.prom"))
        got = {}
        for m in re.finditer(r'(?m)^(nopfs_sibling_\w+)\{([^}]*)\} (\d+)$', text):
            direction = re.search(r'direction="(\w+)"', m.group(2))
            got[(m.group(1), direction.group(1) if direction else "")] = int(m.group(3))
        return got

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
        self.assertIn("sibling: job 101.0", log_b)
        self.assertGreaterEqual(self.source(sb, "sibling")["samples"], 1, sb)
        self.assertLessEqual(sb["pfs_bytes"], 0.05 * self.total, sb)
        self.assertGreaterEqual(pfs, self.total)
        self.assertLessEqual(pfs, 1.05 * self.total, (sa, sb))
        # Nothing is left in the registry, nor anywhere in the scratch directory.
        self.assertEqual(os.listdir(self.scratch), [])

    def test_two_jobs_started_at_once_read_the_pfs_once_and_count_it(self):
        # 1 MB/s: the dataset (about 2.5 MB) takes seconds to read, long against the 250 ms after
        # which a job without a sibling looks again.
        mnt = self.mount_pfs("--bandwidth", "1", "--burst-bytes", "0")
        a = self.spawn_job("A", mnt, until="B.done")
        b = self.spawn_job("B", mnt, until="A.done")
        for name, p in (("A", a), ("B", b)):
            self.wait_for(self.flag(name) + ".up", p)
        open(self.flag("go"), "w").close()
        self.finish("A", a)
        self.finish("B", b)
        final = {n: json.loads(st.read(self.flag(n) + ".final.json")) for n in "AB"}
        logs = {n: st.read(self.flag(n + ".rundir/nopfsd.log")) for n in "AB"}
        # One reads through the other, never both ways.
        readers = [n for n in "AB" if final[n]["siblings"]["read_samples"] > 0]
        self.assertEqual(len(readers), 1, final)
        later = readers[0]
        first = "B" if later == "A" else "A"
        f, lt = final[first]["siblings"], final[later]["siblings"]
        self.assertIn(f"sibling: job {self.JOB_IDS[first]}.0 (pid", logs[later])
        self.assertNotIn("runs on this dataset", logs[first])
        self.assertEqual(f["read_samples"], 0, f)
        self.assertEqual(lt["served_samples"], 0, lt)
        self.assertEqual(lt["read_failed"], 0, logs[later])
        # What the first served is what the later one read, and the later one got every sample
        # once: from the first or from the PFS (what it read before it found the first).
        self.assertEqual(f["served_samples"], lt["read_samples"], final)
        self.assertEqual(f["served_bytes"], lt["read_bytes"], final)
        later_pfs = final[later]["pfs_bytes"]
        self.assertGreaterEqual(lt["read_bytes"] + later_pfs, self.total, final)
        self.assertLessEqual(lt["read_bytes"] + later_pfs, 1.05 * self.total, final)
        pfs = self.daemons_pfs_bytes(mnt, jobs=2)
        self.assertEqual(pfs, final["A"]["pfs_bytes"] + final["B"]["pfs_bytes"], (self.total, {n: (final[n]["pfs_bytes"], final[n]["siblings"], final[n]["sources"]) for n in "AB"}))
        print(f"\ntwo jobs started at once: PFS read {pfs / self.total:.3f} datasets; job "
              f"{self.JOB_IDS[later]} read {lt['read_bytes'] / self.total:.3f} datasets through "
              f"job {self.JOB_IDS[first]} and {later_pfs / self.total:.3f} from the PFS",
              file=sys.stderr)
        # The bound: the first reads the dataset once; the later one reads the PFS only until it
        # finds the first (its first look, or one 250 ms later), at its share of 1 MB/s.
        self.assertLessEqual(final[first]["pfs_bytes"], 1.05 * self.total, final)
        self.assertLessEqual(later_pfs, 0.3 * self.total, final)
        self.assertLessEqual(pfs, 1.3 * self.total)
        # `nopfs status` and the metrics file (written last at exit) say the same.
        for n in "AB":
            sib = final[n]["siblings"]
            text = st.read(self.flag(n) + ".final.txt")
            self.assertRegex(text, r"(?m)^siblings: read %d samples \(.*\) through .*, 0 failed; "
                             r"served %d samples " % (sib["read_samples"], sib["served_samples"]))
            m = self.prom_figures(n)
            self.assertEqual(m[("nopfs_sibling_reads_total", "read")], sib["read_samples"], m)
            self.assertEqual(m[("nopfs_sibling_reads_total", "served")], sib["served_samples"])
            self.assertEqual(m[("nopfs_sibling_read_bytes_total", "read")], sib["read_bytes"])
            self.assertEqual(m[("nopfs_sibling_read_bytes_total", "served")],
                             sib["served_bytes"])
            self.assertEqual(m[("nopfs_sibling_failures_total", "")], 0)
        self.assertEqual(os.listdir(self.scratch), [])

    def test_a_stop_during_reads_through_a_silent_sibling_is_prompt(self):
        # A sibling's answer may take 10 s (it may read the PFS for it); a stop does not wait.
        mnt = self.mount_pfs("--bandwidth", "1", "--burst-bytes", "0")
        a = self.start_job("A", mnt, until="B.done")
        with open(self.flag("A.rundir/nopfsd.pid")) as fh:
            pid_a = int(fh.read().strip())
        self.addCleanup(lambda: os.kill(pid_a, signal.SIGCONT))
        b = self.spawn_job("B", mnt)
        log_b = self.flag("B.rundir/nopfsd.log")
        deadline = time.time() + 120
        while "sibling: job 101.0" not in (st.read(log_b) if os.path.exists(log_b) else ""):
            self.assertIsNone(b.poll(), "job B ended")
            self.assertLess(time.time(), deadline, "job B never read through job A")
            time.sleep(0.01)
        # Job B's prefetch reads through job A, whose nopfsd now answers nothing.
        os.kill(pid_a, signal.SIGSTOP)
        time.sleep(0.5)
        with open(self.flag("B.rundir/nopfsd.pid")) as fh:
            pid_b = int(fh.read().strip())
        t0 = time.monotonic()
        os.kill(pid_b, signal.SIGTERM)
        while os.path.exists(f"/proc/{pid_b}") and time.monotonic() - t0 < 30:
            with open(f"/proc/{pid_b}/stat") as fh:
                if fh.read().split(") ")[-1].startswith("Z"):
                    break  # exited, not reaped yet
            time.sleep(0.01)
        took = time.monotonic() - t0
        print(f"\nstop during reads through a silent sibling: {took:.2f} s", file=sys.stderr)
        os.kill(pid_a, signal.SIGCONT)
        log = st.read(log_b)
        # The reads in flight were cut, not answered.
        self.assertIn("sibling: a read failed, reading the PFS for it instead", log)
        self.assertIn("sibling: stopped", log)
        self.assertLess(took, 3.0, log)

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
        # 0.5 MB/s: the first job takes seconds to read the dataset (about 2.5 MB), and the second
        # cannot get ahead of it: the first dies while the second still reads through it.
        mnt = self.mount_pfs("--bandwidth", "0.5", "--burst-bytes", "0")
        a = self.start_job("A", mnt, until="B.done")
        b = self.spawn_job("B", mnt)
        log_b_path = self.flag("B.rundir/nopfsd.log")
        deadline = time.time() + 120
        while "sibling: job 101.0" not in (st.read(log_b_path)
                                            if os.path.exists(log_b_path) else ""):
            self.assertIsNone(b.poll(), "job B ended")
            self.assertLess(time.time(), deadline, "job B never read through job A")
            time.sleep(0.01)
        time.sleep(0.2)
        with open(self.flag("A.rundir/nopfsd.pid")) as fh:
            os.kill(int(fh.read().strip()), signal.SIGKILL)
        self.wait_for(self.flag("B.up"), b)
        open(self.flag("go"), "w").close()
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
        self.assertIn("sibling: not reading from job 101.0: sibling: connecting to "
                      f"{self.flag('A.rundir')}/nopfsd.sock: Permission denied", log_b)
        self.assertNotIn("runs on this dataset", log_b)
        log_a = st.read(self.flag("A.rundir/nopfsd.log"))
        self.assertNotIn("sibling: served", log_a)


if __name__ == "__main__":
    BIN = os.path.abspath(sys.argv.pop(1))
    st.BIN = BIN
    unittest.main(verbosity=2)
