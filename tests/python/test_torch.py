"""nopfs.torch: the DataLoader over a live nopfsd, against the files and the plan."""

import gc
import json
import os
import pickle
import random
import signal
import threading
import time

import pytest
import torch

import nopfs
from nopfs.torch import DataLoader, DistributedSampler, ImageFolder
from conftest import Service


def file_bytes(path):
    with open(path, "rb") as fh:
        return fh.read()


def keep_list(batch):
    return batch


def one_pass(loader):
    """[(bytes, label)] of one pass of a loader built with decode=bytes and collate_fn=keep_list."""
    out = []
    for batch in loader:
        assert len(batch) <= loader.batch_size
        out.extend(batch)
    return out


def make_loader(root, batch_size=4, num_workers=0, **kw):
    dataset = ImageFolder(root, decode=bytes)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                        collate_fn=keep_list, **kw)
    return dataset, sampler, loader


def at(state):
    """The position a loader state names."""
    return {"epoch": state["epoch"], "step": state["step"]}


def check_pass(items, paths, order):
    assert len(items) == len(order)
    for (data, label), sid in zip(items, order):
        assert data == file_bytes(paths[sid]), f"sample {sid}"
        assert label == int(os.path.basename(os.path.dirname(paths[sid]))[-1])


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_loader_delivers_the_files_in_the_planned_order(service, images, rank_env, workers):
    root, paths = images
    rank_env(1)
    _, sampler, loader = make_loader(root, num_workers=workers)
    assert sampler.rank == 1 and sampler.num_replicas == 2 and sampler.seed == 7
    stream = service.stream(1)
    per_epoch = len(stream) // 3
    for epoch in range(3):
        sampler.set_epoch(epoch)
        items = one_pass(loader)
        order = stream[epoch * per_epoch:(epoch + 1) * per_epoch]
        assert sampler.order(epoch).tolist() == order
        check_pass(items, paths, order)
        sampler.set_epoch(epoch)
        assert list(sampler) == order  # the sampler alone, as torch's DataLoader iterates it


def test_without_set_epoch_every_pass_is_epoch_0_and_the_second_pass_warns_once(
        service, images, rank_env):
    import warnings

    root, paths = images
    rank_env(0)
    _, sampler, loader = make_loader(root, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = one_pass(loader)  # the first pass of epoch 0 needs no set_epoch
    with pytest.warns(UserWarning, match=r"second pass over epoch 0 without set_epoch"):
        assert one_pass(loader) == first
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: not again
        assert one_pass(loader) == first
        assert list(sampler) == sampler.order(0).tolist()
    check_pass(first, paths, sampler.order(0).tolist())
    _, sampler, _ = make_loader(root)
    list(sampler)
    with pytest.warns(UserWarning, match="set_epoch"):
        list(sampler)  # the sampler alone warns too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for epoch in (0, 0, 1, 1):  # set_epoch before each pass: no warning, even when repeated
            sampler.set_epoch(epoch)
            list(sampler)


def test_arguments_that_contradict_the_job_are_refused(service, images, rank_env):
    """The job (rank 1 of 2, seed 7, global batch 8, drop_last off) against each argument."""
    root, _ = images
    rank_env(1)
    ds = ImageFolder(root, decode=bytes)
    cases = [
        (dict(seed=123), r"seed=123\) contradicts the job, whose seed is 7 \(NOPFS_SEED, set by "
         r"sbatch --nopfs-seed or nopfs run --seed\)"),
        (dict(drop_last=True), r"drop_last is False \(NOPFS_DROP_LAST, set by sbatch "
         r"--nopfs-drop-last or nopfs run --drop-last\)"),
        (dict(num_replicas=4), r"num_replicas is 2 \(NOPFS_RANKS, set by sbatch --nodes x "
         r"--nopfs-ranks-per-node or nopfs run --ranks\)"),
        (dict(rank=0), r"gives this process rank 1"),
        (dict(batch_size=3), r"batch is 8 \(NOPFS_BATCH, set by sbatch --nopfs-batch"),
        (dict(shuffle=False), r"torch.utils.data.DistributedSampler"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            DistributedSampler(ds, **kwargs)
    # The job's own values are accepted, as are torch's defaults.
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=7,
                                 drop_last=False, batch_size=4)
    DataLoader(ds, batch_size=4, sampler=sampler, drop_last=False)
    with pytest.raises(ValueError, match=r"batch_size=3\) contradicts the job, whose batch per "
                                         r"rank is 4 .*--nopfs-batch.*write batch_size=4"):
        DataLoader(ds, batch_size=3, sampler=DistributedSampler(ds))
    with pytest.raises(ValueError, match=r"DataLoader\(drop_last=True\).*--nopfs-drop-last"):
        DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds), drop_last=True)


def test_epochs_come_from_the_job_and_past_the_last_one_raises_at_once(service, images,
                                                                        rank_env):
    root, _ = images
    rank_env(0)
    _, sampler, loader = make_loader(root)
    assert sampler.epochs == service.job["epochs"] == 3
    for epoch in (3, 4):
        with pytest.raises(ValueError, match=r"epoch \d is past the job's last epoch: the job "
                                             r"reads 3 epochs .*--nopfs-epochs") as e:
            sampler.set_epoch(epoch)
        assert "start-epoch" not in str(e.value)
    sampler.set_epoch(2)
    one_pass(loader)
    assert at(loader.state_dict()) == {"epoch": 3, "step": 0}  # the job is done
    _, sampler, loader = make_loader(root)
    loader.load_state_dict({**loader.state_dict(), "epoch": 3, "step": 0})
    with pytest.raises(ValueError, match="--nopfs-epochs"):
        iter(loader)
    with pytest.raises(ValueError, match="--nopfs-epochs"):
        iter(sampler)
    with pytest.raises(ValueError, match="past the job's last epoch"):
        sampler.resume(3, 1)


def test_the_sampler_has_torchs_attributes(service, images, rank_env):
    root, paths = images
    rank_env(1)
    _, sampler, loader = make_loader(root)
    assert sampler.shuffle is True and sampler.drop_last is False
    assert sampler.num_samples == len(sampler) == len(sampler.order(0))
    lengths = [len(nopfs.Job(seed=7, samples=len(paths), ranks=2, rank=r, batch=8).order(0))
               for r in (0, 1)]
    assert sampler.total_size == sum(lengths) >= len(paths)
    assert len(loader) == -(-sampler.num_samples // 4)


@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_counts_the_batches_the_loop_received(service, images, rank_env, workers):
    root, paths = images
    rank_env(1)
    _, sampler, loader = make_loader(root, num_workers=workers, prefetch_factor=4) \
        if workers else make_loader(root)
    steps = len(loader)
    sampler.set_epoch(1)
    assert at(loader.state_dict()) == {"epoch": 1, "step": 0}
    it = iter(loader)
    for k in range(1, 4):
        next(it)  # with workers, more batches than this are fetched ahead
        assert loader.state_dict() == sampler.state_dict()
        assert at(loader.state_dict()) == {"epoch": 1, "step": k}
        assert len(loader) == steps
    state = loader.state_dict()
    del it
    # Another process would build its loader afresh: it resumes at exactly the next batch.
    _, sampler2, loader2 = make_loader(root, num_workers=workers)
    loader2.load_state_dict(state)
    want = sampler2.job.order(1, 3).tolist()
    assert len(loader2) == -(-len(want) // 4) == steps - 3  # the rest of epoch 1
    sampler2.set_epoch(1)  # the loop's `for epoch in range(state["epoch"], E)` keeps the step
    items = one_pass(loader2)
    check_pass(items, paths, want)
    assert at(loader2.state_dict()) == {"epoch": 2, "step": 0}
    assert len(loader2) == steps  # the next pass is a whole epoch
    sampler2.set_epoch(2)
    check_pass(one_pass(loader2), paths, sampler2.order(2).tolist())


TRAIN = r"""
import json, os, pickle, sys, time
from nopfs.torch import DataLoader, DistributedSampler, ImageFolder

def keep_list(batch):
    return batch

root, workers, log_path, ckpt_path, kill_epoch, kill_step, ready = sys.argv[1:]
kill_at = (int(kill_epoch), int(kill_step))
dataset = ImageFolder(root, decode=bytes)
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=int(workers),
                    collate_fn=keep_list)
log = open(log_path, "ab")
if os.path.exists(ckpt_path):
    with open(ckpt_path) as fh:
        ckpt = json.load(fh)
    loader.load_state_dict(ckpt["loader"])
    log.truncate(ckpt["log_bytes"])  # what was trained after the checkpoint is lost
    log.seek(ckpt["log_bytes"])
    print("resumed at", json.dumps(ckpt["loader"]), flush=True)
after = None
for epoch in range(loader.state_dict()["epoch"], sampler.epochs):
    sampler.set_epoch(epoch)
    for batch in loader:
        pickle.dump((epoch, batch), log)  # "training": the bytes and labels of each sample
        log.flush()
        if after is not None:
            after += 1
            if after == 2:  # trained on two batches past the checkpoint: wait to be killed
                open(ready, "w").close()
                time.sleep(600)
        elif (loader.state_dict()["epoch"], loader.state_dict()["step"]) == kill_at:
            tmp = ckpt_path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump({"loader": loader.state_dict(), "log_bytes": log.tell()}, fh)
            os.rename(tmp, ckpt_path)
            after = 0
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_a_training_killed_mid_epoch_resumes_at_the_next_batch(service, images, rank_env,
                                                               tmp_path, workers):
    import subprocess
    import sys

    root, paths = images
    rank_env(1)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)

    def start(log, ckpt, kill_at, ready):
        return subprocess.Popen([sys.executable, str(script), root, str(workers), str(log),
                                 str(ckpt), *map(str, kill_at), str(ready)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

    def finish(p):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        return out

    whole = tmp_path / "whole.log"
    finish(start(whole, tmp_path / "none.json", (-1, -1), tmp_path / "never"))
    log, ckpt, ready = tmp_path / "run.log", tmp_path / "ckpt.json", tmp_path / "ready"
    p = start(log, ckpt, (1, 5), ready)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert p.poll() is None, p.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)  # the process and its DataLoader workers
    finally:
        p.wait()
    assert p.returncode == -signal.SIGKILL
    assert log.stat().st_size > json.loads(ckpt.read_text())["log_bytes"]
    out = finish(start(log, ckpt, (-1, -1), tmp_path / "never"))
    assert '"epoch": 1, "step": 5' in out
    assert log.read_bytes() == whole.read_bytes()
    # And the run is what the service plans for rank 1: 3 epochs of the files, in order.
    items = []
    with open(whole, "rb") as fh:
        while True:
            try:
                items.extend(pickle.load(fh)[1])
            except EOFError:
                break
    check_pass(items, paths, service.stream(1))


def prefetching_threads():
    return [t for t in threading.enumerate() if t.name == "nopfs-batches"]


def test_without_workers_a_thread_makes_the_next_batches_while_the_loop_works(
        service, images, rank_env):
    """Without workers, once the loop is seen to work between batches, a thread makes
    prefetch_factor batches (torch's default, 2) ahead of it, as workers would, and the pass is
    the same; a loop that asks for its batches back to back gets them made when it asks, as
    does prefetch_factor=0; leaving the loop early stops the thread."""
    root, paths = images
    rank_env(0)
    made = []

    def collate(batch):
        made.append(threading.current_thread().name)
        return batch

    def loader_of(**kw):
        dataset = ImageFolder(root, decode=bytes)
        sampler = DistributedSampler(dataset)
        return sampler, DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=collate,
                                   **kw)

    def working_pass(loader):
        items = []
        for batch in loader:
            items.extend(batch)
            time.sleep(0.03)  # the training step
        return items

    sampler, loader = loader_of()
    assert len(loader) >= 6
    sampler.set_epoch(0)
    check_pass(working_pass(loader), paths, sampler.order(0))
    # The first three batches show that the loop works; the thread makes the others.
    assert made == ["MainThread"] * 3 + ["nopfs-batches"] * (len(loader) - 3)
    assert not prefetching_threads()

    # The next pass starts with the thread: while the loop trains on its first batch, two
    # batches are made and wait, and a third is made and waits for room.
    made.clear()
    sampler.set_epoch(1)
    it = iter(loader)
    items = list(next(it))
    deadline = time.monotonic() + 10
    while len(made) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert made == ["nopfs-batches"] * 4
    for batch in it:
        items.extend(batch)
        time.sleep(0.03)  # still working between batches: the next pass keeps the thread
    check_pass(items, paths, sampler.order(1))

    # Broken off after one batch: the thread stops (and closes the stream), the next pass is whole.
    sampler.set_epoch(1)
    it = iter(loader)
    next(it)
    assert len(prefetching_threads()) == 1
    del it
    assert not prefetching_threads()
    sampler.set_epoch(1)
    check_pass(one_pass_of(loader), paths, sampler.order(1))
    # That pass, made by the thread, asked for its batches back to back: judged again, the next
    # one is made when it asks, in the loop's thread.
    made.clear()
    sampler.set_epoch(0)
    check_pass(one_pass_of(loader), paths, sampler.order(0))
    assert made == ["MainThread"] * len(loader)

    # A loop that does not wait between batches: each is made when asked, in the loop's thread.
    made.clear()
    sampler, loader = loader_of()
    sampler.set_epoch(0)
    check_pass(one_pass_of(loader), paths, sampler.order(0))
    assert made == ["MainThread"] * len(loader)

    made.clear()
    sampler, loader = loader_of(prefetch_factor=0)
    sampler.set_epoch(0)
    check_pass(working_pass(loader), paths, sampler.order(0))
    assert made == ["MainThread"] * len(loader)
    with pytest.raises(ValueError, match="prefetch_factor=-1"):
        loader_of(prefetch_factor=-1)


def one_pass_of(loader):
    return [item for batch in loader for item in batch]


def test_persistent_workers_follow_set_epoch(service, images, rank_env):
    root, paths = images
    rank_env(0)
    _, sampler, loader = make_loader(root, num_workers=2, persistent_workers=True)
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        check_pass(one_pass(loader), paths, sampler.order(epoch).tolist())


def test_resume_starts_one_pass_at_the_step(service, images, rank_env):
    root, paths = images
    rank_env(1)
    _, sampler, loader = make_loader(root, num_workers=2)
    sampler.load_state_dict({**sampler.state_dict(), "epoch": 1, "step": 2})
    for epoch in (1, 2):
        sampler.set_epoch(epoch)  # a training loop's `for epoch in range(start, E)`
        items = one_pass(loader)
        if epoch == 1:
            want = service.stream(1, start_epoch=1, start_step=2)[: len(sampler.order(1, 2))]
        else:
            want = sampler.order(2).tolist()
        check_pass(items, paths, want)
    with pytest.raises(ValueError, match="step"):
        sampler.resume(0, 10**6)


def test_fallback_reads_the_same_files_in_the_same_order(service, images, rank_env, monkeypatch):
    root, paths = images
    rank_env(0)
    _, sampler, loader = make_loader(root, num_workers=2)
    sampler.set_epoch(2)
    served = one_pass(loader)
    monkeypatch.delenv("NOPFS_SOCKET")
    with pytest.raises(nopfs.UnavailableError, match="NOPFS_FALLBACK"):
        make_loader(root)
    monkeypatch.setenv("NOPFS_FALLBACK", "1")
    for workers in (0, 3):
        _, sampler, loader = make_loader(root, num_workers=workers)
        assert loader.nopfs_fallback
        sampler.set_epoch(2)
        assert one_pass(loader) == served


def test_fallback_without_any_nopfs_environment(images, monkeypatch):
    """A plain script (no NOPFS_* at all): rank/world from torch's variables, the planner's order."""
    root, paths = images
    for k in list(os.environ):
        if k.startswith("NOPFS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    dataset = ImageFolder(root, decode=bytes)
    sampler = DistributedSampler(dataset, seed=5)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2,
                        collate_fn=keep_list, fallback=True)
    sampler.set_epoch(1)
    job = nopfs.Job(seed=5, samples=len(paths), ranks=3, rank=1, batch=12)
    check_pass(one_pass(loader), paths, job.order(1).tolist())


def test_images_decode_and_transform_in_the_workers(service, images, rank_env):
    from PIL import Image
    import torchvision.transforms as T

    root, paths = images
    rank_env(0)
    tf = T.Compose([T.Resize((8, 8)), T.ToTensor()])
    dataset = ImageFolder(root, transform=tf)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2)
    xs, ys = [], []
    for x, y in loader:
        assert x.shape[1:] == (3, 8, 8) and x.dtype == torch.float32
        xs.append(x)
        ys.append(y)
    order = sampler.order(0).tolist()
    want = torch.stack([tf(Image.open(paths[i]).convert("RGB")) for i in order])
    assert torch.equal(torch.cat(xs), want)
    assert torch.cat(ys).tolist() == [dataset.samples[i][1] for i in order]


def test_unreadable_file_raises_through_the_loader_with_its_path(tmp_path, monkeypatch):
    from conftest import Service, make_image_folder

    root = str(tmp_path / "data")
    paths = make_image_folder(root, files=24, classes=2, seed=4)
    job = nopfs.Job(seed=7, samples=len(paths), ranks=2, rank=0, batch=8)
    bad = paths[int(job.order(0)[5])]
    os.chmod(bad, 0)
    svc = Service(root, str(tmp_path / "run"), len(paths))
    try:
        for k, v in svc.env(0).items():
            monkeypatch.setenv(k, v)
        for workers in (0, 2):
            _, _, loader = make_loader(root, num_workers=workers)
            with pytest.raises(nopfs.SampleError, match=bad):
                one_pass(loader)
        monkeypatch.delenv("NOPFS_SOCKET")
        monkeypatch.setenv("NOPFS_FALLBACK", "1")
        _, _, loader = make_loader(root, num_workers=0)
        with pytest.raises(nopfs.SampleError, match=bad):
            one_pass(loader)
    finally:
        os.chmod(bad, 0o644)
        svc.stop()


def test_length_comes_from_the_service_and_the_dataset_is_checked(service, images, rank_env,
                                                                   monkeypatch, tmp_path):
    root, paths = images
    rank_env(0)
    monkeypatch.delenv("NOPFS_SAMPLES")  # as under Slurm: the service says how many it has
    dataset = ImageFolder(root, decode=bytes)
    assert len(dataset) == len(paths) and dataset._samples is None  # no scan needed
    other = tmp_path / "other"
    (other / "a").mkdir(parents=True)
    (other / "a" / "x").write_bytes(b"x")
    with pytest.raises(ValueError, match="serves"):
        DataLoader(ImageFolder(str(other)), batch_size=4)


@pytest.fixture
def doomed(tmp_path, monkeypatch):
    """A service whose ring holds a few of its 60 samples of 256 KB (so that most of a pass is
    still to come when it dies), and a function that kills its nopfsd with SIGKILL."""
    rnd = random.Random(5)
    root = tmp_path / "big"
    paths = []
    for k in range(60):
        d = root / f"class{k % 2}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"img{k:03d}.png"
        p.write_bytes(rnd.randbytes(256 << 10))
        paths.append(str(p))
    conf = tmp_path / "small-ring.lua"
    conf.write_text('staging = { capacity = "1M", threads = 1 }\nclasses = { }\n')
    job = {"seed": 3, "epochs": 1, "ranks": 1, "batch": 4, "scheme": "uniform"}
    run = tmp_path / "run"
    svc = Service(str(root), str(run), len(paths), job=job, extra=("--config", str(conf)))
    for k, v in svc.env(0).items():
        monkeypatch.setenv(k, v)

    def kill():
        with open(run / "nopfsd.pid") as fh:
            os.kill(int(fh.read()), signal.SIGKILL)
        return time.monotonic()

    # These tests time how soon a dead service is noticed. Earlier tests may leave torch
    # DataLoader iterators with worker processes in reference cycles, and torch takes 5 s per
    # worker to shut them down when the cyclic collector finds them (torch 1.13, whatever the
    # dataset): collected now, and no collection while the test times.
    gc.collect()
    gc.disable()
    try:
        yield str(root), sorted(paths), kill
    finally:
        gc.enable()
    svc.proc.send_signal(signal.SIGTERM)
    svc.proc.communicate(timeout=60)


def test_a_killed_service_falls_back_to_the_files_in_the_same_order(doomed, monkeypatch):
    root, paths, kill = doomed
    monkeypatch.setenv("NOPFS_FALLBACK", "1")
    _, sampler, loader = make_loader(root, timeout_per_sample=20)
    order = list(sampler)
    items = []
    with pytest.warns(RuntimeWarning, match="the service went away after"):
        for k, batch in enumerate(loader):
            items.extend(batch)
            if k == 1:
                killed = kill()
    assert time.monotonic() - killed < 5
    check_pass(items, paths, order)


def test_a_killed_service_without_fallback_raises_at_once(doomed):
    root, paths, kill = doomed
    _, sampler, loader = make_loader(root, timeout_per_sample=20)
    it = iter(loader)
    next(it)
    killed = kill()
    with pytest.raises(nopfs.UnavailableError, match="nopfsd is gone"):
        for _ in it:
            pass
    assert time.monotonic() - killed < 2


@pytest.fixture(scope="module")
def manifest_service(tmp_path_factory):
    """A manifest of whole files and of byte ranges of a packed shard, labelled and not, served
    by its own nopfsd; returns (manifest path, service)."""
    rnd = random.Random(11)
    root = tmp_path_factory.mktemp("manifest")
    (root / "files").mkdir()
    lines = []
    for k in range(14):
        name = f"files/s{k:02d}.bin"
        (root / name).write_bytes(rnd.randbytes(50 + 7 * k))
        lines.append(name if k % 3 == 0 else f"{name}\t{k % 4}")
    shard = rnd.randbytes(4000)
    (root / "shard.bin").write_bytes(shard)
    for k in range(16):
        lines.append(f"shard.bin\t{k % 2}\t{k * 250}\t{100 + k}")
    rnd.shuffle(lines)  # the ids do not depend on the manifest's line order
    manifest = root / "train.tsv"
    manifest.write_text("# samples\n" + "\n".join(lines) + "\n")
    svc = Service(str(manifest), str(tmp_path_factory.mktemp("mrun")), 30,
                  job={"seed": 9, "epochs": 2, "ranks": 2, "batch": 6, "scheme": "strided"})
    yield str(manifest), svc
    svc.stop()


@pytest.mark.parametrize("workers", [0, 2])
def test_manifest_dataset_yields_what_the_service_serves(manifest_service, monkeypatch, workers):
    from nopfs.torch import ManifestDataset, uint8_tensor

    manifest, svc = manifest_service
    for k, v in svc.env(1).items():
        monkeypatch.setenv(k, v)
    # What the service delivers rank 1 in epoch 1, through the plain client: ids, labels, bytes.
    with nopfs.connect().open(1, epoch=1, epochs=1) as stream:
        served = []
        for sample in stream:
            with sample:
                served.append((sample.id, sample.label, sample.tobytes()))
    dataset = ManifestDataset(manifest)
    assert len(dataset) == 30
    for sid, label, data in served:  # the same numbering as the catalog's
        assert dataset.read(sid) == (data, label)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=workers,
                        collate_fn=keep_list)
    sampler.set_epoch(1)
    assert one_pass(loader) == [(data, label) for _, label, data in served]
    # Tensors per sample, and the same from a list of the files without a service.
    tensors = ManifestDataset(manifest, decode=uint8_tensor)
    sampler = DistributedSampler(tensors)
    loader = DataLoader(tensors, batch_size=3, sampler=sampler, num_workers=workers,
                        collate_fn=keep_list)
    sampler.set_epoch(1)
    got = one_pass(loader)
    assert all(x.dtype == torch.uint8 and x.dim() == 1 for x, _ in got)
    assert [(bytes(x.numpy()), label) for x, label in got] == \
        [(data, label) for _, label, data in served]
    with pytest.raises(ValueError, match="serves the manifest"):
        DataLoader(ManifestDataset([dataset.samples[0][0]]), batch_size=3)


def test_manifest_dataset_from_a_list_of_files_reads_them_in_the_catalogs_order(
        tmp_path, monkeypatch):
    from nopfs.torch import ManifestDataset

    for k in list(os.environ):
        if k.startswith("NOPFS_"):
            monkeypatch.delenv(k)
    files = []
    for name in ("b", "a", "c", "d"):
        (tmp_path / name).write_bytes(name.encode() * 3)
        files.append(str(tmp_path / name))
    ds = ManifestDataset(files, labels=[1, 1, 0, -1])
    assert [os.path.basename(p) for p, *_ in ds.samples] == ["d", "c", "a", "b"]
    assert ds[0] == (b"ddd", -1) and ds[3] == (b"bbb", 1)
    sampler = DistributedSampler(ds, seed=3)
    loader = DataLoader(ds, batch_size=2, sampler=sampler, collate_fn=keep_list, fallback=True)
    want = nopfs.Job(seed=3, samples=4, ranks=1, rank=0, batch=2).order(0).tolist()
    assert one_pass(loader) == [ds[i] for i in want]
    with pytest.raises(ValueError, match="one label per file"):
        ManifestDataset(files, labels=[1])
    (tmp_path / "bad.tsv").write_text("a\tcat\n")
    with pytest.raises(ValueError, match=r"line 1: bad label 'cat'"):
        len(ManifestDataset(str(tmp_path / "bad.tsv")))


def test_the_validation_recipe_next_to_the_training_loader(service, images, rank_env):
    """docs/python.md's recipe: torch's classes for validation, split as the job's ranks."""
    import torch.utils.data as tud
    import torchvision

    root, paths = images
    rank_env(1)
    train = ImageFolder(root, decode=bytes)
    sampler = DistributedSampler(train)
    DataLoader(train, batch_size=4, sampler=sampler, num_workers=0, collate_fn=keep_list)
    val = torchvision.datasets.ImageFolder(root, transform=lambda img: img.size)
    val_sampler = tud.distributed.DistributedSampler(val, num_replicas=sampler.num_replicas,
                                                     rank=sampler.rank, shuffle=False)
    val_loader = tud.DataLoader(val, batch_size=4, sampler=val_sampler, num_workers=2,
                                collate_fn=keep_list)
    got = [label for batch in val_loader for _, label in batch]
    assert got == [val.targets[i] for i in range(1, len(paths), 2)]  # rank 1 of 2, in order
