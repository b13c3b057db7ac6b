#!/usr/bin/env python3
"""ResNet-18 on an ImageFolder dataset, on CPU, one process per rank, with ImageFolder,
DistributedSampler and DataLoader as PyTorch users write them. train_resnet18.py reads the files
itself; train_resnet18_nopfs.py differs from it in three lines (the imports) and reads through
nopfs (docs/python.md shows the diff and the commands).
"""

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torchvision
import torchvision.transforms as T
from nopfs.torch import DataLoader
from nopfs.torch import DistributedSampler
from nopfs.torch import ImageFolder


def rank_and_world():
    """From torchrun (RANK/WORLD_SIZE), Slurm (SLURM_PROCID/SLURM_NTASKS) or `nopfs run`."""
    for r, w in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                 ("NOPFS_RANK", "NOPFS_RANKS")):
        if os.environ.get(r) is not None and os.environ.get(w) is not None:
            return int(os.environ[r]), int(os.environ[w])
    return 0, 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="an ImageFolder root")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16, help="per rank")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many")
    args = ap.parse_args()

    rank, world = rank_and_world()
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1234)
    torch.set_num_threads(1)

    transform = T.Compose([T.Resize((args.image_size, args.image_size)), T.ToTensor(),
                           T.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])])
    dataset = ImageFolder(args.data, transform=transform)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers)

    model = torchvision.models.resnet18(num_classes=len(dataset.classes))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        digest = hashlib.sha256()
        seen, total, t0 = 0, 0.0, time.monotonic()
        for step, (x, y) in enumerate(loader):
            if args.max_steps and step >= args.max_steps:
                break
            digest.update(x.numpy().tobytes())
            digest.update(y.numpy().tobytes())
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            seen += len(y)
            total += loss.item() * len(y)
        dt = time.monotonic() - t0
        # One write per line: ranks share stdout, and print() may write the text and its newline
        # separately (unbuffered, as with PYTHONUNBUFFERED), which interleaves the ranks' lines.
        sys.stdout.write(f"rank {rank} epoch {epoch}: {seen} samples, "
                         f"loss {total / max(seen, 1):.4f}, {seen / dt:.1f} samples/s, "
                         f"data {digest.hexdigest()[:16]}\n")
        sys.stdout.flush()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
