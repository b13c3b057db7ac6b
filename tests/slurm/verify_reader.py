#!/usr/bin/python3
"""A verifying rank for the cluster's fault and tenant tests (tests/slurm/faults_test.py,
tenants_test.py): reads the rank's whole stream from the node's nopfsd through the Python package
(NOPFS_SOCKET, NOPFS_RANK, NOPFS_SAMPLES, NOPFS_DATASET), compares every sample's bytes with its
file, and can stop at a gate half-way so that the test does its damage while the rank is mid-read.

    verify_reader.py OUT [--gate-after N --gate DIR] [--original DIR] [--pause SECONDS]

A sample is right when its bytes equal the file's bytes at the sample's offset and length as the
file is now or, with --original, as the copy of the dataset taken before the job holds them (a
file changed, truncated or removed during the job may be served with the bytes it had: a tier
keeps the first copy, docs/catalog.md). Anything else is a mismatch: a wrong byte. A sample the
service reports it cannot read is an error (allowed: it names the sample); the service going away
ends the read with its message (allowed too).

The last line, written to OUT (and stdout), reads
`rank R: N samples, M bytes, K mismatches, E errors[; stopped: ...]`; SIGTERM (scancel) writes
it with what was read so far.
"""
import argparse
import os
import signal
import sys
import time

import nopfs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--gate-after", type=int, default=-1,
                   help="after this many samples, touch GATE/at-JOB-RANK and wait for GATE/go-JOB")
    p.add_argument("--gate", default="")
    p.add_argument("--original", default="", help="a copy of the dataset taken before the job")
    p.add_argument("--pause", type=float, default=0.0, help="seconds to hold each sample")
    a = p.parse_args()

    rank = int(os.environ["NOPFS_RANK"])
    job = os.environ.get("SLURM_JOB_ID", "0")
    dataset = os.environ["NOPFS_DATASET"]
    counts = {"samples": 0, "bytes": 0, "mismatches": 0, "errors": 0}
    stopped = []

    def report():
        line = (f"rank {rank}: {counts['samples']} samples, {counts['bytes']} bytes, "
                f"{counts['mismatches']} mismatches, {counts['errors']} errors")
        if stopped:
            line += "; stopped: " + stopped[0]
        # Whole or not at all: the test reads the file as soon as it exists.
        tmp = f"{a.out}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(line + "\n")
        os.replace(tmp, a.out)
        print(line, flush=True)

    def on_term(signum, frame):
        stopped.append("SIGTERM")
        report()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)

    def file_bytes(path, offset, length):
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(length)
        except OSError:
            return None

    client = nopfs.connect()
    # Where every sample lives, asked before reading: a rank whose nopfsd dies still verifies
    # the samples that were published to it.
    where = [client.describe(i) for i in range(int(os.environ["NOPFS_SAMPLES"]))]
    stream = client.open(rank)
    while True:
        if counts["samples"] + counts["errors"] == a.gate_after:
            open(os.path.join(a.gate, f"at-{job}-{rank}"), "w").close()
            while not os.path.exists(os.path.join(a.gate, f"go-{job}")):
                time.sleep(0.1)
        try:
            sample = stream.next()
        except nopfs.SampleError as e:
            counts["errors"] += 1
            print(f"rank {rank}: sample error: {e}", file=sys.stderr, flush=True)
            continue
        except nopfs.Error as e:  # UnavailableError, TimeoutError: the service is gone
            stopped.append(f"{type(e).__name__}: {e}")
            break
        if sample is None:
            break
        with sample:
            got = sample.tobytes()
            info = where[sample.id]
        want = [file_bytes(info["path"], info["offset"], info["length"])]
        if a.original:
            rel = os.path.relpath(info["path"], dataset)
            want.append(file_bytes(os.path.join(a.original, rel), info["offset"], info["length"]))
        if got not in [w for w in want if w is not None and len(w) == info["length"]]:
            counts["mismatches"] += 1
            print(f"rank {rank}: sample {sample.id} ({info['path']}): {len(got)} bytes delivered "
                  "match neither the file nor its copy from before the job", file=sys.stderr,
                  flush=True)
        counts["samples"] += 1
        counts["bytes"] += len(got)
        if a.pause:
            time.sleep(a.pause)
    report()
    return 0 if counts["mismatches"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
