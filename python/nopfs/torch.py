"""PyTorch integration: a script using torchvision's ImageFolder + DistributedSampler + DataLoader
reads through nopfs by changing its imports:

    from nopfs.torch import DataLoader, DistributedSampler, ImageFolder

- ImageFolder(root, transform=..., target_transform=...): the dataset. Its samples are decoded
  from bytes (PIL, RGB, like torchvision's default loader) wherever they come from.
- ManifestDataset(manifest or [files], decode=bytes, ...): any list of files or byte ranges (the
  manifest nopfsd serves), yielding bytes, tensors (decode=uint8_tensor) or what decode returns.
- DistributedSampler(dataset, ...): DistributedSampler semantics (set_epoch, num_samples,
  total_size, ...) whose parameters are the job's (NOPFS_*: an argument that contradicts them
  raises) and whose order is the service's plan; `epochs` is the job's, and an epoch past them
  raises at once; state_dict()/load_state_dict() checkpoint the position of the next batch.
- DataLoader(dataset, batch_size=..., sampler=..., num_workers=...): a torch DataLoader over
  StreamDataset, an IterableDataset: each worker process connects on its own and opens its share
  of the rank's stream (batches w, w+W, ... of the epoch), and the DataLoader's round-robin over
  workers puts the batches back into the planned order. Transforms run in the workers.
  state_dict() counts the batches the training loop received (as torchdata's
  StatefulDataLoader), and load_state_dict() resumes at exactly the next one.

Why iterable and not map-style: the service delivers a stream in a fixed order and each sample
once; a map-style dataset would receive indices from the main process and could only check that
they arrive in the order the stream has them. As an IterableDataset each worker owns its stream
and nothing has to agree at run time: the order is exact by construction.

Without a service (NOPFS_SOCKET unset) the DataLoader raises nopfs.UnavailableError, unless the
fallback is asked for (fallback=True or NOPFS_FALLBACK=1): then each worker reads the files itself,
in the same order (the planner's, computed locally), with the same decoding. A service that dies
during a pass (killed, crashed) is noticed within a second: with the fallback asked for, each
worker warns and reads the rest of its share from the files, in the same order, from where its
stream stopped; without it, the DataLoader raises nopfs.UnavailableError.
"""

import functools
import io
import math
import multiprocessing
import os
import queue
import threading
import time
import warnings
import weakref
from typing import (TYPE_CHECKING, Any, Callable, Dict, Generator, Iterator, List, Optional,
                    Sequence, Tuple, Union)

import torch.utils.data as tud

if TYPE_CHECKING:
    import torch

from . import _client
from .folder import list_classes, read_manifest, scan_image_folder
from .job import Job, _env_int, fallback_requested, service_available, service_samples


def pil_decode(data: Any) -> Any:
    """Decodes image bytes (any buffer) to an RGB PIL image, as torchvision's default loader."""
    from PIL import Image  # imported lazily: only image datasets need PIL

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


class _SampleDataset(tud.Dataset):
    """What ImageFolder and ManifestDataset share: an item is made from a sample's bytes and
    label by decode, transform and target_transform; `read(i)` (the subclass's) gives them."""

    decode: Callable[[Any], Any]
    transform: Optional[Callable[[Any], Any]]
    target_transform: Optional[Callable[[int], Any]]

    def read(self, sample_id: int) -> Tuple[bytes, int]:
        raise NotImplementedError

    def make_item(self, data: Any, label: int) -> Tuple[Any, Any]:
        """(transform(decode(data)), target_transform(label)): one item from a sample's bytes."""
        x = self.decode(data)
        if self.transform is not None:
            x = self.transform(x)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return x, label

    def __getitem__(self, index: int) -> Tuple[Any, Any]:
        data, label = self.read(index)
        return self.make_item(data, label)


class ImageFolder(_SampleDataset):
    """An ImageFolder dataset (root/<class>/<files>) whose samples may come from nopfs.

    Labels are class indices in sorted class order, as torchvision's. `decode(buffer)` turns a
    sample's bytes into the object `transform` receives (default: pil_decode); it must not keep a
    reference to the buffer (copy what it keeps). Indexing (dataset[i]) reads the file directly.
    """

    def __init__(self, root: Union[str, "os.PathLike[str]"],
                 transform: Optional[Callable[[Any], Any]] = None,
                 target_transform: Optional[Callable[[int], Any]] = None,
                 decode: Callable[[Any], Any] = pil_decode) -> None:
        self.root = os.path.abspath(root)
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.classes = list_classes(self.root)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._samples: Optional[List[Tuple[str, int]]] = None

    @property
    def samples(self) -> List[Tuple[str, int]]:
        """[(path, label)] in sample-id order (scans the tree on first use)."""
        if self._samples is None:
            classes, samples = scan_image_folder(self.root)
            if classes != self.classes:
                raise RuntimeError(f"nopfs: {self.root}: the class directories changed")
            self._samples = samples
        return self._samples

    @property
    def targets(self) -> List[int]:
        return [label for _, label in self.samples]

    def __len__(self) -> int:
        # Under a service the catalog already counted the files: do not walk the PFS again.
        if self._samples is None and service_available():
            return service_samples()
        return len(self.samples)

    def check_served(self) -> None:
        """Raises ValueError if the job's service serves another directory than this root."""
        served = os.environ.get("NOPFS_DATASET")
        if served and os.path.isdir(served) and \
                os.path.realpath(served) != os.path.realpath(self.root):
            raise ValueError(f"nopfs: the job's service serves {served}, not {self.root}")

    def read(self, sample_id: int) -> Tuple[bytes, int]:
        """(bytes, label) of a sample, read from its file."""
        path, label = self.samples[sample_id]
        with open(path, "rb") as fh:
            return fh.read(), label


def uint8_tensor(data: Any) -> "torch.Tensor":
    """Decodes a sample's bytes (any buffer) to a 1-D torch.uint8 tensor (a copy)."""
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class ManifestDataset(_SampleDataset):
    """A dataset of files or byte ranges of files, from a manifest or a list of files.

    `source` is a manifest file (the format nopfsd serves, docs/catalog.md: one sample per line,
    `path[<TAB>label[<TAB>offset<TAB>length]]`) or a list of file paths (`labels`: one integer per
    file, default -1: none). Ids are in the catalog's order: (label, path, offset, length), as
    nopfsd numbers the samples of the same manifest. An item is (decode(bytes), label):
    decode=bytes (the default) yields bytes, decode=uint8_tensor a torch.uint8 tensor, any other
    callable whatever it returns (it must copy what it keeps of the buffer); `transform` and
    `target_transform` then apply as in ImageFolder. Indexing (dataset[i]) reads the file directly.
    """

    def __init__(self, source: Union[str, "os.PathLike[str]", Sequence[str]],
                 labels: Optional[Sequence[int]] = None,
                 decode: Callable[[Any], Any] = bytes,
                 transform: Optional[Callable[[Any], Any]] = None,
                 target_transform: Optional[Callable[[int], Any]] = None) -> None:
        self.decode = decode
        self.transform = transform
        self.target_transform = target_transform
        self._samples: Optional[List[Tuple[str, int, int, int]]] = None
        if isinstance(source, (str, bytes, os.PathLike)):
            if labels is not None:
                raise ValueError("nopfs: ManifestDataset(manifest, labels=...): a manifest "
                                 "carries its labels; pass labels only with a list of files")
            self.manifest: Optional[str] = os.path.abspath(os.fsdecode(source))
            self._files: Optional[List[str]] = None
            self._labels: Optional[List[int]] = None
        else:
            files = [os.path.abspath(os.fsdecode(f)) for f in source]
            if not files:
                raise ValueError("nopfs: ManifestDataset([]): the list of files is empty")
            lab = [-1] * len(files) if labels is None else [int(x) for x in labels]
            if len(lab) != len(files):
                raise ValueError(f"nopfs: ManifestDataset: {len(files)} files but {len(lab)} "
                                 "labels: give one label per file")
            self.manifest = None
            self._files, self._labels = files, lab

    @property
    def samples(self) -> List[Tuple[str, int, int, int]]:
        """[(path, label, offset, length)] in sample-id order (read on first use)."""
        if self._samples is None:
            if self.manifest is not None:
                self._samples = read_manifest(self.manifest)
            else:
                assert self._files is not None and self._labels is not None
                rows = sorted((lab, os.fsencode(f), os.stat(f).st_size, f)
                              for f, lab in zip(self._files, self._labels))
                self._samples = [(f, lab, 0, size) for lab, _, size, f in rows]
        return self._samples

    @property
    def targets(self) -> List[int]:
        return [s[1] for s in self.samples]

    def __len__(self) -> int:
        if self._samples is None and self.manifest is not None and service_available():
            return service_samples()
        return len(self.samples)

    def check_served(self) -> None:
        """Raises ValueError if the job's service serves another dataset than this one."""
        served = os.environ.get("NOPFS_DATASET")
        if not served or not os.path.exists(served):
            return
        if self.manifest is not None:
            if os.path.realpath(served) != os.path.realpath(self.manifest):
                raise ValueError(f"nopfs: the job's service serves {served}, not "
                                 f"{self.manifest}")
            return
        if not os.path.isfile(served):
            raise ValueError(f"nopfs: the job's service serves the directory {served}; a list "
                             "of files is served only as a manifest listing the same files "
                             "(sbatch --nopfs=MANIFEST, nopfs run --dataset MANIFEST)")
        theirs = [(os.path.realpath(p), lab, off, n) for p, lab, off, n in read_manifest(served)]
        mine = [(os.path.realpath(p), lab, off, n) for p, lab, off, n in self.samples]
        if theirs != mine:
            raise ValueError(f"nopfs: the job's service serves the manifest {served}, whose "
                             "samples are not these files: pass ManifestDataset(manifest path)")

    def read(self, sample_id: int) -> Tuple[bytes, int]:
        """(bytes, label) of a sample, read from its file."""
        path, label, offset, length = self.samples[sample_id]
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(length)
        if len(data) != length:
            raise OSError(f"{path}: {len(data)} bytes at offset {offset}, the sample has {length}")
        return data, label


def _distributed_default(what: str) -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() if what == "world" else dist.get_rank()
    value = os.environ.get("WORLD_SIZE" if what == "world" else "RANK")
    return int(value) if value else (1 if what == "world" else 0)


# How the job's parameters are set: (variable, sbatch option, `nopfs run` option).
_JOB_OPTIONS = {
    "seed": ("NOPFS_SEED", "--nopfs-seed", "--seed"),
    "drop_last": ("NOPFS_DROP_LAST", "--nopfs-drop-last", "--drop-last"),
    "num_replicas": ("NOPFS_RANKS", "--nodes x --nopfs-ranks-per-node", "--ranks"),
    "batch": ("NOPFS_BATCH", "--nopfs-batch", "--batch"),
    "epochs": ("NOPFS_EPOCHS", "--nopfs-epochs", "--epochs"),
}


def _set_by(what: str) -> str:
    var, sbatch, run = _JOB_OPTIONS[what]
    return f"{var}, set by sbatch {sbatch} or nopfs run {run}"


def _mismatch(call: str, given: object, what: str, job_value: object) -> ValueError:
    if what == "rank":
        return ValueError(f"nopfs: {call} contradicts the job, which gives this process rank "
                          f"{job_value} (NOPFS_RANK): leave the argument out (nopfs knows the "
                          "rank), or start one process per rank (docs/user.md)")
    return ValueError(f"nopfs: {call} contradicts the job, whose {what} is {job_value!r} "
                      f"({_set_by(what)}): leave the argument out, or run the job with "
                      f"{what} {given!r}")


def job_epochs() -> Optional[int]:
    """The job's number of epochs (NOPFS_EPOCHS), or None outside a nopfs job."""
    return _env_int("NOPFS_EPOCHS")


class DistributedSampler(tud.Sampler):
    """torch's DistributedSampler, with the order nopfs plans.

    Rank, replicas, seed, global batch, scheme, drop_last and epochs come from the NOPFS_*
    environment when it is there; an explicit argument that contradicts it raises ValueError,
    naming the job's value and the option that sets it. Without a job they come from the
    arguments, torch.distributed or RANK/WORLD_SIZE, as torch's sampler does.

    Iterating yields the sample ids of the current epoch in order; set_epoch(e) selects the epoch
    (without it every pass is epoch 0, as with torch, and a second pass over an epoch without
    set_epoch warns once). An epoch >= `epochs` raises at once. resume(epoch, step) makes the next
    pass start at `step` of `epoch`; state_dict() is the position of the next batch the training
    loop has not consumed yet (nopfs's DataLoader counts the batches it hands out).
    shuffle=False is not offered: the service serves the planned shuffle.
    """

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: Optional[int] = None,
                 drop_last: Optional[bool] = None, batch_size: Optional[int] = None) -> None:
        if not shuffle:
            raise ValueError("nopfs: DistributedSampler(shuffle=False) is not supported: nopfs "
                             "serves the planned shuffle. For an unshuffled pass (validation) use "
                             "torch.utils.data.DistributedSampler (docs/python.md)")
        self.dataset = dataset
        self._seed_default = 0 if seed is None else int(seed)
        self._drop_last_default = bool(drop_last)
        self._num_replicas = num_replicas if num_replicas is not None else _distributed_default(
            "world")
        self._rank = rank if rank is not None else _distributed_default("rank")
        self._batch = batch_size  # per rank; the DataLoader sets it when it is None
        self._job: Optional[Job] = None
        job = self._make_job()
        for what, given, have in (("num_replicas", num_replicas, job.ranks),
                                  ("rank", rank, job.rank), ("seed", seed, job.seed),
                                  ("drop_last", drop_last, job.drop_last)):
            if given is not None and given != have:
                raise _mismatch(f"DistributedSampler({what}={given!r})", given, what, have)
        if batch_size is not None and job.rank_batch != batch_size:
            raise _mismatch(f"DistributedSampler(batch_size={batch_size})", batch_size *
                            job.ranks, "batch", job.batch)
        self._job = job if batch_size is not None else None
        self._epochs = job_epochs()
        self.epoch = 0
        self.start_step = 0
        self._pos = (0, 0)  # (epoch, step) of the next batch the training loop consumes
        self._active: Optional[list] = None  # [epoch, start step, batches, consumed] of a pass
        self._epoch_chosen = False  # set_epoch()/resume() since the last pass began
        self._last_pass_epoch: Optional[int] = None
        self._warned_repeat = False

    def _make_job(self) -> Job:
        rank_batch = self._batch or 1
        return Job.from_env(samples=len(self.dataset), ranks=self._num_replicas, rank=self._rank,
                            batch=rank_batch * self._num_replicas, seed=self._seed_default,
                            drop_last=self._drop_last_default)

    @property
    def job(self) -> Job:
        if self._job is None:
            self._job = self._make_job()
        return self._job

    @property
    def num_replicas(self) -> int:
        return self.job.ranks

    @property
    def rank(self) -> int:
        return self.job.rank

    @property
    def seed(self) -> int:
        return self.job.seed

    @property
    def shuffle(self) -> bool:
        """Always True: the service serves the planned shuffle."""
        return True

    @property
    def drop_last(self) -> bool:
        return self.job.drop_last

    @property
    def epochs(self) -> Optional[int]:
        """The job's number of epochs (NOPFS_EPOCHS); None without a job (no limit)."""
        return self._epochs

    @property
    def num_samples(self) -> int:
        """The samples this rank reads in one whole epoch, as torch's num_samples."""
        return int(self.job.epoch_length())

    @property
    def total_size(self) -> int:
        """The samples all ranks read in one epoch together, as torch's total_size."""
        j = self.job
        return sum(int(_client.rank_epoch_length(j.samples, j.ranks, j.batch, j.scheme,
                                                 j.drop_last, r)) for r in range(j.ranks))

    def _set_batch_size(self, batch_size: int) -> None:
        if self._batch is None:
            self._batch = batch_size
            self._job = None

    def _check_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"nopfs: epoch {epoch} is negative")
        if self._epochs is not None and epoch >= self._epochs:
            raise ValueError(f"nopfs: epoch {epoch} is past the job's last epoch: the job reads "
                             f"{self._epochs} epochs (0 to {self._epochs - 1}; "
                             f"{_set_by('epochs')}); run the job with more epochs "
                             "to train longer")

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch of the next pass. A pending resume() step is kept for its epoch."""
        epoch = int(epoch)
        self._check_epoch(epoch)
        if epoch != self.epoch:
            self.start_step = 0
        self.epoch = epoch
        self._epoch_chosen = True
        self._active = None
        self._pos = (epoch, self.start_step)

    def resume(self, epoch: int, step: int) -> None:
        """The next pass starts at step `step` of `epoch` (steps of the job's per-rank batch)."""
        epoch, step = int(epoch), int(step)
        if self._epochs is not None and epoch == self._epochs and step == 0:
            pass  # the state after the job's last batch: there is nothing left to read
        else:
            self._check_epoch(epoch)
            steps = self.job.steps_per_epoch()
            if step < 0 or step >= steps:
                raise ValueError(f"nopfs: step {step} is out of range: an epoch has {steps} "
                                 f"steps (0 to {steps - 1})")
        self.epoch = epoch
        self.start_step = step
        self._epoch_chosen = True
        self._active = None
        self._pos = (epoch, step)

    def state_dict(self) -> Dict[str, int]:
        """{"epoch", "step"}: where the next batch the training loop has not consumed is.

        After the last batch of epoch e it is (e + 1, 0). Load it with load_state_dict()."""
        return {"epoch": self._pos[0], "step": self._pos[1]}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.resume(state["epoch"], state["step"])

    def order(self, epoch: Optional[int] = None, step: Optional[int] = None) -> Any:
        """The sample ids of a pass (default: the next one), as a numpy array."""
        return self.job.order(self.epoch if epoch is None else epoch,
                              self.start_step if step is None else step)

    def _begin_pass(self) -> Tuple[int, int]:
        """Starts a pass: checks the epoch, warns once on a repeated epoch; (epoch, step)."""
        self._check_epoch(self.epoch)
        if (not self._epoch_chosen and self._last_pass_epoch == self.epoch
                and not self._warned_repeat):
            self._warned_repeat = True
            warnings.warn(f"nopfs: a second pass over epoch {self.epoch} without set_epoch(): "
                          "every pass reads the same order; call sampler.set_epoch(epoch) "
                          "before each epoch", UserWarning, stacklevel=3)
        self._epoch_chosen = False
        self._last_pass_epoch = self.epoch
        start = self.start_step
        self.start_step = 0  # a resume applies to one pass
        self._pos = (self.epoch, start)
        return self.epoch, start

    def _pass_started(self, epoch: int, start: int, batches: int) -> None:
        self._active = [epoch, start, batches, 0]
        if batches == 0:
            self._pass_done()

    def _batch_consumed(self) -> None:
        a = self._active
        if a is None:
            return
        a[3] += 1
        self._pos = (a[0], a[1] + a[3])
        if a[3] >= a[2]:
            self._pass_done()

    def _pass_done(self) -> None:
        if self._active is not None:
            self._pos = (self._active[0] + 1, 0)
            self._active = None

    def _pass_samples(self) -> int:
        """Samples of the pass under way (a DataLoader's), else of the next one."""
        if self._active is not None:
            return len(self.job.order(self._active[0], self._active[1]))
        return len(self.order())

    def __iter__(self) -> Iterator[int]:
        epoch, start = self._begin_pass()
        return iter(self.job.order(epoch, start).tolist())

    def __len__(self) -> int:
        return len(self.order())


# This process's connections to nopfsd, per socket path: every pass of every DataLoader of the
# process opens its stream on one, so that the RAM tier is mapped once per process and a later
# epoch does not fault its pages in again. A DataLoader worker (another process) makes its own.
_connections: Dict[Tuple[int, str], Any] = {}


def _close_quietly(stream: Any) -> None:
    """Closes a stream whose service may be gone (then there is nothing left to free)."""
    try:
        stream.close()
    except (_client.Error, TimeoutError):
        pass


def _open_stream(socket: Optional[str], rank: int, **share: Any) -> Any:
    """client.open(rank, **share) on this process's connection to the service at `socket`
    (None: $NOPFS_SOCKET), connecting if there is none; a connection that has broken since (the
    service restarted, or timed out an answer) is replaced once."""
    path = socket if socket is not None else os.environ.get("NOPFS_SOCKET", "")
    key = (os.getpid(), path)
    for inherited in [k for k in _connections if k[0] != key[0]]:
        del _connections[inherited]  # the parent's, across fork(): unusable here
    client = _connections.pop(key, None)
    if client is not None:
        try:
            stream = client.open(rank, **share)
            _connections[key] = client
            return stream
        except (_client.UnavailableError, TimeoutError):
            pass  # connect again below
    client = _client.connect(socket)
    stream = client.open(rank, **share)
    _connections[key] = client
    return stream


class _Kept:
    """The stream a StreamDataset's last pass left open for the next one (_iter_service): a
    pass that read the whole of its epoch keeps its stream, which has no epoch limit, so that
    nopfsd stages the next epoch while the training loop ends this one, and the next pass goes
    on with it if it starts that epoch at step 0, without opening a stream or waiting for its
    first batch. Closed when a pass takes another way, when its dataset is collected, by
    close_streams(), and at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entry: Optional[Tuple[int, Any, int]] = None  # (pid, stream, next epoch)
        _keepers.add(self)

    def put(self, stream: Any, next_epoch: int) -> None:
        with self._lock:
            old, self._entry = self._entry, (os.getpid(), stream, next_epoch)
        if old is not None and old[0] == os.getpid():
            _close_quietly(old[1])

    def take(self, epoch: int, step: int) -> Optional[Any]:
        """The stream kept at exactly (epoch, step), else None (and any other kept is closed)."""
        with self._lock:
            entry, self._entry = self._entry, None
        if entry is None or entry[0] != os.getpid():
            return None  # none, or the parent's across fork(): not this process's to use or close
        _, stream, next_epoch = entry
        if next_epoch == epoch and step == 0 and not stream.closed and not stream.service_gone:
            return stream
        _close_quietly(stream)
        return None

    def close(self) -> None:
        self.take(-1, -1)

    def peek(self) -> Optional[Tuple[Any, int]]:
        """(stream, next epoch) kept by this process, for tests and diagnostics."""
        entry = self._entry
        return None if entry is None or entry[0] != os.getpid() else (entry[1], entry[2])


_keepers: "weakref.WeakSet[_Kept]" = weakref.WeakSet()


def close_streams() -> None:
    """Closes the streams this process's nopfs DataLoaders keep open between passes. Each holds
    its rank's later epochs for this process (nopfsd refuses them to another process until it is
    closed); a loader's stream is closed when the loader is collected and at exit, so call this
    only to hand a rank to another process of the job while this one goes on."""
    for keeper in list(_keepers):
        keeper.close()


def _identity(batch: Any) -> Any:
    """The DataLoader's collate_fn: StreamDataset yields batches already collated."""
    return batch


def _batch_mode(dataset: Any, collate_fn: Optional[Callable[[List[Any]], Any]]) -> str:
    """How StreamDataset makes a batch's items: "tensor", "bytes", "copies" or "views"."""
    plain = (getattr(dataset, "transform", None) is None
             and getattr(dataset, "target_transform", None) is None
             and type(dataset).make_item is _SampleDataset.make_item)
    decode = getattr(dataset, "decode", None)
    if plain and decode is uint8_tensor and collate_fn in (None, tud.default_collate):
        return "tensor"
    if plain and decode is bytes:
        return "bytes"
    if decode is pil_decode:
        # It copies what it is given into a BytesIO, which takes a bytes object as it is: bytes
        # made by Batch.tobytes() cost that one copy (by read() in a worker that lives one pass,
        # client.open(read_once=True)) and free the batch's slots before decoding.
        return "copies"
    return "views"


def _batch_tensor(nbytes: int, pin_memory: bool = False) -> "torch.Tensor":
    """An uninitialized 1-D uint8 tensor of `nbytes`: in shared memory in a DataLoader worker
    (as torch's default_collate makes a worker's batch), pinned if asked for."""
    import torch

    if pin_memory:
        if not torch.cuda.is_available():
            raise RuntimeError("nopfs: pin_memory=True needs CUDA, and torch finds no CUDA device "
                               "here (torch.cuda.is_available() is False): pass "
                               "pin_memory=False on this machine")
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    if tud.get_worker_info() is not None:
        storage = torch.empty(0, dtype=torch.uint8).storage()._new_shared(nbytes)
        return torch.empty(0, dtype=torch.uint8).new(storage)
    return torch.empty(nbytes, dtype=torch.uint8)


class _Blocks:
    """Batch memory of one size, reused: the tensors a pass hands out in the main process (not
    pinned) are views of blocks kept here, each block coming back once nothing refers to its
    tensor any more (torch.from_numpy keeps the numpy view that this watches alive for as long
    as the tensor's storage lives, views of it included). So a block is reused exactly when
    malloc would reuse freed memory, but without the page faults of memory that malloc has
    returned to the system between two batches. Safe from any thread (list operations under the
    GIL)."""

    KEEP = 4  # blocks kept for reuse; more in use at once are made and dropped

    def __init__(self) -> None:
        self.shape = (0, 0)
        self.free: List[Any] = []

    def rows(self, count: int, batch: int, row: int) -> Tuple["torch.Tensor", Any]:
        """An uninitialized [count, row] uint8 tensor (writable, not resizable) in a block of
        [batch, row] (a pass's short last batch takes a block as the others), and the numpy
        array it views."""
        import numpy as np
        import torch

        if (batch, row) != self.shape:
            self.shape, self.free = (batch, row), []
        free = self.free
        block = free.pop() if free else np.empty((batch, row), dtype=np.uint8)
        view = block[:count]
        weakref.finalize(view, self._back, free, block).atexit = False
        return torch.from_numpy(view), view

    def _back(self, free: List[Any], block: Any) -> None:
        if free is self.free and len(free) < self.KEEP:
            free.append(block)


def read_batch(stream: Any, n: int, pin_memory: bool = False,
               timeout: Optional[float] = None) -> Optional[Tuple["torch.Tensor", Any, Any, Any]]:
    """The next n samples of a nopfs._client stream in one uint8 tensor: (data, offsets, labels,
    ids), sample k being data[offsets[k]:offsets[k + 1]]; None at the end of the stream. The
    bytes are copied in C++ without per-sample Python objects; fewer than n samples when the
    stream ends or the ring holds no more at once. pin_memory=True allocates page-locked memory
    (as torch.empty(..., pin_memory=True)), and raises RuntimeError on a machine without CUDA."""
    if pin_memory:
        _batch_tensor(0, pin_memory=True)  # the clear error first, before taking samples
    batch = stream.next_batch(n, timeout)
    if batch is None:
        return None
    with batch:
        data = _batch_tensor(batch.nbytes, pin_memory)
        batch.copy_into(data.numpy())
        return data, batch.offsets, batch.labels, batch.ids


_END = object()  # _ahead's end of the items


class _Pace:
    """Whether a loop works between its batches long enough for a thread making the next ones
    to pay: at least _Pace.FLOOR seconds, and at least as long as a batch takes to make (medians
    of the first _Pace.SEEN batches). A loop that asks for batches back to back gains nothing
    from a thread, and each hand-over between two Python threads costs a GIL switch."""

    FLOOR = 0.001
    SEEN = 3

    def __init__(self) -> None:
        self.works = False
        self.make: List[float] = []
        self.loop: List[float] = []

    def add(self, make: float, loop: float) -> bool:
        self.make.append(make)
        self.loop.append(loop)
        if len(self.loop) >= self.SEEN:
            m, w = sorted(self.make)[len(self.make) // 2], sorted(self.loop)[len(self.loop) // 2]
            self.works = w >= max(self.FLOOR, m)
            self.make, self.loop = [], []
            return True
        return False


def _ahead(items: Generator[Any, None, None], depth: int, pace: _Pace) -> Iterator[Any]:
    """Yields what `items` yields. Once `pace` finds that the loop works between batches (it
    remembers it across passes), a thread of its own makes them, with up to `depth` made items
    waiting, so that copying a batch out of the ring (without the GIL) overlaps the training
    step; the first batches of every threaded pass are judged again, so that a loop that no
    longer works between batches (or a pass judged on a moment of noise) has the next pass made
    when it asks. An exception of `items` is raised where its item would have come. Leaving the
    loop early (or dropping the iterator) stops the thread, which closes `items` (and so the
    stream) itself."""
    try:
        while not pace.works:
            t0 = time.monotonic()
            try:
                item = next(items)
            except StopIteration:
                return
            t1 = time.monotonic()
            yield item
            if pace.add(t1 - t0, time.monotonic() - t1) and not pace.works:
                yield from items  # a loop that does not wait for its batches: made when asked
                return
    except GeneratorExit:
        items.close()  # left early: close the stream now
        raise

    done: "queue.Queue[Tuple[Any, Optional[BaseException]]]" = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: Any) -> bool:
        while not stop.is_set():
            try:
                done.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    makes: List[float] = []  # how long the thread took to make each of the first batches

    def run() -> None:
        try:
            while True:
                t0 = time.monotonic()
                try:
                    item = next(items)
                except StopIteration:
                    break
                if len(makes) < pace.SEEN:
                    makes.append(time.monotonic() - t0)
                if not put((item, None)):
                    return
            put((_END, None))
        except BaseException as e:  # noqa: B902 -- handed to the consumer, raised there
            put((_END, e))
        finally:
            items.close()

    thread = threading.Thread(target=run, name="nopfs-batches", daemon=True)
    thread.start()
    loops: List[float] = []  # how long the loop worked after each of the first batches
    try:
        while True:
            item, error = done.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            t1 = time.monotonic()
            yield item
            if len(loops) < pace.SEEN:
                loops.append(time.monotonic() - t1)
                if len(loops) == pace.SEEN:  # the thread made these batches before they came
                    for make, loop in zip(makes, loops):
                        pace.add(make, loop)  # decides the next pass
    finally:
        stop.set()
        if thread is not threading.current_thread():  # the collector may run anywhere
            thread.join()


class StreamDataset(tud.IterableDataset):
    """One pass over a rank's stream, for torch's DataLoader.

    In worker w of W (or the main process: w = 0, W = 1) it yields the items of batches w, w+W, ...
    of the pass, so that the DataLoader's round-robin over workers restores the planned order;
    `batch_size` must be the DataLoader's. From the service (each process connects on its own and
    opens its share of the stream) or, in fallback mode, from the files in the same order.
    The pass (epoch, start step) is read when a worker starts iterating, from shared memory, so
    that persistent workers follow set_epoch() too.
    """

    def __init__(self, dataset: Any, sampler: DistributedSampler, batch_size: int,
                 fallback: bool = False, socket: Optional[str] = None,
                 timeout: Optional[float] = None, fallback_on_loss: bool = False,
                 collate_fn: Optional[Callable[[List[Any]], Any]] = None,
                 pin_memory: bool = False, prefetch: int = 2,
                 read_once: bool = False) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = int(batch_size)
        # The batch's collate (torch's default_collate unless given); applied here, per batch.
        self.collate_fn = collate_fn
        # How a batch's samples become items (_batch_mode): "tensor" fills one uint8 tensor per
        # batch (default collate of uint8_tensor items), "bytes" makes the bytes in one call,
        # "copies" hands pil_decode one bytes object per sample, "views" hands decode one view
        # per sample.
        self.mode = _batch_mode(dataset, collate_fn)
        self.pin_memory = bool(pin_memory)
        # Batches made ahead of the training loop by a thread, in the main process (a worker's
        # batches are made ahead by torch's prefetch_factor); 0: each when it is asked for.
        self.prefetch = int(prefetch)
        self.pace = _Pace()
        # The bytes of every sample so far (tensor mode), once a batch has shown them all of one
        # size: the next batch is copied straight into a tensor of that many bytes per sample.
        self.row_bytes: Optional[int] = None
        self._rows_key: Tuple[int, int] = (0, 0)
        self._rows: Any = None
        # A worker process lives one pass (not persistent workers) and reads each of its samples
        # once: its copies out of the RAM tier read the tier's file rather than fault in its
        # fresh mapping page by page (client.open(read_once=True)).
        self.read_once = bool(read_once)
        self.fallback = fallback
        # The service went away mid-pass (nopfs.UnavailableError): go on from the files, in the
        # same order, from where the stream stopped; False: raise.
        self.fallback_on_loss = fallback_on_loss
        self.socket = socket
        self.timeout = timeout
        self.pass_state = multiprocessing.RawArray("q", 2)  # epoch, start step of the next pass
        self.owner = os.getpid()  # the workers open shares of this process's rank (docs/wire.md)
        self._per_process_state()

    def _per_process_state(self) -> None:
        """This process's own state: made here and anew where the dataset is unpickled."""
        self.kept = _Kept()  # the stream the last pass left for the next one
        weakref.finalize(self, self.kept.close)
        # The main process's batch memory, reused (tensor mode, unless pinned: torch's pinned
        # allocator reuses its own); a worker's batches are made in shared memory, which crosses
        # to the main process as it is.
        import torch

        pinned = self.pin_memory and torch.cuda.is_available()
        self.blocks = None if pinned else _Blocks()

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        del state["kept"]  # a worker keeps nothing (and a stream does not cross processes)
        del state["blocks"]
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._per_process_state()

    def set_pass(self, epoch: int, step: int) -> None:
        self.pass_state[0] = epoch
        self.pass_state[1] = step

    def __len__(self) -> int:
        # Of the pass under way, else of the next one (after a resume: what is left of its epoch).
        return self.sampler._pass_samples()

    def __iter__(self) -> Iterator[Any]:
        """Yields this worker's batches of the pass, each collated (collate_fn)."""
        info = tud.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, step = int(self.pass_state[0]), int(self.pass_state[1])
        if self.fallback:
            yield from self._batches_of(self._iter_files(epoch, step, worker, workers))
        elif info is None and self.prefetch > 0:
            yield from _ahead(self._iter_service(epoch, step, worker, workers), self.prefetch,
                              self.pace)
        else:
            yield from self._iter_service(epoch, step, worker, workers)

    def _collate(self, items: List[Any]) -> Any:
        if self.collate_fn is not None:
            return self.collate_fn(items)
        return tud.default_collate(items)

    def _batches_of(self, items: Iterator[Any]) -> Iterator[Any]:
        batch: List[Any] = []
        for item in items:
            batch.append(item)
            if len(batch) == self.batch_size:
                yield self._collate(batch)
                batch = []
        if batch:
            yield self._collate(batch)

    def _iter_service(self, epoch, step, worker, workers):
        """This process's batches of the pass from the service. The process that owns the rank
        (not a worker, which lives one pass or reads shares) opens its stream without an epoch
        limit and takes exactly the pass's samples; once it has them all it keeps the stream for
        the next pass (_Kept), which goes on with it if it starts the next epoch at step 0."""
        delivered = 0  # samples of the batches yielded
        read_once = self.read_once and tud.get_worker_info() is not None
        keep = tud.get_worker_info() is None and workers == 1
        mine = (max(0, int(self.sampler.job.epoch_length()) - step * self.batch_size)
                if keep else None)
        if self.mode == "tensor":
            take = self._tensor_batch
        else:
            take = functools.partial(self._item_batch, read_once=read_once)

        def open_own() -> Any:
            return _open_stream(self.socket, self.sampler.rank, epoch=epoch, step=step,
                                worker=worker, workers=workers, batch=self.batch_size,
                                epochs=0 if keep else 1, owner=self.owner, read_once=read_once)

        stream = None
        try:
            stream = self.kept.take(epoch, step) if keep else None
            kept = stream is not None
            if stream is None:
                stream = open_own()
            while mine is None or delivered < mine:
                want = self.batch_size if mine is None else min(self.batch_size, mine - delivered)
                try:
                    batch, n = take(stream, want)
                except _client.UnavailableError:
                    if not (kept and delivered == 0):
                        raise
                    # The kept stream's service went away between the passes (it restarted):
                    # open this pass's stream anew, on a new connection if need be.
                    _close_quietly(stream)
                    stream, kept = None, False
                    stream = open_own()
                    continue
                if n == 0:
                    break  # the stream ended (the job has no more epochs)
                delivered += n
                if keep and delivered == mine:
                    # Every sample of the pass is in hand (the items are copies): the stream goes
                    # on with the next epoch, unless this is the job's last one.
                    epochs = self.sampler.epochs
                    if epochs is None or epoch + 1 < epochs:
                        self.kept.put(stream, epoch + 1)
                        stream = None
                yield batch
            return
        except _client.UnavailableError as e:
            if not self.fallback_on_loss:
                raise
            warnings.warn(f"nopfs: the service went away after {delivered} samples of this "
                          f"pass ({e}); reading the rest from the files in the same order "
                          "(NOPFS_FALLBACK)", RuntimeWarning, stacklevel=2)
        finally:
            if stream is not None:  # broken off, failed or the job's last epoch
                _close_quietly(stream)
        yield from self._batches_of(self._iter_files(epoch, step, worker, workers,
                                                     skip=delivered))

    def _item_batch(self, stream: Any, want: int,
                    read_once: bool = False) -> Tuple[Any, int]:
        """(collated batch, samples): up to `want` samples made into items, bytes in one
        call per ring batch, else decode/transform per sample over views made in one call (of
        copies made in one call, in a stream opened read_once: views of the RAM tier would fault
        in the pages a copy reads from its file)."""
        items: List[Any] = []
        while len(items) < want:
            batch = stream.next_batch(want - len(items), self.timeout)
            if batch is None:
                break
            labels = batch.labels.tolist()
            if self.mode == "bytes":
                items.extend(zip(batch.tobytes(), labels))
                batch.release()
                continue
            if self.mode == "copies" or read_once:
                copies = batch.tobytes()
                batch.release()
                if self.mode != "copies":  # what a decode given views gets: a read-only view
                    copies = [memoryview(c) for c in copies]
                items.extend(self.dataset.make_item(data, label)
                             for data, label in zip(copies, labels))
                continue
            views = batch.views()
            try:
                for view, label in zip(views, labels):
                    items.append(self.dataset.make_item(view, label))
            finally:
                for view in views:
                    view.release()
                del views
                batch.release()
        return (self._collate(items) if items else None), len(items)

    def _tensor_batch(self, stream: Any, want: int) -> Tuple[Any, int]:
        """(collated batch, samples) of up to `want` samples for uint8_tensor items and the
        default collate: the samples' bytes copied in C++ into one uint8 tensor per batch (in
        shared memory in a worker, pinned when asked for and CUDA is there), viewed as
        [n, size] as torch.stack makes it. Once a batch has shown the samples' size (all of one
        size), the next is copied in one call straight into a [want, size] tensor; a batch that
        breaks the rule goes on the general way."""
        import numpy as np
        import torch

        row = self.row_bytes
        if row is None:
            return self._tensor_batch_of(stream, want, None, 0, [], [])
        if self.blocks is not None and tud.get_worker_info() is None:
            data, out = self.blocks.rows(want, max(want, self.batch_size), row)
        else:  # a worker (fork() copies the main process's blocks), or pinned
            flat = _batch_tensor(want * row, self.pin_memory and torch.cuda.is_available())
            data, out = flat.view(want, row), flat.numpy()
        offsets, labels, _ = stream.next_batch_into(want, out, self.timeout)
        count = len(labels)
        if count == 0:
            return None, 0
        if count == want and (offsets == self._rows_at(want, row)).all():
            return [data, torch.from_numpy(labels)], count
        # Fewer, or of other sizes: the stream ended, or the next sample is larger than what is
        # left of the tensor (it is first in line for the next call), or it did not come in time.
        return self._tensor_batch_of(stream, want, data.view(-1), int(offsets[count]), [labels],
                                     [np.diff(offsets)])

    def _rows_at(self, count: int, row: int) -> Any:
        """The offsets of `count` samples of `row` bytes back to back (0 and each one's end)."""
        import numpy as np

        if self._rows_key != (count, row):
            self._rows_key, self._rows = (count, row), np.arange(count + 1, dtype=np.int64) * row
        return self._rows

    def _tensor_batch_of(self, stream: Any, want: int, out: Optional["torch.Tensor"], pos: int,
                         labels: List[Any], sizes: List[Any]) -> Tuple[Any, int]:
        """_tensor_batch's general way: the batch goes on from `pos` bytes of `out` and the
        labels and sizes of the samples there, a ring batch at a time, growing `out` as needed;
        learns the samples' size for the next batch (row_bytes) if they are all of one."""
        import numpy as np
        import torch

        count = sum(len(x) for x in labels)
        while count < want:
            batch = stream.next_batch(want - count, self.timeout)
            if batch is None:
                break
            with batch:
                end = pos + batch.nbytes
                if out is None or end > out.numel():
                    room = max(end, want * int(batch.sizes.max(initial=1)))
                    grown = _batch_tensor(room, self.pin_memory and torch.cuda.is_available())
                    if out is not None:
                        grown[:pos] = out[:pos]
                    out = grown
                batch.copy_into(out.numpy(), pos)
                pos = end
                labels.append(batch.labels)
                sizes.append(batch.sizes)
                count += len(batch)
        if count == 0 or out is None:
            return None, 0
        size = np.concatenate(sizes)
        target = torch.from_numpy(np.concatenate(labels))
        if (size == size[0]).all():
            self.row_bytes = int(size[0]) if size[0] > 0 else None
            data = out[:pos].view(count, int(size[0]))
        else:  # what torch.stack says of tensors of different sizes
            self.row_bytes = None
            offsets = np.concatenate([[0], np.cumsum(size)]).tolist()
            data = tud.default_collate([out[offsets[k]:offsets[k + 1]] for k in range(count)])
        return [data, target], count

    def _iter_files(self, epoch, step, worker, workers, skip=0):
        order = self.sampler.job.order(epoch, step)
        mine = 0
        for k, sample_id in enumerate(order.tolist()):
            if (k // self.batch_size) % workers != worker:
                continue
            mine += 1
            if mine <= skip:
                continue
            try:
                data, label = self.dataset.read(sample_id)
            except OSError as e:
                path = self.dataset.samples[sample_id][0]
                err = _client.SampleError(f"sample {sample_id} ({path}): {e.strerror or e}")
                err.sample_id, err.path, err.code = sample_id, path, None
                raise err from e
            yield self.dataset.make_item(data, label)


class _LoaderIter:
    """A DataLoader pass: torch's iterator (or, without workers, the stream's own batches),
    counting the batches the training loop receives."""

    def __init__(self, inner: Any, sampler: DistributedSampler, loader: "DataLoader") -> None:
        self._inner = inner
        self._sampler = sampler
        self._loader = loader

    def __iter__(self) -> "_LoaderIter":
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._inner)
        except StopIteration:
            self._sampler._pass_done()
            raise
        self._sampler._batch_consumed()
        return batch

    def __len__(self) -> int:
        return len(self._loader)


def _pinned(batches: Iterator[Any], device: Optional[str]) -> Iterator[Any]:
    """The batches in page-locked memory, as torch's DataLoader pins them without workers."""
    for batch in batches:
        yield tud._utils.pin_memory.pin_memory(batch, device)


class DataLoader(tud.DataLoader):
    """torch.utils.data.DataLoader reading through nopfs (see the module's docstring).

    Takes DataLoader's arguments. `sampler` must be a nopfs DistributedSampler (one is made if
    none is given); `shuffle` is not accepted; a batch_size or drop_last that contradicts the job
    raises ValueError. fallback: None -> NOPFS_FALLBACK; socket: None -> NOPFS_SOCKET; timeout:
    seconds to wait for one sample (None: no limit). state_dict()/load_state_dict() are the
    sampler's: the position of the next batch the training loop has not received.
    """

    def __init__(self, dataset: Any, batch_size: Optional[int] = 1,
                 shuffle: Optional[bool] = None, sampler: Optional[DistributedSampler] = None,
                 num_workers: int = 0, drop_last: Optional[bool] = None,
                 fallback: Optional[bool] = None, socket: Optional[str] = None,
                 timeout_per_sample: Optional[float] = None, **kwargs: Any) -> None:
        if shuffle:
            raise ValueError("nopfs: DataLoader(shuffle=True): pass a nopfs DistributedSampler "
                             "(the service plans the shuffle)")
        if kwargs.get("batch_sampler") is not None:
            raise ValueError("nopfs: DataLoader(batch_sampler=...) is not supported; pass "
                             "batch_size and a nopfs DistributedSampler")
        if not (hasattr(dataset, "make_item") and hasattr(dataset, "read")):
            raise TypeError("nopfs: DataLoader needs a nopfs dataset (nopfs.torch.ImageFolder, "
                            "nopfs.torch.ManifestDataset, or one with make_item(data, label) and "
                            "read(id))")
        if sampler is None:
            sampler = DistributedSampler(dataset)
        if not isinstance(sampler, DistributedSampler):
            raise TypeError("nopfs: DataLoader(sampler=...) must be a nopfs.torch."
                            "DistributedSampler, whose order is the service's")
        if batch_size is None:
            raise ValueError("nopfs: DataLoader(batch_size=None) is not supported")
        if fallback is None:
            fallback = fallback_requested()
        use_service = socket is not None or service_available()
        if not use_service and not fallback:
            raise _client.UnavailableError(
                "nopfs: no service in the environment (NOPFS_SOCKET is not set): run the job "
                "with nopfs (`nopfs run`, or sbatch --nopfs), or set NOPFS_FALLBACK=1 (or "
                "fallback=True) to read the files directly in the same order")
        if use_service and hasattr(dataset, "check_served"):
            dataset.check_served()
        sampler._set_batch_size(batch_size)
        job = sampler.job
        if batch_size != job.rank_batch:
            raise ValueError(
                f"nopfs: DataLoader(batch_size={batch_size}) contradicts the job, whose batch "
                f"per rank is {job.rank_batch} (global batch {job.batch} over {job.ranks} ranks; "
                f"{_set_by('batch')}): write batch_size={job.rank_batch}, or run the job with "
                f"batch {batch_size * job.ranks}")
        if drop_last is not None and bool(drop_last) != job.drop_last:
            raise _mismatch(f"DataLoader(drop_last={drop_last!r})", drop_last, "drop_last",
                            job.drop_last)
        self.nopfs_sampler = sampler
        self.nopfs_fallback = not use_service
        self.nopfs_batch = int(batch_size)
        collate_fn = kwargs.pop("collate_fn", None)
        # From the service with nothing to run per sample (uint8_tensor items, no transform, the
        # default collate: each batch is one tensor filled in C++ from nopfsd's prefetched ring),
        # worker processes would only copy every batch once more, across processes, which costs
        # far more than filling it: the batches are filled in this process and no worker starts.
        # A worker_init_fn keeps the workers (it may set up what the caller relies on).
        self.nopfs_requested_workers = int(num_workers)
        if (use_service and num_workers > 0 and kwargs.get("worker_init_fn") is None
                and _batch_mode(dataset, collate_fn) == "tensor"):
            num_workers = 0
            for worker_only in ("prefetch_factor", "persistent_workers",
                                "multiprocessing_context"):
                kwargs.pop(worker_only, None)
        # Without workers a thread makes the batches ahead, prefetch_factor of them (torch's
        # default, 2; 0: none), as torch's workers do; torch itself takes the argument only
        # with workers.
        prefetch = 0
        if num_workers == 0:
            prefetch = kwargs.pop("prefetch_factor", None)
            prefetch = 2 if prefetch is None else int(prefetch)
            if prefetch < 0:
                raise ValueError(f"nopfs: DataLoader(prefetch_factor={prefetch}): write a "
                                 "number of batches >= 0 (0: none made ahead)")
        self.nopfs_stream = StreamDataset(dataset, sampler, batch_size, fallback=not use_service,
                               socket=socket, timeout=timeout_per_sample,
                               fallback_on_loss=bool(fallback), collate_fn=collate_fn,
                               pin_memory=bool(kwargs.get("pin_memory", False))
                               and num_workers == 0, prefetch=prefetch,
                               read_once=not kwargs.get("persistent_workers", False))
        # The stream makes the job's batches, whole (one ring call per batch, collated in the
        # worker as torch would): torch batches nothing more, and its drop_last would drop a
        # rank's short batch. batch_size reads as the job's, for len() and for the user.
        super().__init__(self.nopfs_stream, batch_size=None, num_workers=num_workers,
                         drop_last=False, collate_fn=_identity, **kwargs)
        object.__setattr__(self, "batch_size", int(batch_size))

    def __iter__(self) -> _LoaderIter:  # type: ignore[override]
        s = self.nopfs_sampler
        epoch, start = s._begin_pass()
        self.nopfs_stream.set_pass(epoch, start)
        samples = len(s.job.order(epoch, start))
        s._pass_started(epoch, start, math.ceil(samples / self.nopfs_batch))
        if self.num_workers > 0:
            return _LoaderIter(super().__iter__(), s, self)
        # Without workers torch's iterator only hands on the stream's batches (its fetcher calls
        # next() and the identity collate), at a cost per batch of a tenth or more of the batch's
        # copy (docs/PERFORMANCE.md), so the stream's batches are handed on directly. What it
        # does besides is done here too: it draws its workers' base seed from torch's generator
        # (so that the training loop's random numbers are the same either way), and pins the
        # batches if asked.
        import torch

        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        batches: Iterator[Any] = iter(self.nopfs_stream)
        if self.pin_memory and (self.pin_memory_device or torch.cuda.is_available()):
            batches = _pinned(batches, self.pin_memory_device or None)
        return _LoaderIter(batches, s, self)

    def state_dict(self) -> Dict[str, int]:
        """The sampler's state_dict(): the epoch and step of the next batch not yet received."""
        return self.nopfs_sampler.state_dict()

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """The next pass starts at the batch state_dict() named."""
        self.nopfs_sampler.load_state_dict(state)
