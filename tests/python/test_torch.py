"""nopfs.torch: the DataLoader over a live nopfsd, against the files and the plan."""

import os
import random
import signal
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
        assert list(sampler) == order
        check_pass(items, paths, order)


def test_without_set_epoch_every_pass_is_epoch_0(service, images, rank_env):
    root, paths = images
    rank_env(0)
    _, sampler, loader = make_loader(root, num_workers=2)
    first = one_pass(loader)
    assert one_pass(loader) == first
    check_pass(first, paths, sampler.order(0).tolist())


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
    sampler.load_state_dict({"epoch": 1, "step": 2})
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
    conf.write_text('staging = { capacity = "1MB", threads = 1 }\nclasses = { }\n')
    job = {"seed": 3, "epochs": 1, "ranks": 1, "batch": 4, "scheme": "uniform"}
    run = tmp_path / "run"
    svc = Service(str(root), str(run), len(paths), job=job, extra=("--config", str(conf)))
    for k, v in svc.env(0).items():
        monkeypatch.setenv(k, v)

    def kill():
        with open(run / "nopfsd.pid") as fh:
            os.kill(int(fh.read()), signal.SIGKILL)
        return time.monotonic()

    yield str(root), sorted(paths), kill
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
