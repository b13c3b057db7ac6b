#!/usr/bin/env python3
"""A realistic input pipeline through a PyTorch DataLoader: JPEG files decoded and augmented as an
ImageNet training script does, read through nopfs against torchvision reading the same files, in
one run, for several worker counts.

    python3 bench/pipeline_bench.py --build build [--files 2000 --workers 2,4 --passes 8]

A synthetic ImageFolder of --files JPEG images (500x375, quality 90, about 110 KB each: the size
of an ImageNet-1k training image) is written to a temporary directory; `nopfs run` serves it (one
rank) while this process reads it two ways per worker count, one warm-up pass each and then
--passes rounds of one pass each, interleaved (direct, nopfs; nopfs, direct; ...) so that the
machine's drift falls on both alike (the files are in the page cache: this measures what nopfs
adds to a pipeline whose cost is decoding, not a PFS):
  direct   torchvision.datasets.ImageFolder + torch's DistributedSampler + DataLoader;
  nopfs    nopfs.torch.ImageFolder + nopfs.torch.DistributedSampler + nopfs.torch.DataLoader
           (the three-line change), decoding with PIL from the bytes nopfsd serves.
Both apply RandomResizedCrop(224), RandomHorizontalFlip, ToTensor and Normalize, batch --batch,
the default collate. Each round's ratio nopfs/direct is of the images per second of its two
passes (made back to back, under the same load); printed are their median and range, and the
ratio of the images per second over all rounds. CPU ms/img is the CPU time of this process, its
workers and nopfsd (all of it, whichever loader runs) per image, over all rounds; `CPU
nopfs/direct` the median of the rounds' ratios of it: the load moves the wall time far more than
the CPU time. As root, runs as `nobody` (nopfsd refuses root).
"""

import argparse
import io
import os
import random
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dataloader_util import (measure_interleaved, nopfsd_pid, rerun_as_nobody,  # noqa: E402
                             start_service, stop_service)

import torch
import torch.utils.data as tud
import torchvision
import torchvision.transforms as T
from PIL import Image

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def make_jpeg(rnd, width=500, height=375, quality=90):
    """An image with the detail of a photograph: a smooth colour field with noise on top, so that
    JPEG needs about 110 KB for it at quality 90 (pure noise would need far more, a flat image
    far less)."""
    small = Image.frombytes("RGB", (width // 25, height // 25), rnd.randbytes(3 * (width // 25) *
                                                                              (height // 25)))
    base = small.resize((width, height), Image.BICUBIC)
    noise = Image.frombytes("L", (width, height), rnd.randbytes(width * height)).convert("RGB")
    img = Image.blend(base, noise, 0.28)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    return out.getvalue()



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build directory (bin/, python/)")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--passes", type=int, default=8, help="measured rounds per worker count")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    rerun_as_nobody(__file__, "nopfs-pipeline-bench-")
    sys.path.insert(0, os.path.join(build, "python"))
    from nopfs.torch import DataLoader, DistributedSampler, ImageFolder

    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    tmp = tempfile.mkdtemp(prefix="nopfs-pipeline-bench-")
    service = None
    try:
        root = os.path.join(tmp, "data")
        rnd = random.Random(11)
        total = 0
        for k in range(args.files):
            d = os.path.join(root, f"n{k % 10:08d}")
            os.makedirs(d, exist_ok=True)
            data = make_jpeg(rnd)
            total += len(data)
            with open(os.path.join(d, f"img_{k:06d}.JPEG"), "wb") as fh:
                fh.write(data)
        epochs = 2 + args.passes
        run_dir = os.path.join(tmp, "run")
        service = start_service(build, root, run_dir, epochs, args.batch, "pipeline_bench")
        os.environ.update({
            "NOPFS_SOCKET": os.path.join(run_dir, "nopfsd.sock"), "NOPFS_RANK": "0",
            "NOPFS_RANKS": "1", "NOPFS_RANKS_PER_NODE": "1", "NOPFS_NODE": "0",
            "NOPFS_LOCAL_RANK": "0", "NOPFS_SEED": "3", "NOPFS_BATCH": str(args.batch),
            "NOPFS_SCHEME": "strided", "NOPFS_DROP_LAST": "0", "NOPFS_SAMPLES": str(args.files),
            "NOPFS_EPOCHS": str(epochs)})

        print(f"pipeline_bench: {args.files} JPEG files, {total / args.files / 1e3:.0f} KB on "
              f"average, RandomResizedCrop(224) + flip + ToTensor + Normalize, batch "
              f"{args.batch}, {args.passes} measured passes after a warm-up, "
              f"{os.cpu_count()} cores, torch {torch.__version__}, torchvision "
              f"{torchvision.__version__}")
        pid = nopfsd_pid(run_dir)
        print("| workers | direct img/s | nopfs img/s | nopfs / direct, median of rounds | "
              "rounds | over all rounds | CPU ms per image, direct / nopfs | "
              "CPU nopfs / direct, median |")
        print("|---|---|---|---|---|---|---|---|", flush=True)
        for workers in [int(w) for w in args.workers.split(",")]:
            direct_ds = torchvision.datasets.ImageFolder(root, transform=transform)
            sampler = tud.distributed.DistributedSampler(direct_ds, num_replicas=1, rank=0)
            ds = ImageFolder(root, transform=transform)
            s = DistributedSampler(ds)
            rates = measure_interleaved({
                "direct": (tud.DataLoader(direct_ds, batch_size=args.batch, sampler=sampler,
                                          num_workers=workers), sampler.set_epoch),
                "nopfs": (DataLoader(ds, batch_size=args.batch, sampler=s, num_workers=workers),
                          s.set_epoch)}, args.passes, pid)
            direct, nopfs = rates["direct"], rates["nopfs"]
            per_pass = [b / a for a, b in zip(direct.passes, nopfs.passes)]
            cpu = [b / a for a, b in zip(direct.cpu_passes, nopfs.cpu_passes)]
            print(f"| {workers} | {direct.per_second:.0f} | {nopfs.per_second:.0f} | "
                  f"{statistics.median(per_pass):.2f} | {min(per_pass):.2f}–{max(per_pass):.2f} | "
                  f"{nopfs.per_second / direct.per_second:.2f} | "
                  f"{direct.cpu_ms_per_item:.2f} / {nopfs.cpu_ms_per_item:.2f} | "
                  f"{statistics.median(cpu):.2f} |", flush=True)
    finally:
        stop_service(service)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
