#!/usr/bin/env python3
"""Samples per second through a PyTorch DataLoader: reading through nopfs against the same
DataLoader reading the same files directly, in one run, for several worker counts.

    python3 bench/loader_bench.py --build build [--files 3000 --size 65536 --workers 0,2,4 --passes 4]

A synthetic ImageFolder of --files files of --size random bytes is written to a temporary
directory; `nopfs run` serves it (one rank) while this process reads it four ways per worker
count, one warm-up pass each and then --passes rounds of one pass each, interleaved (the order
reversed every other round, so that the machine's drift falls on all alike; all from the page
cache or RAM: this measures the data path, not a PFS), each through the public API (ImageFolder,
DistributedSampler, DataLoader; only the imports differ):
  direct   torch.utils.data.DataLoader over a map-style dataset that reads each file, with
           torch's DistributedSampler (what a script does today);
  fallback nopfs.torch.DataLoader with no service (each worker reads the files, in the plan's
           order), decode=nopfs.torch.uint8_tensor;
  nopfs    nopfs.torch.DataLoader reading from nopfsd's shared-memory rings,
           decode=nopfs.torch.uint8_tensor (the batch path: one uint8 tensor per batch, filled in
           C++);
  decode   the same with a decode function of the script's own (one view per sample, as a PIL
           decode gets);
  copy     the baseline: each batch's samples copied (numpy's take, a memcpy per sample) from one
           array in this process's memory, in a shuffled order, into one of 4 preallocated
           tensors in turn: the memory copy any loader that hands out tensors makes, without a
           loader and without allocating a tensor per batch (measured in the row of 0 workers).
Each item is a uint8 tensor of the sample's bytes, batches are stacked by the default collate.
Ratios are against `direct` and `copy` measured in the same run, over all rounds; `nopfs per
pass` is the range of nopfs's rounds; CPU µs is the CPU time of this process, its workers and
nopfsd per sample. As root, runs as `nobody` (nopfsd refuses root).
"""

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dataloader_util import (measure_interleaved, nopfsd_pid, rerun_as_nobody,  # noqa: E402
                             start_service, stop_service)

import numpy as np
import torch
import torch.utils.data as tud


def to_tensor(data):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class CopyBound:
    """Batches of `batch` samples of `size` bytes copied from one array, in a shuffled order per
    epoch, into preallocated tensors taken in turn (numpy's take: one call per batch, a memcpy
    per sample): the memory copy that handing out tensors costs, without a loader and without
    allocating each batch's tensor."""

    def __init__(self, files, size, batch):
        self.data = torch.randint(0, 256, (files, size), dtype=torch.uint8).numpy()
        self.files, self.size, self.batch = files, size, batch
        self.outs = [torch.empty((batch, size), dtype=torch.uint8) for _ in range(4)]
        for out in self.outs:
            out.fill_(0)  # faulted in now, not in the first measured pass
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.files, generator=torch.Generator().manual_seed(self.epoch))
        order = order.numpy()
        for n, k in enumerate(range(0, self.files, self.batch)):
            ids = order[k:k + self.batch]
            out = self.outs[n % len(self.outs)][:len(ids)]
            np.take(self.data, ids, axis=0, out=out.numpy(), mode="clip")  # clip: unbuffered
            yield out, None


class Files(tud.Dataset):
    """What a script has today: a map-style dataset reading each sample's file."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with open(path, "rb") as fh:
            return to_tensor(fh.read()), label



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build directory (bin/, python/)")
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--size", type=int, default=64 * 1024, help="bytes per file")
    ap.add_argument("--workers", default="0,2,4")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--passes", type=int, default=4)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    rerun_as_nobody(__file__, "nopfs-loader-bench-")
    sys.path.insert(0, os.path.join(build, "python"))
    import nopfs
    from nopfs.torch import DataLoader, DistributedSampler, ImageFolder, uint8_tensor

    tmp = tempfile.mkdtemp(prefix="nopfs-loader-bench-")
    service = None
    try:
        root = os.path.join(tmp, "data")
        rnd = os.urandom
        for k in range(args.files):
            d = os.path.join(root, f"class{k % 10}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"{k:06d}.bin"), "wb") as fh:
                fh.write(rnd(args.size))
        epochs = 2 + args.passes
        run_dir = os.path.join(tmp, "run")
        service = start_service(build, root, run_dir, epochs, args.batch, "loader_bench")
        env = {"NOPFS_SOCKET": os.path.join(run_dir, "nopfsd.sock"), "NOPFS_RANK": "0",
               "NOPFS_RANKS": "1", "NOPFS_SEED": "3", "NOPFS_BATCH": str(args.batch),
               "NOPFS_SCHEME": "strided", "NOPFS_DROP_LAST": "0",
               "NOPFS_SAMPLES": str(args.files), "NOPFS_EPOCHS": str(epochs)}
        _, samples = nopfs.scan_image_folder(root)

        print(f"loader_bench: {args.files} files of {args.size} bytes, batch {args.batch}, "
              f"{args.passes} measured passes after a warm-up, {os.cpu_count()} cores")
        print(f"{'workers':>7} {'direct/s':>10} {'fallback/s':>10} {'nopfs/s':>10} "
              f"{'decode/s':>10} {'nopfs/direct':>12} {'decode/direct':>13} "
              f"{'fallback/direct':>15} {'nopfs per pass':>17} {'direct CPU µs':>13} "
              f"{'nopfs CPU µs':>12} {'copy/s':>8} {'nopfs/copy':>10}")
        pid = nopfsd_pid(run_dir)

        def environment(mode):
            def set_it():
                os.environ.pop("NOPFS_FALLBACK", None)
                os.environ.update(env)
                if mode == "fallback":
                    del os.environ["NOPFS_SOCKET"]
                    os.environ["NOPFS_FALLBACK"] = "1"
            return set_it

        copy_rate = float("nan")
        workers_list = [int(w) for w in args.workers.split(",")]
        if 0 not in workers_list:
            workers_list.insert(0, 0)  # the copy bound is measured with the row of no workers
        for workers in workers_list:
            sampler = tud.distributed.DistributedSampler(Files(samples), num_replicas=1, rank=0)
            loaders = {"direct": (tud.DataLoader(Files(samples), batch_size=args.batch,
                                                 sampler=sampler, num_workers=workers),
                                  sampler.set_epoch)}
            if workers == 0:
                copy = CopyBound(args.files, args.size, args.batch)
                loaders["copy"] = (copy, copy.set_epoch)
            for mode in ("fallback", "nopfs", "decode"):
                environment(mode)()
                ds = ImageFolder(root, decode=to_tensor if mode == "decode" else uint8_tensor)
                s = DistributedSampler(ds)
                loaders[mode] = (DataLoader(ds, batch_size=args.batch, sampler=s,
                                            num_workers=workers), s.set_epoch, environment(mode))
            r = measure_interleaved(loaders, args.passes, pid)
            rates = {mode: rate.per_second for mode, rate in r.items()}
            direct = rates["direct"]
            copy_rate = rates.get("copy", copy_rate)  # measured with no workers
            print(f"{workers:>7} {direct:>10.0f} {rates['fallback']:>10.0f} "
                  f"{rates['nopfs']:>10.0f} {rates['decode']:>10.0f} "
                  f"{rates['nopfs'] / direct:>12.2f} {rates['decode'] / direct:>13.2f} "
                  f"{rates['fallback'] / direct:>15.2f} "
                  f"{min(r['nopfs'].passes):>8.0f}-{max(r['nopfs'].passes):<8.0f} "
                  f"{r['direct'].cpu_ms_per_item * 1e3:>13.1f} "
                  f"{r['nopfs'].cpu_ms_per_item * 1e3:>12.1f} "
                  f"{copy_rate:>8.0f} {rates['nopfs'] / copy_rate:>10.2f}",
                  flush=True)
    finally:
        stop_service(service)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
