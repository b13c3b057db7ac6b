#!/usr/bin/env python3
"""Decoding in threads of the training process against DataLoader worker processes: samples per
second of decodes that release the GIL, both reading through nopfs, in one run.

    python3 bench/thread_bench.py --build build [--files 2000 --kind photo --parallel 2,4
        --decodes pil,pipeline,tvio,numpy --passes 2]

A synthetic ImageFolder of --files JPEG files is written to a temporary directory (--kind photo:
500x375, quality 90, about 110 KB, as pipeline_bench.py; small: 64x48, about 2.4 KB) and served
by `nopfs run` (one rank). For each decode and each parallelism P:
  procs    nopfs.torch.DataLoader(ImageFolder(decode=...), num_workers=P): the decode runs in P
           worker processes, each batch is handed to the training process by torch (pickled, or
           a tensor in shared memory);
  threads  nopfs.torch.DataLoader(ImageFolder(decode=...), num_workers=0, decode_threads=P): P
           threads of the training process make each batch's items (the batch split in P
           parts), nothing pickled.
The decodes: pil (PIL, RGB, loaded: pil_decode; the batch is the list of images), pipeline
(pil_decode + RandomResizedCrop(224) + flip + ToTensor + Normalize, stacked), tvio
(torchvision.io.decode_jpeg, stacked), numpy (the bytes as float32
scaled to [0, 1], a numpy ufunc; the batch is the list of arrays). `serial` is the same decode in
the training process's one thread (num_workers=0, decode_threads=0). The loaders' passes are interleaved (one warm-up pass each,
then --passes rounds, the order reversed every other round). As root, runs as `nobody`.
"""

import argparse
import os
import random
import shutil
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dataloader_util import (measure_interleaved, nopfsd_pid, rerun_as_nobody,  # noqa: E402
                             start_service, stop_service)
from pipeline_bench import make_jpeg  # noqa: E402

import numpy as np
import torch
import torch.utils.data as tud
import torchvision
import torchvision.transforms as T


def pil_loaded(data):
    from nopfs.torch import pil_decode

    img = pil_decode(data)
    img.load()
    return img


def numpy_decode(data):
    return np.frombuffer(data, dtype=np.uint8).astype(np.float32) * np.float32(1 / 255)


def tvio_decode(data):
    return torchvision.io.decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build directory (bin/, python/)")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--kind", choices=("photo", "small"), default="photo")
    ap.add_argument("--parallel", default="2,4", help="threads and worker processes")
    ap.add_argument("--decodes", default="pil,pipeline,tvio,numpy")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    rerun_as_nobody(__file__, "nopfs-thread-bench-")
    # More workers than cores is what is measured here.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    sys.path.insert(0, os.path.join(build, "python"))
    from nopfs.torch import DataLoader, DistributedSampler, ImageFolder

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(mean, std)])
    decodes = {"pil": (pil_loaded, None, list), "numpy": (numpy_decode, None, list),
               "pipeline": (pil_loaded, transform, tud.default_collate),
               "tvio": (tvio_decode, None, tud.default_collate)}
    tmp = tempfile.mkdtemp(prefix="nopfs-thread-bench-")
    service = None
    try:
        root = os.path.join(tmp, "data")
        rnd = random.Random(11)
        size = (500, 375) if args.kind == "photo" else (64, 48)
        total = 0
        for k in range(args.files):
            d = os.path.join(root, f"n{k % 10:08d}")
            os.makedirs(d, exist_ok=True)
            data = make_jpeg(rnd, *size)
            total += len(data)
            with open(os.path.join(d, f"img_{k:06d}.JPEG"), "wb") as fh:
                fh.write(data)
        epochs = 2 + args.passes
        run_dir = os.path.join(tmp, "run")
        service = start_service(build, root, run_dir, epochs, args.batch, "thread_bench")
        os.environ.update({
            "NOPFS_SOCKET": os.path.join(run_dir, "nopfsd.sock"), "NOPFS_RANK": "0",
            "NOPFS_RANKS": "1", "NOPFS_SEED": "3", "NOPFS_BATCH": str(args.batch),
            "NOPFS_SCHEME": "strided", "NOPFS_DROP_LAST": "0", "NOPFS_SAMPLES": str(args.files),
            "NOPFS_EPOCHS": str(epochs)})
        pid = nopfsd_pid(run_dir)
        print(f"thread_bench: {args.files} JPEG files of {total / args.files / 1e3:.1f} KB on "
              f"average ({size[0]}x{size[1]}), batch {args.batch}, {args.passes} measured "
              f"rounds after a warm-up, {os.cpu_count()} cores, torch {torch.__version__}")
        print("| decode | P | serial samples/s | procs samples/s | threads samples/s | "
              "threads / procs | CPU µs per sample, procs / threads |")
        print("|---|---|---|---|---|---|---|", flush=True)
        parallel = [int(p) for p in args.parallel.split(",")]
        for name in args.decodes.split(","):
            if name not in decodes:
                sys.exit(f"thread_bench: --decodes: unknown decode '{name}': write some of "
                         f"{','.join(decodes)}")
            decode, transform, collate = decodes[name]
            loaders = {}
            for p in [0] + parallel:
                for way in ("threads", "procs") if p else ("threads",):
                    ds = ImageFolder(root, decode=decode, transform=transform)
                    s = DistributedSampler(ds)
                    loaders[f"{way} {p}"] = (DataLoader(
                        ds, batch_size=args.batch, sampler=s, collate_fn=collate,
                        num_workers=p if way == "procs" else 0,
                        decode_threads=p if way == "threads" else 0), s.set_epoch)
            r = measure_interleaved(loaders, args.passes, pid,
                                    count=lambda b: len(b[0]) if collate is tud.default_collate
                                    else len(b))
            serial = r["threads 0"].per_second
            for p in parallel:
                pr, th = r[f"procs {p}"], r[f"threads {p}"]
                print(f"| {name} | {p} | {serial:,.0f} | {pr.per_second:,.0f} | "
                      f"{th.per_second:,.0f} | {th.per_second / pr.per_second:.2f} | "
                      f"{pr.cpu_ms_per_item * 1e3:.0f} / {th.cpu_ms_per_item * 1e3:.0f} |",
                      flush=True)
    finally:
        stop_service(service)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
