#!/usr/bin/env python3
"""One training rank of the end-to-end benchmark: reads its samples and "computes" by sleeping.

    consumer.py --mode direct|nopfs|noio --root DIR --epochs E --batch B --rate R --out PREFIX
                [--workers W] [--seed S]

Each step takes one batch of B samples from the loader (the time spent waiting for it is the
step's stall), then sleeps B / R seconds, R being the rank's compute rate in samples/s, so the
CPU is not what limits it. Modes:
  direct  torch.utils.data.DataLoader over the files with torch's DistributedSampler
          (RANK / WORLD_SIZE from the environment), W worker processes: what scripts do today;
  nopfs   nopfs.torch's DataLoader, ImageFolder and DistributedSampler under `nopfs run`
          (everything from the NOPFS_* environment), W worker processes;
  noio    no data at all: the same steps, the sleep alone (the lower bound).
Writes PREFIX.<rank>.json: per epoch its wall time, and every step's stall in seconds, and the bytes it received.
"""

import argparse
import json
import math
import os
import time

import torch.utils.data as tud


def count_batch(batch):
    """collate_fn: a batch becomes (samples, bytes); the bytes were moved, not kept."""
    return len(batch), sum(len(x) for x, _ in batch)


class Files(tud.Dataset):
    """A map-style dataset reading each sample's file (what a training script has today)."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with open(path, "rb") as fh:
            return fh.read(), label


def scan(root):
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    samples = []
    for label, c in enumerate(classes):
        d = os.path.join(root, c)
        samples += [(os.path.join(d, f), label) for f in sorted(os.listdir(d))]
    return samples


def run_epochs(make_iter, epochs, batch, rate):
    result = []
    for epoch in range(epochs):
        stalls, nbytes, nsamples = [], 0, 0
        t0 = time.perf_counter()
        it = make_iter(epoch)
        while True:
            s0 = time.perf_counter()
            try:
                n, b = next(it)
            except StopIteration:
                break
            stalls.append(time.perf_counter() - s0)
            nsamples += n
            nbytes += b
            time.sleep(n / rate)
        result.append({"epoch": epoch, "time": time.perf_counter() - t0, "stalls": stalls,
                       "samples": nsamples, "bytes": nbytes})
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["direct", "nopfs", "noio"], required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True, help="samples per step on this rank")
    ap.add_argument("--rate", type=float, required=True, help="compute rate, samples/s")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output path prefix")
    args = ap.parse_args()

    if args.mode == "nopfs":
        from nopfs.torch import DataLoader, DistributedSampler, ImageFolder
        # No decoding (the benchmark measures the data path, not JPEG decoding): each item is the
        # sample's bytes, a copy as a decoder's output would be and as the direct setups' read()
        # returns (decode=bytes: the batch's bytes objects are made in one call).
        ds = ImageFolder(args.root, decode=bytes)
        sampler = DistributedSampler(ds)
        rank = sampler.rank
        loader = DataLoader(ds, batch_size=args.batch, sampler=sampler,
                            num_workers=args.workers, collate_fn=count_batch)
    else:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        ds = Files(scan(args.root))
        sampler = tud.distributed.DistributedSampler(ds, num_replicas=world, rank=rank,
                                                     seed=args.seed)
        loader = tud.DataLoader(ds, batch_size=args.batch, sampler=sampler,
                                num_workers=args.workers, collate_fn=count_batch,
                                persistent_workers=args.workers > 0)

    def make_iter(epoch):
        if args.mode == "noio":
            steps = math.ceil(len(sampler) / args.batch)
            sizes = [min(args.batch, len(sampler) - k * args.batch) for k in range(steps)]
            return iter([(n, 0) for n in sizes])
        sampler.set_epoch(epoch)
        return iter(loader)

    epochs = run_epochs(make_iter, args.epochs, args.batch, args.rate)
    with open(f"{args.out}.{rank}.json", "w") as fh:
        json.dump({"mode": args.mode, "rank": rank, "workers": args.workers, "epochs": epochs}, fh)


if __name__ == "__main__":
    main()
