#!/usr/bin/env python3
"""The kept area end to end (docs/tiers.md, "The kept area"): a real nopfsd with an SSD tier keeps
its samples at exit (`--keep`) and the next job on the same dataset adopts them, through
`nopfs run` and `nopfs cat --verify` on a generated ImageFolder tree.

Checked here:
- the same job run twice: the second reads at most 5 % of the first's PFS bytes, every sample
  adopted, every byte right;
- a dataset file rewritten between the runs: only that sample is rejected and read again, and its
  new bytes are delivered;
- a flipped byte in the kept copy: that sample rejected, the right bytes delivered;
- what a crash leaves (a nopfsd killed with SIGKILL, an entry without its MANIFEST): never trusted,
  removed by the next start;
- without `--keep` nothing is kept, and a kept copy is read and left kept as it was;
- two SSD classes on two scratch directories: each keeps its own samples in its own kept area, and
  the next job adopts them all.

`nopfs run` starts the nopfsd beside its own executable: the runs that keep use a copy of `nopfs`
next to a `nopfsd` that adds `--keep` (and `--keep-max-bytes`) to the real one's arguments, as a
launcher that passes the flags does.

Usage: keep_test.py BUILD_BIN_DIR
"""

import glob
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import service_test as st  # noqa: E402  (the dataset and config helpers)

BIN = None


def read_bytes(path):
    with open(path, "rb") as fh:
        return fh.read()


def disk_bytes(path):
    """The disk bytes of the regular files under `path`."""
    total = 0
    for d, _, names in os.walk(path):
        for n in names:
            st_ = os.lstat(os.path.join(d, n))
            total += st_.st_blocks * 512 if os.path.isfile(os.path.join(d, n)) else 0
    return total


class KeepTest(unittest.TestCase):
    JOB = ["--seed", 5, "--epochs", 2, "--batch", 16]

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="nopfs-keep-test-")
        os.chmod(cls.tmp, 0o755)
        cls.files = 300
        # Samples are kept only from files unchanged since before the job started (ctime).
        time.sleep(1)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="case-", dir=self.tmp)
        os.chmod(self.work, 0o777)
        self.data = st.Dataset(os.path.join(self.work, "data"), files=self.files, seed=7)
        self.total = sum(os.path.getsize(f) for f in self.data.files)
        self.scratch = os.path.join(self.work, "scratch")
        os.mkdir(self.scratch)
        os.chmod(self.scratch, 0o777)
        self.conf = os.path.join(self.work, "ssd.conf.lua")
        st.write_config(self.conf, ssd="1G", ssd_path=self.scratch)
        self.keep_bin = self.launcher("keep", ["--keep"])
        self.runs = 0
        time.sleep(1)  # the dataset's ctimes are then before any run's start

    def launcher(self, name, extra):
        return st.launcher(self.work, name, extra)

    def run_job(self, bin_dir=None, check=True, conf=None, tiers=("ssd",), then=""):
        """One `nopfs run` of one rank that reads both epochs with `nopfs cat --verify`, waits for
        the prefetch of the SSD `tiers`, runs the shell command `then` (if any; `{out}` in it is
        this run's output prefix) and saves `nopfs status --json`. Returns (proc, status,
        cat)."""
        self.runs += 1
        out = os.path.join(self.work, f"run{self.runs}")
        nopfs_bin = os.path.join(BIN, "nopfs")
        done = " && ".join(f"echo \"$s\" | grep -q 'tier {t}: .*prefetch done'" for t in tiers)
        script = (f"{nopfs_bin} cat --verify > {out}.cat 2> {out}.err && "
                  f"until s=$({nopfs_bin} status) && {done}; "
                  f"do sleep 0.05; done; {then.format(out=out) + '; ' if then else ''}"
                  f"{nopfs_bin} status --json > {out}.json")
        argv = st.demote_argv([os.path.join(bin_dir or BIN, "nopfs"), "run", "--dataset",
                               self.data.root, "--ranks", "1", *map(str, self.JOB), "--config",
                               conf or self.conf, "--run-dir", out + ".rundir", "--keep-run-dir",
                               "--", "sh", "-c", script])
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if check and p.returncode != 0:
            raise AssertionError(f"{argv} exited {p.returncode}\n{p.stdout}\n{p.stderr}\n"
                                 f"{self.log(out)}")
        status = json.loads(st.read(out + ".json")) if os.path.exists(out + ".json") else None
        cat = st.read(out + ".cat") if os.path.exists(out + ".cat") else ""
        if check:
            self.assertRegex(cat, r"(?m)^\d+ samples, \d+ bytes, 0 mismatches$", cat)
        return p, status, cat

    def log(self, out):
        path = out + ".rundir/nopfsd.log"
        return st.read(path) if os.path.exists(path) else "(no log)"

    def kept_entries(self, scratch=None):
        """{name: sorted file names} of every entry of the kept area."""
        kept = glob.glob(os.path.join(scratch or self.scratch, "nopfs-*", "kept"))
        if not kept:
            return {}
        self.assertEqual(len(kept), 1, kept)
        return {n: sorted(os.listdir(os.path.join(kept[0], n))) for n in os.listdir(kept[0])}

    def the_kept_dir(self, scratch=None):
        entries = self.kept_entries(scratch)
        self.assertEqual(len(entries), 1, entries)
        (name, files), = entries.items()
        self.assertRegex(name, r"^[0-9a-f]{16}$")
        self.assertIn("MANIFEST", files)
        self.assertIn("index", files)
        return glob.glob(os.path.join(scratch or self.scratch, "nopfs-*", "kept", name))[0]

    def kept_index(self, kept_dir):
        """The index's records (kept/area.h) as dicts."""
        with open(os.path.join(kept_dir, "index"), "rb") as fh:
            b = fh.read()
        self.assertEqual(b[:8], b"NOPFSKIX")
        (count,) = struct.unpack_from("<Q", b, 12)
        at, out = 20, []
        for _ in range(count):
            (n,) = struct.unpack_from("<I", b, at)
            path = b[at + 4:at + 4 + n].decode()
            at += 4 + n
            off, length, xxh3, size, mtime, ctime, ino = struct.unpack_from("<QQQQqqQ", b, at)
            at += 56
            data_file, data_offset = struct.unpack_from("<IQ", b, at)
            at += 12
            out.append(dict(path=path, length=length, data_file=data_file,
                            data_offset=data_offset))
        return out

    def test_second_run_adopts_and_reads_almost_nothing_from_the_pfs(self):
        _, first, _ = self.run_job(self.keep_bin)
        self.assertGreaterEqual(first["pfs_bytes"], self.total)
        self.assertEqual(first["adopted_samples"], 0)
        kept = self.the_kept_dir()
        self.assertEqual(len(self.kept_index(kept)), self.files)
        p, second, _ = self.run_job(self.keep_bin)
        self.assertLessEqual(second["pfs_bytes"], 0.05 * first["pfs_bytes"], second)
        self.assertIn(f"adopted from the kept copy: {self.files} samples", p.stdout)
        self.assertEqual(second["adopted_samples"], self.files, second)
        self.assertEqual(second["adopted_bytes"], self.total, second)
        self.assertEqual(second["adopt_rejected_samples"], 0, second)
        # Kept again at exit, under the same key, with nothing left over.
        self.assertEqual(self.the_kept_dir(), kept)
        self.assertEqual(len(self.kept_index(kept)), self.files)
        log = self.log(os.path.join(self.work, "run2"))
        self.assertRegex(log, rf"kept area: kept {self.files} samples")
        self.assertEqual(second["kept_bytes"], 0)  # only known at exit

    def test_the_adopted_copy_is_never_on_disk_twice(self):
        self.run_job(self.keep_bin)
        kept = self.the_kept_dir()
        kept_disk = disk_bytes(kept)
        self.assertGreaterEqual(kept_disk, self.total)
        adopted = os.path.join(os.path.dirname(kept), ".tmp.adopt.*")
        # Another seed, another layout: the samples are copied into the new tier, and once its
        # prefetch is done the adopted entry (.tmp.adopt.*) holds none of them on disk.
        self.JOB = ["--seed", 6, "--epochs", 2, "--batch", 16]
        then = (f"for i in $(seq 100); do b=$(cat {adopted}/data.* | wc -c) && "
                f"d=$(du -s --block-size=1 {adopted} | cut -f1) && "
                f"[ $d -lt {kept_disk // 10} ] && break; sleep 0.1; done; "
                "echo $b $d > {out}.adopted")
        _, second, _ = self.run_job(self.keep_bin, then=then)
        self.assertEqual(second["adopted_samples"], self.files, second)
        self.assertEqual(second["pfs_bytes"], 0, second)
        size, disk = map(int, st.read(os.path.join(self.work, "run2.adopted")).split())
        # The data files keep their length (holes read as zeros) but not their blocks.
        self.assertGreaterEqual(size, self.total)
        self.assertLess(disk, kept_disk // 10, (disk, kept_disk))
        self.assertNotIn("took over", self.log(os.path.join(self.work, "run2")))
        # The same job again (the layout it kept): the new tier takes the kept data files over,
        # so the adopted entry has none while the job runs; every byte is right (--verify).
        then = "ls " + adopted + " > {out}.adopted"
        _, third, _ = self.run_job(self.keep_bin, then=then)
        self.assertEqual(third["adopted_samples"], self.files, third)
        self.assertEqual(third["pfs_bytes"], 0, third)
        self.assertEqual(third["corrupt"], 0, third)
        self.assertNotIn("data.", st.read(os.path.join(self.work, "run3.adopted")))
        log = self.log(os.path.join(self.work, "run3"))
        self.assertRegex(log, r"kept area: the SSD tier .* took over data files of ")
        self.assertRegex(log, rf"kept area: kept {self.files} samples")

    def test_a_file_rewritten_between_runs_is_read_again(self):
        _, first, _ = self.run_job(self.keep_bin)
        victim = self.data.files[17]
        size = os.path.getsize(victim)
        with open(victim, "r+b") as fh:  # same size, other bytes
            fh.write(os.urandom(size))
        time.sleep(1)
        _, second, cat = self.run_job(self.keep_bin)
        self.assertEqual(second["adopt_rejected_samples"], 1, second)
        self.assertEqual(second["adopted_samples"], self.files - 1, second)
        self.assertEqual(second["pfs_bytes"], size, second)
        log = self.log(os.path.join(self.work, "run2"))
        self.assertIn(f"{os.path.relpath(victim, self.data.root)}) not adopted", log)
        self.assertIn("its file changed since it was kept", log)

    def test_a_flipped_byte_in_the_kept_copy_is_rejected(self):
        self.run_job(self.keep_bin)
        kept = self.the_kept_dir()
        rec = max(self.kept_index(kept), key=lambda r: r["length"])
        with open(os.path.join(kept, f"data.{rec['data_file']}"), "r+b") as fh:
            at = rec["data_offset"] + rec["length"] // 2
            fh.seek(at)
            b = fh.read(1)
            fh.seek(at)
            fh.write(bytes([b[0] ^ 0x40]))
        _, second, _ = self.run_job(self.keep_bin)
        self.assertEqual(second["adopt_rejected_samples"], 1, second)
        self.assertEqual(second["adopted_samples"], self.files - 1, second)
        self.assertEqual(second["pfs_bytes"], rec["length"], second)
        self.assertIn("the kept bytes differ from their checksum",
                      self.log(os.path.join(self.work, "run2")))

    def test_nothing_incomplete_is_trusted(self):
        # A nopfsd killed with SIGKILL keeps nothing (its tier is left for the next start).
        out = os.path.join(self.work, "killed")
        nopfs_bin = os.path.join(BIN, "nopfs")
        script = (f"until {nopfs_bin} status | grep -q 'tier ssd: .*prefetch done'; "
                  f"do sleep 0.05; done; kill -9 $(cat {out}.rundir/nopfsd.pid); sleep 1")
        argv = st.demote_argv([os.path.join(self.keep_bin, "nopfs"), "run", "--dataset",
                               self.data.root, "--ranks", "1", *map(str, self.JOB), "--config",
                               self.conf, "--run-dir", out + ".rundir", "--", "sh", "-c", script])
        subprocess.run(argv, capture_output=True, text=True, timeout=300)
        self.assertFalse([n for n in self.kept_entries() if not n.startswith(".tmp.")],
                         self.kept_entries())
        # What a crash inside the keep leaves: an entry being written (its lock free), and a key
        # directory whose MANIFEST never arrived or arrived torn.
        self.run_job(self.keep_bin)
        kept = self.the_kept_dir()
        area = os.path.dirname(kept)
        writing = os.path.join(area, ".tmp.keep.9.0.abcdef")
        shutil.copytree(kept, writing)
        open(os.path.join(writing, "lock"), "w").close()  # its nopfsd's flock died with it
        torn = os.path.join(area, "0123456789abcdef")
        shutil.copytree(kept, torn)
        with open(os.path.join(torn, "MANIFEST"), "r+b") as fh:
            fh.truncate(20)
        os.remove(os.path.join(kept, "MANIFEST"))
        owner = os.stat(kept)
        for d in (writing, torn):  # as its nopfsd (the user) would have left them
            for root, dirs, files in os.walk(d):
                for n in [root] + [os.path.join(root, f) for f in files]:
                    os.chown(n, owner.st_uid, owner.st_gid)
        _, status, _ = self.run_job(self.keep_bin)
        self.assertEqual(status["adopted_samples"], 0, status)
        self.assertGreaterEqual(status["pfs_bytes"], self.total, status)
        # Removed at start; what this run kept is the only entry.
        self.assertEqual(self.the_kept_dir(), kept)
        self.assertIn("MANIFEST", os.listdir(kept))

    def test_a_failed_start_gives_the_kept_copy_back(self):
        self.run_job(self.keep_bin)
        kept = self.the_kept_dir()
        # The SSD tier's directory name taken by a file: nopfsd adopts, then fails to start.
        blocker = os.path.join(os.path.dirname(os.path.dirname(kept)), "local.0")
        open(blocker, "w").close()
        p, _, _ = self.run_job(self.keep_bin, check=False)
        self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(self.the_kept_dir(), kept)
        self.assertIn("given back as", self.log(os.path.join(self.work, "run2")))
        os.remove(blocker)
        _, status, _ = self.run_job(self.keep_bin)
        self.assertEqual(status["adopted_samples"], self.files, status)

    def test_without_keep_nothing_is_kept(self):
        _, status, _ = self.run_job()
        self.assertEqual(status["adopted_samples"], 0)
        self.assertEqual(self.kept_entries(), {})
        self.assertEqual(os.listdir(self.scratch), [])  # nothing else either

    def test_a_run_without_keep_reads_the_kept_copy_and_leaves_it_kept(self):
        _, first, _ = self.run_job(self.keep_bin)
        kept = self.the_kept_dir()
        files = {n: read_bytes(os.path.join(kept, n)) for n in os.listdir(kept)
                 if n == "index" or n.startswith("data.")}
        disk = disk_bytes(kept)
        time.sleep(1.1)  # the MANIFEST's last use is in seconds
        before = os.stat(os.path.join(kept, "MANIFEST")).st_mtime
        p, second, _ = self.run_job()  # no --keep
        self.assertLessEqual(second["pfs_bytes"], 0.05 * first["pfs_bytes"], second)
        self.assertEqual(second["adopted_samples"], self.files, second)
        self.assertIn("leaving kept (this job keeps nothing)", self.log(os.path.join(self.work,
                                                                                  "run2")))
        # Still kept, byte for byte, its MANIFEST rewritten (last use), nothing punched out.
        self.assertEqual(self.the_kept_dir(), kept)
        self.assertEqual({n: read_bytes(os.path.join(kept, n)) for n in files}, files)
        self.assertEqual(disk_bytes(kept), disk)
        self.assertGreater(os.stat(os.path.join(kept, "MANIFEST")).st_mtime, before)
        # The next run that keeps adopts every sample of it.
        _, third, _ = self.run_job(self.keep_bin)
        self.assertEqual(third["adopted_samples"], self.files, third)

    def test_keep_max_bytes_bounds_what_is_kept(self):
        limit = self.total // 3
        bounded = self.launcher("bounded", ["--keep", "--keep-max-bytes", str(limit)])
        self.run_job(bounded)
        kept = self.the_kept_dir()
        records = self.kept_index(kept)
        self.assertGreater(len(records), 0)
        self.assertLess(len(records), self.files)
        data = sum(os.stat(os.path.join(kept, f)).st_blocks * 512
                   for f in os.listdir(kept) if f.startswith("data."))
        self.assertLessEqual(data, limit)
        _, second, _ = self.run_job(self.keep_bin)
        self.assertEqual(second["adopted_samples"], len(records), second)
        self.assertEqual(second["pfs_bytes"], self.total - second["adopted_bytes"], second)

    def test_every_ssd_class_keeps_its_samples_and_the_next_job_adopts_them_all(self):
        # Two SSD classes on two scratch directories (two disks): the first holds what fits in
        # 512 KB, the second the rest.
        scratch2 = os.path.join(self.work, "scratch2")
        os.mkdir(scratch2)
        os.chmod(scratch2, 0o777)
        conf = os.path.join(self.work, "two-ssd.conf.lua")
        with open(conf, "w") as fh:
            fh.write('staging = { capacity = "64M", threads = 2 }\n'
                     f'classes = {{ ssd {{ name = "nvme0", path = "{self.scratch}", '
                     'capacity = "512K", threads = 2 }, '
                     f'ssd {{ name = "nvme1", path = "{scratch2}", capacity = "1G", '
                     'threads = 2 } }\n')
        os.chmod(conf, 0o644)
        tiers = ("nvme0", "nvme1")
        _, first, _ = self.run_job(self.keep_bin, conf=conf, tiers=tiers)
        self.assertGreaterEqual(first["pfs_bytes"], self.total)
        kept = [self.the_kept_dir(d) for d in (self.scratch, scratch2)]
        # The same key in each class's own kept area; each index names its own samples.
        self.assertEqual(os.path.basename(kept[0]), os.path.basename(kept[1]))
        records = [self.kept_index(k) for k in kept]
        self.assertGreater(len(records[0]), 0)
        self.assertGreater(len(records[1]), 0)
        paths = [{r["path"] for r in rs} for rs in records]
        self.assertEqual(paths[0] & paths[1], set())
        self.assertEqual(len(records[0]) + len(records[1]), self.files)
        log = self.log(os.path.join(self.work, "run1"))
        self.assertRegex(log, rf"kept area: kept {len(records[0])} samples .*\(class nvme0\)")
        self.assertRegex(log, rf"kept area: kept {len(records[1])} samples .*\(class nvme1\)")
        # The next job adopts both: every sample, every byte right, nothing from the PFS.
        p, second, _ = self.run_job(self.keep_bin, conf=conf, tiers=tiers)
        self.assertEqual(second["adopted_samples"], self.files, second)
        self.assertEqual(second["adopted_bytes"], self.total, second)
        self.assertEqual(second["adopt_rejected_samples"], 0, second)
        self.assertEqual(second["pfs_bytes"], 0, second)
        self.assertIn(f"adopted from the kept copy: {self.files} samples", p.stdout)
        # And keeps both again, under the same key, with nothing else left in either area.
        self.assertEqual([self.the_kept_dir(d) for d in (self.scratch, scratch2)], kept)


if __name__ == "__main__":
    BIN = os.path.abspath(sys.argv.pop(1))
    st.BIN = BIN
    unittest.main(verbosity=2)
