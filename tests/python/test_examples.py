"""The examples run: the plain script, and the nopfs script with a service and, unchanged,
without one (fallback), reading the same data in the same order."""

import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import BIN

EXAMPLES = os.environ.get("NOPFS_EXAMPLES", "")
# In the sanitizer build Python runs with libasan preloaded, and the ASan allocator of Debian 12's
# GCC is not fork-safe: a DataLoader worker forked while another thread of the rank (gloo's,
# torch's) holds an allocator lock hangs in its first malloc (seen in CI: the worker stuck in
# SizeClassAllocator64::GetFromAllocator, its rank waiting for it, the other rank in gloo). So the
# sanitizer build runs the examples with the loader in each rank's own process; the release build
# runs them with a worker process.
WORKERS = "0" if "libasan" in os.environ.get("LD_PRELOAD", "") else "1"
ARGS = ["--epochs", "2", "--batch-size", "4", "--workers", WORKERS, "--image-size", "16",
        "--max-steps", "3", "--seed", "5"]


def run(argv, env=None, timeout=300):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    assert p.returncode == 0, f"{argv} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def epochs(text):
    """{(rank, epoch): (samples, data digest)} from the scripts' epoch lines."""
    out = {}
    for m in re.finditer(r"rank (\d+) epoch (\d+): (\d+) samples, .* data ([0-9a-f]+)", text):
        out[(int(m[1]), int(m[2]))] = (int(m[3]), m[4])
    return out


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("synthetic") / "data")
    run([sys.executable, os.path.join(EXAMPLES, "make_synthetic_imagefolder.py"), root,
         "--images", "40", "--classes", "4", "--size", "20"])
    return root


def test_plain_script_runs(synthetic):
    out = run([sys.executable, os.path.join(EXAMPLES, "train_resnet18.py"), "--data", synthetic,
               *ARGS])
    got = epochs(out)
    assert sorted(got) == [(0, 0), (0, 1)] and all(n == 12 for n, _ in got.values())


def test_nopfs_script_with_a_service_and_with_the_fallback(synthetic, tmp_path):
    script = os.path.join(EXAMPLES, "train_resnet18_nopfs.py")
    served = run([os.path.join(BIN, "nopfs"), "run", "--dataset", synthetic, "--ranks", "2",
                  "--seed", "5", "--epochs", "2", "--batch", "8", "--scheme", "strided",
                  "--run-dir", str(tmp_path / "run"), "--", sys.executable, script, "--data",
                  synthetic, *ARGS], env={"MASTER_PORT": "29611"})
    got = epochs(served)
    assert sorted(got) == [(r, e) for r in (0, 1) for e in (0, 1)], served
    # The same script, no service: two ranks as torchrun would start them, fallback on.
    procs = [subprocess.Popen([sys.executable, script, "--data", synthetic, *ARGS],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "NOPFS_FALLBACK": "1", "RANK": str(r),
                                   "WORLD_SIZE": "2", "MASTER_PORT": "29612"},
                              start_new_session=True)
             for r in (0, 1)]
    direct = ""
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            direct += out
    finally:
        for p in procs:  # a rank that failed or hung must not outlive the test, nor its workers
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    assert epochs(direct) == got
    # Without the fallback and without a service: a clear error.
    p = subprocess.run([sys.executable, script, "--data", synthetic, *ARGS], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode != 0 and "NOPFS_FALLBACK" in p.stderr
