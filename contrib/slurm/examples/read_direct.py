#!/usr/bin/env python3
"""Reads this rank's stream straight from the dataset's files, in the order nopfs plans it: the
baseline that `nopfs cat` is compared with in the demo. Uses the NOPFS_* environment that the
Slurm plugin (or `nopfs run`) gives every task, and the catalog's order for an ImageFolder tree:
class folders sorted bytewise (label = index), then files by relative path, bytewise; hidden
entries skipped (docs/catalog.md).

Prints one line: `N samples, M bytes in S s`."""

import os
import subprocess
import sys
import time


def imagefolder(root):
    files = []
    classes = sorted(e for e in os.listdir(root)
                     if not e.startswith(".") and os.path.isdir(os.path.join(root, e)))
    for cls in classes:
        found = []
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, cls), followlinks=True):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for f in filenames:
                if not f.startswith("."):
                    p = os.path.join(dirpath, f)
                    found.append(os.path.relpath(p, root).encode())
        files.extend(os.path.join(root.encode(), rel) for rel in sorted(found))
    return files


def main():
    env = os.environ
    nopfs = sys.argv[1] if len(sys.argv) > 1 else "nopfs"
    files = imagefolder(env["NOPFS_DATASET"])
    args = [nopfs, "stream", "--seed", env["NOPFS_SEED"], "--samples", str(len(files)),
            "--epochs", env["NOPFS_EPOCHS"], "--ranks", env["NOPFS_RANKS"],
            "--rank", env["NOPFS_RANK"], "--batch", env["NOPFS_BATCH"],
            "--scheme", env["NOPFS_SCHEME"], "--ranks-per-node", env["NOPFS_RANKS_PER_NODE"]]
    if env.get("NOPFS_DROP_LAST") == "1":
        args.append("--drop-last")
    ids = [int(x) for x in subprocess.run(args, check=True, capture_output=True,
                                          text=True).stdout.split()]
    t0 = time.monotonic()
    total = 0
    for k in ids:
        with open(files[k], "rb") as fh:
            total += len(fh.read())
    print(f"{len(ids)} samples, {total} bytes in {time.monotonic() - t0:.2f} s")


if __name__ == "__main__":
    main()
