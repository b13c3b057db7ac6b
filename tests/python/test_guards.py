"""What keeps a PyTorch script from reading the wrong data without a word: checkpoints of another
order, a subclass's __getitem__, more workers than the service allows, ranks that contradict the
job, the documented loop without a service, the fallback's files, a generator's seed
(docs/python.md, "Guarantees")."""

import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings

import pytest
import torch

import nopfs
from nopfs.torch import DataLoader, DistributedSampler, ImageFolder, ManifestDataset
from conftest import BIN, Service, make_image_folder

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs", "python.md")


def file_bytes(path):
    with open(path, "rb") as fh:
        return fh.read()


def keep_list(batch):
    return batch


def loader_of(dataset, workers=0, **kw):
    sampler = DistributedSampler(dataset)
    return sampler, DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers,
                               collate_fn=keep_list, **kw)


def items_of(loader):
    return [item for batch in loader for item in batch]


def no_nopfs_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("NOPFS_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                           "LOCAL_WORLD_SIZE"):
            monkeypatch.delenv(k)


# 1. Checkpoints ---------------------------------------------------------------------------------

def test_a_checkpoint_records_its_order_and_another_jobs_is_refused(service, images, rank_env,
                                                                     monkeypatch, tmp_path):
    root, paths = images
    # A checkpoint saved at step 4 of epoch 1 of another job: seed 5, one rank, batch 4.
    other = Service(root, str(tmp_path / "run"), len(paths),
                    job={"seed": 5, "epochs": 3, "ranks": 1, "batch": 4, "scheme": "strided"})
    try:
        for k, v in other.env(0).items():
            monkeypatch.setenv(k, v)
        sampler, loader = loader_of(ImageFolder(root, decode=bytes))
        sampler.set_epoch(1)
        it = iter(loader)
        for _ in range(4):
            next(it)
        del it
        buf = io.BytesIO()
        torch.save({"loader": loader.state_dict()}, buf)  # as a training script saves it
    finally:
        other.stop()
    buf.seek(0)
    state = torch.load(buf)["loader"]
    assert state["nopfs_state"] == 1 and (state["epoch"], state["step"]) == (1, 4)
    assert state["order"] == {"seed": 5, "samples": 90, "ranks": 1, "batch": 4,
                              "scheme": "strided", "drop_last": False}
    assert state["rank"] == 0 and state["epochs"] == 3
    assert state["dataset"] == {"path": os.path.realpath(root), "samples": 90,
                                "bytes": sum(os.path.getsize(p) for p in paths)}
    # Resumed under this job (seed 7, 2 ranks, batch 8): refused, naming each difference.
    rank_env(1)
    sampler, loader = loader_of(ImageFolder(root, decode=bytes))
    with pytest.raises(ValueError) as e:
        loader.load_state_dict(state)
    msg = str(e.value)
    assert "saved in another order than this job's" in msg
    for part in ("seed 5 (this job's: 7): run the job with NOPFS_SEED=5 (sbatch --nopfs-seed, "
                 "nopfs run --seed)",
                 "ranks 1 (this job's: 2): run the job with NOPFS_RANKS=1 (sbatch --nodes x "
                 "--nopfs-ranks-per-node, nopfs run --ranks)",
                 "batch 4 (this job's: 8): run the job with NOPFS_BATCH=4"):
        assert part in msg, msg
    assert "scheme" not in msg and "drop last" not in msg and "dataset" not in msg
    assert sampler.state_dict()["step"] == 0  # nothing was resumed

    # This job's own state resumes exactly; so does rank 0's state on rank 1 (every rank runs
    # the same steps: one rank's checkpoint is every rank's).
    rank_env(0)
    s0, l0 = loader_of(ImageFolder(root, decode=bytes))
    s0.set_epoch(2)
    it = iter(l0)
    next(it), next(it)
    mine = l0.state_dict()
    del it
    rank_env(1)
    sampler, loader = loader_of(ImageFolder(root, decode=bytes))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.load_state_dict(mine)
    sampler.set_epoch(2)
    assert [d for d, _ in items_of(loader)] == [file_bytes(paths[i])
                                                for i in sampler.job.order(2, 2).tolist()]

    # The dataset's files changed (same count, other bytes): refused.
    changed = {**mine, "dataset": {**mine["dataset"], "bytes": mine["dataset"]["bytes"] + 1}}
    with pytest.raises(ValueError, match=r"dataset of \d+ bytes \(this job's: \d+, .*\): its "
                                         r"files changed"):
        loader.load_state_dict(changed)
    more = {**mine, "order": {**mine["order"], "samples": 91},
            "dataset": {**mine["dataset"], "samples": 91}}
    with pytest.raises(ValueError, match=r"dataset of 91 samples \(this job's: 90"):
        loader.load_state_dict(more)
    # A state of a newer format is refused; one of an older nopfs is resumed with a warning.
    with pytest.raises(ValueError, match="saved by a newer nopfs"):
        loader.load_state_dict({**mine, "nopfs_state": 2})
    with pytest.warns(UserWarning, match=r"does not say which order it is a position in \(saved "
                                         r"by an older nopfs\)"):
        loader.load_state_dict({"epoch": 1, "step": 3})
    sampler.set_epoch(1)
    assert [d for d, _ in items_of(loader)] == [file_bytes(paths[i])
                                                for i in sampler.job.order(1, 3).tolist()]

    # The same job's state resumes in the fallback, without a word: the same dataset.
    monkeypatch.delenv("NOPFS_SOCKET")
    monkeypatch.setenv("NOPFS_FALLBACK", "1")
    sampler, loader = loader_of(ImageFolder(root, decode=bytes))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.load_state_dict(mine)
    assert loader.state_dict()["dataset"] == mine["dataset"]


# 2. A subclass's __getitem__ ----------------------------------------------------------------------

class IndexedFolder(ImageFolder):
    """The torch idiom: an item with its index."""

    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        return x, y, index


class ReadsItself(ImageFolder):
    def __getitem__(self, index):
        path, label = self.samples[index]
        with open(path, "rb") as fh:
            return fh.read(), label


class OwnRead(ImageFolder):
    def read(self, sample_id):
        data, label = super().read(sample_id)
        return data[::-1], label


class Reversed(ImageFolder):
    def make_item(self, data, label):
        return bytes(data)[::-1], label


@pytest.mark.parametrize("workers", [0, 2])
def test_a_subclass_getitem_is_honoured_with_and_without_a_service(service, images, rank_env,
                                                                    monkeypatch, workers):
    root, paths = images
    rank_env(0)
    ds = IndexedFolder(root, decode=bytes)
    assert len(ds[5]) == 3
    sampler, loader = loader_of(ds, workers=workers)
    sampler.set_epoch(1)
    order = sampler.job.order(1).tolist()
    served = items_of(loader)
    assert [len(item) for item in served] == [3] * len(order)
    assert [i for _, _, i in served] == order
    assert [d for d, _, _ in served] == [file_bytes(paths[i]) for i in order]
    # The default collate too: torch batches the third element like the others.
    loader = DataLoader(IndexedFolder(root, decode=lambda b: torch.tensor(len(b))), batch_size=4,
                        num_workers=workers)
    x, y, i = next(iter(loader))
    first = loader.nopfs_sampler.order(0).tolist()[:4]
    assert i.tolist() == first
    assert x.tolist() == [os.path.getsize(paths[k]) for k in first]
    # make_item, the other hook, is honoured as well.
    _, loader = loader_of(Reversed(root, decode=bytes), workers=workers)
    assert [d for d, _ in items_of(loader)] == [file_bytes(paths[i])[::-1]
                                                for i in sampler.job.order(0).tolist()]
    # Without a service: the same items, from the files.
    monkeypatch.delenv("NOPFS_SOCKET")
    monkeypatch.setenv("NOPFS_FALLBACK", "1")
    sampler, loader = loader_of(IndexedFolder(root, decode=bytes), workers=workers)
    sampler.set_epoch(1)
    assert items_of(loader) == served


def test_a_subclass_the_loader_cannot_honour_is_refused_naming_the_hooks(service, images,
                                                                         rank_env, monkeypatch):
    root, _ = images
    rank_env(0)
    with pytest.raises(TypeError, match=r"OwnRead overrides read\(\), which the loader does not "
                                        r"call.*override make_item\(self, data, label\).*or "
                                        r"__getitem__\(self, index\) calling self.read\(index\)"):
        loader_of(OwnRead(root, decode=bytes))
    _, loader = loader_of(ReadsItself(root, decode=bytes))
    with pytest.raises(TypeError, match=r"ReadsItself.__getitem__\(\d+\) did not call "
                                        r"self.read\(\d+\).*override make_item"):
        items_of(loader)
    monkeypatch.delenv("NOPFS_SOCKET")
    monkeypatch.setenv("NOPFS_FALLBACK", "1")
    _, loader = loader_of(ReadsItself(root, decode=bytes))
    with pytest.raises(TypeError, match="did not call"):
        items_of(loader)


# 3. Workers and the service's limit ---------------------------------------------------------------

def test_more_workers_than_the_service_allows_are_refused_at_construction(images, service,
                                                                          tmp_path, monkeypatch):
    root, paths = images
    # The default limit: 32 streams per rank, and the status says so.
    client = nopfs.connect(service.socket)
    assert client.report()["refusals"]["streams_per_rank"] == 32
    assert "limits: 32 streams per rank" in client.status()
    conf = tmp_path / "two-streams.lua"
    conf.write_text("classes = { }\nlimits = { streams_per_rank = 2 }\n")
    svc = Service(root, str(tmp_path / "run"), len(paths), extra=("--config", str(conf)))
    try:
        for k, v in svc.env(0).items():
            monkeypatch.setenv(k, v)
        assert "limits: 2 streams per rank" in nopfs.connect(svc.socket).status()
        with pytest.raises(ValueError) as e:
            loader_of(ImageFolder(root, decode=bytes), workers=3)
        assert ("DataLoader(num_workers=3): each worker opens a stream of rank 0, and this job's "
                "service allows 2 streams per rank (limits.streams_per_rank = 2 in the node "
                "config") in str(e.value)
        assert "write num_workers=2 or fewer, or ask the admin to raise limits.streams_per_rank" \
            in str(e.value)
        sampler, loader = loader_of(ImageFolder(root, decode=bytes), workers=2)
        assert [d for d, _ in items_of(loader)] == [file_bytes(paths[i])
                                                    for i in sampler.job.order(0).tolist()]
    finally:
        svc.stop()


# 4. Ranks -----------------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(images, tmp_path, *command):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    argv = [os.path.join(BIN, "nopfs"), "run", "--dataset", images, "--ranks", "2", "--batch",
            "8", "--seed", "7", "--epochs", "1", "--scheme", "strided", "--run-dir",
            str(tmp_path / "run"), "--", *command]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    return p


@pytest.mark.parametrize("mode", ["agree", "swapped", "explicit"])
def test_the_sampler_agrees_with_the_process_group(images, tmp_path, mode):
    root, paths = images
    p = run_two_ranks(root, tmp_path, sys.executable, os.path.join(HERE, "guard_ranks.py"),
                      root, mode)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}"
    lines = sorted(re.findall(r"(?m)^rank \d group \d: .*$", p.stdout))
    assert len(lines) == 2, p.stdout
    if mode == "swapped":
        for rank, line in enumerate(lines):
            assert line.startswith(
                f"rank {rank} group {1 - rank}: refused: nopfs: torch.distributed's process "
                f"group makes this process rank {1 - rank} of 2, but the job makes it nopfs "
                f"rank {rank} of 2"), line
            assert "pass DistributedSampler(num_replicas=2, rank=" in line
    else:
        assert "read no sample through nopfs" not in p.stderr
        group = (lambda r: r) if mode == "agree" else (lambda r: 1 - r)
        got = [int(x) for x in re.findall(r"(\d+) samples", "\n".join(lines))]
        assert lines == [f"rank {r} group {group(r)}: sampler rank {r} of 2, {got[r]} samples"
                         for r in (0, 1)]
        assert sum(got) >= len(paths)


RANK_SCRIPT = r"""
import os, sys
from nopfs.torch import DistributedSampler, ImageFolder
rank = os.environ["NOPFS_RANK"]
try:
    line = f"rank {rank} sampler {DistributedSampler(ImageFolder(sys.argv[1])).rank}"
except ValueError as e:
    line = f"rank {rank} refused: {e}"
sys.stdout.write(line + "\n")  # one write: the two ranks share the output
"""


def test_a_rank_in_the_environment_that_contradicts_the_job_is_refused(images, tmp_path):
    """`RANK=$SLURM_PROCID`-style exports under nopfs run (one process per rank): a RANK that is
    the job's passes, one that is not is refused with what to write."""
    root, _ = images
    script = RANK_SCRIPT
    p = run_two_ranks(root, tmp_path, "bash", "-c",
                      'RANK=$NOPFS_RANK WORLD_SIZE=2 exec "$0" -c "$1" "$2"', sys.executable,
                      script, root)
    assert p.returncode == 0, p.stderr
    assert sorted(re.findall(r"(?m)^rank \d .*$", p.stdout)) == ["rank 0 sampler 0",
                                                                  "rank 1 sampler 1"]
    p = run_two_ranks(root, tmp_path, "bash", "-c",
                      'RANK=$((1 - NOPFS_RANK)) exec "$0" -c "$1" "$2"', sys.executable, script,
                      root)
    assert p.returncode == 0, p.stderr
    for r in (0, 1):
        assert (f"rank {r} refused: nopfs: RANK={1 - r} in the environment is not this "
                f"process's nopfs rank {r}") in p.stdout, p.stdout
    assert p.stdout.count("write RANK=$NOPFS_RANK") == 2


# 5. The documented loops, with a service and without -------------------------------------------

def docs_blocks(after, count=1):
    """The first `count` ```python blocks of docs/python.md after the line `after`."""
    text = open(DOCS).read()
    return re.findall(r"```python\n(.*?)```", text[text.index(after):], re.S)[:count]


def run_documented_loops(root, tmp_path):
    """Runs docs/python.md's three-line-change loop and its checkpoint loop as written; returns
    the labels of every batch of the first and the epochs of the second's steps."""
    seen = []

    class Args:
        data = root
        epochs = 3
        batch_size = 4
        seed = 7

    # The three-line change: its sampler and loader as written, its loop's body filled in.
    code, = docs_blocks("The rest of the script stays as it is")
    code = code.replace("        ...", "        seen.append((epoch, y.tolist()))")
    exec(code, {"ImageFolder": ImageFolder, "DistributedSampler": DistributedSampler,
                "DataLoader": DataLoader, "args": Args, "world": 2, "rank": 1,
                "transform": lambda img: 0, "seen": seen})
    assert sorted({e for e, _ in seen}) == [0, 1, 2]
    # The checkpoint loop, twice: the first run saves at its third batch and goes on to the end;
    # the second resumes from that checkpoint and goes on to the end.
    ckpt = str(tmp_path / "ckpt.pt")
    make, loop = docs_blocks("makes the next pass start at exactly that batch", 2)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for attempt in range(2):
        saves = iter([False, False, True] if attempt == 0 else [])
        ns = {"os": os, "torch": torch, "ckpt": ckpt, "model": model, "opt": opt, "args": Args,
              "dataset": ImageFolder(root, transform=lambda img: 0),
              "DistributedSampler": DistributedSampler, "DataLoader": DataLoader,
              "train_step": lambda x, y: steps.append((attempt, ns["sampler"].epoch)),
              "time_to_save": lambda: next(saves, False)}
        exec(make, ns)
        exec(loop, ns)
        assert ns["sampler"].state_dict()["epoch"] == 3
    return seen, steps


def test_the_documented_loops_run_with_a_service_and_in_fallback(service, images, rank_env,
                                                                 monkeypatch, tmp_path):
    root, _ = images
    rank_env(1)
    os.makedirs(tmp_path / "served")
    served = run_documented_loops(root, tmp_path / "served")
    # Two checkpointed runs: the first saved at its third batch and went on to the end, the
    # second resumed there and went on to the end too.
    assert served[1].count((1, 0)) == served[1].count((0, 0)) - 3
    no_nopfs_env(monkeypatch)
    monkeypatch.setenv("NOPFS_FALLBACK", "1")
    monkeypatch.setenv("RANK", "1")  # rank 1 of 2, as the job's (torchrun's variables)
    monkeypatch.setenv("WORLD_SIZE", "2")
    os.makedirs(tmp_path / "fallback")
    assert run_documented_loops(root, tmp_path / "fallback") == served


def test_epochs_without_a_job(images, monkeypatch, service, rank_env):
    root, _ = images
    no_nopfs_env(monkeypatch)
    monkeypatch.setenv("NOPFS_FALLBACK", "1")
    sampler = DistributedSampler(ImageFolder(root, decode=bytes))
    with pytest.raises(ValueError, match=r"sampler.epochs is unknown: there is no job .* pass "
                                         r"epochs=N"):
        sampler.epochs
    assert DistributedSampler(ImageFolder(root, decode=bytes), epochs=4).epochs == 4
    rank_env(0)
    assert DistributedSampler(ImageFolder(root, decode=bytes), epochs=3).epochs == 3
    with pytest.raises(ValueError, match=r"epochs=4\) contradicts the job, whose epochs is 3 "
                                         r"\(NOPFS_EPOCHS"):
        DistributedSampler(ImageFolder(root, decode=bytes), epochs=4)


# 6. The fallback reads the files the job listed, or stops ----------------------------------------

@pytest.fixture
def tree(tmp_path):
    root = str(tmp_path / "tree")
    paths = make_image_folder(root, files=24, classes=2, seed=9)
    return root, paths


def fallback_loader(root, workers=0):
    return loader_of(ImageFolder(root, decode=bytes), workers=workers)


def test_the_fallback_reads_the_files_listed_at_start_through_the_resolved_path(
        tree, tmp_path, monkeypatch):
    root, paths = tree
    no_nopfs_env(monkeypatch)
    monkeypatch.setenv("NOPFS_FALLBACK", "1")
    link = str(tmp_path / "link")
    os.symlink(root, link)
    twin = str(tmp_path / "twin")
    make_image_folder(twin, files=24, classes=2, seed=10)  # the same shape, other bytes
    sampler, loader = fallback_loader(link, workers=2)
    want = [file_bytes(paths[i]) for i in sampler.job.order(0).tolist()]
    # A file added to a class (it would sort first and shift every id after it), and the link
    # re-pointed to a tree of the same shape: the pass reads what was listed.
    shutil.copy(paths[1], os.path.join(root, "class0", "img0000a.png"))
    os.unlink(link)
    os.symlink(twin, link)
    assert [d for d, _ in items_of(loader)] == want


@pytest.mark.parametrize("change", ["rewritten", "replaced", "removed", "truncated"])
def test_the_fallback_stops_naming_a_file_that_changed(tree, monkeypatch, change):
    root, paths = tree
    no_nopfs_env(monkeypatch)
    monkeypatch.setenv("NOPFS_FALLBACK", "1")
    sampler, loader = fallback_loader(root)
    victim = paths[sampler.job.order(0).tolist()[6]]
    size = os.path.getsize(victim)
    if change == "rewritten":  # the same size, other bytes, in place
        with open(victim, "r+b") as fh:
            fh.write(b"\0" * size)
        os.utime(victim, ns=(time.time_ns(), time.time_ns() + 10**9))
        what = "was modified"
    elif change == "replaced":
        tmp = victim + ".new"
        shutil.copy(paths[0] if paths[0] != victim else paths[1], tmp)
        os.rename(tmp, victim)
        what = "is another file (inode"
    elif change == "removed":
        os.unlink(victim)
        what = "is gone"
    else:
        os.truncate(victim, size - 1)
        what = f"is {size - 1} bytes, listed with {size}"
    got = []
    with pytest.raises(nopfs.Error, match=re.escape(f"({victim}) {what}")):
        for batch in loader:
            got.extend(batch)
    assert [d for d, _ in got] == [file_bytes(paths[i]) for i in
                                   sampler.job.order(0).tolist()[:4]]


def manifest_of(root, paths):
    path = os.path.join(root, "train.tsv")
    with open(path, "w") as fh:
        for p in paths:
            fh.write(f"{os.path.relpath(p, root)}\t{int(os.path.dirname(p)[-1])}\n")
    return path


def test_a_manifest_fallback_checks_its_files_too(tree, tmp_path, monkeypatch):
    root, paths = tree
    manifest = manifest_of(root, paths)
    # Under a service, the listing is the catalog's (checked when the loader is made).
    svc = Service(manifest, str(tmp_path / "run"), len(paths),
                  job={"seed": 3, "epochs": 1, "ranks": 1, "batch": 4, "scheme": "uniform"})
    try:
        for k, v in svc.env(0).items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("NOPFS_FALLBACK", "1")
        sampler, loader = loader_of(ManifestDataset(manifest))
        assert [d for d, _ in items_of(loader)] == [file_bytes(paths[i])
                                                    for i in sampler.job.order(0).tolist()]
    finally:
        svc.stop()
    no_nopfs_env(monkeypatch)
    monkeypatch.setenv("NOPFS_FALLBACK", "1")
    ds = ManifestDataset(manifest)
    sampler, loader = loader_of(ds)
    victim = ds.samples[sampler.job.order(0).tolist()[5]][0]
    with open(victim, "ab") as fh:
        fh.write(b"more")
    with pytest.raises(nopfs.Error, match=re.escape(f"({victim}) is ")):
        items_of(loader)


def test_a_dataset_changed_since_the_job_started_is_refused_before_the_fallback(
        tree, tmp_path, monkeypatch):
    root, paths = tree
    link = str(tmp_path / "link")
    os.symlink(root, link)
    svc = Service(link, str(tmp_path / "run"), len(paths),
                  job={"seed": 3, "epochs": 1, "ranks": 1, "batch": 4, "scheme": "uniform"})
    try:
        for k, v in svc.env(0).items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("NOPFS_FALLBACK", "1")
        monkeypatch.delenv("NOPFS_SAMPLES")  # as under Slurm: the length comes from the service
        loader_of(ImageFolder(link, decode=bytes))  # the same files: accepted
        extra = os.path.join(root, "class1", "img0000a.png")
        shutil.copy(paths[0], extra)
        with pytest.raises(nopfs.Error, match=r"now holds 25 samples of \d+ bytes, the job's "
                                              r"catalog 24 of \d+ \(listed when the job started\)"):
            loader_of(ImageFolder(link, decode=bytes))
        os.unlink(extra)
        # The link re-pointed (after nopfsd resolved it) to a tree of the same shape and sizes.
        twin = str(tmp_path / "twin")
        shutil.copytree(root, twin)
        for p in paths:
            q = p.replace(root, twin)
            with open(q, "r+b") as fh:
                fh.write(b"X")
        os.unlink(link)
        os.symlink(twin, link)
        with pytest.raises(nopfs.Error, match=r"sample 0 is .*/tree/class0/img0000.png .* in the "
                                              r"job's catalog, but .*/twin/class0/img0000.png"):
            loader_of(ImageFolder(link, decode=bytes))
    finally:
        svc.stop()


def test_a_killed_service_falls_back_to_the_files_it_listed(tmp_path, monkeypatch):
    """nopfsd dies mid-pass after a file was added to a class: the rest of the pass is the files
    the service's catalog names, not the tree as it is now."""
    import random

    rnd = random.Random(4)
    root = str(tmp_path / "big")
    paths = []
    for k in range(40):  # 256 KB each, a ring of 1 MB: most of the pass is to come at the kill
        os.makedirs(os.path.join(root, f"class{k % 2}"), exist_ok=True)
        paths.append(os.path.join(root, f"class{k % 2}", f"img{k:04d}.bin"))
        with open(paths[-1], "wb") as fh:
            fh.write(rnd.randbytes(256 << 10))
    paths.sort()
    conf = tmp_path / "small-ring.lua"
    conf.write_text('staging = { capacity = "1M", threads = 1 }\nclasses = { }\n')
    run = tmp_path / "run"
    svc = Service(root, str(run), len(paths),
                  job={"seed": 3, "epochs": 1, "ranks": 1, "batch": 4, "scheme": "uniform"},
                  extra=("--config", str(conf)))
    try:
        for k, v in svc.env(0).items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("NOPFS_FALLBACK", "1")
        sampler, loader = loader_of(ImageFolder(root, decode=bytes), timeout_per_sample=20)
        want = [file_bytes(paths[i]) for i in sampler.job.order(0).tolist()]
        got = []
        with pytest.warns(RuntimeWarning, match="the service went away"):
            for k, batch in enumerate(loader):
                got.extend(d for d, _ in batch)
                if k == 0:
                    shutil.copy(paths[3], os.path.join(root, "class0", "img0000a.bin"))
                    with open(run / "nopfsd.pid") as fh:
                        os.kill(int(fh.read()), signal.SIGKILL)
        assert got == want
    finally:
        svc.proc.send_signal(signal.SIGTERM)
        svc.proc.communicate(timeout=60)


# 7. generator= ----------------------------------------------------------------------------------

def test_a_generator_whose_seed_is_not_the_jobs_warns(service, images, rank_env):
    root, _ = images
    rank_env(0)
    with pytest.warns(UserWarning, match=r"generator=...\) is seeded with 5, the job's seed is "
                                         r"7: the order of the samples comes from the job's seed"):
        loader_of(ImageFolder(root, decode=bytes), generator=torch.Generator().manual_seed(5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader_of(ImageFolder(root, decode=bytes), generator=torch.Generator().manual_seed(7))


def test_a_job_that_staged_but_served_nothing_says_so(images, tmp_path):
    """A script that reads with torch's own classes under `nopfs run`: the job's end says so,
    with the three lines to change."""
    root, _ = images
    script = ("import sys, torchvision\n"
              "ds = torchvision.datasets.ImageFolder(sys.argv[1])\n"
              "assert len(ds) == 90\n"
              "import time; time.sleep(1)\n")  # nopfsd stages meanwhile
    p = run_two_ranks(root, tmp_path, sys.executable, "-c", script, root)
    assert p.returncode == 0, p.stderr
    assert re.search(r"nopfs run: the job staged [\d.]+ (?:[KMGTP]i)?B from the PFS but its ranks "
                     r"read no sample through nopfs: the training script reads the files "
                     r"itself\. To read through nopfs, change three lines .*\n  from nopfs.torch "
                     r"import DataLoader\n  from nopfs.torch import DistributedSampler\n  from "
                     r"nopfs.torch import ImageFolder\n", p.stderr), p.stderr
