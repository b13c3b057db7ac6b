#!/usr/bin/env python3
"""One task of the demo job (scripts/demo.sh): reads this rank's stream epoch by epoch, first
through the node's nopfsd, then straight from the dataset's files in the same order, and prints
the time of every epoch of both, and whether both delivered the same bytes.

The bytes are compared by a digest (BLAKE2b over every sample, in stream order): both passes read
the same samples in the same order, so equal digests mean equal bytes, without reading the files
a third time. Uses the NOPFS_* environment the Slurm plugin gives every task.

Prints one line:
  rank R on NODE: epochs nopfs T1 / T2 / ... s, files T1 / T2 / ... s; N samples, M bytes, same bytes: yes
"""

import hashlib
import os
import socket
import sys
import time

import nopfs


def nopfs_pass(job, epochs):
    client = nopfs.connect()
    digest, count, size, times = hashlib.blake2b(), 0, 0, []
    for epoch in range(epochs):
        t0 = time.monotonic()
        with client.open(job.rank, epoch=epoch, epochs=1) as stream:
            for sample in stream:
                with sample:
                    view = sample.data
                    digest.update(view)
                    size += len(view)
                    view.release()
                count += 1
        times.append(time.monotonic() - t0)
    return digest.hexdigest(), count, size, times


def files_pass(job, epochs, paths):
    digest, count, size, times = hashlib.blake2b(), 0, 0, []
    for epoch in range(epochs):
        t0 = time.monotonic()
        for sample_id in job.order(epoch).tolist():
            with open(paths[sample_id], "rb") as fh:
                data = fh.read()
            digest.update(data)
            size += len(data)
            count += 1
        times.append(time.monotonic() - t0)
    return digest.hexdigest(), count, size, times


def main():
    env = os.environ
    epochs = int(env["NOPFS_EPOCHS"])
    job = nopfs.Job.from_env(samples=nopfs.service_samples())
    _, samples = nopfs.scan_image_folder(env["NOPFS_DATASET"])
    paths = [path for path, _ in samples]
    served = nopfs_pass(job, epochs)
    direct = files_pass(job, epochs, paths)
    same = "yes" if served[:3] == direct[:3] else "NO"
    fmt = " / ".join
    print(f"rank {job.rank} on {env.get('SLURMD_NODENAME', socket.gethostname())}: "
          f"epochs nopfs {fmt(f'{t:.2f}' for t in served[3])} s, "
          f"files {fmt(f'{t:.2f}' for t in direct[3])} s; "
          f"{served[1]} samples, {served[2]} bytes, same bytes: {same}", flush=True)
    return 0 if same == "yes" else 1


if __name__ == "__main__":
    sys.exit(main())
