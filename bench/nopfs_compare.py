#!/usr/bin/env python3
"""nopfs side by side with NoPFS's own code (github.com/spcl/NoPFS, branch old-nopfs, "HDMLP"), on
one machine, the same files, alternating runs: the stall per batch and the throughput.

    bench/nopfs_compare.py --hdmlp DIR [--build build] [--pfs] [--ranks 1] [--runs 5]
                           [--files 4000] [--size 65536] [--batch 32] [--epochs 3] [--rate 3200]

(as root: it runs every rank as nobody, and --pfs mounts the emulated PFS, bench/pfsemu.) DIR is
a checkout of NoPFS's old-nopfs branch whose libhdmlp is built (DIR/libhdmlp/build/libhdmlp.so;
docs/PERFORMANCE.md says how); nothing of it is part of nopfs. Each run of each setup starts its
ranks afresh on the same dataset (an ImageFolder of --files files of --size bytes, 100 classes),
reads --epochs epochs, and each rank "computes" B / --rate seconds after every batch of B (a
sleep), so a loader that prefetches has the time to. The stall of a step is the time the loop
waits for its batch. Setups:
  hdmlp          NoPFS: hdmlp.Job (its prefetcher in the training process, MPI between ranks),
                 B calls of Job.get() per batch as its HDMLPDataLoader makes them, each a bytes
                 copy of the sample out of its staging buffer;
  nopfs-copy     `nopfs run`, nopfs.torch.DataLoader(ImageFolder(decode=bytes)): each sample
                 copied out of nopfsd's ring or RAM tier into a bytes object, one call per batch;
  nopfs-tensor   the same with decode=nopfs.torch.uint8_tensor: the batch copied into one tensor;
  nopfs-zerocopy the client API, stream.next_batch(B).views(): no copy at all (the lower bound);
                 a stream per epoch (client.open(rank, epoch=e, epochs=1)), opened in the
                 epoch's first step, whose stall includes it.
Both sides hold the whole dataset in RAM (nopfsd's RAM tier; NoPFS's memory storage class), stage
64 MiB ahead, and are told the same PFS bandwidth curve. Printed per setup: the median and p99
stall per batch over all ranks and the steps of epochs 2+ (and of epoch 1), and the throughput of
epochs 2+ (samples of all ranks / the slowest rank's time), the medians over the runs, and the
ratios of each nopfs setup to hdmlp within each run (their median over the runs). --json FILE
writes every run's figures.
"""

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from dataloader_util import stall_stats  # noqa: E402
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
PFS_CURVE = "1:120,2:170,4:240,8:300"  # nopfs_pfsemu's default t(γ), MB/s
SETUPS = ("hdmlp", "nopfs-copy", "nopfs-tensor", "nopfs-zerocopy")


def log(msg):
    print(f"nopfs_compare: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- one rank (runs as nobody)

def rank_loop(next_batch, batches, batch, rate):
    """Steps of one epoch: wait for a batch (the stall), then compute (sleep)."""
    stalls, samples = [], 0
    t0 = time.perf_counter()
    for _ in range(batches):
        s0 = time.perf_counter()
        n = next_batch()
        stalls.append(time.perf_counter() - s0)
        if n == 0:
            break
        samples += n
        if rate > 0:
            time.sleep(n / rate)
    return {"time": time.perf_counter() - t0, "stalls": stalls, "samples": samples}


def rank_hdmlp(args):
    sys.path.insert(0, args.hdmlp)
    from hdmlp.hdmlp import Job  # NoPFS's Python API (ctypes over libhdmlp)
    ranks = args.ranks
    job = Job(args.root, args.batch * ranks, args.epochs, "uniform", False, seed=args.seed,
              config_path=args.hdmlp_config,
              libhdmlp_path=os.path.join(args.hdmlp, "libhdmlp", "build", "libhdmlp.so"))
    job.setup()
    rank, n_nodes = job.get_node_id(), job.get_no_nodes()
    length = job.length()
    glob = args.batch * ranks
    local = math.ceil(glob / n_nodes)
    out = []
    for epoch in range(args.epochs):
        # The batch sizes of HDMLPDataLoader (which mirrors its Sampler.cpp).
        sizes, offset = [], 0
        while offset < length:
            if offset + glob > length:
                k = min(max(length - offset - local * rank, 0), local)
            else:
                k = min(max(glob - rank * local, 0), local)
            if k == 0:
                break
            sizes.append(k)
            offset += glob
        it = iter(sizes)

        def next_batch():
            k = next(it)
            got = [job.get() for _ in range(k)]
            return len(got)

        out.append(rank_loop(next_batch, len(sizes), args.batch, args.rate))
    # Not job.destroy(): its destructor joins the thread serving other ranks, which waits in
    # MPI_Waitsome for ever; rank_main leaves with os._exit once the figures are written.
    return rank, out


def rank_nopfs(args):
    import nopfs
    out = []
    if args.setup == "nopfs-zerocopy":
        client = nopfs.connect()
        job = nopfs.Job.from_env()
        rank = job.rank
        batches = math.ceil(job.epoch_length() / args.batch)
        for epoch in range(args.epochs):
            # One stream per epoch, opened when the epoch's first batch is asked for (its stall
            # includes the open) and closed after its last.
            streams = []

            def next_batch():
                if not streams:
                    streams.append(client.open(rank, epoch=epoch, epochs=1))
                # A ring batch may be short (the rest not there within 100 ms): the step's batch
                # is made of as many as it takes, as the DataLoader's are.
                n = 0
                while n < args.batch:
                    b = streams[0].next_batch(args.batch - n)
                    if b is None:
                        break
                    with b:
                        views = b.views()
                        n += len(views)
                        for v in views:
                            v.release()
                return n
            out.append(rank_loop(next_batch, batches, args.batch, args.rate))
            for s in streams:
                s.close()
        return rank, out
    from nopfs.torch import DataLoader, DistributedSampler, ImageFolder, uint8_tensor
    decode = bytes if args.setup == "nopfs-copy" else uint8_tensor
    ds = ImageFolder(args.root, decode=decode)
    sampler = DistributedSampler(ds)
    rank = sampler.rank
    if args.setup == "nopfs-copy":
        collate = len  # the batch's bytes objects were made; the loop takes their count
        loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, collate_fn=collate)
    else:
        loader = DataLoader(ds, batch_size=args.batch, sampler=sampler)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        it = iter(loader)
        batches = len(loader)

        def next_batch():
            try:
                b = next(it)
            except StopIteration:
                return 0
            return b if isinstance(b, int) else len(b[0])
        out.append(rank_loop(next_batch, batches, args.batch, args.rate))
    return rank, out


def rank_main(args):
    rank, epochs = rank_hdmlp(args) if args.setup == "hdmlp" else rank_nopfs(args)
    with open(f"{args.out}.{rank}.json.tmp", "w") as fh:
        json.dump({"rank": rank, "epochs": epochs}, fh)
    os.rename(f"{args.out}.{rank}.json.tmp", f"{args.out}.{rank}.json")
    if args.setup == "hdmlp":
        # mpirun ends the other ranks as soon as one leaves without MPI_Finalize: wait until every
        # rank has written its figures (a barrier through the files), then leave.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
                os.path.exists(f"{args.out}.{r}.json") for r in range(args.ranks)):
            time.sleep(0.05)
        sys.stdout.flush()
        os._exit(0)


# ---------------------------------------------------------------- the driver (root)

def make_dataset(root, files, size):
    for k in range(files):
        d = os.path.join(root, f"c{k % 100:03d}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"s{k:06d}.bin"), "wb") as fh:
            fh.write(os.urandom(size))


def mib(n):
    return max(1, n // (1 << 20))


class Driver:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.tmp = os.path.join(work, "tmp")
        self.outdir = os.path.join(work, "out")
        for d in (self.tmp, self.outdir):
            os.makedirs(d)
            shutil.chown(d, "nobody", "nogroup")
        self.env = {**os.environ, "HOME": self.tmp, "TMPDIR": self.tmp, "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": os.path.join(args.build, "python"),
                    "PYTHONWARNINGS": "ignore::UserWarning"}
        self.dataset_bytes = args.files * args.size
        self.curve = args.curve
        self.write_configs()

    def write_configs(self):
        a = self.args
        ram = int(self.dataset_bytes * 1.25)
        pfs = ", ".join(f'{{{r}, "{m}MB/s"}}' for r, m in
                        (p.split(":") for p in self.curve.split(",")))
        self.nopfs_config = os.path.join(self.work, "node.lua")
        with open(self.nopfs_config, "w") as fh:
            fh.write(f'log_level = "warn"\npfs = {{ {pfs} }}\n'
                     f'staging = {{ capacity = "{64 * a.ranks}MiB", threads = 2 }}\n'
                     f'classes = {{ ram {{ capacity = {ram}, threads = 2 }} }}\n')
        # NoPFS (libconfig): its staging buffer (the first class) 64 MiB per rank, a memory class
        # that holds the dataset, the same PFS curve; bandwidths of the classes as its sample
        # config has them.
        bw = ('bandwidth: ( { threads = 1; bw = 16550; }, { threads = 2; bw = 21164; } );')
        pfs_bw = ", ".join(f"{{ processes: {r}; bw: {m}; }}" for r, m in
                           (p.split(":") for p in self.curve.split(",")))
        self.hdmlp_config = os.path.join(self.work, "hdmlp.cfg")
        with open(self.hdmlp_config, "w") as fh:
            fh.write(f'b_c = 10000\nb_fs = 2000\ndistributed_threads = 2\ncheckpoint = false\n'
                     f'checkpoint_path = ""\n'
                     f'storage_classes: ( {{ capacity: 64; threads: 2; {bw} }},\n'
                     f'  {{ capacity: {mib(ram)}; backend: "memory"; threads: 2; {bw} }} );\n'
                     f'pfs_bandwidth: ( {pfs_bw} );\n')
        for p in (self.nopfs_config, self.hdmlp_config):
            os.chmod(p, 0o644)

    def rank_argv(self, setup, tag):
        a = self.args
        return [sys.executable, os.path.abspath(__file__), "--rank-of", setup, "--root", a.data,
                "--epochs", str(a.epochs), "--batch", str(a.batch), "--rate", str(a.rate),
                "--ranks", str(a.ranks), "--seed", str(a.seed), "--hdmlp", a.hdmlp,
                "--hdmlp-config", self.hdmlp_config, "--out", os.path.join(self.outdir, tag)]

    def run(self, setup, tag):
        a = self.args
        if setup == "hdmlp":
            argv = ["mpirun", "-np", str(a.ranks), "--oversubscribe", "--bind-to", "none",
                    "-x", "PYTHONPATH", "-x", "HOME", "-x", "TMPDIR", "-x", "OMP_NUM_THREADS"]
            argv += self.rank_argv(setup, tag)
        else:
            argv = [os.path.join(a.build, "bin", "nopfs"), "run", "--dataset", a.data, "--seed",
                    str(a.seed), "--epochs", str(a.epochs), "--ranks", str(a.ranks),
                    "--batch", str(a.batch * a.ranks), "--scheme", "strided", "--config",
                    self.nopfs_config, "--run-dir", os.path.join(self.tmp, f"run-{tag}"), "-q",
                    "--"] + self.rank_argv(setup, tag)
        p = subprocess.run(NOBODY + argv, env=self.env, capture_output=True, text=True)
        done = all(os.path.exists(os.path.join(self.outdir, f"{tag}.{r}.json"))
                   for r in range(a.ranks))
        # mpirun exits 1 for ranks that leave without MPI_Finalize (rank_main): the figures count.
        if p.returncode != 0 and not (setup == "hdmlp" and done):
            raise RuntimeError(f"{tag}: exited {p.returncode}:\n{p.stderr[-3000:]}")
        ranks = []
        for r in range(a.ranks):
            with open(os.path.join(self.outdir, f"{tag}.{r}.json")) as fh:
                ranks.append(json.load(fh)["epochs"])
        return summarize(ranks)


def summarize(ranks):
    stall = stall_stats(ranks)
    samples = sum(ep["samples"] for r in ranks for ep in r[1:])
    secs = max(sum(ep["time"] for ep in r[1:]) for r in ranks)
    return {"median_ms": stall["median"] * 1e3, "p99_ms": stall["p99"] * 1e3,
            "first_median_ms": stall["first_median"] * 1e3,
            "first_p99_ms": stall["first_p99"] * 1e3,
            "samples_per_s": samples / secs if secs > 0 else float("nan")}


def report(results, setups):
    med = statistics.median
    keys = [("median_ms", "stall median ms"), ("p99_ms", "stall p99 ms"),
            ("samples_per_s", "samples/s"), ("first_median_ms", "epoch 1 median"),
            ("first_p99_ms", "epoch 1 p99")]
    print("| setup | " + " | ".join(k[1] for k in keys) +
          " | median / hdmlp | p99 / hdmlp | samples/s / hdmlp |")
    print("|---" * (len(keys) + 4) + "|")
    for s in setups:
        runs = results[s]
        cells = [f"{med(r[k] for r in runs):,.2f}" if k != "samples_per_s" else
                 f"{med(r[k] for r in runs):,.0f}" for k, _ in keys]
        if s != "hdmlp" and "hdmlp" in results:
            ratios = [f"{med(r[k] / h[k] for r, h in zip(runs, results['hdmlp'])):.2f}"
                      for k in ("median_ms", "p99_ms", "samples_per_s")]
        else:
            ratios = ["", "", ""]
        print(f"| {s} | " + " | ".join(cells + ratios) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hdmlp", help="NoPFS old-nopfs checkout with libhdmlp/build/libhdmlp.so")
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"))
    ap.add_argument("--pfs", action="store_true", help="read through the emulated PFS")
    ap.add_argument("--curve", default=PFS_CURVE, help="t(γ) of the emulated PFS, R:MB/s,...")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--size", type=int, default=65536)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=3200.0, help="compute, samples/s per rank")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--json", help="write every run's figures here")
    # One rank (internal).
    ap.add_argument("--rank-of", dest="setup", choices=SETUPS, help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--hdmlp-config", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.setup:
        rank_main(args)
        return
    setups = [s for s in args.setups.split(",") if s]
    for s in setups:
        if s not in SETUPS:
            sys.exit(f"nopfs_compare: unknown setup {s!r}: write some of {','.join(SETUPS)}")
    if "hdmlp" in setups:
        if not args.hdmlp:
            sys.exit("nopfs_compare: --hdmlp DIR is required (a NoPFS old-nopfs checkout with "
                     "libhdmlp built), or leave hdmlp out of --setups")
        args.hdmlp = os.path.abspath(args.hdmlp)
        lib = os.path.join(args.hdmlp, "libhdmlp", "build", "libhdmlp.so")
        if not os.path.exists(lib):
            sys.exit(f"nopfs_compare: {lib} does not exist: build libhdmlp first "
                     "(docs/PERFORMANCE.md)")
    else:
        args.hdmlp = ""
    args.build = os.path.abspath(args.build)
    if os.geteuid() != 0:
        sys.exit("nopfs_compare: run as root: the ranks run as nobody (nopfsd refuses root) and "
                 "--pfs mounts a FUSE file system")
    work = tempfile.mkdtemp(prefix="nopfs-compare-", dir="/var/tmp")
    os.chmod(work, 0o755)
    pfs = None
    try:
        backing = os.path.join(work, "data")
        make_dataset(backing, args.files, args.size)
        subprocess.run(["chmod", "-R", "a+rX", work], check=True)
        args.data = backing
        if args.pfs:
            mnt = os.path.join(work, "pfs")
            os.makedirs(mnt)
            pfs = subprocess.Popen([os.path.join(args.build, "bin", "nopfs_pfsemu"),
                                    "--bandwidth", args.curve, backing, mnt],
                                   stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 30
            while not os.path.exists(os.path.join(mnt, ".pfsemu_stats")):
                if pfs.poll() is not None or time.monotonic() > deadline:
                    sys.exit("nopfs_compare: the emulated PFS did not mount: " + pfs.stderr.read())
                time.sleep(0.05)
            args.data = mnt
        else:
            # The page cache holds every file (read once here).
            for d, _, fs in os.walk(backing):
                for f in fs:
                    with open(os.path.join(d, f), "rb") as fh:
                        fh.read()
        driver = Driver(args, work)
        log(f"{args.files} x {args.size} B, batch {args.batch}, {args.ranks} rank(s), "
            f"{args.epochs} epochs, {'emulated PFS ' + args.curve if args.pfs else 'page cache'}")
        results = {s: [] for s in setups}
        for run in range(args.runs):
            order = setups if run % 2 == 0 else list(reversed(setups))
            for s in order:
                r = driver.run(s, f"{s}-{run}")
                results[s].append(r)
                log(f"run {run} {s}: stall median {r['median_ms']:.3f} ms, p99 "
                    f"{r['p99_ms']:.2f} ms, {r['samples_per_s']:,.0f} samples/s")
        report(results, setups)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"args": {k: v for k, v in vars(args).items()}, "results": results},
                          fh, indent=1)
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
