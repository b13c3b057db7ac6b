#!/usr/bin/env python3
"""The end-to-end benchmark of issue 7 on one machine: nopfs against what users run today, reading
a synthetic ImageNet-like dataset through an emulated PFS (bench/pfsemu), side by side in one run.

    bench/e2e/run.sh [--quick] [--build DIR] [--out DIR]      (as root: it mounts a FUSE file system)

Setups, each with R ranks on one node that "compute" at --rate samples/s (sleep):
  no-io            the consumer alone, no data (the lower bound);
  dataloader-w0/4  torch DataLoader + DistributedSampler reading the emulated PFS, 0 / 4 workers;
  copy-local-w4    copy the dataset from the PFS to local disk first (time added to epoch 1),
                   then the same DataLoader (4 workers) on the copy;
  nopfs-<planner>  `nopfs run` with nopfsd serving the emulated PFS, nopfs.torch's DataLoader,
                   planner frequency (NoPFS), staging (no tiers, prefetch only), fill-once (MinIO);
  nopfs-frequency-2nodes  the same R ranks on 2 nodes (`nopfs run --nodes 2`: two nopfsd on this
                   machine serving each other over loopback), each node's tiers half the size,
                   so that only the two nodes' caches together hold what one node's did.
For each: the time of every epoch (slowest rank), stall per batch (median, p99 over all ranks and
steps after epoch 1, and in epoch 1), and the bytes read from the PFS (pfsemu's counters). `nopfs
simulate` is run on the same parameters and its predicted epoch times are put beside them. Writes
results.json, table.md, epochs.dat, epochs.png and stalls.png to --out (default docs/e2e).
"""

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from dataloader_util import stall_stats  # noqa: E402
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def log(msg):
    print(f"e2e: {msg}", file=sys.stderr, flush=True)


def make_dataset(root, samples, classes, seed):
    """ImageFolder of `samples` files; sizes log-normal like ImageNet's (σ 0.6, mean ~110 KB)."""
    rnd = random.Random(seed)
    sigma = 0.6
    mu = math.log(110_000) - sigma * sigma / 2
    sizes = {}
    for k in range(samples):
        cls = f"n{k % classes:08d}"
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        size = int(min(max(rnd.lognormvariate(mu, sigma), 4096), 2_000_000))
        path = os.path.join(root, cls, f"img_{k:07d}.JPEG")
        with open(path, "wb") as fh:
            fh.write(os.urandom(size))
        sizes[path] = size
    # Catalog order (sorted classes, sorted files): what nopfs simulate's file:PATH expects.
    return [sizes[p] for p in sorted(sizes)]


def pfs_stats(mnt):
    with open(os.path.join(mnt, ".pfsemu_stats")) as fh:
        return {k: v for k, v in (line.split(" ", 1) for line in fh.read().splitlines())}


def pfs_bytes(mnt):
    return int(pfs_stats(mnt)["bytes_read"])


def summarize(name, rank_results, pfs_read, extra_first=0.0, wall=0.0):
    epochs = len(rank_results[0]["epochs"])
    times = [max(r["epochs"][e]["time"] for r in rank_results) for e in range(epochs)]
    times[0] += extra_first
    stall = stall_stats([r["epochs"] for r in rank_results])
    samples = sum(ep["samples"] for r in rank_results for ep in r["epochs"])
    return {"name": name, "epoch_times": times, "pfs_bytes": pfs_read, "wall": wall,
            "samples": samples, "stall_first_median": stall["first_median"],
            "stall_first_p99": stall["first_p99"], "stall_median": stall["median"],
            "stall_p99": stall["p99"]}


class Bench:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.bin = os.path.join(args.build, "bin")
        self.out = os.path.join(work, "out")
        os.makedirs(self.out)
        shutil.chown(self.out, "nobody", "nogroup")
        self.tmp = os.path.join(work, "tmp")
        os.makedirs(self.tmp)
        shutil.chown(self.tmp, "nobody", "nogroup")
        self.summaries = {}
        self.env = {**os.environ, "HOME": self.tmp, "TMPDIR": self.tmp,
                    "PYTHONPATH": os.path.join(args.build, "python"), "OMP_NUM_THREADS": "1",
                    # torch warns that 4 workers exceed 2 cores: that is the point here.
                    "PYTHONWARNINGS": "ignore::UserWarning"}

    def consumer_argv(self, mode, root, workers, tag):
        return [sys.executable, os.path.join(HERE, "consumer.py"), "--mode", mode, "--root", root,
                "--epochs", str(self.args.epochs), "--batch", str(self.args.batch), "--rate",
                str(self.args.rate), "--workers", str(workers), "--seed", str(self.args.seed),
                "--out", os.path.join(self.out, tag)]

    def results(self, tag):
        rs = []
        for r in range(self.args.ranks):
            with open(os.path.join(self.out, f"{tag}.{r}.json")) as fh:
                rs.append(json.load(fh))
        return rs

    def run_ranks(self, mode, root, workers, tag):
        """R consumer processes started together (RANK / WORLD_SIZE as torchrun sets them)."""
        procs = []
        for r in range(self.args.ranks):
            env = {**self.env, "RANK": str(r), "WORLD_SIZE": str(self.args.ranks)}
            procs.append(subprocess.Popen(NOBODY + self.consumer_argv(mode, root, workers, tag),
                                          env=env))
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError(f"{tag}: a rank exited {p.returncode}")
        return self.results(tag)

    def node_config(self, planner, dataset_bytes, nodes=1):
        # With several nodes each node's tiers are 1/nodes of one node's, and the model knows the
        # network (loopback: about 1 GB/s per node in bench/peer_bench), so peers are read.
        ram = int(dataset_bytes * self.args.ram_fraction / nodes)
        ssd = int(dataset_bytes * self.args.ssd_fraction / nodes)
        scratch = os.path.join(self.tmp, "ssd")
        os.makedirs(scratch, exist_ok=True)
        shutil.chown(scratch, "nobody", "nogroup")
        path = os.path.join(self.work, f"node-{planner}-{nodes}.lua")
        network = 'network = "1G/s"\n' if nodes > 1 else ""
        with open(path, "w") as fh:
            fh.write(f'-- e2e benchmark node: RAM tier {ram} B, SSD tier {ssd} B, the emulated PFS.\n'
                     f'planner = "{planner}"\n'
                     f'log_level = "warn"\n'
                     f'pfs = {{ {self.args.pfs_table} }}\n{network}'
                     f'staging = {{ capacity = "64MiB", threads = 4 }}\n'
                     f'classes = {{\n'
                     f'  ram {{ capacity = "{ram}B", threads = 2 }},\n'
                     f'  ssd {{ path = "{scratch}", capacity = "{ssd}B", threads = 2 }},\n'
                     f'}}\n')
        os.chmod(path, 0o644)
        return path

    def run_nopfs(self, planner, root, config, nodes=1):
        tag = f"nopfs-{planner}" + (f"-{nodes}nodes" if nodes > 1 else "")
        run_dir = os.path.join(self.tmp, f"run-{tag}")
        argv = [os.path.join(self.bin, "nopfs"), "run", "--dataset", root, "--seed",
                str(self.args.seed), "--epochs", str(self.args.epochs), "--ranks",
                str(self.args.ranks), "--nodes", str(nodes), "--ranks-per-node",
                str(self.args.ranks // nodes), "--batch",
                str(self.args.batch * self.args.ranks), "--scheme", "strided", "--config", config,
                "--run-dir", run_dir, "-q", "--"]
        argv += self.consumer_argv("nopfs", root, self.args.nopfs_workers, tag)
        p = subprocess.run(NOBODY + argv, env=self.env, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{tag}: nopfs run exited {p.returncode}:\n{p.stderr[-3000:]}")
        # nopfs run's summary (per node: samples and bytes per source, PFS bytes, stall) goes
        # into results.json beside the row.
        self.summaries[tag] = p.stdout
        return self.results(tag)

    def simulate(self, sizes_file, config, extra=(), nodes=1):
        argv = [os.path.join(self.bin, "nopfs"), "simulate", "--config", config, "--nodes",
                str(nodes), "--ranks-per-node", str(self.args.ranks // nodes), "--epochs",
                str(self.args.epochs),
                "--batch", str(self.args.batch * self.args.ranks), "--sizes", f"file:{sizes_file}",
                "--seed", str(self.args.seed), "--scheme", "strided", "--compute-rate",
                str(self.args.rate), "--format", "json", "--loader-workers", "4", *extra]
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0:
            log(f"nopfs simulate failed ({p.returncode}): {p.stderr.strip()[:500]}")
            return None
        return json.loads(p.stdout)


def has_option(binary, sub, option):
    p = subprocess.run([binary, sub, "--help"], capture_output=True, text=True)
    return p.returncode == 0 and option in p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"))
    ap.add_argument("--out", default=os.path.join(SOURCE, "docs", "e2e"))
    ap.add_argument("--quick", action="store_true", help="a smaller dataset (about 2.5 minutes)")
    ap.add_argument("--samples", type=int, default=None, help="F (default 3000, quick 1500)")
    ap.add_argument("--epochs", type=int, default=None, help="E (default 4, quick 3)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--rate", type=float, default=400.0, help="compute, samples/s per rank")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ram-fraction", type=float, default=0.5,
                    help="RAM tier as a fraction of the dataset (below 1: it does not fit)")
    ap.add_argument("--ssd-fraction", type=float, default=0.75)
    ap.add_argument("--pfs-config", default=os.path.join(HERE, "pfs.conf"))
    ap.add_argument("--nopfs-workers", type=int, default=0,
                    help="DataLoader workers of the nopfs setups (default 0)")
    ap.add_argument("--only", default="", help="comma-separated setups to run (default: all)")
    args = ap.parse_args()
    if args.samples is None:
        args.samples = 1500 if args.quick else 3000
    if args.epochs is None:
        args.epochs = 3 if args.quick else 4
    args.build = os.path.abspath(args.build)
    if os.geteuid() != 0:
        sys.exit("e2e: run as root: it mounts the emulated PFS (FUSE) and runs ranks as nobody")

    # The node config's t(γ) is the emulated PFS's (so that nopfs plans, and simulate predicts,
    # for the PFS actually measured).
    curve = None
    with open(args.pfs_config) as fh:
        for line in fh:
            line = line.split("#")[0].strip()
            if line.startswith("bandwidth"):
                curve = line.split("=", 1)[1].strip()
    # pfsemu's curve is in 10^6 bytes/s; the node config's "M" is 2^20 (as --mem): write bytes.
    args.pfs_table = ", ".join(f'{{{r}, "{int(float(m) * 10**6)}B/s"}}' for r, m in
                               (p.split(":") for p in curve.split(",")))

    work = tempfile.mkdtemp(prefix="nopfs-e2e-", dir="/var/tmp")
    os.chmod(work, 0o755)
    pfs = None
    try:
        backing = os.path.join(work, "backing")
        mnt = os.path.join(work, "pfs")
        os.makedirs(mnt)
        log(f"writing {args.samples} samples")
        sizes = make_dataset(backing, args.samples, 100, args.seed)
        dataset_bytes = sum(sizes)
        sizes_file = os.path.join(work, "sizes.txt")
        with open(sizes_file, "w") as fh:
            fh.write("\n".join(map(str, sizes)) + "\n")
        subprocess.run(["chmod", "-R", "a+rX", work], check=True)
        subprocess.run(["sync"], check=True)
        pfs = subprocess.Popen([os.path.join(args.build, "bin", "nopfs_pfsemu"), "--config",
                                args.pfs_config, backing, mnt], stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(mnt, ".pfsemu_stats")):
            if pfs.poll() is not None or time.monotonic() > deadline:
                sys.exit("e2e: the emulated PFS did not mount: " + pfs.stderr.read())
            time.sleep(0.05)
        log(f"dataset {dataset_bytes / 1e6:.0f} MB, mean {dataset_bytes / len(sizes) / 1e3:.0f} KB;"
            f" PFS {curve} MB/s; {args.ranks} ranks x {args.rate:g} samples/s; {args.epochs} epochs")

        bench = Bench(args, work)
        only = set(filter(None, args.only.split(",")))
        rows = []
        notes = []

        def measure(name, fn):
            if only and name not in only:
                return
            log(f"running {name}")
            before = pfs_bytes(mnt)
            t0 = time.perf_counter()
            ranks, extra = fn()
            wall = time.perf_counter() - t0
            row = summarize(name, ranks, pfs_bytes(mnt) - before, extra, wall)
            rows.append(row)
            log(f"{name}: epochs {' '.join(f'{t:.1f}' for t in row['epoch_times'])} s, "
                f"PFS {row['pfs_bytes'] / dataset_bytes:.2f} datasets")

        measure("no-io", lambda: (bench.run_ranks("noio", mnt, 0, "no-io"), 0.0))
        measure("dataloader-w0", lambda: (bench.run_ranks("direct", mnt, 0, "dataloader-w0"), 0.0))
        measure("dataloader-w4", lambda: (bench.run_ranks("direct", mnt, 4, "dataloader-w4"), 0.0))

        def copy_local():
            local = os.path.join(work, "local")
            t0 = time.perf_counter()
            shutil.copytree(mnt, local)
            copy = time.perf_counter() - t0
            subprocess.run(["chmod", "-R", "a+rX", local], check=True)
            return bench.run_ranks("direct", local, 4, "copy-local-w4"), copy

        if shutil.disk_usage(work).free > 2 * dataset_bytes:
            measure("copy-local-w4", copy_local)
        else:
            notes.append("copy-local-w4 skipped: the local disk cannot hold the dataset")

        for planner in ("frequency", "staging", "fill-once"):
            config = bench.node_config(planner, dataset_bytes)
            measure(f"nopfs-{planner}", lambda c=config, p=planner: (bench.run_nopfs(p, mnt, c),
                                                                     0.0))
        config2 = bench.node_config("frequency", dataset_bytes, nodes=2)
        if args.ranks % 2 != 0:
            notes.append("nopfs-frequency-2nodes not run: --ranks is odd")
        else:
            measure("nopfs-frequency-2nodes",
                    lambda: (bench.run_nopfs("frequency", mnt, config2, nodes=2), 0.0))

        # The simulator as nopfsd runs (fetch-and-cache: a staged PFS read of a sample planned
        # for a tier also fills it), and without fetch-and-cache (tiers filled by prefetchers only).
        sim_config = bench.node_config("frequency", dataset_bytes)
        sim = bench.simulate(sizes_file, sim_config)
        sim_fc = bench.simulate(sizes_file, sim_config, ["--no-fetch-and-cache"])
        sim2 = bench.simulate(sizes_file, config2, nodes=2) if args.ranks % 2 == 0 else None
        sim2_fc = (bench.simulate(sizes_file, config2, ["--no-fetch-and-cache"], nodes=2)
                   if args.ranks % 2 == 0 else None)
        if sim is None or sim_fc is None:
            notes.append("no simulate column: `nopfs simulate` failed (see the log)")
        result = {"samples": args.samples, "dataset_bytes": dataset_bytes, "epochs": args.epochs,
                  "ranks": args.ranks, "batch": args.batch, "rate": args.rate, "pfs": curve,
                  "ram_fraction": args.ram_fraction, "ssd_fraction": args.ssd_fraction,
                  "rows": rows, "simulate": sim, "simulate_no_fetch_and_cache": sim_fc,
                  "simulate_2nodes": sim2, "simulate_2nodes_no_fetch_and_cache": sim2_fc,
                  "notes": notes, "nopfs_summaries": bench.summaries,
                  "pfs_stats": pfs_stats(mnt), "cores": os.cpu_count(),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as fh:
            json.dump(result, fh, indent=1)
        subprocess.run([sys.executable, os.path.join(HERE, "report.py"), args.out], check=True)
    finally:
        if pfs is not None and pfs.poll() is None:
            pfs.send_signal(signal.SIGTERM)
            try:
                pfs.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pfs.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
