"""nopfs._client against a live nopfsd: bytes, order, buffer lifetime, shares, resume."""

import os
import subprocess
import time

import numpy as np
import pytest

import nopfs


def file_bytes(path):
    with open(path, "rb") as fh:
        return fh.read()


def read_all(stream):
    """[(id, label, epoch, bytes)] of a whole stream, releasing every sample."""
    out = []
    for s in stream:
        with s:
            out.append((s.id, s.label, s.epoch, bytes(s.data)))
    return out


def test_catalog_order_matches_the_python_scan(service, images):
    root, paths = images
    classes, samples = nopfs.scan_image_folder(root)
    assert classes == ["class0", "class1", "class2"]
    assert [p for p, _ in samples] == paths
    client = nopfs.connect(service.socket)
    for sid in (0, 1, len(paths) // 2, len(paths) - 1):
        d = client.describe(sid)
        assert d["path"] == samples[sid][0]
        assert d["label"] == samples[sid][1]
        assert d["length"] == os.path.getsize(samples[sid][0])


@pytest.mark.parametrize("rank", [0, 1])
def test_every_byte_and_the_order_equal_the_plan(service, images, rank):
    _, paths = images
    client = nopfs.connect(service.socket)
    assert client.info["ranks"] == 2 and client.info["local_ranks"] == 2
    with client.open(rank) as stream:
        got = read_all(stream)
        stats = stream.stats()
    want = service.stream(rank)
    assert [g[0] for g in got] == want
    job = nopfs.Job(seed=7, samples=len(paths), ranks=2, rank=rank, batch=8)
    assert want == [int(x) for e in range(3) for x in job.order(e)]
    assert [g[2] for g in got] == [e for e in range(3) for _ in range(job.epoch_length())]
    for sid, label, _, data in got:
        assert data == file_bytes(paths[sid])
        assert label == int(os.path.basename(os.path.dirname(paths[sid]))[-1])
    assert stats["samples"] == len(want)
    assert stats["bytes"] == sum(len(g[3]) for g in got)


def test_views_are_zero_copy_and_cannot_outlive_release(service, images):
    _, paths = images
    client = nopfs.connect(service.socket)
    with client.open(0, epochs=1) as stream:
        s = stream.next(timeout=30)
        want = file_bytes(paths[s.id])
        view = s.data
        assert view.readonly and len(view) == len(want) == s.size == len(s)
        arr = s.numpy()
        assert arr.dtype == np.uint8 and not arr.flags.writeable
        assert arr.tobytes() == want and bytes(view) == want
        with pytest.raises(ValueError):
            arr[0] = 1  # read-only: the bytes belong to the service
        copy = s.tobytes()
        with pytest.raises(BufferError, match=f"sample {s.id}"):
            s.release()  # two views are alive
        del arr
        view.release()
        s.release()
        assert s.released
        with pytest.raises(ValueError, match="after release"):
            s.data
        with pytest.raises(ValueError):
            s.numpy()
        s.release()  # idempotent
        assert copy == want
        # A sample dropped with a view alive is released when the view goes: reading goes on.
        t = stream.next(timeout=30)
        keep = t.numpy()
        tid = t.id
        del t
        assert keep.tobytes() == file_bytes(paths[tid])
        del keep
        rest = read_all(stream)
    order = service.stream(0)[: len(rest) + 2]
    assert [s.id, tid] + [r[0] for r in rest] == order


def test_resume_at_epoch_and_step(service, images):
    client = nopfs.connect(service.socket)
    with client.open(1, epoch=1, step=3) as stream:
        got = [g[0] for g in read_all(stream)]
    assert got == service.stream(1, start_epoch=1, start_step=3)
    job = nopfs.Job(seed=7, samples=len(images[1]), ranks=2, rank=1, batch=8)
    assert got[: len(job.order(1, 3))] == job.order(1, 3).tolist()
    with pytest.raises(nopfs.Error, match="step"):
        client.open(1, epoch=1, step=10**6)


def test_worker_shares_interleave_back_into_the_plan(service, images):
    """Worker w of W gets batches w, w+W, ... of one epoch; together they are the epoch."""
    client = nopfs.connect(service.socket)
    W, b = 3, 4
    job = nopfs.Job(seed=7, samples=len(images[1]), ranks=2, rank=0, batch=8)
    for epoch, step in ((0, 0), (2, 1)):
        shares = []
        for w in range(W):
            with client.open(0, epoch=epoch, step=step, worker=w, workers=W, batch=b,
                             epochs=1) as stream:
                got = read_all(stream)
                # The service counts the share's accesses (what it stages) the same way.
                want = {"id": stream.id, "rank": 0, "staged": len(got), "total": len(got),
                        "errors": 0}

                def listed():
                    return [{k: x[k] for k in want} for x in client.report()["streams"]]
                deadline = time.monotonic() + 5
                while want not in listed() and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert want in listed(), client.report()["streams"]
            assert {g[2] for g in got} == {epoch}
            shares.append([g[0] for g in got])
        merged, k = [], 0
        while any(shares):
            chunk = shares[k % W][:b]
            shares[k % W] = shares[k % W][b:]
            merged += chunk
            k += 1
        assert merged == job.order(epoch, step).tolist()
    with pytest.raises(nopfs.Error, match="worker"):
        client.open(0, worker=3, workers=3, batch=4)


def fnv1a64(data):
    h = 14695981039346656037
    for byte in data:
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def test_c_api_shares_deliver_the_files_in_the_planned_order(service, images):
    """The C API's nopfs_open_share (client/c_api_test.c, share mode) against the service: the
    workers' shares interleave back into the rank's epoch, and every sample is its file."""
    prog = os.path.join(os.environ["NOPFS_BIN"], "nopfs_c_api_test")
    env = {**os.environ, "NOPFS_SOCKET": service.socket}
    W, b = 2, 4
    job = nopfs.Job(seed=7, samples=len(images[1]), ranks=2, rank=1, batch=8)
    shares = []
    for w in range(W):
        p = subprocess.run([prog, "share", "1", "1", "2", str(w), str(W), str(b), "1"], env=env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        rows = [line.split() for line in p.stdout.splitlines()]
        for sample, size, h in rows:
            with open(images[1][int(sample)], "rb") as fh:
                data = fh.read()
            assert int(size) == len(data)
            assert int(h, 16) == fnv1a64(data), f"sample {sample}"
        shares.append([int(r[0]) for r in rows])
    merged, k = [], 0
    while any(shares):
        merged += shares[k % W][:b]
        shares[k % W] = shares[k % W][b:]
        k += 1
    assert merged == job.order(1, 2).tolist()


def test_without_a_service_the_error_is_clear(monkeypatch, tmp_path):
    monkeypatch.delenv("NOPFS_SOCKET", raising=False)
    with pytest.raises(nopfs.UnavailableError, match="NOPFS_SOCKET"):
        nopfs.connect()
    with pytest.raises(nopfs.UnavailableError):
        nopfs.connect(str(tmp_path / "no-such.sock"))


def test_unreadable_file_raises_with_its_path(images, tmp_path):
    from conftest import Service, make_image_folder

    root = str(tmp_path / "data")
    paths = make_image_folder(root, files=24, classes=2, seed=9)
    job = nopfs.Job(seed=7, samples=len(paths), ranks=2, rank=0, batch=8)
    bad = paths[int(job.order(0)[3])]  # rank 0 reads it in epoch 0
    os.chmod(bad, 0)  # the scan only stats it: the catalog has it, reading it fails
    svc = Service(root, str(tmp_path / "run"), len(paths))
    try:
        client = nopfs.connect(svc.socket)
        errors, ids = [], []
        with client.open(0, epochs=1) as stream:
            while True:
                try:
                    s = stream.next(timeout=30)
                except nopfs.SampleError as e:
                    errors.append(e)
                    continue
                if s is None:
                    break
                with s:
                    data = bytes(s.data)
                assert data == file_bytes(paths[s.id])
                ids.append(s.id)
        order = svc.stream(0)[: len(ids) + len(errors)]
        bad_id = paths.index(bad)
        assert [i for i in order if i != bad_id] == ids
        assert len(errors) == order.count(bad_id) >= 1
        for e in errors:
            assert bad in str(e) and f"sample {bad_id}" in str(e)
            assert e.sample_id == bad_id and e.path == bad
    finally:
        os.chmod(bad, 0o644)
        svc.stop()


def test_an_exception_inside_with_is_not_masked(service, images):
    _, paths = images
    client = nopfs.connect(service.socket)
    with client.open(1, epochs=1) as stream:
        s = stream.next(timeout=30)
        with pytest.raises(KeyError):
            with s:
                view = s.data  # alive when the block is left
                raise KeyError("boom")
        assert bytes(view) == file_bytes(paths[s.id])
        del view  # the slot goes back now
        rest = read_all(stream)
    assert [s.id] + [r[0] for r in rest] == service.stream(1)[: len(rest) + 1]


def test_a_stream_refuses_use_across_fork(service):
    client = nopfs.connect(service.socket)
    stream = client.open(0, epochs=1)
    pid = os.fork()
    if pid == 0:  # the child: every use fails without touching the parent's connection
        code = 0
        for call in (lambda: stream.next(timeout=1), lambda: client.status()):
            try:
                call()
                code = 1
            except nopfs.Error as e:
                if "fork" not in str(e):
                    code = 2
            except BaseException:
                code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    first = stream.next(timeout=30)  # the parent's stream is intact
    assert first.id == service.stream(0)[0]
    first.release()
    stream.close()
