"""The batch path of nopfs._client (Stream.next_batch, Batch, Stream.next_batch_into) over a live
nopfsd: the bytes are the files', the order is the stream's, whatever the batch, the ring's size or
the buffer's."""

import io
import os
import random
import re
import threading
import warnings

import numpy as np
import pytest
import torch

import nopfs
from conftest import Service
from nopfs.torch import (DataLoader, DistributedSampler, ImageFolder, pil_decode, read_batch,
                         uint8_tensor)


def file_bytes(path):
    with open(path, "rb") as fh:
        return fh.read()


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """40 files of 200 KiB (8 MiB) in two classes: more than the 4 MiB ring nopfsd gives a rank,
    served to one rank in batches of 30 (6 MiB, larger than the ring; the last of an epoch has
    10); returns (root, [path by sample id], service)."""
    rnd = random.Random(5)
    root = tmp_path_factory.mktemp("big") / "data"
    for k in range(40):
        (root / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{k % 2}" / f"s{k:03d}.bin").write_bytes(rnd.randbytes(200 << 10))
    paths = sorted(str(p) for p in root.glob("c*/*.bin"))
    svc = Service(str(root), str(tmp_path_factory.mktemp("bigrun")), len(paths),
                  job={"seed": 3, "epochs": 2, "ranks": 1, "batch": 30, "scheme": "strided"})
    yield str(root), paths, svc
    svc.stop()


def test_next_batch_into_fills_a_tensor_with_the_files_in_stream_order(service, images):
    _, paths = images
    order = service.stream(1)
    per_epoch = len(order) // 3
    client = nopfs.connect(service.socket)
    out = torch.empty(8 * 4096, dtype=torch.uint8)
    got, sizes = [], []
    with client.open(1, epochs=1) as stream:
        while True:
            offsets, labels, ids = stream.next_batch_into(8, out.numpy())
            assert offsets.dtype == np.int64 and labels.dtype == np.int64 and ids.dtype == np.uint32
            assert len(offsets) == len(ids) + 1 and len(labels) == len(ids)
            if len(ids) == 0:
                break
            sizes.append(len(ids))
            for k, sid in enumerate(ids.tolist()):
                data = bytes(out[offsets[k]:offsets[k + 1]].numpy())
                assert data == file_bytes(paths[sid]), f"sample {sid}"
                assert labels[k] == int(os.path.basename(os.path.dirname(paths[sid]))[-1])
                got.append(sid)
    assert got == order[:per_epoch]
    # Whole batches, then the short last one (45 samples per rank and epoch).
    assert sizes == [8] * (per_epoch // 8) + [per_epoch % 8]


def test_a_batch_larger_than_the_ring_and_a_sample_larger_than_the_buffer(big):
    _, paths, svc = big
    order = svc.stream(0)[:40]
    client = nopfs.connect(svc.socket)
    with client.open(0, epochs=1) as stream:
        small = np.empty(100 << 10, dtype=np.uint8)
        with pytest.raises(ValueError, match=rf"sample {order[0]} is \d+ bytes, larger than the "
                                             r"batch buffer \(102400 bytes\); give a buffer"):
            stream.next_batch_into(10, small)
        # All 40 samples (8 MiB, twice the ring) in one call: the refused sample comes first.
        out = torch.empty(12 << 20, dtype=torch.uint8)
        offsets, labels, ids = stream.next_batch_into(40, out.numpy())
        assert ids.tolist() == order
        for k, sid in enumerate(ids.tolist()):
            assert bytes(out[offsets[k]:offsets[k + 1]].numpy()) == file_bytes(paths[sid])
        offsets, labels, ids = stream.next_batch_into(40, out.numpy())
        assert len(ids) == 0 and offsets.tolist() == [0]


def test_a_buffer_that_fills_up_returns_what_fits_and_the_rest_comes_next(big):
    _, paths, svc = big
    order = svc.stream(0)[:40]
    client = nopfs.connect(svc.socket)
    got, counts = [], []
    with client.open(0, epochs=1) as stream:
        buf = bytearray(500 << 10)  # two samples
        while True:
            offsets, _, ids = stream.next_batch_into(10, buf)
            if len(ids) == 0:
                break
            counts.append(len(ids))
            for k, sid in enumerate(ids.tolist()):
                assert bytes(buf[offsets[k]:offsets[k + 1]]) == file_bytes(paths[sid])
            got.extend(ids.tolist())
    assert got == order
    assert counts == [2] * 20


def test_next_batch_gives_views_and_copies_and_refuses_release_while_a_view_lives(service, images):
    _, paths = images
    order = service.stream(0)
    per_epoch = len(order) // 3
    client = nopfs.connect(service.socket)
    got = []
    with client.open(0, epochs=1) as stream:
        while True:
            batch = stream.next_batch(8)
            if batch is None:
                break
            assert 1 <= len(batch) <= 8
            ids = batch.ids.tolist()
            assert batch.offsets[-1] == batch.nbytes == sum(batch.sizes.tolist())
            views = batch.views()
            assert [bytes(v) for v in views] == [file_bytes(paths[i]) for i in ids]
            assert all(v.readonly for v in views)
            assert batch.tobytes() == [file_bytes(paths[i]) for i in ids]
            out = torch.empty(batch.nbytes + 5, dtype=torch.uint8)
            assert batch.copy_into(out.numpy(), 5) == batch.nbytes + 5
            o = batch.offsets.tolist()
            assert [bytes(out[5 + o[k]:5 + o[k + 1]].numpy()) for k in range(len(ids))] == \
                [file_bytes(paths[i]) for i in ids]
            with pytest.raises(ValueError, match="the batch is .* bytes, the buffer has"):
                batch.copy_into(bytearray(3))
            keep = views[-1]
            del views
            with pytest.raises(BufferError, match="1 sample\\(s\\) of this batch have live views"):
                batch.release()
            del keep
            batch.release()
            assert batch.released
            with pytest.raises(ValueError, match="after release"):
                batch.views()
            got.extend(ids)
    assert got == order[:per_epoch]
    assert stream.closed


def test_batches_mix_with_single_samples_in_order(service, images):
    order = service.stream(0)
    client = nopfs.connect(service.socket)
    got = []
    with client.open(0, epochs=1) as stream:
        for k in range(6):
            if k % 3 == 0:
                s = stream.next()
                got.append(s.id)
                s.release()
            elif k % 3 == 1:
                with stream.next_batch(5) as b:
                    got.extend(b.ids.tolist())
            else:
                _, _, ids = stream.next_batch_into(4, bytearray(64 << 10))
                got.extend(ids.tolist())
    assert got == order[:len(got)]


def test_bad_buffers_and_sizes_are_refused_clearly(service):
    client = nopfs.connect(service.socket)
    with client.open(0, epochs=1) as stream:
        with pytest.raises(ValueError, match="out must be a writable buffer of bytes"):
            stream.next_batch_into(4, b"read-only bytes")
        with pytest.raises(ValueError, match="out must be contiguous"):
            stream.next_batch_into(4, np.zeros((64, 64), dtype=np.uint8)[:, ::2])
        with pytest.raises(ValueError, match="ask for at least 1 sample"):
            stream.next_batch(0)


def label_of(path):
    return int(os.path.basename(os.path.dirname(path))[-1])


def expected_batches(paths, order, batch, make):
    """torch's default_collate over [(make(file bytes), label)] in chunks of `batch`."""
    items = [(make(file_bytes(paths[i])), label_of(paths[i])) for i in order]
    return [torch.utils.data.default_collate(items[k:k + batch])
            for k in range(0, len(items), batch)]


def same(a, b):
    """Equal batches: the same structure, types and values."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


def set_env(monkeypatch, svc, rank):
    for k, v in svc.env(rank).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("NOPFS_FALLBACK", raising=False)


@pytest.mark.parametrize("workers", [0, 2, 4])
def test_default_collate_of_tensors_fills_one_tensor_per_batch_larger_than_the_ring(
        big, monkeypatch, workers):
    root, paths, svc = big
    set_env(monkeypatch, svc, 0)
    order = svc.stream(0)
    dataset = ImageFolder(root, decode=uint8_tensor)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=30, sampler=sampler, num_workers=workers)
    assert loader.batch_size == 30 and len(loader) == 2
    assert loader.nopfs_stream.mode == "tensor"  # one tensor per batch, filled in C++
    # Nothing runs per sample: the batches are filled in this process, no worker starts.
    assert loader.num_workers == 0 and loader.nopfs_requested_workers == workers
    for epoch in range(2):
        sampler.set_epoch(epoch)
        got = list(loader)
        want = expected_batches(paths, order[epoch * 40:(epoch + 1) * 40], 30, uint8_tensor)
        assert [len(b[1]) for b in got] == [30, 10]  # the short last batch
        for g, w in zip(got, want):
            same(g, w)
            data = g[0]
            assert data.shape[1] == 200 << 10 and data.is_contiguous()
    # Resume at (epoch 1, step 1): the short batch alone.
    sampler.resume(1, 1)
    got = list(loader)
    same(got, expected_batches(paths, order[70:80], 30, uint8_tensor))
    # A pass draws from torch's generator what torch's own DataLoader draws (its workers' base
    # seed), no more: the training loop's random numbers are the same with either loader.
    sampler.set_epoch(0)
    torch.manual_seed(11)
    passes = iter(loader)
    assert len(passes) == 2
    list(passes)
    after_nopfs = torch.rand(4)
    torch.manual_seed(11)
    list(torch.utils.data.DataLoader(list(range(40)), batch_size=30))
    assert torch.equal(after_nopfs, torch.rand(4))


@pytest.mark.parametrize("make", [bytes, uint8_tensor])
def test_a_pass_goes_on_with_the_stream_the_previous_pass_left(big, monkeypatch, make):
    """A pass of the rank's own process that read its share to the end leaves its stream open,
    staging the next epoch; the next pass goes on with it if it starts that epoch at step 0, and
    any other pass opens its own. The bytes and the order are the stream's either way."""
    import nopfs.torch as nt

    root, paths, svc = big
    set_env(monkeypatch, svc, 0)
    order = svc.stream(0)
    opened = []
    real_open = nt._stream_dataset._open_stream

    def counting_open(*args, **kwargs):
        opened.append(kwargs)
        return real_open(*args, **kwargs)

    # (Where StreamDataset looks the function up.)
    monkeypatch.setattr(nt._stream_dataset, "_open_stream", counting_open)
    dataset = ImageFolder(root, decode=make)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=30, sampler=sampler)

    def kept():
        left = loader.nopfs_stream.kept.peek()
        return [] if left is None else [left]

    assert kept() == []
    sampler.set_epoch(0)
    same(list(loader), expected_batches(paths, order[:40], 30, make))
    assert len(opened) == 1 and opened[0]["epochs"] == 0  # no epoch limit
    [(left, next_epoch)] = kept()
    assert next_epoch == 1 and not left.closed
    # Epoch 0 again: not where the kept stream stands, so it is closed and the pass opens its own.
    sampler.set_epoch(0)
    same(list(loader), expected_batches(paths, order[:40], 30, make))
    assert len(opened) == 2 and left.closed
    [(left, next_epoch)] = kept()
    assert next_epoch == 1
    # Epoch 1 from step 0: the kept stream, which has been staging it; no stream is opened.
    sampler.set_epoch(1)
    it = iter(loader)
    first = next(it)
    assert kept() == []  # taken by this pass
    same([first] + list(it), expected_batches(paths, order[40:80], 30, make))
    assert len(opened) == 2
    # The job's last epoch: nothing to go on with, the stream is closed.
    assert kept() == [] and left.closed
    # A pass broken off keeps nothing; the next opens a stream and gets every byte.
    sampler.set_epoch(0)
    it = iter(loader)
    next(it)
    del it
    assert kept() == []
    sampler.set_epoch(0)
    same(list(loader), expected_batches(paths, order[:40], 30, make))
    assert len(opened) == 4
    # A resume at step 1 of epoch 1 does not start where the kept stream stands.
    [(left, _)] = kept()
    sampler.resume(1, 1)
    same(list(loader), expected_batches(paths, order[70:80], 30, make))
    assert len(opened) == 5 and left.closed and kept() == []


def test_a_kept_stream_is_closed_by_close_streams_and_with_its_loader(big, monkeypatch):
    """A kept stream holds its rank's later epochs for this process: nopfs.torch.close_streams()
    closes it, and so does collecting its loader. A loader with workers keeps none."""
    import gc

    import nopfs.torch as nt

    root, paths, svc = big
    set_env(monkeypatch, svc, 0)
    dataset = ImageFolder(root, decode=bytes)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=30, sampler=sampler)
    sampler.set_epoch(0)
    assert len(list(loader)) == 2
    left, _ = loader.nopfs_stream.kept.peek()
    nt.close_streams()
    assert left.closed and loader.nopfs_stream.kept.peek() is None
    sampler.set_epoch(0)
    assert len(list(loader)) == 2
    left, _ = loader.nopfs_stream.kept.peek()
    del loader
    gc.collect()
    assert left.closed
    workers = DataLoader(dataset, batch_size=30, sampler=sampler, num_workers=2)
    sampler.set_epoch(0)
    assert len(list(workers)) == 2
    assert workers.nopfs_stream.kept.peek() is None


def test_a_kept_stream_whose_service_restarted_gives_way_to_a_new_one(tmp_path, monkeypatch):
    """The service restarts between two passes (the same socket): the stream the first pass kept
    is dead (what it had staged of the next epoch, at most its ring's slots, is not all of it),
    and the next pass opens its own on a new connection, without falling back to the files or
    raising, and delivers its epoch's bytes in order."""
    rnd = random.Random(8)
    root = tmp_path / "data"
    for k in range(200):  # 12.5 MiB: 3 times the ring (4 MiB, no RAM tier to serve in place)
        (root / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{k % 2}" / f"s{k:03d}.bin").write_bytes(rnd.randbytes(64 << 10))
    paths = sorted(str(p) for p in root.glob("c*/*.bin"))
    conf = tmp_path / "small-ring.lua"
    conf.write_text('staging = { capacity = "1M", threads = 1 }\nclasses = { }\n')
    job = {"seed": 4, "epochs": 3, "ranks": 1, "batch": 20, "scheme": "strided"}
    run = tmp_path / "run"
    svc = Service(str(root), str(run), len(paths), job=job, extra=("--config", str(conf)))
    try:
        set_env(monkeypatch, svc, 0)
        order = svc.stream(0)
        dataset = ImageFolder(str(root), decode=bytes)
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=20, sampler=sampler)
        sampler.set_epoch(0)
        same(list(loader), expected_batches(paths, order[:200], 20, bytes))
        left, _ = loader.nopfs_stream.kept.peek()
        assert not left.service_gone
    finally:
        svc.stop()
    assert left.service_gone
    svc = Service(str(root), str(run), len(paths), job=job, extra=("--config", str(conf)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback to the files
            sampler.set_epoch(1)
            same(list(loader), expected_batches(paths, order[200:400], 20, bytes))
        assert left.closed
    finally:
        svc.stop()


def test_tensor_batches_in_workers_when_a_worker_init_fn_asks_for_them(big, monkeypatch):
    """A worker_init_fn keeps the workers of a tensor-mode DataLoader: each fills its batches in
    shared memory, and the loader still gives the stream's bytes in the stream's order; the
    worker-only options are accepted whether or not workers start."""
    root, paths, svc = big
    set_env(monkeypatch, svc, 0)
    order = svc.stream(0)
    dataset = ImageFolder(root, decode=uint8_tensor)
    sampler = DistributedSampler(dataset)
    started = torch.multiprocessing.get_context("fork").Value("i", 0)

    def init(worker_id):
        with started.get_lock():
            started.value += 1

    loader = DataLoader(dataset, batch_size=30, sampler=sampler, num_workers=2,
                        worker_init_fn=init)
    assert loader.num_workers == 2
    sampler.set_epoch(1)
    got = list(loader)
    assert started.value == 2
    same(got, expected_batches(paths, order[40:80], 30, uint8_tensor))
    in_process = DataLoader(dataset, batch_size=30, sampler=sampler, num_workers=2,
                            persistent_workers=True, prefetch_factor=4)
    assert in_process.num_workers == 0
    sampler.set_epoch(0)
    same(list(in_process), expected_batches(paths, order[:40], 30, uint8_tensor))


def _keep_workers(worker_id):
    """A worker_init_fn that keeps a tensor-mode DataLoader's workers."""


@pytest.mark.parametrize("workers", [0, 2])
def test_tensor_batches_follow_the_sizes_of_their_samples_and_stay_while_held(
        tmp_path, monkeypatch, workers):
    """A tensor-mode loader copies a batch straight into a [batch, size] tensor once a batch has
    shown the size; batches of smaller, then larger samples than that, then of the size again,
    are each the files' bytes in [n, their size]; a batch whose sizes differ but add up to the
    rule's raises torch.stack's error, as torch's collate does. Every batch is held to the end
    of the pass and compared then: the memory a loader reuses is never a held batch's."""
    batch, batches = 4, 12
    order = nopfs.epoch_order(3, batch * batches, 1, batch, "strided", False, 0, 0).tolist()
    kib = [8, 8, 4, 4, 16, 16, 8, 8, 8, 8, 8, None]
    sizes = {}
    for b, size in enumerate(kib):
        for k, sid in enumerate(order[b * batch:(b + 1) * batch]):
            sizes[sid] = size << 10 if size else [4, 12, 8, 8][k] << 10  # 32 KiB, as 4 x 8
    rnd = random.Random(9)
    root = tmp_path / "data"
    (root / "c0").mkdir(parents=True)
    paths = []
    for sid in range(batch * batches):
        path = root / "c0" / f"s{sid:03d}.bin"
        path.write_bytes(rnd.randbytes(sizes[sid]))
        paths.append(str(path))
    svc = Service(str(root), str(tmp_path / "run"), len(paths),
                  job={"seed": 3, "epochs": 1, "ranks": 1, "batch": batch, "scheme": "strided"})
    try:
        set_env(monkeypatch, svc, 0)
        assert svc.stream(0) == order
        dataset = ImageFolder(str(root), decode=uint8_tensor)
        loader = DataLoader(dataset, batch_size=batch, sampler=DistributedSampler(dataset),
                            num_workers=workers, worker_init_fn=_keep_workers)
        assert loader.num_workers == workers
        got = []
        with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
            for b in loader:
                got.append(b)
        want = expected_batches(paths, order[:(batches - 1) * batch], batch, uint8_tensor)
        assert len(got) == batches - 1
        for b, (g, w) in enumerate(zip(got, want)):
            same(g, w)
            assert g[0].shape == (batch, kib[b] << 10) and g[0].is_contiguous(), b
    finally:
        svc.stop()


@pytest.mark.parametrize("workers", [0, 3])
def test_default_collate_of_bytes_and_of_varied_tensors_is_torchs(service, images, rank_env,
                                                                 workers):
    root, paths = images
    rank_env(0)
    order = service.stream(0)[:45]
    dataset = ImageFolder(root, decode=bytes)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers)
    assert loader.nopfs_stream.mode == "bytes"
    sampler.set_epoch(0)
    got = list(loader)
    want = expected_batches(paths, order, 4, bytes)
    assert len(got) == len(want) == 12
    for g, w in zip(got, want):
        same(g, w)
    # Tensors of different sizes (the PNGs): torch.stack's error, as torch's collate raises.
    tensors = ImageFolder(root, decode=uint8_tensor)
    loader = DataLoader(tensors, batch_size=4, sampler=DistributedSampler(tensors),
                        num_workers=workers)
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        list(loader)


def _pixels(img):
    """An image's pixels as a uint8 tensor (a transform that keeps every byte to compare)."""
    return torch.from_numpy(np.asarray(img).copy())


def _first_pass_items(service, root, rank_env, workers, **dataset_args):
    """(loader, items, order): rank 0's epoch 0 through DataLoader(ImageFolder(root,
    **dataset_args), batch 4, collate_fn=list), its items, and the stream's order."""
    rank_env(0)
    dataset = ImageFolder(root, **dataset_args)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers,
                        collate_fn=list)
    sampler.set_epoch(0)
    return loader, [item for batch in loader for item in batch], service.stream(0)[:45]


def _pil_reads(path):
    """The RGB image PIL makes of a file, as torchvision's default loader."""
    from PIL import Image

    with Image.open(path) as img:
        return img.convert("RGB")


@pytest.mark.parametrize("workers", [0, 2])
def test_default_decode_decodes_the_files(service, images, rank_env, workers):
    """The default pil_decode, with a transform: each sample arrives as a view (of a copy in a
    worker that lives one pass), and the batches are those of PIL reading the files in the
    stream's order."""
    root, paths = images
    loader, got, order = _first_pass_items(service, root, rank_env, workers, transform=_pixels)
    assert loader.nopfs_stream.mode == "views"
    # Workers that live one pass read the tier's file (read_once); persistent ones map it.
    assert loader.nopfs_stream.read_once
    assert not DataLoader(loader.nopfs_stream.dataset, batch_size=4,
                          sampler=loader.nopfs_sampler, num_workers=2,
                          persistent_workers=True).nopfs_stream.read_once
    want = [(_pixels(_pil_reads(paths[i])), label_of(paths[i])) for i in order]
    assert len(got) == len(want) == 45
    for g, w in zip(got, want):
        same(g, w)


def _jpeg_of(kind, rnd, size):
    """A JPEG of one kind: its bytes."""
    from PIL import Image, ImageFilter

    w, h = size
    img = Image.frombytes("RGB", (w, h), rnd.randbytes(w * h * 3)).filter(ImageFilter.SMOOTH)
    args = {"quality": rnd.choice((60, 90, 100))}
    if kind == "gray":
        img = img.convert("L")
    elif kind == "cmyk":
        img = img.convert("CMYK")
    elif kind == "progressive":
        args["progressive"] = True
    elif kind == "444":
        args["subsampling"] = 0
    elif kind == "exif":
        exif = Image.Exif()
        exif[0x0112] = 6  # orientation: stays as it is (neither decode applies it)
        args["exif"] = exif.tobytes()
    out = io.BytesIO()
    img.save(out, format="JPEG", **args)
    return out.getvalue()


# The JPEGs nopfs decodes itself (pil_decode), and those it leaves to PIL: CMYK, and another
# format.
OWN_JPEGS = ("baseline", "gray", "progressive", "444", "exif")


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """36 image files of every kind in 3 classes (root/c<label>/), JPEGs of OWN_JPEGS, CMYK and
    a PNG, of sizes from 1x1 to 97x61, served to one rank in batches of 4; returns (root,
    [path by sample id], service)."""
    from PIL import Image

    rnd = random.Random(11)
    root = tmp_path_factory.mktemp("jpegs") / "data"
    kinds = OWN_JPEGS + ("cmyk", "png")
    for k in range(36):
        (root / f"c{k % 3}").mkdir(parents=True, exist_ok=True)
        kind, size = kinds[k % len(kinds)], (1 + 7 * k % 97, 1 + 5 * k % 61)
        if kind == "png":
            Image.frombytes("RGB", size, rnd.randbytes(size[0] * size[1] * 3)).save(
                root / f"c{k % 3}" / f"i{k:03d}.png")
        else:
            (root / f"c{k % 3}" / f"i{k:03d}.jpg").write_bytes(_jpeg_of(kind, rnd, size))
    paths = sorted(str(p) for p in root.glob("c*/*"))
    svc = Service(str(root), str(tmp_path_factory.mktemp("jpegrun")), len(paths),
                  job={"seed": 5, "epochs": 2, "ranks": 1, "batch": 4, "scheme": "strided"})
    yield str(root), paths, svc
    svc.stop()


def _image(img):
    return img.mode, img.size, img.tobytes()


def test_pil_decode_gives_the_pixels_of_pil_reading_the_file(tmp_path):
    """pil_decode (of bytes, and of a read-only view) is PIL's Image.open(path).convert("RGB"):
    the same mode, size and pixels, for JPEGs of every kind nopfs decodes itself (the same
    libjpeg as PIL's, with PIL's settings) and for those it leaves to PIL."""
    from PIL import Image

    assert nopfs._client.use_libjpeg_of(Image.core.__file__)  # what pil_decode does first
    rnd = random.Random(3)
    own = 0
    for k in range(60):
        kind = (OWN_JPEGS + ("cmyk",))[k % 6]
        size = (1 + 13 * k % 300, 1 + 11 * k % 200)
        path = tmp_path / f"{k}.jpg"
        path.write_bytes(_jpeg_of(kind, rnd, size) + (rnd.randbytes(k) if k % 4 == 0 else b""))
        data = file_bytes(path)
        fast = nopfs._client.decode_jpeg_rgb(data)
        assert (fast is not None) == (kind != "cmyk"), (kind, size)
        own += fast is not None
        want = _image(_pil_reads(path))
        assert _image(pil_decode(data)) == want, (kind, size)
        assert _image(pil_decode(memoryview(data).toreadonly())) == want, (kind, size)
    assert own == 50


def test_pil_decode_of_a_broken_or_huge_jpeg_is_what_pil_makes_of_it(tmp_path, monkeypatch):
    """A truncated JPEG, a corrupt one, and one over PIL's decompression bomb limits: nopfs does
    not decode them itself, and pil_decode raises, warns or decodes as PIL reading the file
    does."""
    from PIL import Image

    assert nopfs._client.use_libjpeg_of(Image.core.__file__)
    rnd = random.Random(4)
    data = _jpeg_of("baseline", rnd, (64, 48))
    for bad in (data[:len(data) // 2], data[:300] + bytes(200) + data[500:], data[:2]):
        assert nopfs._client.decode_jpeg_rgb(bad) is None
        try:
            want = _image(_pil_reads(io.BytesIO(bad)))
        except Exception as theirs:  # noqa: BLE001 (whatever PIL raises)
            with pytest.raises(type(theirs)) as ours:
                pil_decode(bad)
            assert re.sub("0x[0-9a-f]+", "", str(ours.value)) == \
                re.sub("0x[0-9a-f]+", "", str(theirs))
        else:  # PIL decodes what libjpeg warned of (corrupt data), as it decodes it
            assert _image(pil_decode(bad)) == want
    assert nopfs._client.decode_jpeg_rgb(data, max_pixels=64 * 48) is not None
    assert nopfs._client.decode_jpeg_rgb(data, max_pixels=64 * 48 - 1) is None
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 48 - 1)
    with pytest.warns(Image.DecompressionBombWarning):
        assert _image(pil_decode(data)) == _image(_pil_reads(io.BytesIO(data)))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 48 // 2 - 1)
    with pytest.raises(Image.DecompressionBombError):
        pil_decode(data)
    with pytest.raises(ValueError, match="contiguous buffer"):
        nopfs._client.decode_jpeg_rgb(memoryview(data)[::2])


@pytest.mark.parametrize("workers,threads", [(0, 0), (0, 3), (2, 0)])
def test_loader_of_jpegs_gives_the_pixels_of_pil_reading_the_files(jpegs, monkeypatch, workers,
                                                                  threads):
    """ImageFolder's default pil_decode through the DataLoader (without workers, with decode
    threads, in workers that live one pass): every item is PIL's image of its file, in the
    stream's order."""
    root, paths, svc = jpegs
    for k, v in svc.env(0).items():
        monkeypatch.setenv(k, v)
    dataset = ImageFolder(root, transform=_pixels)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers,
                        decode_threads=threads, collate_fn=list)
    sampler.set_epoch(0)
    got = [item for batch in loader for item in batch]
    order = svc.stream(0)[:36]  # epoch 0
    assert len(got) == len(order) == 36
    for g, i in zip(got, order):
        same(g, (_pixels(_pil_reads(paths[i])), label_of(paths[i])))


@pytest.fixture(scope="module")
def large_jpegs(tmp_path_factory):
    """Image files whose decode reads more or less than the first piece decode_jpegs reads of a
    sample in a read_once stream (16 KiB), in 2 classes: a 640x480 JPEG of 450 KB (read in
    pieces of 16, 32, 64, ... KiB), small JPEGs followed by 64 KiB of other bytes (as the
    loader benchmark's files), one whose ICC profile of 100 KB (markers libjpeg skips) spans
    pieces, a progressive one, a CMYK one and a PNG (PIL's), and a truncated JPEG (libjpeg
    warns); served to one rank in batches of 5; returns (root, [path by sample id], service)."""
    from PIL import Image, ImageFilter

    rnd = random.Random(17)
    root = tmp_path_factory.mktemp("large_jpegs") / "data"
    big = Image.frombytes("RGB", (640, 480), rnd.randbytes(640 * 480 * 3)).filter(
        ImageFilter.SMOOTH)

    def jpeg(img, **args):
        out = io.BytesIO()
        img.save(out, format="JPEG", **args)
        return out.getvalue()

    small = big.resize((64, 48))
    files = {
        "large.jpg": jpeg(big, quality=100),
        "trailing.jpg": jpeg(small, quality=90) + rnd.randbytes(64 << 10),
        "trailing_gray.jpg": jpeg(small.convert("L"), quality=75) + rnd.randbytes(64 << 10),
        "icc.jpg": jpeg(small, quality=90, icc_profile=rnd.randbytes(100_000)),
        "progressive.jpg": jpeg(big.resize((300, 200)), quality=95, progressive=True),
        "cmyk.jpg": jpeg(small.convert("CMYK")),
        "truncated.jpg": jpeg(big, quality=100)[:40_000],
    }
    out = io.BytesIO()
    small.save(out, format="PNG")
    files["image.png"] = out.getvalue()
    for k, (name, data) in enumerate(sorted(files.items())):
        (root / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{k % 2}" / name).write_bytes(data)
    paths = sorted(str(p) for p in root.glob("c*/*"))
    svc = Service(str(root), str(tmp_path_factory.mktemp("large_jpegs_run")), len(paths),
                  job={"seed": 7, "epochs": 2, "ranks": 1, "batch": 5, "scheme": "strided"})
    yield str(root), paths, svc
    svc.stop()


@pytest.mark.parametrize("read_once", [True, False])
def test_decode_jpegs_of_a_batch_is_decode_jpeg_rgb_of_each_file(large_jpegs, read_once):
    """Batch.decode_jpegs() decodes each sample as decode_jpeg_rgb() decodes the file's bytes:
    the same pixels, or None where nopfs leaves the decode to PIL (CMYK, PNG, a truncated
    JPEG), whether the stream reads its samples in place or, read_once, in pieces up to
    about the image's end (a large image read in several, markers skipped across pieces, bytes
    after the image left unread)."""
    from PIL import Image

    from nopfs.torch._datasets import _uses_pils_libjpeg

    assert _uses_pils_libjpeg(Image)
    root, paths, svc = large_jpegs
    client = nopfs.connect(svc.socket)
    got = {}
    with client.open(0, epochs=1, read_once=read_once) as stream:
        while len(got) < len(paths):
            with stream.next_batch(len(paths) - len(got)) as batch:
                got.update(zip(batch.ids.tolist(), batch.decode_jpegs()))
    for i, path in enumerate(paths):
        want = nopfs._client.decode_jpeg_rgb(file_bytes(path))
        assert got[i] == want, path
        name = os.path.basename(path)
        assert (want is None) == (name in ("cmyk.jpg", "image.png", "truncated.jpg")), name
    with client.open(0, epoch=1, epochs=1, read_once=read_once) as stream:
        batch = stream.next_batch(2)
        assert batch.decode_jpegs(max_pixels=1) == [None, None]  # more pixels than allowed
        batch.release()
        with pytest.raises(ValueError, match="after release"):
            batch.decode_jpegs()


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_loader_of_large_and_padded_jpegs_gives_the_pixels_of_pil_reading_the_files(
        large_jpegs, monkeypatch, workers, persistent):
    """ImageFolder's default pil_decode through the DataLoader, without workers, in workers
    that live one pass (reading of each sample what its decode reads) and in persistent workers,
    each batch decoded in one call: every item is PIL's image of its file, those nopfs leaves to PIL too (the
    truncated one as PIL decodes it when told to load truncated images)."""
    from PIL import ImageFile

    root, paths, svc = large_jpegs
    for k, v in svc.env(0).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    dataset = ImageFolder(root, transform=_pixels)
    sampler = DistributedSampler(dataset)
    extra = {"persistent_workers": True} if persistent else {}
    loader = DataLoader(dataset, batch_size=5, sampler=sampler, num_workers=workers,
                        collate_fn=list, **extra)
    for epoch in (0, 1) if persistent else (0,):
        sampler.set_epoch(epoch)
        order = svc.stream(0)[epoch * len(paths):(epoch + 1) * len(paths)]
        got = [item for batch in loader for item in batch]
        assert len(got) == len(order)
        for g, i in zip(got, order):
            same(g, (_pixels(_pil_reads(paths[i])), label_of(paths[i])))


def _view_and_bytes(data):
    """A decode that reports what it was given: (a read-only memoryview?, its bytes)."""
    return isinstance(data, memoryview) and data.readonly, bytes(data)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_custom_decode_gets_read_only_views_of_the_files_bytes(service, images, rank_env,
                                                                 workers):
    """decode gets a read-only memoryview per sample, of the RAM tier in the main process and
    of a copy in a worker that lives one pass; the bytes are the files' either way."""
    root, paths = images
    loader, got, order = _first_pass_items(service, root, rank_env, workers,
                                           decode=_view_and_bytes)
    assert loader.nopfs_stream.mode == "views"
    assert [(ok, data) for (ok, data), _ in got] == [(True, file_bytes(paths[i])) for i in order]


def _memory_kept(data):
    """A decode that reports whether its process's malloc keeps what it frees, and its pid."""
    from nopfs.torch import _memory

    return _memory._kept_in == [os.getpid()], os.getpid(), bytes(data)


@pytest.mark.parametrize("workers", [0, 2])
def test_every_process_making_batches_keeps_the_memory_it_frees(service, images, rank_env,
                                                                workers):
    """The process that makes the batches (the training process without workers, each worker
    with them) has its malloc keep the memory a batch frees, and the items are the files'."""
    root, paths = images
    loader, got, order = _first_pass_items(service, root, rank_env, workers,
                                           decode=_memory_kept)
    assert [data for (_, _, data), _ in got] == [file_bytes(paths[i]) for i in order]
    assert all(kept == GLIBC_MALLOC for (kept, _, _), _ in got)
    pids = {pid for (_, pid, _), _ in got}
    if workers == 0:
        assert pids == {os.getpid()}
    else:
        assert len(pids) == workers and os.getpid() not in pids


def _glibc_malloc():
    """Whether this process's malloc is glibc's: not when a sanitizer's runtime, which brings its
    own allocator, is loaded (the ASan build runs the tests with it preloaded)."""
    with open("/proc/self/maps") as f:
        return not any(lib in f.read() for lib in ("libasan", "libtsan", "libmsan"))


GLIBC_MALLOC = _glibc_malloc()

_FAULTS = """
import resource, sys
from nopfs.torch import _memory
kept = _memory.keep_freed_memory()

def batch():  # 64 items of 64 KiB (4 MiB) made and freed, as a batch of a loader
    items = [bytearray(65536) for _ in range(64)]
    del items

batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    batch()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_kept_memory_is_not_faulted_in_again_for_every_batch_unless_the_user_tunes_malloc():
    """With keep_freed_memory(), 20 more batches of 4 MiB fault in fewer pages than one batch
    has (glibc's defaults give the memory back and fault all of it in again every batch); a
    process whose environment sets malloc's parameters keeps them."""
    import subprocess
    import sys

    def run(**env):
        out = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True,
                             env={**os.environ, **env}, check=True).stdout.split()
        return out[0] == "True", int(out[1])

    kept, faults = run()
    if GLIBC_MALLOC:
        assert kept and faults < 64 * 16, faults
    else:  # a sanitizer's allocator: glibc's parameters do not apply, and it says so
        assert kept is False
    for env in ({"MALLOC_TRIM_THRESHOLD_": "131072"}, {"MALLOC_MMAP_THRESHOLD_": "131072"},
                {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}):
        assert run(**env)[0] is False, env


class _IndexedPixels(ImageFolder):
    """A subclass's own __getitem__: its pixels, label and index, and the thread it ran in."""

    def __getitem__(self, index):
        data, label = self.read(index)
        return _pixels(pil_decode(data)), label, index, threading.current_thread().name


# The decode threads of decode_threads=3 (a lone sample, such as the pass's last, is made in the
# loader's own thread).
DECODERS = {f"nopfs-decode_{k}" for k in range(3)}


def _thread_and_bytes(data):
    """A decode that reports the thread it ran in and the (read-only view's) bytes."""
    return threading.current_thread().name, isinstance(data, memoryview), bytes(data)


@pytest.mark.parametrize("make", ["views", "pil", "getitem"])
def test_decode_threads_make_the_same_items_in_the_same_order(service, images, rank_env, make):
    """decode_threads=3: the items of each batch are made by threads of the training process
    (a batch of 4 in 3 parts), and the passes are item for item what the loader's own thread
    makes, in the stream's order: a custom decode given views, pil_decode, and a subclass's own
    __getitem__."""
    root, paths = images
    rank_env(0)
    order = service.stream(0)[:45]

    def one_pass(threads):
        if make == "views":
            dataset = ImageFolder(root, decode=_thread_and_bytes)
        elif make == "pil":
            dataset = ImageFolder(root, transform=_pixels)
        else:
            dataset = _IndexedPixels(root)
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=list,
                            decode_threads=threads)
        assert loader.nopfs_stream.mode == ("getitem" if make == "getitem" else "views")
        sampler.set_epoch(0)
        return [item for batch in loader for item in batch]

    serial, threaded = one_pass(0), one_pass(3)
    assert len(serial) == len(threaded) == len(order) == 45
    if make == "views":
        assert {name for (name, _, _), _ in serial} == {threading.current_thread().name}
        # Batches of 2 or more on the pool's threads, never the caller's (which of the three take
        # part is the scheduler's: under load one may do it all); the last, lone sample (45 in
        # batches of 4) in the caller's.
        names = [name for (name, _, _), _ in threaded]
        assert set() < set(names[:44]) <= DECODERS
        assert names[44] == threading.current_thread().name
        assert [(view, data) for (_, view, data), _ in threaded] == \
            [(True, file_bytes(paths[i])) for i in order]
        assert [label for _, label in threaded] == [label_of(paths[i]) for i in order]
    elif make == "pil":
        for a, b in zip(serial, threaded):
            same(a, b)
        same(threaded[0], (_pixels(_pil_reads(paths[order[0]])),
                           label_of(paths[order[0]])))
    else:
        assert [x[2] for x in threaded] == order
        assert set() < {x[3] for x in threaded[:44]} <= DECODERS
        assert threaded[44][3] == threading.current_thread().name
        for a, b in zip(serial, threaded):
            same(list(a[:3]), list(b[:3]))


def _tasks():
    """This process's threads as the kernel lists them (thread ids)."""
    return set(os.listdir("/proc/self/task"))


def _slow_thread_and_bytes(data):
    """_thread_and_bytes, 2 ms slower (the decode threads take part however busy the host)."""
    threading.Event().wait(0.002)
    return _thread_and_bytes(data)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_pass_leaves_no_thread_behind(service, images, rank_env, prefetch):
    """The decode threads and the read-ahead thread of a pass have exited, as the kernel lists
    the process's threads, when the loop gets StopIteration and when it drops the pass's
    iterator midway: the workers a later DataLoader forks copy no lock that a thread of an
    ended pass holds while it tears itself down (under ASan, its allocator's: the worker's next
    allocation of that size would wait forever)."""
    root, paths = images
    rank_env(0)
    dataset = ImageFolder(root, decode=_slow_thread_and_bytes)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=list,
                        decode_threads=3, prefetch_factor=prefetch)
    before = _tasks()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = set()
        for batch in loader:
            seen |= {name for (name, _, _), _ in batch}
            seen |= {t.name for t in threading.enumerate()}
            threading.Event().wait(0.01)  # the loop works between its batches
        assert seen & DECODERS
        assert ("nopfs-batches" in seen) == (prefetch > 0)
        assert not _tasks() - before, f"epoch {epoch}: threads left: {threading.enumerate()}"
    sampler.set_epoch(2)
    it = iter(loader)
    for _ in range(5):
        next(it)
    assert _tasks() - before
    del it
    assert not _tasks() - before, f"left midway: {threading.enumerate()}"


def test_decode_threads_are_refused_with_workers_and_when_not_a_count(service, images,
                                                                      rank_env):
    root, _ = images
    rank_env(0)
    dataset = ImageFolder(root)
    sampler = DistributedSampler(dataset)
    with pytest.raises(ValueError, match="pass one of them: num_workers=0 to decode in threads"):
        DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2, decode_threads=2)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"write a number of threads >= 0"):
            DataLoader(dataset, batch_size=4, sampler=sampler, decode_threads=bad)


def test_pin_memory(big, monkeypatch):
    """DataLoader(pin_memory=True) as torch's: pinned with CUDA, a no-op without it; the
    extension-level read_batch(pin_memory=True) pins, or says clearly that it needs CUDA."""
    root, paths, svc = big
    set_env(monkeypatch, svc, 0)
    order = svc.stream(0)
    dataset = ImageFolder(root, decode=uint8_tensor)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=30, sampler=sampler, pin_memory=True)
    sampler.set_epoch(0)
    got = list(loader)
    for g, w in zip(got, expected_batches(paths, order[:40], 30, uint8_tensor)):
        same(g, w)
        assert g[0].is_pinned() == torch.cuda.is_available()
    with nopfs.connect(svc.socket).open(0, epochs=1) as stream:
        if torch.cuda.is_available():
            data, offsets, labels, ids = read_batch(stream, 8, pin_memory=True)
            assert data.is_pinned()
        else:
            with pytest.raises(RuntimeError, match="pin_memory=True needs CUDA.*pass "
                                                   "pin_memory=False"):
                read_batch(stream, 8, pin_memory=True)
            data, offsets, labels, ids = read_batch(stream, 8)
        assert ids.tolist() == order[:len(ids)]
        for k, sid in enumerate(ids.tolist()):
            assert bytes(data[offsets[k]:offsets[k + 1]].numpy()) == file_bytes(paths[sid])
            assert labels[k] == label_of(paths[sid])


def test_fallback_batches_are_the_services(big, monkeypatch):
    root, paths, svc = big
    set_env(monkeypatch, svc, 0)
    order = svc.stream(0)
    monkeypatch.delenv("NOPFS_SOCKET")
    monkeypatch.setenv("NOPFS_FALLBACK", "1")
    dataset = ImageFolder(root, decode=uint8_tensor)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=30, sampler=sampler, num_workers=2)
    assert loader.nopfs_fallback
    sampler.set_epoch(1)
    same(list(loader), expected_batches(paths, order[40:80], 30, uint8_tensor))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_drop_last_job_has_whole_batches_only(big, tmp_path, monkeypatch, workers):
    root, paths, _ = big
    svc = Service(root, str(tmp_path / "run"), len(paths),
                  job={"seed": 4, "epochs": 2, "ranks": 1, "batch": 30, "scheme": "strided"},
                  extra=("--drop-last",))
    try:
        set_env(monkeypatch, svc, 0)
        monkeypatch.setenv("NOPFS_DROP_LAST", "1")
        dataset = ImageFolder(root, decode=uint8_tensor)
        sampler = DistributedSampler(dataset)
        assert sampler.drop_last
        loader = DataLoader(dataset, batch_size=30, sampler=sampler, num_workers=workers)
        assert len(loader) == 1
        for epoch in range(2):
            with nopfs.connect(svc.socket).open(0, epoch=epoch, epochs=1) as stream:
                served = [s.id for s in stream]
            assert served == sampler.order(epoch).tolist() and len(served) == 30
            sampler.set_epoch(epoch)
            got = list(loader)
            assert len(got) == 1
            same(got, expected_batches(paths, served, 30, uint8_tensor))
    finally:
        svc.stop()


def _tier_rss_kb():
    """{address range: resident KiB} of this process's mappings of a RAM tier (memfd
    nopfs-*-ram): the pages each mapping has touched."""
    rss, current = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            if "memfd:nopfs-" in line and "-ram" in line:
                current = line.split()[0]
            elif current is not None and line.startswith("Rss:"):
                rss[current] = int(line.split()[1])
                current = None
    return rss


def test_a_read_once_stream_copies_out_of_the_tier_without_touching_its_mapping(big):
    """open(read_once=True), what a DataLoader worker that lives one pass opens: its copies
    (copy_into, tobytes) read the RAM tier's file, and the connection's own mapping of the tier
    keeps no page; a default stream copies from the mapping. The bytes are the files' in both."""
    root, paths, svc = big
    order = svc.stream(0)[:40]
    for read_once in (True, False):
        before = _tier_rss_kb()
        client = nopfs.connect(svc.socket)
        in_place = client.report()["sources"][0]["in_place"]
        with client.open(0, epochs=1, read_once=read_once) as stream:
            got, k = [], 0
            while k < len(order):
                batch = stream.next_batch(len(order) - k)
                with batch:
                    if k == 0:
                        data = [bytes(x) for x in batch.tobytes()]
                    else:
                        buf = np.empty(batch.nbytes, np.uint8)
                        batch.copy_into(buf)
                        offs = batch.offsets
                        data = [buf[offs[i]:offs[i + 1]].tobytes() for i in range(len(batch))]
                    got.extend(zip(batch.ids.tolist(), data))
                k += len(got) - k
            mine = [r for r in _tier_rss_kb() if r not in before]
            assert len(mine) == 1, "the connection's mapping of the tier"
            rss = _tier_rss_kb()[mine[0]]
        assert [i for i, _ in got] == order
        for i, data in got:
            assert data == file_bytes(paths[i]), f"sample {i}"
        assert client.report()["sources"][0]["in_place"] > in_place, "no sample in the RAM tier"
        if read_once:
            assert rss == 0, f"read_once: the mapping holds {rss} KiB"
        else:
            assert rss >= 200, f"default: the mapping holds {rss} KiB"
        del client
