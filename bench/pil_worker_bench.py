#!/usr/bin/env python3
"""Where a DataLoader worker's time goes per sample on the pil path, nopfs against torch: the
ceiling of loader_bench.py's pil cells with workers that live one pass.

    python3 bench/pil_worker_bench.py --build build [--files 8000 --passes 4]

loader_bench.py's files (--files of 64 KiB: a 64x48 JPEG followed by random bytes) served by
`nopfs run` (one rank). Each pass, in this process as a worker that lives one pass has it: a
fresh connection opens the pass's stream read_once and times, per sample, what such a worker
does with pil_decode (the batch's JPEGs decoded in one call, each reading only the part of its
sample that libjpeg reads: "nopfs batch"), and, for the same batch, the way a decode of the
script's own gets its samples, nopfs's copy out of the RAM tier (Batch.tobytes(), a read-only
view of each copy) and pil_decode of each copy; then, over the same samples in the same order,
torch's dataset's open and read of the file and PIL's Image.open(...).convert("RGB") of its
bytes. All with the memory malloc frees kept, as nopfs's loader keeps it (docs/python.md). What a loader adds on top (the batches' hand-over, the
workers' start) is not here. As root, runs as `nobody` (nopfsd refuses root).
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dataloader_util import rerun_as_nobody, start_service, stop_service  # noqa: E402
from loader_bench import make_files, pil  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="the build directory (bin/, python/)")
    ap.add_argument("--files", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--passes", type=int, default=4)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    rerun_as_nobody(__file__, "nopfs-pil-worker-bench-")
    sys.path.insert(0, os.path.join(build, "python"))
    import nopfs
    from nopfs import _client
    from nopfs.torch import pil_decode
    from nopfs.torch._datasets import _pil_decode_batch
    from nopfs.torch._memory import keep_freed_memory

    keep_freed_memory()
    tmp = tempfile.mkdtemp(prefix="nopfs-pil-worker-bench-")
    service = None
    try:
        root = os.path.join(tmp, "data")
        make_files(root, args.files, 64 * 1024)
        _, samples = nopfs.scan_image_folder(root)
        run_dir = os.path.join(tmp, "run")
        service = start_service(build, root, run_dir, args.passes, args.batch, "pil_worker_bench")
        print(f"pil_worker_bench: {args.files} files of 64 KiB, µs per sample "
              f"({os.cpu_count()} cores)")
        print("| pass | nopfs batch | nopfs copy | pil_decode | copy + pil_decode | torch read | "
              "PIL | torch | torch / nopfs batch | torch / (copy + pil_decode) |")
        print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
        for epoch in range(args.passes):
            client = _client.connect(os.path.join(run_dir, "nopfsd.sock"))
            stream = client.open(0, epoch=epoch, step=0, worker=0, workers=1, batch=args.batch,
                                 epochs=1, read_once=True)
            n, whole, copy, decode, read, image = 0, 0.0, 0.0, 0.0, 0.0, 0.0
            while True:
                batch = stream.next_batch(args.batch, None)
                if batch is None:
                    break
                ids = batch.ids.tolist()
                n += len(ids)
                t0 = time.perf_counter()
                _pil_decode_batch(batch)
                whole += time.perf_counter() - t0
                t0 = time.perf_counter()
                views = [memoryview(c) for c in batch.tobytes()]
                batch.release()
                t1 = time.perf_counter()
                for v in views:
                    pil_decode(v)
                t2 = time.perf_counter()
                copy += t1 - t0
                decode += t2 - t1
                # torch's worker, the same samples right after (the load falls on both alike)
                for i in ids:
                    t0 = time.perf_counter()
                    with open(samples[i][0], "rb") as fh:
                        data = fh.read()
                    t1 = time.perf_counter()
                    pil(data)
                    image += time.perf_counter() - t1
                    read += t1 - t0
            stream.close()
            del client  # as a worker's, gone with the pass
            w, c, d, r, p = (1e6 * x / n for x in (whole, copy, decode, read, image))
            print(f"| {epoch} | {w:.1f} | {c:.1f} | {d:.1f} | {c + d:.1f} | {r:.1f} | {p:.1f} | "
                  f"{r + p:.1f} | {(r + p) / w:.2f} | {(r + p) / (c + d):.2f} |", flush=True)
    finally:
        stop_service(service)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
