#!/usr/bin/env python3
"""Writes a synthetic ImageFolder dataset: CLASSES folders of random-noise PNG images whose mean
colour depends on the class (so a model can learn something).

    python3 examples/make_synthetic_imagefolder.py /tmp/synthetic --images 512 --classes 4
"""

import argparse
import os
import random

from PIL import Image


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--size", type=int, default=48, help="side of each image in pixels")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    for k in range(args.images):
        label = k % args.classes
        folder = os.path.join(args.root, f"class{label:03d}")
        os.makedirs(folder, exist_ok=True)
        base = [(label * 67 + 40 * c) % 256 for c in range(3)]
        pixels = bytes(max(0, min(255, base[i % 3] + rnd.randint(-60, 60)))
                       for i in range(args.size * args.size * 3))
        Image.frombytes("RGB", (args.size, args.size), pixels).save(
            os.path.join(folder, f"img{k:06d}.png"))
    print(f"{args.images} images in {args.classes} classes under {args.root}")


if __name__ == "__main__":
    main()
