#!/usr/bin/env python3
"""An independent reference of nopfs's epoch permutation and of both partitions.

Written from docs/algorithm.md alone, in plain Python (arbitrary-precision ints, no numpy), so that
a bug in the C++ planner (policy/) cannot hide in a shared helper. Three uses:

  sampler_ref.py --golden
      Prints the golden vectors that policy/sampler_test.cc and policy/partition_test.cc embed.
      To regenerate them, run this and paste the output over the marked blocks of those files.

  sampler_ref.py --check DUMP [--cases N]
      Runs DUMP (the policy_ref_dump program built from tests/reference/policy_dump.cc), feeds it
      random cases (fixed seed, so a failure reproduces) and compares every number it prints with
      this reference. ctest runs this as policy_reference_check.

  sampler_ref.py --torch [--cases N]
      Checks this reference's strided partition against PyTorch itself:
      DistributedSampler(shuffle=False) + BatchSampler over range(F), mapped through pi_e, must
      equal strided(pi_e). ctest runs this as policy_strided_torch where torch is installed.
"""

import argparse
import random
import subprocess
import sys

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15


class SplitMix64:
    """Vigna's SplitMix64: add the golden gamma, then two xor-shift-multiply rounds."""

    def __init__(self, state):
        self.state = state & MASK64

    def next(self):
        self.state = (self.state + GOLDEN_GAMMA) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def bounded(self, bound):
        """Uniform in [0, bound): Lemire's multiply-shift, rejecting the 2^64 mod bound lowest
        products (written without the C++ version's early-out, which must not change results)."""
        assert 1 <= bound <= MASK64
        threshold = (1 << 64) % bound
        while True:
            product = self.next() * bound
            if (product & MASK64) >= threshold:
                return product >> 64


def epoch_seed(seed, epoch):
    """The state epoch `epoch`'s shuffle starts from: the first output of a SplitMix64 whose state
    starts at seed XOR (epoch * gamma) (docs/algorithm.md §2.1 says why not that value itself)."""
    return SplitMix64(seed ^ ((epoch * GOLDEN_GAMMA) & MASK64)).next()


def permutation(seed, epoch, f):
    """pi_epoch: Fisher-Yates from the top, i = F-1 down to 1, partner j = bounded(i+1)."""
    rng = SplitMix64(epoch_seed(seed, epoch))
    perm = list(range(f))
    for i in range(f - 1, 0, -1):
        j = rng.bounded(i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def ceil_div(a, b):
    return -(-a // b)


def uniform(perm, n, b, drop_last):
    """[rank][step] -> samples. Step h takes perm[hB : min((h+1)B, F')], F' = T*B with drop_last;
    without it a trailing batch of t = F mod B entries is padded with the head of perm to
    max(t, (N-1)*ceil(t/N) + 1) entries, so that no rank's slice is empty; rank i takes the i-th
    slice of ceil(b/N) of that batch of b entries."""
    f = len(perm)
    steps = f // b if drop_last else ceil_div(f, b)
    usable = steps * b if drop_last else f
    padded = perm + perm
    out = [[] for _ in range(n)]
    for h in range(steps):
        batch = perm[h * b:min((h + 1) * b, usable)]
        if len(batch) < b:
            size = max(len(batch), (n - 1) * ceil_div(len(batch), n) + 1)
            batch = padded[h * b:h * b + size]
        q = ceil_div(len(batch), n)
        for i in range(n):
            out[i].append(batch[i * q:(i + 1) * q])
    return out


def distributed_sampler_indices(f, n, rank, drop_last):
    """The indices torch.utils.data.DistributedSampler(shuffle=False) yields, restated from its
    definition: pad by repeating the list (or truncate), then take every N-th from `rank`."""
    if drop_last and f % n != 0:
        num_samples = ceil_div(f - n, n)
    else:
        num_samples = ceil_div(f, n)
    total = num_samples * n
    indices = list(range(f))
    if not drop_last:
        padding = total - f
        if padding <= f:
            indices += indices[:padding]
        else:
            indices += (indices * ceil_div(padding, f))[:padding]
    else:
        indices = indices[:total]
    return indices[rank:total:n]


def batches(items, size, drop_last):
    """A DataLoader's BatchSampler: consecutive batches of `size`, the short last one kept or not."""
    out = [items[k:k + size] for k in range(0, len(items), size)]
    if drop_last and out and len(out[-1]) < size:
        out.pop()
    return out


def strided(perm, n, b, drop_last):
    """[rank][step] -> samples: DistributedSampler + DataLoader(batch_size=ceil(B/N)) over pi_e."""
    r = ceil_div(b, n)
    out = []
    for i in range(n):
        own = [perm[p] for p in distributed_sampler_indices(len(perm), n, i, drop_last)]
        out.append(batches(own, r, drop_last))
    return out


def partition(scheme, perm, n, b, drop_last):
    return (uniform if scheme == "uniform" else strided)(perm, n, b, drop_last)


# ---------------------------------------------------------------------------------------------
# --golden

def fnv1a(values):
    """FNV-1a 64 over the values as little-endian uint32: a short fingerprint of a long vector."""
    h = 0xCBF29CE484222325
    for v in values:
        for k in range(4):
            h ^= (v >> (8 * k)) & 0xFF
            h = (h * 0x100000001B3) & MASK64
    return h


GOLDEN_PERMS = [  # (seed, epoch, F): printed in full
    (0, 0, 1), (0, 0, 2), (1, 0, 2), (42, 3, 13), (2**64 - 1, 7, 10), (12345, 0, 31),
    (2**64 - 1, 2**32 - 1, 17),
]
GOLDEN_PERM_HASHES = [  # (seed, epoch, F): first 8 entries and the FNV-1a of all
    (0, 0, 1000), (7, 89, 100003), (2**64 - 1, 1, 65536),
]
GOLDEN_PARTITIONS = [  # (scheme, seed, epoch, F, N, B, drop_last)
    ("uniform", 5, 0, 10, 3, 5, False),
    ("uniform", 5, 0, 10, 3, 5, True),
    ("uniform", 9, 2, 11, 4, 8, False),
    ("uniform", 3, 0, 65, 2, 8, False),
    ("strided", 5, 0, 10, 3, 4, False),
    ("strided", 5, 0, 10, 3, 4, True),
    ("strided", 9, 2, 11, 4, 6, False),
    ("strided", 3, 0, 65, 2, 8, False),
]


def cxx_list(values):
    return "{" + ", ".join(str(v) for v in values) + "}"


def golden():
    print("// SplitMix64(0): the first outputs")
    rng = SplitMix64(0)
    print("  " + cxx_list("0x%016XULL" % rng.next() for _ in range(4)))
    print("// SplitMix64(2^64-1): the first outputs")
    rng = SplitMix64(MASK64)
    print("  " + cxx_list("0x%016XULL" % rng.next() for _ in range(3)))
    print("// Bounded(range) x4 from SplitMix64(state): {state, range, {outputs}}")
    for state, bound in [(0, 1), (0, 3), (1, 2**63 + 1), (99, 2**64 - 1), (2024, 1000003)]:
        rng = SplitMix64(state)
        outs = [rng.bounded(bound) for _ in range(4)]
        print("  {0x%016XULL, 0x%016XULL, %s}," % (state, bound, cxx_list("%dULL" % o for o in outs)))
    print("// Permutations: {seed, epoch, F, {pi}}")
    for seed, epoch, f in GOLDEN_PERMS:
        print("  {0x%016XULL, %du, %d, %s}," % (seed, epoch, f, cxx_list(permutation(seed, epoch, f))))
    print("// Permutation fingerprints: {seed, epoch, F, {first 8}, fnv1a}")
    for seed, epoch, f in GOLDEN_PERM_HASHES:
        perm = permutation(seed, epoch, f)
        print("  {0x%016XULL, %du, %d, %s, 0x%016XULL}," % (seed, epoch, f, cxx_list(perm[:8]),
                                                            fnv1a(perm)))
    print("// Partitions: {scheme, seed, epoch, F, N, B, drop_last, \"rank|step;step...\"}")
    for scheme, seed, epoch, f, n, b, drop in GOLDEN_PARTITIONS:
        parts = partition(scheme, permutation(seed, epoch, f), n, b, drop)
        text = "|".join(";".join(" ".join(str(s) for s in step) for step in rank) for rank in parts)
        print('  {Scheme::k%s, %d, %d, %d, %d, %d, %s, "%s"},' % (
            scheme.capitalize(), seed, epoch, f, n, b, "true" if drop else "false", text))


# ---------------------------------------------------------------------------------------------
# --check

def random_cases(count, rnd):
    """Commands for the dump program, each with the answer this reference expects."""
    cases = []
    for _ in range(count // 4):
        state = rnd.getrandbits(64)
        rng = SplitMix64(state)
        cases.append(("splitmix %d 5" % state, [rng.next() for _ in range(5)]))
        bound = rnd.choice([1, 2, 3, 2**63 + 1, 2**64 - 1, rnd.getrandbits(rnd.randint(1, 64)) + 1])
        rng = SplitMix64(state)
        cases.append(("bounded %d %d 5" % (state, bound), [rng.bounded(bound) for _ in range(5)]))
    for _ in range(count):
        seed = rnd.choice([0, 2**64 - 1, rnd.getrandbits(64)])
        epoch = rnd.choice([0, 1, rnd.getrandbits(32)])
        f = rnd.choice([1, 2, 3, rnd.randint(1, 40), rnd.randint(1, 3000)])
        n = rnd.choice([1, 2, rnd.randint(1, 9), rnd.randint(1, min(f + 3, 40))])
        b = rnd.choice([1, n, 2 * n + 1, rnd.randint(1, 3 * n + 5), rnd.randint(1, f + 5)])
        scheme = rnd.choice(["uniform", "strided"])
        drop = rnd.random() < 0.4
        # Skip jobs JobSpec::Validate rejects (a rank without samples, an epoch without a step).
        if n > f:
            n = f
        if scheme == "uniform" and (n - 1) * ceil_div(b, n) >= b:
            b = n * ceil_div(b, n)
        if drop and (b > f or (scheme == "strided" and f // n < ceil_div(b, n))):
            drop = False
        perm = permutation(seed, epoch, f)
        cases.append(("perm %d %d %d" % (seed, epoch, f), perm))
        parts = partition(scheme, perm, n, b, drop)
        flat = []
        for i, rank in enumerate(parts):
            for h, step in enumerate(rank):
                flat += [i, h, len(step)] + step
        cases.append(("partition %s %d %d %d %d %d %d" % (scheme, seed, epoch, f, n, b, int(drop)),
                      [len(parts[0])] + flat))
    big = 100003
    cases.append(("perm %d 7 %d" % (2**64 - 1, big), permutation(2**64 - 1, 7, big)))
    return cases


def check(dump, count):
    cases = random_cases(count, random.Random(20240611))
    stdin = "".join(command + "\n" for command, _ in cases)
    proc = subprocess.run([dump], input=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print("sampler_ref: %s failed (%d): %s" % (dump, proc.returncode, proc.stderr), file=sys.stderr)
        return 1
    lines = proc.stdout.splitlines()
    if len(lines) != len(cases):
        print("sampler_ref: %d answers for %d cases" % (len(lines), len(cases)), file=sys.stderr)
        return 1
    for (command, expected), line in zip(cases, lines):
        try:
            got = [int(v) for v in line.split()]
        except ValueError:
            got = line.split()
        if got != expected:
            print("sampler_ref: MISMATCH for '%s'\n  reference: %s\n  policy:    %s" %
                  (command, expected[:40], got[:40]), file=sys.stderr)
            return 1
    print("sampler_ref: %d cases agree" % len(cases))
    return 0


# ---------------------------------------------------------------------------------------------
# --torch

def torch_check(count):
    from torch.utils.data import BatchSampler, DistributedSampler

    rnd = random.Random(7)
    checked = 0
    grid = [(f, n, b, d) for f in (1, 2, 7, 10, 16, 33) for n in (1, 2, 3, 4, 8)
            for b in (1, 2, 3, 4, 6, 8, 17) for d in (False, True)]
    grid += [(rnd.randint(1, 500), rnd.randint(1, 20), rnd.randint(1, 64), rnd.random() < 0.5)
             for _ in range(count)]
    for f, n, b, drop in grid:
        r = ceil_div(b, n)
        if drop and (b > f or f // n < r):
            continue
        perm = permutation(rnd.getrandbits(64), rnd.randint(0, 99), f)
        mine = strided(perm, n, b, drop)
        for i in range(n):
            sampler = DistributedSampler(range(f), num_replicas=n, rank=i, shuffle=False,
                                         drop_last=drop)
            theirs = [[perm[k] for k in batch] for batch in BatchSampler(sampler, r, drop)]
            if theirs != mine[i]:
                print("sampler_ref: strided differs from PyTorch for F=%d N=%d B=%d drop_last=%s "
                      "rank %d:\n  torch: %s\n  ref:   %s" % (f, n, b, drop, i, theirs, mine[i]),
                      file=sys.stderr)
                return 1
        checked += 1
    print("sampler_ref: strided equals DistributedSampler + BatchSampler in %d jobs" % checked)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--golden", action="store_true", help="print the golden vectors")
    mode.add_argument("--check", metavar="DUMP", help="compare with the policy_ref_dump program")
    mode.add_argument("--torch", action="store_true", help="compare strided with PyTorch")
    parser.add_argument("--cases", type=int, default=200, help="random cases (default 200)")
    args = parser.parse_args()
    if args.golden:
        golden()
        return 0
    if args.check:
        return check(args.check, args.cases)
    return torch_check(args.cases)


if __name__ == "__main__":
    sys.exit(main())
