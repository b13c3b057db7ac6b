"""Fixtures for the nopfs Python tests: small datasets and a live nopfsd started by `nopfs run`."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

BIN = os.environ.get("NOPFS_BIN", "")

# The job every service in these tests serves (tests compare against `nopfs stream` with it).
JOB = {"seed": 7, "epochs": 3, "ranks": 2, "batch": 8, "scheme": "strided"}


@pytest.fixture(autouse=True)
def _no_kept_streams():
    """Each test starts without the streams an earlier test's DataLoaders kept open between
    passes (nopfs.torch.close_streams): they hold their rank's later epochs for this process."""
    yield
    torch_module = sys.modules.get("nopfs.torch")
    if torch_module is not None:
        torch_module.close_streams()


def nopfs(*args, check=True):
    p = subprocess.run([os.path.join(BIN, "nopfs"), *map(str, args)], capture_output=True,
                       text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"nopfs {' '.join(map(str, args))} exited {p.returncode}:\n"
                             f"{p.stdout}\n{p.stderr}")
    return p


def make_image_folder(root, files=90, classes=3, seed=3, size=(12, 10)):
    """Real PNG images of varied content in `classes` class folders."""
    from PIL import Image

    rnd = random.Random(seed)
    paths = []
    for k in range(files):
        cls = os.path.join(root, f"class{k % classes}")
        os.makedirs(cls, exist_ok=True)
        w, h = size[0] + k % 5, size[1] + k % 3
        img = Image.frombytes("RGB", (w, h), rnd.randbytes(w * h * 3))
        path = os.path.join(cls, f"img{k:04d}.png")
        img.save(path)
        paths.append(path)
    return sorted(paths)


class Service:
    """`nopfs run --dataset D ... -- sleep`: a live nopfsd whose ranks sleep until stop()."""

    def __init__(self, dataset, run_dir, samples, job=JOB, extra=()):
        self.dataset = dataset
        self.run_dir = run_dir
        self.samples = samples
        self.job = dict(job)
        self.socket = os.path.join(run_dir, "nopfsd.sock")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "nopfs"), "run", "--dataset", dataset, "--run-dir", run_dir,
             "--seed", str(job["seed"]), "--epochs", str(job["epochs"]), "--ranks",
             str(job["ranks"]), "--batch", str(job["batch"]), "--scheme", job["scheme"],
             *extra, "--", "sleep", "600"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(run_dir, "ready")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out, err = self.proc.communicate(timeout=30) if self.proc.poll() is not None \
                    else ("", "timeout")
                raise AssertionError(f"nopfs run did not start nopfsd:\n{out}\n{err}")
            time.sleep(0.02)

    def env(self, rank):
        j = self.job
        return {"NOPFS_SOCKET": self.socket, "NOPFS_RANK": str(rank), "NOPFS_RANKS": str(j["ranks"]),
                "NOPFS_SEED": str(j["seed"]), "NOPFS_EPOCHS": str(j["epochs"]),
                "NOPFS_BATCH": str(j["batch"]), "NOPFS_SCHEME": j["scheme"],
                "NOPFS_DROP_LAST": "0", "NOPFS_SAMPLES": str(self.samples),
                "NOPFS_DATASET": self.dataset, "NOPFS_RUN_DIR": self.run_dir}

    def stream(self, rank, start_epoch=0, start_step=0):
        """What `nopfs stream` says rank reads, as a list of sample ids."""
        j = self.job
        p = nopfs("stream", "--seed", j["seed"], "--epochs", j["epochs"], "--ranks", j["ranks"],
                  "--batch", j["batch"], "--scheme", j["scheme"], "--samples", self.samples,
                  "--rank", rank, "--start-epoch", start_epoch, "--start-step", start_step)
        return [int(x) for x in p.stdout.split()]

    def stop(self):
        """Stops the job; nopfsd must leave nothing but its log behind."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=60)
        left = [n for n in ("nopfsd.sock", "nopfsd.pid", "ready")
                if os.path.exists(os.path.join(self.run_dir, n))]
        assert not left, f"nopfsd left {left} behind:\n{err}"
        assert "left" not in err, err
        return out, err


@pytest.fixture(scope="session")
def images(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("data") / "imagefolder")
    paths = make_image_folder(root)
    return root, paths


@pytest.fixture(scope="session")
def service(images, tmp_path_factory):
    root, paths = images
    svc = Service(root, str(tmp_path_factory.mktemp("run")), len(paths))
    yield svc
    svc.stop()


@pytest.fixture
def rank_env(monkeypatch, service):
    """Puts rank `r`'s NOPFS_* environment in place; returns a function of r."""

    def apply(rank):
        for k, v in service.env(rank).items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("NOPFS_FALLBACK", raising=False)

    return apply
