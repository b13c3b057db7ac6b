"""A real two-process DDP run (torch.distributed, gloo, CPU) through `nopfs run` and nopfsd: every
rank runs the same number of steps in every epoch, with 65 samples, 2 ranks and a global batch of 8
(the last global batch holds one sample), under both schemes, with and without drop_last."""

import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import BIN, make_image_folder

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ddp") / "data")
    make_image_folder(root, files=65, classes=3)
    return root


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("scheme", ["uniform", "strided"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_rank_runs_the_same_steps_under_ddp(images, tmp_path, scheme, drop_last):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    argv = [os.path.join(BIN, "nopfs"), "run", "--dataset", images, "--ranks", "2", "--batch", "8",
            "--seed", "11", "--epochs", "2", "--scheme", scheme, "--run-dir",
            str(tmp_path / "run"), *(["--drop-last"] if drop_last else []), "--",
            sys.executable, os.path.join(HERE, "ddp_steps.py"), images, "4"]
    # A rank left waiting in a collective fails after gloo's 30 s timeout; this bounds the rest.
    p = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, f"exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    got = {(int(m[1]), int(m[2])): (int(m[3]), int(m[4]))
           for m in re.finditer(r"rank (\d) epoch (\d): (\d+) steps, (\d+) samples", p.stdout)}
    assert sorted(got) == [(0, 0), (0, 1), (1, 0), (1, 1)], p.stdout
    # 65 samples, global batch 8: 9 steps (the last one pads or holds one sample per rank), or 8
    # with drop_last; every rank reads 33 samples (32 with drop_last).
    want = (8, 32) if drop_last else (9, 33)
    assert all(v == want for v in got.values()), got
