#!/usr/bin/env python3
"""Tests of the `nopfs` command as users meet it: `nopfs stream` replays exactly the access stream
that the independent reference (tests/reference/sampler_ref.py) computes, and bad arguments fail
with a message that says what to write instead.

Usage: cli_test.py PATH/TO/nopfs   (ctest passes the built binary)
"""

import os
import random
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import sampler_ref  # noqa: E402

NOPFS = None
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def run(*args, check=True):
    p = subprocess.run([NOPFS, *map(str, args)], capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"nopfs {' '.join(map(str, args))} exited {p.returncode}: {p.stderr}")
    return p


def reference_stream(seed, f, epochs, n, rank, b, scheme, drop_last, start_epoch=0, start_step=0):
    out = []
    for e in range(start_epoch, epochs):
        perm = sampler_ref.permutation(seed, e, f)
        steps = sampler_ref.partition(scheme, perm, n, b, drop_last)[rank]
        for h, step in enumerate(steps):
            if e == start_epoch and h < start_step:
                continue
            out.extend(step)
    return out


class StreamTest(unittest.TestCase):
    def stream(self, seed, f, epochs, n, rank, b, scheme, drop_last, extra=()):
        args = ["stream", "--seed", seed, "--samples", f, "--epochs", epochs, "--ranks", n,
                "--rank", rank, "--batch", b, "--scheme", scheme, *extra]
        if drop_last:
            args.append("--drop-last")
        return [int(x) for x in run(*args).stdout.split()]

    def test_equals_reference_for_random_jobs(self):
        rnd = random.Random(20261122)
        for _ in range(40):
            f = rnd.randint(1, 300)
            n = rnd.randint(1, 9)
            b = rnd.randint(1, 40)
            drop_last = rnd.random() < 0.5 and b <= f
            scheme = rnd.choice(["uniform", "strided"])
            seed = rnd.choice([0, 1, 42, rnd.getrandbits(64)])
            epochs = rnd.randint(1, 3)
            rank = rnd.randrange(n)
            with self.subTest(f=f, n=n, b=b, drop_last=drop_last, scheme=scheme, seed=seed):
                got = self.stream(seed, f, epochs, n, rank, b, scheme, drop_last)
                want = reference_stream(seed, f, epochs, n, rank, b, scheme, drop_last)
                self.assertEqual(got, want)

    def test_every_sample_once_per_epoch_across_ranks(self):
        f, n, b = 1000, 4, 40
        seen = []
        for rank in range(n):
            seen += self.stream(7, f, 1, n, rank, b, "uniform", False)
        self.assertEqual(sorted(seen), list(range(f)))

    def test_resume_is_the_tail_of_the_stream(self):
        args = dict(seed=3, f=257, epochs=3, n=3, rank=1, b=12, scheme="strided", drop_last=False)
        full = self.stream(**args)
        # Rank 1 reads ceil(12/3) = 4 entries per step; (epoch 1, step 5) skips 1 epoch + 5 steps.
        per_epoch = len(full) // 3
        tail = self.stream(**args, extra=["--start-epoch", 1, "--start-step", 5])
        self.assertEqual(tail, full[per_epoch + 5 * 4:])
        self.assertEqual(tail, reference_stream(3, 257, 3, 3, 1, 12, "strided", False, 1, 5))

    def test_verbose_and_count(self):
        lines = run("stream", "--seed", 1, "--samples", 100, "--epochs", 2, "--ranks", 2, "--rank",
                    0, "--batch", 10, "-v", "--count", 7).stdout.splitlines()
        self.assertEqual(len(lines), 7)
        want = reference_stream(1, 100, 2, 2, 0, 10, "uniform", False)[:7]
        self.assertEqual([int(l.split()[3]) for l in lines], want)
        self.assertEqual([l.split()[:3] for l in lines[:6]],
                         [["0", str(k // 5), str(k)] for k in range(6)])


class BadArgumentsTest(unittest.TestCase):
    def expect_error(self, args, pattern):
        p = run(*args, check=False)
        self.assertNotEqual(p.returncode, 0, f"{args} succeeded")
        self.assertRegex(p.stderr, pattern)
        self.assertEqual(p.stdout, "")

    def test_stream_errors_say_what_to_write(self):
        base = ["stream", "--samples", 100, "--ranks", 4, "--batch", 8]
        self.expect_error(base + ["--rank", 4], r"--rank 4 is out of range: write a rank in \[0, 4\)")
        self.expect_error(base + ["--rank", 0, "--scheme", "random"], r"uniform.*strided")
        self.expect_error(["stream", "--ranks", 4, "--rank", 0], r"--samples")
        self.expect_error(base + ["--rank", 0, "--epochs", 0], r"--epochs")
        self.expect_error(base + ["--rank", 0, "--ranks-per-node", 5], r"--ranks-per-node")
        self.expect_error(["stream", "--samples", 10, "--batch", 20, "--drop-last", "--rank", 0],
                          r"--batch|--drop-last")
        self.expect_error(base + ["--rank", 0, "--start-epoch", 1], r"epoch")
        self.expect_error(base + ["--rank", "x"], r"--rank")

    def test_plan_errors_say_what_to_write(self):
        job = ["plan", "--ranks", 8, "--ranks-per-node", 4, "--batch", 64]
        self.expect_error(job + ["--synthetic", "100"], r"F:SIZE.*e\.g\.")
        self.expect_error(job + ["--synthetic", "1000:12 parsecs"], r"F:SIZE")
        self.expect_error(job, r"--synthetic F:SIZE or --sizes FILE")
        self.expect_error(job + ["--synthetic", "1000:100KB", "--node", 2], r"--node 2.*2 nodes")
        self.expect_error(job + ["--synthetic", "1000:100KB", "--samples", 999], r"--samples")
        self.expect_error(job + ["--synthetic", "1000:100KB", "--config", "/nonexistent.lua"],
                          r"nonexistent")


class PlanTest(unittest.TestCase):
    JOB = ["--seed", 5, "--epochs", 10, "--ranks", 8, "--ranks-per-node", 4, "--batch", 64]

    def plan(self, *extra):
        return run("plan", *self.JOB, *extra).stdout

    def test_plan_is_deterministic_across_threads(self):
        a = self.plan("--synthetic", "20000:100KB", "--threads", 1)
        b = self.plan("--synthetic", "20000:100KB", "--threads", 2)
        strip = lambda s: [l for l in s.splitlines() if not l.startswith("planned in")]
        self.assertEqual(strip(a), strip(b))

    def test_plan_reports_classes_and_sources(self):
        conf = os.path.join(ROOT, "contrib", "config", "demo.conf.lua")
        out = self.plan("--synthetic", "20000:100KB", "--config", conf, "--compute-rate", 500)
        self.assertRegex(out, r"node reads: 100000 accesses")  # 10 epochs x 20000 / 2 nodes
        self.assertRegex(out, r"(?m)^ram\s+\d+")
        m = re.search(r"sources: local ([\d.]+)%, peer ([\d.]+)%, pfs ([\d.]+)%", out)
        self.assertIsNotNone(m, out)
        self.assertAlmostEqual(sum(float(x) for x in m.groups()), 100.0, delta=0.2)

    def test_sizes_file(self):
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"nopfs-sizes-{os.getpid()}.txt")
        with open(path, "w") as fh:
            fh.write("# sizes\n" + "\n".join(str(1000 + k) for k in range(500)) + "\n")
        try:
            out = self.plan("--sizes", path)
            # 1000 + 1001 + ... + 1499 = 624,750 bytes.
            self.assertRegex(out, r"dataset: 500 samples, 625 KB")
            with open(path, "a") as fh:
                fh.write("twelve\n")
            p = run("plan", *self.JOB, "--sizes", path, check=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(f"{path}:502:", p.stderr)
        finally:
            os.unlink(path)


if __name__ == "__main__":
    NOPFS = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=1)
