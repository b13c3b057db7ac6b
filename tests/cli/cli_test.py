#!/usr/bin/env python3
"""Tests of the `nopfs` command as users meet it: `nopfs stream` replays exactly the access stream
that the independent reference (tests/reference/sampler_ref.py) computes, and bad arguments fail
with a message that says what to write instead.

Usage: cli_test.py PATH/TO/nopfs   (ctest passes the built binary)
"""

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
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
            n = min(rnd.randint(1, 9), f)  # more ranks than samples is refused
            b = rnd.randint(1, 40)
            scheme = rnd.choice(["uniform", "strided"])
            if scheme == "uniform" and (n - 1) * -(-b // n) >= b:
                b = n * -(-b // n)  # a batch that leaves the last rank empty is refused
            drop_last = rnd.random() < 0.5 and b <= f and (scheme == "uniform" or
                                                           f // n >= -(-b // n))
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
        want = reference_stream(1, 100, 2, 2, 0, 10, "strided", False)[:7]  # the default
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
        # Option sets where some rank would read nothing.
        self.expect_error(["stream", "--samples", 3, "--ranks", 5, "--batch", 5, "--rank", 0],
                          r"--ranks 5 is more than --samples 3.*write at most 3 --ranks")
        self.expect_error(["stream", "--samples", 100, "--ranks", 4, "--batch", 2, "--scheme",
                           "uniform", "--rank", 0],
                          r"--scheme uniform with --batch 2 and --ranks 4 leaves rank 3 without "
                          r"a sample.*write --scheme strided, or a --batch that is a multiple of "
                          r"--ranks \(4\)")
        self.expect_error(base + ["--rank", "x"], r"--rank")

    def test_plan_errors_say_what_to_write(self):
        job = ["plan", "--ranks", 8, "--ranks-per-node", 4, "--batch", 64]
        self.expect_error(job + ["--synthetic", "100"], r"F:SIZE.*e\.g\.")
        self.expect_error(job + ["--synthetic", "1000:12 parsecs"], r"F:SIZE")
        self.expect_error(job, r"--synthetic F:SIZE or --sizes FILE")
        self.expect_error(job + ["--synthetic", "1000:100K", "--node", 2], r"--node 2.*2 nodes")
        self.expect_error(job + ["--synthetic", "1000:100K", "--samples", 999], r"--samples")
        self.expect_error(job + ["--synthetic", "1000:100K", "--config", "/nonexistent.lua"],
                          r"nonexistent")


class PlanTest(unittest.TestCase):
    JOB = ["--seed", 5, "--epochs", 10, "--ranks", 8, "--ranks-per-node", 4, "--batch", 64]

    def plan(self, *extra):
        return run("plan", *self.JOB, *extra).stdout

    def test_config_asks_the_policy_about_a_jobs_memory_and_warns_of_a_missing_tier(self):
        conf = os.path.join(ROOT, "contrib", "slurm", "nopfs.conf.lua")
        policy = os.path.join(ROOT, "contrib", "slurm", "policy.lua")
        # The shipped policy grants a quarter of the job's memory: --mem=1000 is 1000 MiB.
        p = run("config", conf, "--policy", policy, "--partition", "batch", "--memory", "1000")
        self.assertIn("admit: ram 250 MiB,", p.stdout)
        p = run("config", conf, "--policy", policy, "--partition", "batch", "--memory", "2G")
        self.assertIn("admit: ram 512 MiB,", p.stdout)  # the partition's cap
        # An SSD path that is not on this machine: said, not refused.
        with tempfile.TemporaryDirectory() as tmp:
            missing = os.path.join(tmp, "no-such-ssd")
            with open(conf) as f:
                text = f.read().replace('"/local/nvme"', f'"{missing}"')
            with open(os.path.join(tmp, "n.conf.lua"), "w") as f:
                f.write(text)
            p = run("config", os.path.join(tmp, "n.conf.lua"))
            self.assertIn(f"warning: class ssd: {missing} is not a directory on this machine",
                          p.stderr)
            os.mkdir(missing)
            self.assertNotIn("warning", run("config", os.path.join(tmp, "n.conf.lua")).stderr)
        p = run("config", conf, "--policy", policy, "--memory", "12x", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("as for Slurm's --mem", p.stderr)

    def test_plan_is_deterministic_across_threads(self):
        a = self.plan("--synthetic", "20000:100K", "--threads", 1)
        b = self.plan("--synthetic", "20000:100K", "--threads", 2)
        strip = lambda s: [l for l in s.splitlines() if not l.startswith("planned in")]
        self.assertEqual(strip(a), strip(b))

    def test_plan_reports_classes_and_sources(self):
        conf = os.path.join(ROOT, "contrib", "config", "demo.conf.lua")
        out = self.plan("--synthetic", "20000:100K", "--config", conf, "--compute-rate", 500)
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
            # A bare number in a sizes file is bytes: 1000 + 1001 + ... + 1499 = 624,750 bytes.
            self.assertRegex(out, r"dataset: 500 samples, 610 KiB")
            with open(path, "a") as fh:
                fh.write("twelve\n")
            p = run("plan", *self.JOB, "--sizes", path, check=False)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(f"{path}:502:", p.stderr)
        finally:
            os.unlink(path)


def parse_kv(text):
    """One dict per `key=value` line of `nopfs simulate --format kv`."""
    rows = []
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split())
        rows.append(fields)
    return rows


class SimulateTest(unittest.TestCase):
    POLICIES = ["no-io", "frequency", "staging", "fill-once", "dataloader"]

    def tmpfile(self, name, text):
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"nopfs-{os.getpid()}-{name}")
        with open(path, "w") as fh:
            fh.write(text)
        self.addCleanup(os.unlink, path)
        return path

    def test_hand_computed_times(self):
        # One rank, three 1000-byte samples, batch 1; PFS 500 B/s (2 s a sample), staging write
        # 1 s a sample, compute 1 s a sample (docs/simulate.md works the example).
        conf = self.tmpfile("slow.conf.lua",
                            'pfs = "500B/s"\n'
                            'staging = { capacity = "1M", threads = 1, write = "1000B/s" }\n')
        out = run("simulate", "--config", conf, "--samples", 3, "--sizes", "fixed:1000B",
                  "--epochs", 1, "--batch", 1, "--compute-rate", "1000B/s",
                  "--loader-workers", 1, "--format", "kv").stdout
        rows = {r["policy"]: r for r in parse_kv(out)}
        self.assertEqual(list(rows), self.POLICIES)
        self.assertAlmostEqual(float(rows["no-io"]["total_s"]), 3)
        self.assertAlmostEqual(float(rows["staging"]["total_s"]), 10)
        self.assertAlmostEqual(float(rows["staging"]["stall_s"]), 7)
        self.assertAlmostEqual(float(rows["dataloader"]["total_s"]), 7)
        self.assertEqual(int(rows["staging"]["job_pfs_bytes"]), 3000)

    def test_kv_and_json_agree_and_are_consistent(self):
        sizes = self.tmpfile("sizes.txt", "\n".join(str(5000 + 37 * k) for k in range(3000)))
        dataset = sum(5000 + 37 * k for k in range(3000))
        args = ["simulate", "--sizes", f"file:{sizes}", "--nodes", 1, "--ranks-per-node", 2,
                "--epochs", 3, "--batch", 64, "--compute-rate", 800]
        rows = parse_kv(run(*args, "--format", "kv").stdout)
        doc = json.loads(run(*args, "--format", "json").stdout)
        self.assertEqual([r["policy"] for r in rows], self.POLICIES)
        self.assertEqual([p["policy"] for p in doc["policies"]], self.POLICIES)
        self.assertEqual(doc["dataset_bytes"], dataset)
        bound = float(rows[0]["total_s"])
        for r, j in zip(rows, doc["policies"]):
            epochs = [float(x) for x in r["epoch_s"].split(",")]
            self.assertEqual(len(epochs), 3)
            self.assertAlmostEqual(sum(epochs), float(r["total_s"]), delta=1e-4 * sum(epochs))
            self.assertAlmostEqual(float(r["total_s"]), j["total_s"], delta=1e-5 * j["total_s"])
            self.assertEqual(int(r["job_pfs_bytes"]), j["job_pfs_bytes"])
            self.assertEqual(int(r["dataset_bytes"]), dataset)
            self.assertGreaterEqual(float(r["total_s"]), bound * (1 - 1e-9))
            self.assertLessEqual(float(r["stall_median_s"]), float(r["stall_p99_s"]))
        by = {r["policy"]: r for r in rows}
        # One node reads the whole dataset each epoch: without a cache, every epoch from the PFS.
        self.assertEqual(int(by["staging"]["job_pfs_bytes"]), 3 * dataset)
        self.assertEqual(int(by["dataloader"]["job_pfs_bytes"]), 3 * dataset)
        self.assertEqual(int(by["no-io"]["job_pfs_bytes"]), 0)

    def test_json_writes_a_path_that_is_not_utf8_byte_for_byte(self):
        # The config's path is bytes: well-formed UTF-8 (2 to 4 bytes) as it is, every other byte
        # (stray, truncated, overlong, a surrogate, above U+10FFFF) as \udcXX, quotes and control
        # characters escaped (docs/service.md, "Status"). The text is UTF-8 that Python's json
        # reads, to the string os.fsdecode makes of the path; os.fsencode gives the bytes back.
        name = (b"bad\xffname \x80 \xe2\x82 \xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 "
                b"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \"q\\ \t\x01.conf.lua")
        tmp = tempfile.mkdtemp(prefix="nopfs-json-")
        self.addCleanup(shutil.rmtree, tmp)
        conf = os.path.join(os.fsencode(tmp), name)
        with open(conf, "w") as fh:
            fh.write("pfs = 500\n")
        p = subprocess.run([NOPFS, "simulate", "--config", conf, "--samples", "3", "--format",
                            "json"], capture_output=True, timeout=120, check=True)
        text = p.stdout.decode("utf-8")  # strict: the text itself is well-formed UTF-8
        self.assertIn("bad\\udcffname \\udc80 \\udce2\\udc82 ", text)
        self.assertIn("caf\u00e9 \u20ac \U0001f600 \\\"q\\\\ \\t\\u0001.conf", text)
        config = json.loads(text)["config"]
        self.assertEqual(config, os.fsdecode(conf))
        self.assertEqual(os.fsencode(config), conf)

    def test_table_and_policy_subset(self):
        out = run("simulate", "--samples", 5000, "--epochs", 2, "--policies",
                  "staging,no-io").stdout
        self.assertRegex(out, r"nopfs simulate: 1 nodes x 1 ranks, 5000 samples")
        self.assertRegex(out, r"(?m)^policy\s+epoch1_s\s+later_s\s+total_s")
        self.assertRegex(out, r"(?m)^staging\s+[\d.]+")
        self.assertRegex(out, r"(?m)^no-io\s+[\d.]+")
        self.assertNotRegex(out, r"(?m)^frequency")

    def test_preset_at_1024_nodes(self):
        rows = parse_kv(run("simulate", "--preset", "imagenet1k-lassen", "--nodes", 1024,
                            "--epochs", 2, "--format", "kv").stdout)
        self.assertEqual(len(rows), 5)
        for r in rows:
            self.assertEqual(r["nodes"], "1024")
            self.assertEqual(r["ranks_per_node"], "4")
            self.assertEqual(r["samples"], "1281167")
            self.assertEqual(r["batch"], str(120 * 4096))
        by = {r["policy"]: r for r in rows}
        # Symmetry: the job's PFS bytes are the node's times the nodes.
        self.assertEqual(int(by["staging"]["job_pfs_bytes"]),
                         1024 * int(by["staging"]["node_pfs_bytes"]))

    STARTUP_LINE = (r"one scan per job: link ([\d.]+) s \+ root ([\d.]+) s \+ walk ([\d.]+) s \+ "
                    r"exchange ([\d.]+) s \+ catalog ([\d.]+) s = ([\d.]+) s; (\d+) metadata "
                    r"operations")

    def startup(self, *args):
        out = run("simulate", "--preset", "imagenet1k-lassen", "--startup", *args).stdout
        m = re.search(self.STARTUP_LINE, out)
        self.assertIsNotNone(m, out)
        link, root, walk, exchange, catalog, total = (float(m.group(i)) for i in range(1, 7))
        self.assertAlmostEqual(total, link + root + walk + exchange + catalog, delta=0.0026)
        return m, out

    def test_startup_at_1024_nodes(self):
        # ImageNet-1k, one scan per job: the peer link's start (0.45 s and 1,023 handshakes of
        # 2 ms each by default), then the walk, one class of ~1,283 stats on 8 threads, then
        # the catalog built from the parts (0.8 us per sample by default).
        m, out = self.startup("--nodes", 1024)
        self.assertEqual(m.group(1), "2.496")
        self.assertEqual(m.group(3), "0.161")
        self.assertEqual(m.group(5), "1.025")
        self.assertLess(float(m.group(6)), 5.0)
        self.assertLessEqual(int(m.group(7)), 1.05 * 1281167)
        self.assertIn("peer link 450 ms + 2.00 ms per other node, catalog 0.80 us per sample", out)
        alone = re.search(r"every node alone: ([\d.]+) s; (\d+) metadata", out)
        self.assertGreater(int(alone.group(2)), 1000 * 1281167)
        self.expect_error(["simulate", "--samples", 100, "--startup", "--classes", 101],
                          r"classes must be 1\.\.files")

    def test_startup_link_term(self):
        # One node has no peers, so no link; each further node adds one handshake's cost.
        m, _ = self.startup("--nodes", 1)
        self.assertEqual(m.group(1), "0.000")
        m, _ = self.startup("--nodes", 2, "--link-start-ms", 300, "--link-per-peer-ms", 10)
        self.assertEqual(m.group(1), "0.310")
        m, _ = self.startup("--nodes", 101, "--link-start-ms", 300, "--link-per-peer-ms", 10)
        self.assertEqual(m.group(1), "1.300")
        m, _ = self.startup("--nodes", 1024, "--link-start-ms", 0, "--link-per-peer-ms", 0,
                            "--catalog-us-per-sample", 0)
        self.assertEqual(m.group(1), "0.000")
        self.assertEqual(m.group(5), "0.000")
        self.assertEqual(m.group(6), "0.293")
        # The catalog's term is files x the CPU per sample, on one node (alone) as on many.
        for nodes in (1, 1024):
            m, _ = self.startup("--nodes", nodes, "--catalog-us-per-sample", 2)
            self.assertEqual(m.group(5), "2.562")
        for option in ("--link-start-ms", "--link-per-peer-ms"):
            self.expect_error(["simulate", "--samples", 100, "--nodes", 4, "--startup", option,
                               -1], option + r" -1 is not a time: write the milliseconds")
        self.expect_error(["simulate", "--samples", 100, "--nodes", 4, "--startup",
                           "--catalog-us-per-sample", -1],
                          r"--catalog-us-per-sample -1 is not a time: write the microseconds")

    def test_simulate_errors_say_what_to_write(self):
        self.expect_error(["simulate", "--sizes", "huge"], r"fixed:SIZE, lognormal:MEAN")
        self.expect_error(["simulate"], r"needs --samples F")
        self.expect_error(["simulate", "--samples", 100, "--policies", "lru"],
                          r"--policies.*no-io, frequency, staging, fill-once")
        self.expect_error(["simulate", "--samples", 100, "--compute-rate", "fast"],
                          r"samples/s per rank")
        self.expect_error(["simulate", "--preset", "imagenet"], r"imagenet1k-lassen")
        self.expect_error(["simulate", "--samples", 100, "--format", "xml"], r"table, kv or json")
        self.expect_error(["simulate", "--samples", 100, "--nodes", 2, "--node", 2],
                          r"node 2 is out of range")

    PLACEMENT = ["simulate", "--preset", "imagenet1k-lassen", "--placement"]

    def test_placement_saves_pfs_bytes_at_every_cluster_size(self):
        args = [*self.PLACEMENT, "--cluster-nodes", "64,1024", "--runs", 5, "--format", "kv"]
        out = run(*args).stdout
        self.assertEqual(out, run(*args).stdout)  # a seed gives the same figures
        rows = {(r["cluster_nodes"], r["placement"]): r for r in parse_kv(out)}
        self.assertEqual(len(rows), 6)
        for cluster in ("64", "1024"):
            off, prefer, require = (rows[(cluster, p)] for p in ("off", "prefer", "require"))
            for r in (off, prefer, require):
                self.assertEqual(r["runs"], "5")
                # 32 jobs, and a start again for each requeue.
                self.assertEqual(int(r["starts"]), 5 * 32 + int(r["requeues"]))
                # Without any kept copy every start reads the dataset (135 GB) in its first epoch.
                self.assertAlmostEqual(float(r["cold_bytes"]) / (int(r["starts"]) / 5), 135e9,
                                       delta=1e9)
                self.assertAlmostEqual(float(r["saved_share"]),
                                       1 - float(r["first_epoch_pfs_bytes"]) /
                                       float(r["cold_bytes"]), places=4)
                self.assertGreaterEqual(float(r["wait_p95_s"]), 0)
            self.assertGreater(float(prefer["saved_share"]), float(off["saved_share"]) + 0.3)
            self.assertGreaterEqual(float(require["saved_share"]), float(prefer["saved_share"]))
            self.assertGreaterEqual(float(require["wait_mean_s"]), float(prefer["wait_mean_s"]))
        # On 1,024 nodes a job lands on its data by chance almost never.
        self.assertLess(float(rows[("1024", "off")]["saved_share"]), 0.1)
        table = run(*self.PLACEMENT, "--cluster-nodes", 128, "--runs", 2,
                    "--placements", "prefer").stdout
        self.assertRegex(table, r"\n +128 prefer +\d")
        self.assertNotIn(" off ", table)
        doc = json.loads(run(*self.PLACEMENT, "--cluster-nodes", 64, "--runs", 2, "--format",
                             "json").stdout)
        self.assertEqual([r["placement"] for r in doc["results"]], ["off", "prefer", "require"])

    def test_placement_a_warm_node(self):
        # n1 of three idle nodes holds the user's copy (100 GB, the whole dataset, within the
        # default quota of a tenth of the SSD): prefer and require land there at once and read
        # nothing from the PFS in the first epoch.
        args = ["simulate", "--samples", 1000, "--sizes", "fixed:100000000B", "--placement",
                "--ssd", "1T", "--cluster-nodes", 3, "--warm-nodes", 1, "--sweep-jobs", 1,
                "--background-load", 0, "--requeue", 0,
                "--runs", 1, "--format", "kv"]
        rows = {r["placement"]: r for r in parse_kv(run(*args).stdout)}
        for p in ("prefer", "require"):
            self.assertEqual(rows[p]["warm_starts"], "1")
            self.assertEqual(rows[p]["first_epoch_pfs_bytes"], "0")
            self.assertEqual(rows[p]["wait_mean_s"], "0")
        self.assertEqual(rows["off"]["cold_bytes"], "1e+11")

    def test_placement_errors_say_what_to_write(self):
        base = ["simulate", "--samples", 100, "--placement"]
        self.expect_error(base, r"no SSD class; write --ssd SIZE")
        ssd = [*base, "--ssd", "1T"]
        self.expect_error([*ssd, "--cluster-nodes", "64,x"],
                          r"--cluster-nodes \"64,x\" is not a list of whole numbers: write e\.g\.")
        self.expect_error([*ssd, "--placements", "soft"], r"off, prefer or require")
        self.expect_error([*ssd, "--background-load", 1], r"--background-load 1 .*\[0, 1\)")
        self.expect_error([*ssd, "--requeue", 2], r"--requeue 2 .*\[0, 1\)")
        self.expect_error([*ssd, "--job-hours", 0], r"--job-hours 0 is not a duration")
        self.expect_error([*ssd, "--cluster-nodes", 64, "--nodes", 100],
                          r"--nodes 100 does not fit a cluster of 64 nodes: write 1\.\.64")
        self.expect_error([*ssd, "--job-ssd", "2T"], r"--job-ssd is larger than --ssd")
        self.expect_error([*ssd, "--keep-lifetime", "7w"], r"--keep-lifetime")
        self.expect_error([*ssd, "--cluster-nodes", 4, "--warm-nodes", 4],
                          r"warm node 4 is not a node of the cluster: write 0\.\.3")
        self.expect_error([*ssd, "--ssd", "lots"], r"--ssd")

    def expect_error(self, args, pattern):
        p = run(*args, check=False)
        self.assertNotEqual(p.returncode, 0, f"{args} succeeded")
        self.assertRegex(p.stderr, pattern)
        self.assertEqual(p.stdout, "")


class PlannerRunTest(unittest.TestCase):
    """The node config's `planner` reaches nopfsd: each planner serves every rank its exact
    stream with the files' bytes, and only the tiered ones serve from the RAM tier."""

    JOB = ["--seed", 3, "--epochs", 3, "--batch", 8]

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="nopfs-planner-test-")
        rnd = random.Random(7)
        cls.root = os.path.join(cls.tmp, "data")
        for k in range(200):
            d = os.path.join(cls.root, f"class{k % 3}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"img{k:04d}.bin"), "wb") as fh:
                fh.write(rnd.randbytes(rnd.randint(100, 20000)))
        for dirpath, _, files in os.walk(cls.tmp):
            os.chmod(dirpath, 0o777)
            for f in files:
                os.chmod(os.path.join(dirpath, f), 0o644)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_planner(self, planner):
        work = tempfile.mkdtemp(prefix=f"{planner}-", dir=self.tmp)
        os.chmod(work, 0o777)
        conf = os.path.join(work, "node.conf.lua")
        with open(conf, "w") as fh:
            fh.write(f'planner = "{planner}"\n'
                     'staging = { capacity = "16M", threads = 2 }\n'
                     'classes = { ram { capacity = "8M", threads = 2 } }\n')
        os.chmod(conf, 0o644)
        out = os.path.join(work, "out")
        run_dir = os.path.join(work, "run")
        argv = [NOPFS, "run", "--dataset", self.root, "--ranks", 2, *self.JOB, "--config", conf,
                "--run-dir", run_dir, "--keep-run-dir", "--",
                "sh", "-c", f"exec {NOPFS} cat --verify --print > {out}.$NOPFS_RANK"]
        argv = [str(a) for a in argv]
        if os.geteuid() == 0:  # nopfsd runs as the job's user, never as root
            argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"] + argv
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        for rank in range(2):
            with open(f"{out}.{rank}") as fh:
                lines = fh.read().strip().split("\n")
            self.assertRegex(lines[-1], r"^\d+ samples, \d+ bytes, 0 mismatches$")
            stream = run("stream", *self.JOB, "--samples", 200, "--ranks", 2, "--rank", rank)
            self.assertEqual([int(l.split()[0]) for l in lines[:-1]],
                             [int(x) for x in stream.stdout.split()])
        with open(os.path.join(run_dir, "nopfsd.log")) as fh:
            self.assertIn(f"plan ({planner}):", fh.read())
        m = re.search(r"(?m)^ram\s+(\d+)", p.stdout)
        self.assertIsNotNone(m, p.stdout)
        return int(m.group(1))

    def test_staging_serves_nothing_from_tiers(self):
        self.assertEqual(self.run_planner("staging"), 0)

    def test_fill_once_and_frequency_serve_from_ram(self):
        # The RAM tier holds the whole dataset: after the first epoch every read can be local.
        for planner in ("fill-once", "frequency"):
            self.assertGreater(self.run_planner(planner), 0, planner)


class AdminTest(unittest.TestCase):
    """`nopfs admin status` reads slurm.conf as Slurm does, its Include lines too."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="nopfs-admin-")
        self.addCleanup(shutil.rmtree, self.dir)
        self.line = os.path.join(self.dir, "nopfs.conf")
        with open(self.line, "w") as f:
            f.write("optional /nonexistent/spank_nopfs.so\n")

    def write(self, name, text):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    def missing(self):
        r = run("admin", "status", "--line", self.line, "--plugstack-dir", self.dir,
                "--slurm-conf", os.path.join(self.dir, "slurm.conf"))
        return [line for line in r.stdout.splitlines() if line.startswith("missing: ")]

    def flags_missing(self):
        return [m for m in self.missing() if "PrologFlags=Alloc" in m]

    def test_prolog_flags_come_from_included_files(self):
        # Relative to slurm.conf's directory, in either case of the keyword.
        self.write("slurm.conf", "ClusterName=lab\ninclude flags.conf  \n")
        self.write("flags.conf", "# site flags\nPrologFlags=Contain,Alloc\n")
        self.assertEqual(self.flags_missing(), [])
        # %c is the cluster's name.
        self.write("slurm.conf", "ClusterName=lab\nInclude %c_flags.conf\n")
        self.write("lab_flags.conf", "prologflags=alloc\n")
        self.assertEqual(self.flags_missing(), [])
        # An absolute name, nested: the last assignment wins, wherever it is.
        self.write("slurm.conf", f"PrologFlags=Alloc\nInclude {self.dir}/late.conf\n")
        self.write("late.conf", "Include later.conf\n")
        self.write("later.conf", "PrologFlags=Serial\n")
        self.assertEqual(len(self.flags_missing()), 1, self.missing())
        self.write("slurm.conf", "Include late.conf\nPrologFlags=Alloc\n")
        self.assertEqual(self.flags_missing(), [])

    def test_an_include_that_cannot_be_read_is_named(self):
        self.write("slurm.conf", "PrologFlags=Alloc\nInclude absent.conf\n")
        self.assertIn(f"missing: {self.dir}/absent.conf: cannot be read (give slurm.conf with "
                      "--slurm-conf FILE)", self.missing())
        self.write("slurm.conf", "PrologFlags=Alloc\nInclude slurm.conf\n")
        self.assertTrue(any("deep (an Include loop?)" in m for m in self.missing()),
                        self.missing())

if __name__ == "__main__":
    NOPFS = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=1)
