#!/usr/bin/env python3
"""nopfs_pfsemu mounted for real (FUSE 3): what the benchmarks rely on.

- every file reads back byte for byte as the backing file, also as an unprivileged user;
- nothing is cached: reading the same bytes again is served (and counted) again;
- the aggregate read rate stays under t(γ) (as a ratio to the configured rate) and rises with
  concurrent readers; each open costs the configured latency;
- the counters (MOUNTPOINT/.pfsemu_stats) equal the bytes and opens served; writes are refused;
- SIGTERM unmounts, the process exits 0, writes --stats-out, and leaves no mount behind.

Usage: pfsemu_test.py BUILD_BIN_DIR
"""

import hashlib
import os
import random
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest

BIN = None
CHUNK = 128 * 1024
BANDWIDTH = "1:20,4:40"  # MB/s: small, so that the throttle, not the machine, sets the pace
OPEN_LATENCY_US = 20000
GETATTR_LATENCY_US = 5000
READDIR_LATENCY_US = 10000


def mounted(path):
    with open("/proc/mounts") as fh:
        return any(line.split()[1] == path for line in fh)


def stats(mnt):
    with open(os.path.join(mnt, ".pfsemu_stats")) as fh:
        return {k: v for k, v in (line.split(" ", 1) for line in fh.read().splitlines())}


def read_file(path, chunk=CHUNK):
    h = hashlib.sha256()
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            b = os.read(fd, chunk)
            if not b:
                break
            h.update(b)
            n += len(b)
    finally:
        os.close(fd)
    return h.hexdigest(), n


class PfsemuTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="pfsemu_test_")
        os.chmod(self.tmp.name, 0o755)
        self.backing = os.path.join(self.tmp.name, "backing")
        self.mnt = os.path.join(self.tmp.name, "mnt")
        self.stats_out = os.path.join(self.tmp.name, "stats.txt")
        os.makedirs(os.path.join(self.backing, "sub"))
        os.makedirs(self.mnt)
        rnd = random.Random(7)
        self.files = {}
        for k in range(12):
            rel = f"sub/f{k:02d}.bin" if k % 3 else f"f{k:02d}.bin"
            data = rnd.randbytes(rnd.randint(1, 300000) if k else 0)
            with open(os.path.join(self.backing, rel), "wb") as fh:
                fh.write(data)
            self.files[rel] = (hashlib.sha256(data).hexdigest(), len(data))
        for name in ("big0", "big1", "big2", "big3"):
            with open(os.path.join(self.backing, name), "wb") as fh:
                fh.write(rnd.randbytes(3_000_000))
        for root, dirs, files in os.walk(self.tmp.name):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "nopfs_pfsemu"), "--bandwidth", BANDWIDTH, "--open-latency-us",
             str(OPEN_LATENCY_US), "--getattr-latency-us", str(GETATTR_LATENCY_US),
             "--readdir-latency-us", str(READDIR_LATENCY_US), "--burst-bytes", "0", "--stats-out", self.stats_out,
             self.backing, self.mnt], stderr=subprocess.PIPE, text=True)
        self.err_lines = []
        self.err_reader = threading.Thread(target=self.collect_stderr)
        self.err_reader.start()
        deadline = time.monotonic() + 20
        while not mounted(self.mnt):
            if self.proc.poll() is not None:
                self.err_reader.join()
                self.fail(f"nopfs_pfsemu exited {self.proc.returncode}: {self.stderr()}")
            if time.monotonic() > deadline:
                self.fail("nopfs_pfsemu did not mount within 20 s")
            time.sleep(0.02)

    def collect_stderr(self):
        for line in self.proc.stderr:
            self.err_lines.append(line)

    def stderr(self):
        return "".join(self.err_lines)

    def tearDown(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", self.mnt], check=False)
        self.err_reader.join()
        self.proc.stderr.close()
        self.tmp.cleanup()

    def test_bytes_equal_and_nothing_cached(self):
        seen = set()
        for root, dirs, files in os.walk(self.mnt):
            for f in files:
                seen.add(os.path.relpath(os.path.join(root, f), self.mnt))
        # The stats file is readable but not listed: a dataset scan must not see it.
        self.assertEqual(seen, set(self.files) | {"big0", "big1", "big2", "big3"})
        self.assertTrue(os.path.isfile(os.path.join(self.mnt, ".pfsemu_stats")))
        total = 0
        for _ in range(2):
            for rel, (digest, size) in self.files.items():
                self.assertEqual(os.stat(os.path.join(self.mnt, rel)).st_size, size)
                self.assertEqual(read_file(os.path.join(self.mnt, rel)), (digest, size), rel)
                total += size
        s = stats(self.mnt)
        # The second pass was served again: nothing came from a cache.
        self.assertEqual(int(s["bytes_read"]), total)
        self.assertEqual(int(s["opens"]), 2 * len(self.files))
        # An unprivileged user (nopfsd runs as one) reads the same bytes.
        rel = "sub/f01.bin"
        p = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--",
                            "sha256sum", os.path.join(self.mnt, rel)],
                           capture_output=True, text=True, check=True)
        self.assertEqual(p.stdout.split()[0], self.files[rel][0])

    def test_read_only(self):
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_CREAT):
            with self.assertRaises(OSError):
                os.open(os.path.join(self.mnt, "f00.bin"), flags, 0o644)
        with self.assertRaises(OSError):
            os.mkdir(os.path.join(self.mnt, "newdir"))
        with self.assertRaises(OSError):
            os.unlink(os.path.join(self.mnt, "big0"))
        self.assertEqual(sorted(os.listdir(self.backing)), sorted(["sub", "f00.bin", "f03.bin",
                         "f06.bin", "f09.bin", "big0", "big1", "big2", "big3"]))

    def test_throttle_and_open_latency(self):
        t1 = 20e6  # t(1), bytes/s
        t4 = 40e6  # t(4)
        start = time.monotonic()
        _, n = read_file(os.path.join(self.mnt, "big0"))
        one = n / (time.monotonic() - start)
        self.assertLessEqual(one / t1, 1.05, f"one reader: {one / 1e6:.1f} MB/s vs t(1) = 20")
        self.assertGreaterEqual(one / t1, 0.5, f"one reader: {one / 1e6:.1f} MB/s vs t(1) = 20")

        results = []

        def reader(name):
            results.append(read_file(os.path.join(self.mnt, name))[1])

        threads = [threading.Thread(target=reader, args=(f"big{i}",)) for i in range(4)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        four = sum(results) / (time.monotonic() - start)
        self.assertEqual(sum(results), 4 * 3_000_000)
        self.assertLessEqual(four / t4, 1.05, f"four readers: {four / 1e6:.1f} MB/s vs t(4) = 40")
        # More readers get more in aggregate (the curve rises), though less each.
        self.assertGreaterEqual(four / one, 1.3, f"four {four / 1e6:.1f} vs one {one / 1e6:.1f}")
        self.assertGreaterEqual(int(stats(self.mnt)["peak_readers"]), 2)

        opens = 10
        start = time.monotonic()
        for _ in range(opens):
            os.close(os.open(os.path.join(self.mnt, "f00.bin"), os.O_RDONLY))
        elapsed = time.monotonic() - start
        self.assertGreaterEqual(elapsed / (opens * OPEN_LATENCY_US / 1e6), 0.95)

        s = stats(self.mnt)
        self.assertEqual(int(s["bytes_read"]), 5 * 3_000_000)
        self.assertEqual(int(s["opens"]), 5 + opens)

    def test_metadata_counted_and_delayed(self):
        sub = os.path.join(self.mnt, "sub")
        names = sorted(rel[4:] for rel in self.files if rel.startswith("sub/"))
        before = stats(self.mnt)
        start = time.monotonic()
        self.assertEqual(sorted(os.listdir(sub)), names)
        listed = time.monotonic() - start
        start = time.monotonic()
        for name in names:  # paths the kernel has not looked up yet: one getattr each
            os.stat(os.path.join(sub, name))
        stated = time.monotonic() - start
        after = stats(self.mnt)
        delta = {k: int(after[k]) - int(before[k])
                 for k in ("getattrs", "getattrs_files", "getattrs_dirs", "readdirs",
                           "readdir_entries", "opens")}
        self.assertEqual(delta["readdirs"], 1, delta)
        self.assertEqual(delta["readdir_entries"], len(names) + 2, delta)  # with . and ..
        # One per file, plus at most the lookup of sub/ itself (the listing may have made it).
        self.assertGreaterEqual(delta["getattrs"], len(names), delta)
        self.assertLessEqual(delta["getattrs"], len(names) + 1, delta)
        self.assertEqual(delta["opens"], 0, delta)
        # The files' getattrs are the files', the rest is sub/'s (its lookup, once).
        self.assertEqual(delta["getattrs_files"], len(names), delta)
        self.assertEqual(delta["getattrs_dirs"], delta["getattrs"] - len(names), delta)
        self.assertEqual(int(after["getattrs"]),
                         int(after["getattrs_files"]) + int(after["getattrs_dirs"]))
        # A directory's stat is counted as a directory's, a file's as a file's.
        # (new/ is made in the backing directory, so that the kernel has not looked it up yet; the
        # root's attributes may be refreshed for the permission check of the two lookups.)
        os.mkdir(os.path.join(self.backing, "new"), 0o755)
        before = stats(self.mnt)
        self.assertTrue(stat.S_ISDIR(os.stat(os.path.join(self.mnt, "new")).st_mode))
        self.assertTrue(stat.S_ISREG(os.stat(os.path.join(self.mnt, "f00.bin")).st_mode))
        after = stats(self.mnt)
        delta = {k: int(after[k]) - int(before[k]) for k in ("getattrs_files", "getattrs_dirs")}
        self.assertEqual(delta["getattrs_files"], 1, delta)
        self.assertIn(delta["getattrs_dirs"], (1, 2), delta)
        self.assertEqual(int(after["metadata_ops"]),
                         int(after["opens"]) + int(after["getattrs"]) + int(after["readdirs"]))
        self.assertGreaterEqual(listed / (READDIR_LATENCY_US / 1e6), 0.95, listed)
        self.assertGreaterEqual(stated / (len(names) * GETATTR_LATENCY_US / 1e6), 0.95, stated)

    def test_sigterm_unmounts_and_reports(self):
        self.assertEqual(read_file(os.path.join(self.mnt, "sub/f01.bin")), self.files["sub/f01.bin"])
        self.proc.send_signal(signal.SIGUSR1)  # prints the counters, keeps serving
        deadline = time.monotonic() + 20
        while "open_latency_us" not in self.stderr().partition("pfsemu: stats:")[2]:
            self.assertLess(time.monotonic(), deadline, "no stats on stderr after SIGUSR1")
            time.sleep(0.02)
        dump = self.stderr().split("pfsemu: stats:")[1]
        self.assertIn(f"bytes_read {self.files['sub/f01.bin'][1]}\n", dump)
        self.assertIsNone(self.proc.poll())
        self.assertTrue(mounted(self.mnt))
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(timeout=20), 0)
        self.err_reader.join()
        self.assertIn("pfsemu: unmounted", self.stderr())
        self.assertFalse(mounted(self.mnt))
        self.assertEqual(os.listdir(self.mnt), [])
        with open(self.stats_out) as fh:
            final = dict(line.split(" ", 1) for line in fh.read().splitlines())
        self.assertEqual(int(final["bytes_read"]), self.files["sub/f01.bin"][1])
        self.assertEqual(int(final["opens"]), 1)


if __name__ == "__main__":
    BIN = sys.argv.pop(1)
    unittest.main(verbosity=2)
