#!/usr/bin/env python3
"""nopfsd end to end, through `nopfs run` and `nopfs cat`, on generated datasets with real files,
real shared memory, a real SSD directory and real RocksDB.

What a user relies on, checked here:
- every byte delivered equals the file's bytes (`nopfs cat --verify`), for an ImageFolder tree and
  for a manifest with offsets into one large file;
- each rank receives its samples in exactly the planned order (`nopfs stream`);
- a RAM tier smaller than the dataset, an SSD tier, both, and none;
- 4 local ranks at once, a slow client, a client killed mid-epoch;
- a vanished or unreadable file: a clear error naming the sample and the path, the rest served;
- a corrupted SSD copy: detected and refetched from the PFS;
- SIGTERM mid-prefetch; nothing left behind after stop.

nopfsd refuses to run as root, as it should: when this test runs as root it runs every nopfs
command as the unprivileged user `nobody` (setpriv), on files that user can read.

Usage: service_test.py BUILD_BIN_DIR
"""

import glob
import hashlib
import json
import os
import pwd
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import unittest

BIN = None
AS_ROOT = os.geteuid() == 0


def demote_argv(argv):
    if not AS_ROOT:
        return argv
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"] + argv


def nopfs(*args, check=True, timeout=300, env=None):
    argv = demote_argv([os.path.join(BIN, "nopfs"), *map(str, args)])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {p.returncode}\nstdout:\n{p.stdout}\n"
                             f"stderr:\n{p.stderr}")
    return p


def read(path):
    with open(path) as fh:
        return fh.read()


def make_world_readable(path):
    for root, dirs, files in os.walk(path):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)


class Dataset:
    """An ImageFolder tree: `classes` folders of files with varied sizes and random bytes."""

    def __init__(self, root, files=600, classes=7, seed=1, max_size=40000):
        self.root = root
        rnd = random.Random(seed)
        self.files = []
        for k in range(files):
            cls = f"class{k % classes:02d}"
            os.makedirs(os.path.join(root, cls), exist_ok=True)
            # Mostly small, a few larger: like images.
            size = int(rnd.lognormvariate(8.5, 1.0)) % max_size + 1
            path = os.path.join(root, cls, f"img{k:05d}.bin")
            with open(path, "wb") as fh:
                fh.write(rnd.randbytes(size))
            self.files.append(path)
        make_world_readable(root)


# Run as a rank: finds the RAM tier's memfd among nopfsd's descriptors, reopens it read-write
# and tries to write it every way the kernel offers; reports each attempt.
SCRIBBLER = r"""
import mmap, os, sys, time
pid = open(sys.argv[1]).read().strip()
fd_dir = f"/proc/{pid}/fd"
tier = None
for n in os.listdir(fd_dir):
    try:
        target = os.readlink(os.path.join(fd_dir, n))
    except OSError:
        continue
    if target.startswith("/memfd:nopfs-") and "-ram" in target:
        tier = os.path.join(fd_dir, n)
if tier is None:
    sys.exit("no RAM tier memfd in " + fd_dir)
fd = os.open(tier, os.O_RDWR)
size = os.fstat(fd).st_size
print("found the tier", tier, size, flush=True)
junk = bytes([0xEE]) * 4096
try:
    os.pwrite(fd, junk, 0)
    print("write: scribbled", flush=True)
except PermissionError:
    print("write: refused", flush=True)
try:
    m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    print("mmap: scribbled", flush=True)
    end = time.time() + 3
    while time.time() < end:
        for off in range(0, size - 4096, 1 << 16):
            m[off:off + 4096] = junk
except PermissionError:
    print("mmap: refused", flush=True)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
if addr in (None, ctypes.c_void_p(-1).value):
    print("mprotect: no read-only mapping", flush=True)
elif libc.mprotect(addr, size, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
    print("mprotect: refused", flush=True)
else:
    print("mprotect: scribbled", flush=True)
    ctypes.memset(addr, 0xEE, min(size, 1 << 20))
"""


def launcher(work, name, extra):
    """A directory <work>/bin-<name> with a copy of `nopfs` and a `nopfsd` that runs the real one
    with `extra` appended (`nopfs run` starts the nopfsd beside itself)."""
    d = os.path.join(work, "bin-" + name)
    os.mkdir(d)
    shutil.copy2(os.path.join(BIN, "nopfs"), os.path.join(d, "nopfs"))
    with open(os.path.join(d, "nopfsd"), "w") as fh:
        fh.write(f'#!/bin/sh\nexec {os.path.join(BIN, "nopfsd")} "$@" {" ".join(extra)}\n')
    os.chmod(os.path.join(d, "nopfsd"), 0o755)
    os.chmod(d, 0o755)
    return d


def write_config(path, ram=None, ssd=None, ssd_path=None, staging="64M", prefetch_threads=2,
                 staging_threads=2):
    classes = []
    if ram:
        classes.append(f'ram {{ capacity = "{ram}", threads = {prefetch_threads} }}')
    if ssd:
        classes.append(f'ssd {{ path = "{ssd_path}", capacity = "{ssd}", '
                       f'threads = {prefetch_threads} }}')
    with open(path, "w") as fh:
        fh.write(f'staging = {{ capacity = "{staging}", threads = {staging_threads} }}\n')
        fh.write("classes = { " + ", ".join(classes) + " }\n")
    os.chmod(path, 0o644)


class ServiceTest(unittest.TestCase):
    JOB = ["--seed", 11, "--epochs", 2, "--batch", 16]

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="nopfs-service-test-")
        os.chmod(cls.tmp, 0o755)
        cls.data = Dataset(os.path.join(cls.tmp, "imagefolder"))
        cls.total_bytes = sum(os.path.getsize(f) for f in cls.data.files)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="case-", dir=self.tmp)
        os.chmod(self.work, 0o777)
        self.scratch = os.path.join(self.work, "scratch")
        os.mkdir(self.scratch)
        os.chmod(self.scratch, 0o777)

    def stream(self, rank, ranks):
        p = nopfs("stream", *self.JOB, "--samples", len(self.data.files), "--ranks", ranks,
                  "--rank", rank)
        return [int(x) for x in p.stdout.split()]

    def run_cat(self, ranks, config, dataset=None, cat_args=("--verify", "--print"), check=True,
                extra=()):
        """Runs `nopfs run ... -- sh -c 'nopfs cat ... > out.RANK'` and returns (proc, outputs)."""
        out = os.path.join(self.work, "out")
        cmd = (f'exec {os.path.join(BIN, "nopfs")} cat {" ".join(cat_args)} '
               f'> {out}.$NOPFS_RANK 2> {out}.$NOPFS_RANK.err')
        p = nopfs("run", "--dataset", dataset or self.data.root, "--ranks", ranks, *self.JOB,
                  "--config", config, "--run-dir", os.path.join(self.work, "run"), *extra, "--",
                  "sh", "-c", cmd, check=check)
        outputs = {}
        for r in range(ranks):
            with open(f"{out}.{r}") as fh:
                o = fh.read()
            with open(f"{out}.{r}.err") as fh:
                e = fh.read()
            outputs[r] = (o, e)
        return p, outputs

    def check_rank_output(self, rank, ranks, text, expect_ids=None):
        lines = text.strip().split("\n")
        summary = lines[-1]
        m = re.fullmatch(r"(\d+) samples, (\d+) bytes, (\d+) mismatches", summary)
        self.assertIsNotNone(m, f"last line: {summary!r}")
        ids = [int(l.split()[0]) for l in lines[:-1]]
        sizes = [int(l.split()[2]) for l in lines[:-1]]
        self.assertEqual(ids, expect_ids if expect_ids is not None else self.stream(rank, ranks))
        self.assertEqual(int(m.group(1)), len(ids))
        self.assertEqual(int(m.group(2)), sum(sizes))
        self.assertEqual(int(m.group(3)), 0)
        return ids

    def assert_nothing_left(self):
        self.assertEqual(os.listdir(self.scratch), [], "SSD files left behind")
        run = os.path.join(self.work, "run")
        if os.path.isdir(run):
            left = [f for f in os.listdir(run) if not f.startswith("nopfsd.log")]
            self.assertEqual(left, [], f"left in the run directory: {left}")

    def summary(self, proc):
        served = dict(re.findall(r"^(\w+)\s+\d+\s+([\d.]+ (?:[KMGTP]i)?B)$", proc.stdout, re.M))
        return proc.stdout, served

    def test_four_ranks_ram_tier_smaller_than_dataset(self):
        conf = os.path.join(self.work, "ram.conf.lua")
        write_config(conf, ram=f"{self.total_bytes // 3}B")
        p, outs = self.run_cat(4, conf)
        for r in range(4):
            self.check_rank_output(r, 4, outs[r][0])
        self.assertRegex(p.stdout, r"(?m)^ram\s+[1-9]\d*\s")
        self.assertRegex(p.stdout, r"(?m)^pfs\s+[1-9]\d*\s")
        self.assertRegex(p.stdout, r"stall: total")
        self.assert_nothing_left()

    def test_ssd_and_ram_tiers(self):
        conf = os.path.join(self.work, "ssd.conf.lua")
        write_config(conf, ram=f"{self.total_bytes // 5}B", ssd="1G", ssd_path=self.scratch)
        p, outs = self.run_cat(2, conf)
        for r in range(2):
            self.check_rank_output(r, 2, outs[r][0])
        self.assertRegex(p.stdout, r"(?m)^ssd\s+[1-9]\d*\s")
        self.assert_nothing_left()

    def test_pfs_read_about_once_when_the_tiers_hold_the_dataset(self):
        # RAM and SSD together hold the whole dataset; one prefetch thread per tier fills them
        # while four staging threads read ahead for the clients. Whoever reads a sample first from
        # the PFS (prefetcher, or staging with fetch-and-cache) keeps it, so over two epochs the
        # PFS serves about one dataset. (Here the files are in the page cache and the prefetchers
        # usually win the race; sample_reader_test covers staging reads that come first.)
        conf = os.path.join(self.work, "race.conf.lua")
        write_config(conf, ram=f"{self.total_bytes // 2}B", ssd="1G", ssd_path=self.scratch,
                     prefetch_threads=1, staging_threads=4)
        p, outs = self.run_cat(2, conf)
        for r in range(2):
            self.check_rank_output(r, 2, outs[r][0])
        m = re.search(r"(?m)^pfs read in all \(prefetch included\): ([\d.]+) ((?:[KMGTP]i)?B)$",
                      p.stdout)
        self.assertIsNotNone(m, p.stdout)
        scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m.group(2)]
        pfs = float(m.group(1)) * scale
        self.assertLessEqual(pfs, 1.05 * self.total_bytes, p.stdout)
        self.assertGreaterEqual(pfs, 0.95 * self.total_bytes, p.stdout)
        self.assert_nothing_left()

    def test_status_watch_and_the_plan_line(self):
        """`nopfs run` prints the plan line; `nopfs status` shows per tier bytes staged of planned,
        a rate and an ETA; `--watch` appends progress lines when its output is a file, draws bars
        in place on a terminal, and ends by itself when nopfsd goes away."""
        conf = os.path.join(self.work, "watch.conf.lua")
        write_config(conf, ram=f"{self.total_bytes // 2}B")
        out = os.path.join(self.work, "w")
        nopfs_bin = os.path.join(BIN, "nopfs")
        script = (
            f"{nopfs_bin} status --watch --interval 0.1 > {out}.watch 2>&1 & "
            f"until {nopfs_bin} status | grep -q 'tier ram: .*prefetch done'; do sleep 0.05; done; "
            f"{nopfs_bin} status > {out}.text; {nopfs_bin} status --json > {out}.json; "
            f"script -q -c '{nopfs_bin} status --watch --interval 0.1' /dev/null > {out}.tty & "
            f"sleep 0.5; kill $!; "
            f"timeout 0.5 {nopfs_bin} status --watch --json --interval 0.1 > {out}.jsonl; "
            f"{nopfs_bin} cat > /dev/null")
        p = nopfs("run", "--dataset", self.data.root, "--ranks", 1, *self.JOB, "--config", conf,
                  "--", "bash", "-c", script)
        status = json.loads(read(out + ".json"))
        ram = status["tiers"][0]
        self.assertEqual((ram["name"], ram["prefetch"], ram["eta_ns"]), ("ram", "done", 0), status)
        self.assertEqual(ram["ready_bytes"], ram["planned_bytes"], status)
        self.assertGreater(ram["planned_bytes"], 0, status)
        # The plan line, on nopfs run's standard error, from the same report.
        size = r"[\d.]+ (?:[KMGTP]i)?B"  # as nopfs prints sizes: 512 B, 1.50 GiB
        plan = re.search(rf"(?m)^nopfs: plan: node 0 of 1, dataset {size}; tiers: ram "
                         rf"({size}) of {size} \((\d+) samples\); .* to stage; "
                         r"predicted stall [\d.]+ \w+ \(a client that takes no time per sample\)$",
                         p.stderr)
        self.assertIsNotNone(plan, p.stderr)
        self.assertEqual(int(plan.group(2)), ram["planned_samples"], p.stderr)
        # The prose shows the same progress line as the watch.
        self.assertRegex(read(out + ".text"),
                         rf"(?m)^staging ram: {size} of {size} staged \(100%\), "
                         rf"{size}/s, done$")
        # The watch ran until nopfsd stopped, then said so (it may still be finishing).
        deadline = time.monotonic() + 20
        while "nopfsd has gone away" not in read(out + ".watch") and time.monotonic() < deadline:
            time.sleep(0.1)
        watch = read(out + ".watch")
        self.assertIn("nopfs status: nopfsd has gone away", watch)
        lines = [x for x in watch.splitlines() if x.startswith("staging ram:")]
        self.assertGreater(len(lines), 1, watch)
        self.assertNotIn("\033", watch)  # plain lines in a file
        self.assertRegex(lines[-1], r"staged \(100%\), .* done$")
        # With --json, one object per refresh and line.
        objects = [json.loads(x) for x in read(out + ".jsonl").splitlines()]
        self.assertGreater(len(objects), 1, objects)
        self.assertTrue(all(o["tiers"][0]["prefetch"] == "done" for o in objects), objects)
        # On a terminal: bars, each refresh drawn over the previous one.
        tty = read(out + ".tty")
        self.assertRegex(tty, r"staging ram: \[#{20}\] ")
        self.assertIn("\033[1A", tty)
        self.assertIn("\033[2K", tty)

    def test_metrics_file_agrees_with_the_status(self):
        """With metrics_dir set, nopfsd writes nopfs_<job>.prom (Prometheus text format, parsed
        here by prometheus_client's own parser); once the traffic stopped, the file written after
        a `nopfs status --json` holds the same figures, and the file goes when nopfsd stops."""
        from prometheus_client.parser import text_string_to_metric_families
        # A directory of the user's own that nobody else may write: nopfsd makes its file there.
        metrics = os.path.join(self.work, "metrics")
        os.mkdir(metrics)
        os.chmod(metrics, 0o755)
        if AS_ROOT:
            os.chown(metrics, pwd.getpwnam("nobody").pw_uid, -1)
        conf = os.path.join(self.work, "metrics.conf.lua")
        write_config(conf, ram=f"{self.total_bytes // 2}B")
        with open(conf, "a") as fh:
            fh.write(f'metrics_dir = "{metrics}"\n')
        prom = os.path.join(metrics, "nopfs_local.prom")
        out = os.path.join(self.work, "m")
        nopfs_bin = os.path.join(BIN, "nopfs")
        # All the traffic first (a rank's whole stream), then the status, then wait for the file
        # nopfsd writes after it (every 5 s), and keep a copy.
        script = (
            f"until {nopfs_bin} status | grep -q 'tier ram: .*prefetch done'; do sleep 0.05; done; "
            f"{nopfs_bin} cat --verify > {out} 2> {out}.err; "
            f"{nopfs_bin} status --json > {out}.status; touch {out}.mark; sleep 0.02; "
            f"until [ {prom} -nt {out}.mark ]; do sleep 0.1; done; cp {prom} {out}.prom")
        p = nopfs("run", "--dataset", self.data.root, "--ranks", 1, *self.JOB, "--config", conf,
                  "--", "bash", "-c", script)
        status = json.loads(read(out + ".status"))

        def samples(text):
            found = {}
            for family in text_string_to_metric_families(text):
                for smp in family.samples:
                    labels = dict(smp.labels)
                    for key in ("slurm_job_id", "slurm_user", "slurm_node"):
                        found.setdefault(key, set()).add(labels.pop(key))
                    found[(smp.name, tuple(sorted(labels.items())))] = smp.value
            return found

        m = samples(read(out + ".prom"))
        user = "nobody" if AS_ROOT else pwd.getpwuid(os.geteuid()).pw_name
        self.assertEqual(m["slurm_job_id"], {"local"})
        self.assertEqual(m["slurm_user"], {user})
        self.assertEqual(m["slurm_node"], {socket.gethostname()})
        version = subprocess.run([os.path.join(BIN, "nopfsd"), "--version"], capture_output=True,
                                 text=True, check=True).stdout.split()[-1]
        self.assertEqual(m[("nopfs_build_info", (("version", version),))], 1)
        self.assertLess(abs(m[("nopfs_start_time_seconds", ())] - time.time()), 600)
        for src in status["sources"]:
            key = (("source", src["name"]),)
            self.assertEqual(m[("nopfs_served_samples_total", key)], src["samples"], src)
            self.assertEqual(m[("nopfs_served_bytes_total", key)], src["bytes"], src)
        self.assertGreater(sum(s["samples"] for s in status["sources"]), 0, status)
        hist = status["stall"]["histogram"]
        self.assertEqual(m[("nopfs_stall_seconds_count", ())], sum(hist))
        self.assertGreater(sum(hist), 0)
        self.assertAlmostEqual(m[("nopfs_stall_seconds_sum", ())],
                               status["stall"]["total_ns"] / 1e9, places=9)
        for b in range(41):
            le = (("le", repr(float(2 ** b) / 1e9)),)
            got = [v for (name, lab), v in
                   ((k, v) for k, v in m.items() if isinstance(k, tuple))
                   if name == "nopfs_stall_seconds_bucket" and lab[0][1] != "+Inf"
                   and abs(float(lab[0][1]) - 2 ** b / 1e9) < 1e-15]
            self.assertEqual(got, [sum(hist[:b + 1])], (b, le))
        self.assertEqual(m[("nopfs_stall_seconds_bucket", (("le", "+Inf"),))], sum(hist))
        for t in status["tiers"]:
            key = (("tier", t["name"]),)
            self.assertEqual(m[("nopfs_tier_capacity_bytes", key)], t["capacity_bytes"], t)
            self.assertEqual(m[("nopfs_tier_used_bytes", key)], t["planned_bytes"], t)
            self.assertEqual(m[("nopfs_tier_ready_bytes", key)], t["ready_bytes"], t)
            self.assertEqual(m[("nopfs_tier_ready_samples", key)], t["ready_samples"], t)
            self.assertEqual(m[("nopfs_staging_eta_seconds", key)], 0, t)  # prefetch done
            self.assertIn(("nopfs_staging_rate_bytes_per_second", key), m)
        self.assertEqual(m[("nopfs_pfs_read_bytes_total", ())], status["pfs_bytes"])
        self.assertIsNone(status["peers"])
        self.assertEqual(m[("nopfs_peer_reads_total", (("direction", "fetched"),))], 0)
        self.assertEqual(m[("nopfs_peer_failures_total", (("kind", "timeout"),))], 0)
        for kind, field in (("owner", "owners"), ("stream", "streams"),
                            ("connection", "connections"), ("timed_out", "timed_out")):
            self.assertEqual(m[("nopfs_refusals_total", (("kind", kind),))],
                             status["refusals"][field], kind)
        # The file nopfsd made itself goes with it: no series of a finished `nopfs run` stays
        # in node_exporter's view (nothing else was ever made beside it: rewritten in place).
        self.assertEqual(os.listdir(metrics), [])

    def test_ram_tier_samples_are_served_in_place(self):
        # Once the RAM tier is filled, every sample of the stream is handed to the client in
        # place (the client maps the tier read-only; zero copy), and its bytes are still the
        # file's (--verify).
        conf = os.path.join(self.work, "zc.conf.lua")
        write_config(conf, ram=f"{2 * self.total_bytes}B")
        out = os.path.join(self.work, "zc")
        nopfs_bin = os.path.join(BIN, "nopfs")
        script = (
            f"until {nopfs_bin} status | grep -q 'tier ram: .*prefetch done'; do sleep 0.05; done; "
            f"{nopfs_bin} cat --verify --print > {out} 2> {out}.err; "
            f"{nopfs_bin} status --json > {out}.status")
        p = nopfs("run", "--dataset", self.data.root, "--ranks", 1, *self.JOB, "--config", conf,
                  "--", "sh", "-c", script)
        ids = self.check_rank_output(0, 1, read(out))
        status = json.loads(read(out + ".status"))
        ram = next(s for s in status["sources"] if s["name"] == "ram")
        self.assertTrue(ram["zero_copy"], status)
        self.assertEqual(ram["samples"], len(ids), status)
        self.assertEqual(ram["in_place"], len(ids), status)

    def test_no_cache_reads_the_pfs(self):
        conf = os.path.join(self.work, "none.conf.lua")
        write_config(conf)
        p, outs = self.run_cat(1, conf)
        ids = self.check_rank_output(0, 1, outs[0][0])
        self.assertRegex(p.stdout, rf"(?m)^pfs\s+{len(ids)}\s")

    def test_manifest_with_offsets(self):
        # One large file holding every sample back to back, and a manifest pointing into it.
        d = os.path.join(self.work, "packed")
        os.mkdir(d)
        blob = os.path.join(d, "shard0.bin")
        rnd = random.Random(5)
        lines, off = [], 0
        with open(blob, "wb") as fh:
            for k in range(300):
                n = rnd.randint(1, 20000)
                fh.write(rnd.randbytes(n))
                lines.append(f"shard0.bin\t{k % 3}\t{off}\t{n}")
                off += n
        manifest = os.path.join(d, "train.manifest")
        with open(manifest, "w") as fh:
            fh.write("# path label offset length\n" + "\n".join(lines) + "\n")
        make_world_readable(d)
        conf = os.path.join(self.work, "ram.conf.lua")
        write_config(conf, ram="2M")
        p, outs = self.run_cat(2, conf, dataset=manifest)
        for r in range(2):
            o = outs[r][0]
            self.assertRegex(o.strip().split("\n")[-1], r"^\d+ samples, \d+ bytes, 0 mismatches$")

    def test_slow_client_gets_everything_in_order(self):
        conf = os.path.join(self.work, "ram.conf.lua")
        write_config(conf, ram="1M", staging="1M")
        p, outs = self.run_cat(1, conf, cat_args=("--verify", "--print", "--pause-us", "300"))
        self.check_rank_output(0, 1, outs[0][0])

    def test_resume_at_epoch_and_step(self):
        conf = os.path.join(self.work, "ram.conf.lua")
        write_config(conf, ram="4M")
        p, outs = self.run_cat(2, conf, cat_args=("--verify", "--print", "--start-epoch", "1",
                                                  "--start-step", "3"))
        for r in range(2):
            full = self.stream(r, 2)
            per_epoch = len(full) // 2
            # Rank's steps are batches of ceil(16/2) = 8 entries (strided, the default).
            expect = full[per_epoch + 3 * 8:]
            self.check_rank_output(r, 2, outs[r][0], expect_ids=expect)

    def test_vanished_and_unreadable_files(self):
        victim = self.data.files[17]
        unreadable = self.data.files[42]
        conf = os.path.join(self.work, "none.conf.lua")
        write_config(conf)  # no tier: every read goes to the PFS when the rank asks
        saved = os.path.join(self.work, "saved.bin")  # outside the dataset
        shutil.copy2(victim, saved)
        out = os.path.join(self.work, "out")
        # One file is unreadable from the start (the scan only stats files); the rank removes
        # another after nopfsd has scanned.
        os.chmod(unreadable, 0)
        script = (f"rm -f {victim}; "
                  f"{os.path.join(BIN, 'nopfs')} cat --verify --print > {out} 2> {out}.err")
        try:
            if AS_ROOT:
                os.chmod(os.path.dirname(victim), 0o777)
            p = nopfs("run", "--dataset", self.data.root, "--ranks", 1, *self.JOB, "--config",
                      conf, "--", "sh", "-c", script, check=False)
        finally:
            shutil.move(saved, victim)
            os.chmod(unreadable, 0o644)
            os.chmod(os.path.dirname(victim), 0o755)
        self.assertNotEqual(p.returncode, 0)
        err = read(out + ".err")
        names = sorted(os.path.relpath(f, self.data.root) for f in self.data.files)
        # ImageFolder order: by class, then by path (the generator's names sort the same way).
        self.assertRegex(err, rf"sample \d+ \([^)]*{re.escape(os.path.relpath(victim, self.data.root))}\): .*No such file")
        self.assertRegex(err, rf"sample \d+ \([^)]*{re.escape(os.path.relpath(unreadable, self.data.root))}\): .*Permission denied")
        # Everything else was served, and verified.
        lines = read(out).strip().split("\n")
        m = re.fullmatch(r"(\d+) samples, (\d+) bytes, 0 mismatches", lines[-1])
        self.assertIsNotNone(m, lines[-1])
        expected = len(self.stream(0, 1)) - 2 * 2  # each of the two files is read once per epoch
        self.assertEqual(int(m.group(1)), expected)
        del names

    def test_corrupted_ssd_copy_is_refetched(self):
        conf = os.path.join(self.work, "ssd.conf.lua")
        write_config(conf, ssd="1G", ssd_path=self.scratch)
        out = os.path.join(self.work, "out")
        nopfs_bin = os.path.join(BIN, "nopfs")
        # Wait for the SSD tier to be filled, flip bytes in its data file, then read everything.
        script = (
            f"until {nopfs_bin} status | grep -q 'tier ssd: .*prefetch done'; do sleep 0.1; done; "
            f"f=$(ls {self.scratch}/nopfs-*/*/data.0); "
            "python3 -c \"import sys; f=open(sys.argv[1],'r+b'); f.seek(0); b=f.read(4096); "
            "f.seek(0); f.write(bytes(x ^ 0xff for x in b))\" $f; "
            f"{nopfs_bin} cat --verify --print > {out} 2> {out}.err; "
            f"{nopfs_bin} status --json > {out}.status")
        p = nopfs("run", "--dataset", self.data.root, "--ranks", 1, *self.JOB, "--config", conf,
                  "--", "sh", "-c", script)
        self.check_rank_output(0, 1, read(out))
        status = json.loads(read(out + ".status"))
        self.assertGreaterEqual(status["corrupt"], 1, status)
        # The refetched samples are ready once, not counted again on top of the first fill.
        ssd = next(t for t in status["tiers"] if t["name"] == "ssd")
        self.assertEqual(ssd["ready_samples"], ssd["planned_samples"], status)
        self.assertEqual(ssd["ready_bytes"], ssd["planned_bytes"], status)
        self.assert_nothing_left()

    def test_a_rank_cannot_write_the_ram_tier(self):
        """A rank that finds the RAM tier's memfd (in nopfsd's /proc/PID/fd, as the user may) and
        reopens it read-write can neither write() it nor map it writable, while another reader
        verifies every byte it is served."""
        conf = os.path.join(self.work, "ram.conf.lua")
        write_config(conf, ram="1G")
        out = os.path.join(self.work, "out")
        run = os.path.join(self.work, "run")
        scribbler = os.path.join(self.work, "scribble.py")
        with open(scribbler, "w") as fh:
            fh.write(SCRIBBLER)
        os.chmod(scribbler, 0o644)
        nopfs_bin = os.path.join(BIN, "nopfs")
        script = (f"until {nopfs_bin} status | grep -q 'tier ram: .*prefetch done'; do sleep 0.1; "
                  f"done; python3 {scribbler} {run}/nopfsd.pid > {out}.scribble 2>&1 & "
                  f"{nopfs_bin} cat --verify --print > {out} 2> {out}.err; wait")
        nopfs("run", "--dataset", self.data.root, "--ranks", 1, *self.JOB, "--config", conf,
              "--run-dir", run, "--", "sh", "-c", script)
        report = read(out + ".scribble")
        self.assertIn("found the tier", report)
        for how in ("write", "mmap", "mprotect"):
            self.assertIn(f"{how}: refused", report)
        self.assertNotIn("scribbled", report)
        self.check_rank_output(0, 1, read(out))

    def test_a_killed_nopfsd_is_noticed_within_a_second(self):
        """nopfsd killed with SIGKILL under a reading client: the client ends at once with an error
        that says the service is gone, instead of waiting minutes on the ring."""
        conf = os.path.join(self.work, "ram.conf.lua")
        write_config(conf, ram="1M", staging="1M")
        out = os.path.join(self.work, "out")
        run = os.path.join(self.work, "run")
        nopfs_bin = os.path.join(BIN, "nopfs")
        # A slow reader (the ring cannot hold the whole stream), then kill -9 of nopfsd; the
        # script records when the kill happened and when the reader ended.
        script = (f"{nopfs_bin} cat --verify --print --pause-us 3000 > {out} 2> {out}.err & "
                  f"cat=$!; sleep 1; kill -9 $(cat {run}/nopfsd.pid); date +%s.%N > {out}.killed; "
                  f"wait $cat; echo $? > {out}.rc; date +%s.%N > {out}.ended")
        t0 = time.time()
        nopfs("run", "--dataset", self.data.root, "--ranks", 1, *self.JOB, "--config", conf,
              "--run-dir", run, "--", "sh", "-c", script, check=False, timeout=120)
        waited = float(read(out + ".ended")) - float(read(out + ".killed"))
        # The client first reads what nopfsd had published (at most the 4 MiB ring, 3 ms a
        # sample: about 1.5 s here), then notices within 50 ms; it used to wait 5 minutes.
        self.assertLess(waited, 5.0, f"the client took {waited:.1f} s to notice")
        self.assertLess(time.time() - t0, 60)
        self.assertEqual(read(out + ".rc").strip(), "1")
        err = read(out + ".err")
        self.assertIn("nopfsd is gone", err)
        # Everything delivered before the death was the file's bytes (the ones it could not
        # verify once the service was gone are named as such, never as wrong bytes).
        self.assertNotIn("differ from the file", err)
        lines = read(out).strip().split("\n")
        self.assertRegex(lines[-1], r"^\d+ samples, \d+ bytes, 0 mismatches(, \d+ not verified)?$")
        self.assertLess(int(lines[-1].split()[0]), len(self.stream(0, 1)))

    def test_a_file_rewritten_during_the_job_is_counted_and_logged(self):
        conf = os.path.join(self.work, "none.conf.lua")
        write_config(conf)
        out = os.path.join(self.work, "out")
        run = os.path.join(self.work, "run")
        victim = self.data.files[5]
        copy = os.path.join(self.work, "data")
        shutil.copytree(self.data.root, copy)
        make_world_readable(copy)
        victim = os.path.join(copy, os.path.relpath(self.data.files[5], self.data.root))
        os.chmod(victim, 0o666)
        nopfs_bin = os.path.join(BIN, "nopfs")
        per_epoch = len(self.stream(0, 1)) // 2
        # Epoch 0 read (every sample from the PFS: no tier), the file rewritten in place with
        # other bytes of the same size, epoch 1 read.
        script = (f"{nopfs_bin} cat --count {per_epoch} > /dev/null; "
                  f"python3 -c \"import sys; f=open(sys.argv[1],'r+b'); b=f.read(); f.seek(0); "
                  f"f.write(bytes(x ^ 0x5a for x in b))\" {victim}; "
                  f"{nopfs_bin} cat --start-epoch 1 --verify > {out} 2> {out}.err; "
                  f"{nopfs_bin} status --json > {out}.status")
        nopfs("run", "--dataset", copy, "--ranks", 1, *self.JOB, "--config", conf,
              "--run-dir", run, "--keep-run-dir", "--", "sh", "-c", script)
        self.assertRegex(read(out), r"0 mismatches")
        self.assertEqual(json.loads(read(out + ".status"))["changed"], 1, read(out + ".status"))
        log = read(os.path.join(run, "nopfsd.log"))
        self.assertIn(f"({victim}): the file changed on the PFS during the job", log)

    def test_a_tier_smaller_than_the_largest_sample_is_named_and_the_job_goes_on(self):
        sizes = {os.path.relpath(f, self.data.root): os.path.getsize(f) for f in self.data.files}
        largest = max(sizes.values())
        conf = os.path.join(self.work, "small.conf.lua")
        write_config(conf, ram=f"{largest // 2}B")
        run = os.path.join(self.work, "smallrun")
        out = os.path.join(self.work, "out")
        nopfs("run", "--dataset", self.data.root, "--ranks", 1, *self.JOB, "--config", conf,
              "--run-dir", run, "--keep-run-dir", "--", "sh", "-c",
              f"cp {os.path.join(run, 'plan')} {out}.plan; "
              f"{os.path.join(BIN, 'nopfs')} cat --verify > {out}")
        self.assertRegex(read(out), r"0 mismatches")
        # The plan file (what the SPANK plugin prints in the job's output) names the sample, its
        # size in the units nopfs prints, and what to ask for; the tier holds what fits.
        plan = read(out + ".plan")
        m = re.search(r"(?m)^nopfs: plan: tier ram: ([\d.]+ \w+) cannot hold the dataset's "
                      r"largest sample, (\S+) \(([\d.]+ KiB)\); it holds (\d+) smaller samples on "
                      r"node 0; write --nopfs-ram=1M or more$", plan)
        self.assertIsNotNone(m, plan)
        self.assertEqual(sizes[m.group(2)], largest, m.group(2))
        self.assertAlmostEqual(float(m.group(3).split()[0]), largest / 1024, delta=0.06)
        self.assertGreater(int(m.group(4)), 0)
        self.assertIn(m.group(0), read(os.path.join(run, "nopfsd.log")))

    def test_client_killed_mid_epoch(self):
        conf = os.path.join(self.work, "ram.conf.lua")
        write_config(conf, ram="2M", staging="1M")
        out = os.path.join(self.work, "out")
        nopfs_bin = os.path.join(BIN, "nopfs")
        # A first reader is killed while it holds samples; a second one then reads the whole
        # stream: the service gave back what the first held and keeps serving.
        script = (f"{nopfs_bin} cat --pause-us 2000 > /dev/null 2>&1 & pid=$!; sleep 0.5; "
                  f"kill -9 $pid; wait $pid; "
                  f"{nopfs_bin} cat --verify --print > {out} 2> {out}.err")
        p = nopfs("run", "--dataset", self.data.root, "--ranks", 1, *self.JOB, "--config", conf,
                  "--", "sh", "-c", script)
        self.check_rank_output(0, 1, read(out))

    def test_sigterm_mid_prefetch_leaves_nothing(self):
        conf = os.path.join(self.work, "ssd.conf.lua")
        write_config(conf, ram="1M", ssd="1G", ssd_path=self.scratch)
        run = os.path.join(self.work, "run2")
        os.mkdir(run, 0o700)
        if AS_ROOT:
            shutil.chown(run, "nobody", "nogroup")
        argv = demote_argv([os.path.join(BIN, "nopfsd"), "--run-dir", run, "--dataset",
                            self.data.root, *map(str, self.JOB), "--ranks", "1", "--config",
                            conf])
        errfile = open(os.path.join(self.work, "nopfsd.err"), "w")
        self.addCleanup(errfile.close)
        d = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=errfile)
        self.addCleanup(lambda: d.poll() is None and (d.kill(), d.wait()))
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(run, "ready")):
            self.assertIsNone(d.poll(), read(os.path.join(self.work, "nopfsd.err")))
            self.assertLess(time.time(), deadline)
            time.sleep(0.01)
        self.assertNotEqual(os.listdir(self.scratch), [])
        t0 = time.time()
        d.send_signal(signal.SIGTERM)
        self.assertEqual(d.wait(timeout=30), 0)
        self.assertLess(time.time() - t0, 10)
        self.assertEqual(os.listdir(self.scratch), [], "SSD files left behind")
        self.assertEqual(sorted(f for f in os.listdir(run) if not f.startswith("nopfsd.log")), [])
        log = read(os.path.join(run, "nopfsd.log"))
        self.assertIn("nothing staged remains", log)

    def test_a_ready_file_that_cannot_be_written_is_a_start_failure_naming_it(self):
        # A directory where nopfsd writes the ready file's text before renaming it into place.
        conf = os.path.join(self.work, "ssd.conf.lua")
        write_config(conf, ram="1M", ssd="1G", ssd_path=self.scratch)
        run = os.path.join(self.work, "run3")
        os.mkdir(run, 0o700)
        os.mkdir(os.path.join(run, ".ready.tmp"), 0o700)
        if AS_ROOT:
            for d in (run, os.path.join(run, ".ready.tmp")):
                shutil.chown(d, "nobody", "nogroup")
        argv = demote_argv([os.path.join(BIN, "nopfsd"), "--run-dir", run, "--dataset",
                            self.data.root, *map(str, self.JOB), "--ranks", "1", "--config",
                            conf])
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 1, p.stderr)
        why = f"creating {run}/ready (as {run}/.ready.tmp): Is a directory"
        self.assertIn(why, p.stderr)
        self.assertIn(why, read(os.path.join(run, "failed")))
        # Nothing a reader could trust, and nothing staged, is left.
        self.assertEqual(sorted(os.listdir(run)), [".ready.tmp", "failed", "nopfsd.log"])
        self.assertEqual(os.listdir(self.scratch), [], "SSD files left behind")

    def test_option_sets_where_a_rank_reads_nothing_are_refused(self):
        # Refused by nopfs run before it starts anything: the batch does not depend on the data.
        p = nopfs("run", "--dataset", self.data.root, "--ranks", 4, "--batch", 2, "--scheme",
                  "uniform", "--", "true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--scheme uniform with --batch 2 and --ranks 4 leaves rank 3 without a "
                      "sample", p.stderr)
        self.assertIn("write --scheme strided, or a --batch that is a multiple of --ranks (4)",
                      p.stderr)
        # More ranks than the dataset has samples: nopfsd, which counts them, refuses.
        tiny = os.path.join(self.work, "tiny")
        os.makedirs(os.path.join(tiny, "c"))
        for name in ("a.bin", "b.bin"):
            with open(os.path.join(tiny, "c", name), "wb") as f:
                f.write(b"x" * 10)
        os.chmod(tiny, 0o755)
        p = nopfs("run", "--dataset", tiny, "--ranks", 3, "--batch", 3,
                  "--run-dir", os.path.join(self.work, "tinyrun"), "--", "true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--ranks 3 is more than --samples 2", p.stderr)
        self.assertIn("write at most 2 --ranks", p.stderr)

    def test_nodes_and_ranks_per_node_make_the_ranks(self):
        # --nodes 2 --ranks-per-node 2 without --ranks: a job of 4 ranks, 2 on each node.
        p = nopfs("run", "--dataset", self.data.root, "--nodes", 2, "--ranks-per-node", 2,
                  *self.JOB, "--run-dir", os.path.join(self.work, "nodesrun"), "--", "sh", "-c",
                  'echo "rank $NOPFS_RANK of $NOPFS_RANKS"')
        got = sorted(re.findall(r"rank (\d+) of (\d+)", p.stdout))
        self.assertEqual(got, [(str(r), "4") for r in range(4)], p.stdout + p.stderr)

    def test_job_id_names_the_job_and_a_bad_one_says_what_to_write(self):
        run_dir = os.path.join(self.work, "jobidrun")
        nopfs("run", "--dataset", self.data.root, "--ranks", 1, *self.JOB, "--job-id", 4242,
              "--run-dir", run_dir, "--keep-run-dir", "--", "true")
        self.assertIn("nopfsd: job 4242, node 0", read(os.path.join(run_dir, "nopfsd.log")))
        for bad in ("", "0", "007", "-1", "+5", "42a", "sib42", "../../etc", "4 2", "1\n2",
                    "18446744073709551616", "9" * 300):
            p = nopfs("run", "--dataset", self.data.root, "--ranks", 1, *self.JOB, "--job-id",
                      bad, "--", "true", check=False)
            self.assertNotEqual(p.returncode, 0, bad)
            self.assertIn("is not a job id: write a Slurm job id, a decimal number", p.stderr)
            self.assertNotIn("nopfsd", p.stderr, bad)  # refused before anything started

    def test_a_launcher_killed_outright_takes_its_ranks_and_nopfsd_with_it(self):
        # `nopfs run` SIGKILLed (no chance to forward a signal): each rank and nopfsd get SIGTERM
        # from the kernel as their parent dies, instead of running on without it.
        run_dir = os.path.join(self.work, "killedrun")
        pids = os.path.join(self.work, "killed-pids")
        os.mkdir(pids)
        os.chmod(pids, 0o777)
        argv = demote_argv([os.path.join(BIN, "nopfs"), "run", "--dataset", self.data.root,
                            "--ranks", 2, *map(str, self.JOB), "--run-dir", run_dir,
                            "--keep-run-dir", "--", "sh", "-c",
                            f"echo $$ > {pids}/$NOPFS_RANK; while :; do sleep 0.05; done"])
        launcher = subprocess.Popen([str(a) for a in argv], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        deadline = time.time() + 60

        def written(name):  # the shell creates the file before it writes the pid and newline
            path = os.path.join(pids, name)
            return os.path.exists(path) and read(path).endswith("\n")

        while not (written("0") and written("1")
                   and os.path.exists(os.path.join(run_dir, "nopfsd.pid"))):
            self.assertIsNone(launcher.poll(), "nopfs run ended")
            self.assertLess(time.time(), deadline, "the ranks never started")
            time.sleep(0.05)
        ranks = [int(read(os.path.join(pids, r)).strip()) for r in ("0", "1")]
        daemon = int(read(os.path.join(run_dir, "nopfsd.pid")).split()[0])
        launcher.kill()
        launcher.wait()

        def alive(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return not f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except FileNotFoundError:
                return False
        deadline = time.time() + 10
        while any(alive(p) for p in ranks + [daemon]) and time.time() < deadline:
            time.sleep(0.05)
        self.assertEqual([p for p in ranks + [daemon] if alive(p)], [])

    def test_bad_dataset_fails_clearly(self):
        p = nopfs("run", "--dataset", os.path.join(self.work, "nope"), "--ranks", 1, *self.JOB,
                  "--", "true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("nope", p.stderr)
        empty = os.path.join(self.work, "empty")
        os.mkdir(empty)
        os.chmod(empty, 0o755)
        # The default run directory goes under $TMPDIR; a failed start removes it too.
        tmpdir = os.path.join(self.work, "tmpdir")
        os.mkdir(tmpdir)
        os.chmod(tmpdir, 0o1777)
        p = nopfs("run", "--dataset", empty, "--ranks", 1, *self.JOB, "--", "true", check=False,
                  env=dict(os.environ, TMPDIR=tmpdir))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("nopfsd did not start", p.stderr)
        self.assertIn("no class directories", p.stderr)
        self.assertEqual(os.listdir(tmpdir), [], "a failed start left its run directory")


if __name__ == "__main__":
    BIN = sys.argv.pop(1)
    unittest.main()
