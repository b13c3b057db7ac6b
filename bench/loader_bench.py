#!/usr/bin/env python3
"""Samples per second through a PyTorch DataLoader, every batch mode of nopfs.torch against
torch's own DataLoader reading the same files, for several worker counts, in one run.

    python3 bench/loader_bench.py --build build [--files 20000 --size 65536 --batch 32
        --workers 0,1,2,4 --persistent 1,2,4 --modes tensor,bytes,pil,decode,subclass
        --passes 2]

A synthetic ImageFolder of --files files of --size bytes each is written to a temporary
directory: a small JPEG (64x48, about 2.4 KB) followed by random bytes up to the size (a JPEG
decoder stops at the image's end), so that every mode reads the same files. `nopfs run` serves
it (one rank, the default RAM tier); the files are in the page cache, so this measures the
loaders' own cost, not a PFS. Per batch mode, the two loaders are:
  torch     torch.utils.data.DataLoader + DistributedSampler over a map-style dataset that opens
            and reads each file and makes the same item (what a script does today);
  nopfs     nopfs.torch.ImageFolder + DistributedSampler + DataLoader (the three-line change).
The modes (each item is (x, label)):
  tensor    x = a uint8 tensor of the bytes (nopfs: decode=nopfs.torch.uint8_tensor), the
            default collate (one [32, size] tensor per batch);
  bytes     x = the bytes (nopfs: decode=bytes);
  pil       x = the RGB PIL image (nopfs: decode=nopfs.torch.pil_decode);
  decode    x = a decode of the script's own, torch.frombuffer(bytearray(data), dtype=uint8);
  subclass  a Dataset subclass whose __getitem__ reads the sample (nopfs: self.read(index)) and
            decodes it as `decode` does.
Every mode but tensor collates a batch to its length, so that the loaders' own cost is what is
measured, not moving the items to the training loop. Rows: --workers (num_workers), and
--persistent (num_workers with persistent_workers=True, shown as "2p"), each with every mode.
In each cell (a row and a mode) each loader runs in a fresh process of its own, as in a training
script (what a process did before, e.g. another loader's batches, changes how its malloc and so
its forked workers behave), and the two make one warm-up pass each and then --passes rounds of
one pass each, interleaved (the order reversed every other round, so that the machine's drift
falls on both alike). The ratio is nopfs / torch over all rounds of the cell. In each round,
each loader's process also times its decode alone (the ceiling): the item it makes, from the
bytes of 256 of the files held in memory (bytes for torch's, read-only views for nopfs's), in
a loop, as many samples as a pass; "X / its alone" is how close the loader comes to it (above 1:
workers decoding on more than one core). As root, runs as `nobody` (nopfsd refuses root).
"""

import argparse
import io
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dataloader_util import rerun_as_nobody, start_service, stop_service  # noqa: E402

import torch
import torch.utils.data as tud
from PIL import Image

MODES = ("tensor", "bytes", "pil", "decode", "subclass")
# The files whose bytes a loader's decode alone cycles through (in memory).
ALONE_FILES = 256


def decode(data):
    """The script's own decode (the `decode` and `subclass` modes)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def pil(data):
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def batch_length(items):
    """The collate of every mode but tensor: the batch's length."""
    return len(items)


def count(batch):
    return batch if isinstance(batch, int) else batch[0].shape[0]


class Files(tud.Dataset):
    """What a script has today: a map-style dataset reading each sample's file."""

    def __init__(self, samples, make):
        self.samples, self.make = samples, make

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with open(path, "rb") as fh:
            return self.make(fh.read()), label


class OwnFiles(tud.Dataset):
    """The subclass mode, as torch reads it: a Dataset of the script's own."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, label = self.samples[index]
        with open(path, "rb") as fh:
            data = fh.read()
        return decode(data), label


def make_files(root, files, size):
    rnd = random.Random(5)
    small = Image.frombytes("RGB", (4, 3), rnd.randbytes(36)).resize((64, 48), Image.BICUBIC)
    noise = Image.frombytes("L", (64, 48), rnd.randbytes(64 * 48)).convert("RGB")
    out = io.BytesIO()
    Image.blend(small, noise, 0.28).save(out, format="JPEG", quality=90)
    jpeg = out.getvalue()
    if len(jpeg) > size:
        sys.exit(f"loader_bench: --size {size} is smaller than the JPEG ({len(jpeg)} bytes)")
    for k in range(files):
        d = os.path.join(root, f"class{k % 10}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{k:06d}.bin"), "wb") as fh:
            fh.write(jpeg + os.urandom(size - len(jpeg)))


def serve_loader(build, workers, persistent, mode, which, batch):
    """One loader (`which`: torch or nopfs) of one cell, in a process of its own (started by
    run_cell with the service's environment): for each epoch read from stdin, one pass, and for
    "alone" its decode alone; writes "items seconds" for it."""
    sys.path.insert(0, os.path.join(build, "python"))
    import nopfs
    from nopfs.torch import (DataLoader, DistributedSampler, ImageFolder, pil_decode,
                             uint8_tensor)

    class Own(ImageFolder):
        """The subclass mode: a nopfs dataset with a __getitem__ of the script's own."""

        def __getitem__(self, index):
            data, label = self.read(index)
            return decode(data), label

    root = os.environ["NOPFS_DATASET"]
    extra = {"persistent_workers": True} if persistent else {}
    collate = None if mode == "tensor" else batch_length
    _, samples = nopfs.scan_image_folder(root)
    # The item each loader makes of a sample's bytes.
    make = {"tensor": decode if which == "torch" else uint8_tensor, "bytes": bytes,
            "pil": pil if which == "torch" else pil_decode, "decode": decode,
            "subclass": decode}[mode]
    if which == "torch":
        ds = OwnFiles(samples) if mode == "subclass" else Files(samples, make)
        sampler = tud.distributed.DistributedSampler(ds, num_replicas=1, rank=0)
        loader = tud.DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers,
                                collate_fn=collate, **extra)
    else:
        ds = Own(root, decode=decode) if mode == "subclass" else ImageFolder(root, decode=make)
        sampler = DistributedSampler(ds)
        loader = DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers,
                            collate_fn=collate, **extra)
    alone = None
    for line in sys.stdin:
        if line.startswith("alone"):
            # The ceiling: this loader's decode of the files' bytes, held in memory (torch's
            # loader hands it bytes, nopfs's read-only views), in a loop in this process.
            if alone is None:
                alone = []
                for path, _ in samples[:ALONE_FILES]:
                    with open(path, "rb") as fh:
                        data = fh.read()
                    alone.append(data if which == "torch" else memoryview(data).toreadonly())
            n = len(samples)
            t0 = time.perf_counter()
            for k in range(n):
                make(alone[k % len(alone)])
            print(n, time.perf_counter() - t0, flush=True)
            continue
        sampler.set_epoch(int(line))
        n = 0
        t0 = time.perf_counter()
        for b in loader:
            n += count(b)
        print(n, time.perf_counter() - t0, flush=True)


def run_cell(build, env, workers, persistent, mode, batch, passes):
    """(torch, nopfs, torch's decode alone, nopfs's decode alone) samples per second of one
    cell: each loader in a fresh process of its own, as a training script has it (what a
    process did before, e.g. another loader's batches, changes how its malloc and so its forked
    workers behave), their passes interleaved: one warm-up pass each (epoch 0), then `passes`
    rounds of one pass each (epoch 1 + round), the order reversed every other round, so that
    the machine's drift falls on both alike; in each round, each process's decode alone (as
    many samples as a pass, in its loop) follows its pass."""
    procs = {}
    for which in ("torch", "nopfs"):
        procs[which] = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--build", build, "--batch", str(batch),
             "--cell", f"{workers},{int(persistent)},{mode},{which}"],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)

    def one_pass(which, epoch):
        p = procs[which]
        p.stdin.write(f"{epoch}\n")
        p.stdin.flush()
        line = p.stdout.readline()
        if not line:
            p.stdin.close()
            sys.exit(f"loader_bench: {which}'s loader of the cell {workers} "
                     f"{'persistent ' if persistent else ''}{mode} failed:\n{p.stderr.read()}")
        n, t = line.split()
        return int(n), float(t)

    try:
        order = list(procs)
        for which in order:
            one_pass(which, 0)
        total = {which: [0, 0.0] for which in order}
        alone = {which: [0, 0.0] for which in order}
        for r in range(passes):
            for which in (order if r % 2 == 0 else order[::-1]):
                n, t = one_pass(which, 1 + r)
                total[which][0] += n
                total[which][1] += t
                n, t = one_pass(which, "alone")
                alone[which][0] += n
                alone[which][1] += t
        return tuple(x[w][0] / x[w][1] for x in (total, alone) for w in order)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.stdin.close()
                p.wait(timeout=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build directory (bin/, python/)")
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--size", type=int, default=64 * 1024, help="bytes per file")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", default="0,1,2,4", help="rows of num_workers")
    ap.add_argument("--persistent", default="1,2,4",
                    help="rows of num_workers with persistent_workers=True ('' for none)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--passes", type=int, default=2, help="measured rounds per cell")
    # workers,persistent,mode,loader: one loader of one cell (run_cell)
    ap.add_argument("--cell", help=argparse.SUPPRESS)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    if args.cell:
        w, p, mode, which = args.cell.split(",")
        serve_loader(build, int(w), p == "1", mode, which, args.batch)
        return
    modes = args.modes.split(",")
    for m in modes:
        if m not in MODES:
            sys.exit(f"loader_bench: --modes: unknown mode '{m}': write some of {','.join(MODES)}")
    rows = [(int(w), False) for w in args.workers.split(",") if w]
    rows += [(int(w), True) for w in args.persistent.split(",") if w]
    rerun_as_nobody(__file__, "nopfs-loader-bench-")
    tmp = tempfile.mkdtemp(prefix="nopfs-loader-bench-")
    service = None
    try:
        root = os.path.join(tmp, "data")
        make_files(root, args.files, args.size)
        epochs = 2 + args.passes
        run_dir = os.path.join(tmp, "run")
        service = start_service(build, root, run_dir, epochs, args.batch, "loader_bench")
        env = {**os.environ, "NOPFS_DATASET": root,
               "NOPFS_SOCKET": os.path.join(run_dir, "nopfsd.sock"), "NOPFS_RANK": "0",
               "NOPFS_RANKS": "1", "NOPFS_SEED": "3", "NOPFS_BATCH": str(args.batch),
               "NOPFS_SCHEME": "strided", "NOPFS_DROP_LAST": "0",
               "NOPFS_SAMPLES": str(args.files), "NOPFS_EPOCHS": str(epochs)}
        print(f"loader_bench: {args.files} files of {args.size} bytes, batch {args.batch}, "
              f"{args.passes} measured rounds per cell after a warm-up, {os.cpu_count()} cores, "
              f"torch {torch.__version__}", flush=True)
        print("| workers | mode | torch samples/s | nopfs samples/s | nopfs / torch | "
              "torch's decode alone | nopfs's decode alone | torch / its alone | "
              "nopfs / its alone |")
        print("|---|---|---|---|---|---|---|---|---|", flush=True)
        for workers, persistent in rows:
            name = f"{workers}p" if persistent else str(workers)
            for mode in modes:
                t, n, ta, na = run_cell(build, env, workers, persistent, mode, args.batch,
                                        args.passes)
                print(f"| {name} | {mode} | {t:,.0f} | {n:,.0f} | {n / t:.2f} | {ta:,.0f} | "
                      f"{na:,.0f} | {t / ta:.2f} | {n / na:.2f} |", flush=True)
    finally:
        stop_service(service)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
