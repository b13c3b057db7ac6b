"""PyTorch integration: a script using torchvision's ImageFolder + DistributedSampler + DataLoader
reads through nopfs by changing its imports:

    from nopfs.torch import DataLoader, DistributedSampler, ImageFolder

- ImageFolder(root, transform=..., target_transform=...): the dataset. Its samples are decoded
  from bytes (PIL, RGB, like torchvision's default loader) wherever they come from.
- DistributedSampler(dataset, ...): DistributedSampler semantics (set_epoch, rank and
  num_replicas from the NOPFS_* environment) whose order is the service's plan; resume(epoch,
  step) starts the next pass at a step.
- DataLoader(dataset, batch_size=..., sampler=..., num_workers=...): a torch DataLoader over
  StreamDataset, an IterableDataset: each worker process connects on its own and opens its share
  of the rank's stream (batches w, w+W, ... of the epoch), and the DataLoader's round-robin over
  workers puts the batches back into the planned order. Transforms run in the workers.

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

import io
import multiprocessing
import os
import warnings

import torch.utils.data as tud

from . import _client
from .folder import list_classes, scan_image_folder
from .job import Job, fallback_requested, service_available, service_samples


def pil_decode(data):
    """Decodes image bytes (any buffer) to an RGB PIL image, as torchvision's default loader."""
    from PIL import Image  # imported lazily: only image datasets need PIL

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


class ImageFolder(tud.Dataset):
    """An ImageFolder dataset (root/<class>/<files>) whose samples may come from nopfs.

    Labels are class indices in sorted class order, as torchvision's. `decode(buffer)` turns a
    sample's bytes into the object `transform` receives (default: pil_decode); it must not keep a
    reference to the buffer (copy what it keeps). Indexing (dataset[i]) reads the file directly.
    """

    def __init__(self, root, transform=None, target_transform=None, decode=pil_decode):
        self.root = os.path.abspath(root)
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.classes = list_classes(self.root)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._samples = None

    @property
    def samples(self):
        """[(path, label)] in sample-id order (scans the tree on first use)."""
        if self._samples is None:
            classes, self._samples = scan_image_folder(self.root)
            if classes != self.classes:
                raise RuntimeError(f"nopfs: {self.root}: the class directories changed")
        return self._samples

    @property
    def targets(self):
        return [label for _, label in self.samples]

    def __len__(self):
        # Under a service the catalog already counted the files: do not walk the PFS again.
        if self._samples is None and service_available():
            return service_samples()
        return len(self.samples)

    def check_served(self):
        """Raises ValueError if the job's service serves another directory than this root."""
        served = os.environ.get("NOPFS_DATASET")
        if served and os.path.isdir(served) and \
                os.path.realpath(served) != os.path.realpath(self.root):
            raise ValueError(f"nopfs: the job's service serves {served}, not {self.root}")

    def make_item(self, data, label):
        """(transform(decode(data)), target_transform(label)): one item from a sample's bytes."""
        x = self.decode(data)
        if self.transform is not None:
            x = self.transform(x)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return x, label

    def read(self, sample_id):
        """(bytes, label) of a sample, read from its file."""
        path, label = self.samples[sample_id]
        with open(path, "rb") as fh:
            return fh.read(), label

    def __getitem__(self, index):
        data, label = self.read(index)
        return self.make_item(data, label)


def _distributed_default(what):
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() if what == "world" else dist.get_rank()
    value = os.environ.get("WORLD_SIZE" if what == "world" else "RANK")
    return int(value) if value else (1 if what == "world" else 0)


class DistributedSampler(tud.Sampler):
    """torch's DistributedSampler, with the order nopfs plans.

    Rank, replicas, seed, global batch, scheme and drop_last come from the NOPFS_* environment when
    it is there (an explicit argument that contradicts it is an error); otherwise from the
    arguments, torch.distributed or RANK/WORLD_SIZE, as torch's sampler does. Iterating yields the
    sample ids of the current epoch in order; set_epoch(e) selects the epoch (without it every pass
    is epoch 0, as with torch). resume(epoch, step) makes the next pass start at `step` of `epoch`.
    shuffle=False is not offered: the service serves the planned shuffle.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False, batch_size=None):
        if not shuffle:
            raise ValueError("nopfs: DistributedSampler(shuffle=False) is not supported: nopfs "
                             "serves the planned shuffle")
        for name, given in (("NOPFS_RANKS", num_replicas), ("NOPFS_RANK", rank)):
            env = os.environ.get(name)
            if given is not None and env and int(env) != given:
                raise ValueError(f"nopfs: {name}={env} but the sampler was given {given}")
        self.dataset = dataset
        self._seed_default = seed
        self._drop_last_default = drop_last
        self._num_replicas = num_replicas if num_replicas is not None else _distributed_default(
            "world")
        self._rank = rank if rank is not None else _distributed_default("rank")
        self._batch = batch_size  # per rank; the DataLoader sets it when it is None
        self._job = None
        self.epoch = 0
        self.start_step = 0

    @property
    def job(self):
        if self._job is None:
            rank_batch = self._batch or 1
            self._job = Job.from_env(samples=len(self.dataset), ranks=self._num_replicas,
                                     rank=self._rank, batch=rank_batch * self._num_replicas,
                                     seed=self._seed_default, drop_last=self._drop_last_default)
        return self._job

    @property
    def num_replicas(self):
        return self.job.ranks

    @property
    def rank(self):
        return self.job.rank

    @property
    def seed(self):
        return self.job.seed

    def _set_batch_size(self, batch_size):
        if self._batch is None:
            self._batch = batch_size
            self._job = None

    def set_epoch(self, epoch):
        """Selects the epoch of the next pass. A pending resume() step is kept for its epoch."""
        if epoch != self.epoch:
            self.start_step = 0
        self.epoch = int(epoch)

    def resume(self, epoch, step):
        """The next pass starts at step `step` of `epoch` (steps of the job's per-rank batch)."""
        if step < 0 or step >= self.job.steps_per_epoch():
            raise ValueError(f"nopfs: step {step} is out of range: an epoch has "
                             f"{self.job.steps_per_epoch()} steps")
        self.epoch = int(epoch)
        self.start_step = int(step)

    def state_dict(self):
        return {"epoch": self.epoch, "step": self.start_step}

    def load_state_dict(self, state):
        self.resume(state["epoch"], state["step"])

    def order(self, epoch=None, step=None):
        """The sample ids of a pass (default: the next one), as a numpy array."""
        return self.job.order(self.epoch if epoch is None else epoch,
                              self.start_step if step is None else step)

    def __iter__(self):
        order = self.order()
        self.start_step = 0
        return iter(order.tolist())

    def __len__(self):
        return len(self.order())


class StreamDataset(tud.IterableDataset):
    """One pass over a rank's stream, for torch's DataLoader.

    In worker w of W (or the main process: w = 0, W = 1) it yields the items of batches w, w+W, ...
    of the pass, so that the DataLoader's round-robin over workers restores the planned order;
    `batch_size` must be the DataLoader's. From the service (each process connects on its own and
    opens its share of the stream) or, in fallback mode, from the files in the same order.
    The pass (epoch, start step) is read when a worker starts iterating, from shared memory, so
    that persistent workers follow set_epoch() too.
    """

    def __init__(self, dataset, sampler, batch_size, fallback=False, socket=None, timeout=None,
                 fallback_on_loss=False):
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = int(batch_size)
        self.fallback = fallback
        # The service went away mid-pass (nopfs.UnavailableError): go on from the files, in the
        # same order, from where the stream stopped; False: raise.
        self.fallback_on_loss = fallback_on_loss
        self.socket = socket
        self.timeout = timeout
        self.pass_state = multiprocessing.RawArray("q", 2)  # epoch, start step of the next pass

    def set_pass(self, epoch, step):
        self.pass_state[0] = epoch
        self.pass_state[1] = step

    def __len__(self):
        return len(self.sampler.job.order(self.pass_state[0], self.pass_state[1]))

    def __iter__(self):
        info = tud.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, step = int(self.pass_state[0]), int(self.pass_state[1])
        if self.fallback:
            yield from self._iter_files(epoch, step, worker, workers)
        else:
            yield from self._iter_service(epoch, step, worker, workers)

    def _iter_service(self, epoch, step, worker, workers):
        delivered = 0
        try:
            client = _client.connect(self.socket)
            with client.open(self.sampler.rank, epoch=epoch, step=step, worker=worker,
                             workers=workers, batch=self.batch_size, epochs=1) as stream:
                while True:
                    sample = stream.next(self.timeout)
                    if sample is None:
                        return
                    view = sample.data
                    try:
                        item = self.dataset.make_item(view, sample.label)
                    finally:
                        view.release()
                        sample.release()
                    delivered += 1
                    yield item
        except _client.UnavailableError as e:
            if not self.fallback_on_loss:
                raise
            warnings.warn(f"nopfs: the service went away after {delivered} samples of this "
                          f"pass ({e}); reading the rest from the files in the same order "
                          "(NOPFS_FALLBACK)", RuntimeWarning, stacklevel=2)
        yield from self._iter_files(epoch, step, worker, workers, skip=delivered)

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


class DataLoader(tud.DataLoader):
    """torch.utils.data.DataLoader reading through nopfs (see the module's docstring).

    Takes DataLoader's arguments. `sampler` must be a nopfs DistributedSampler (one is made if
    none is given); `shuffle` is not accepted. fallback: None -> NOPFS_FALLBACK; socket: None ->
    NOPFS_SOCKET; timeout: seconds to wait for one sample (None: no limit).
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, num_workers=0,
                 drop_last=False, fallback=None, socket=None, timeout_per_sample=None, **kwargs):
        if shuffle:
            raise ValueError("nopfs: DataLoader(shuffle=True): pass a nopfs DistributedSampler "
                             "(the service plans the shuffle)")
        if kwargs.get("batch_sampler") is not None:
            raise ValueError("nopfs: DataLoader(batch_sampler=...) is not supported; pass "
                             "batch_size and a nopfs DistributedSampler")
        if not isinstance(dataset, ImageFolder) and not (
                hasattr(dataset, "make_item") and hasattr(dataset, "read")):
            raise TypeError("nopfs: DataLoader needs a nopfs dataset (nopfs.torch.ImageFolder or "
                            "one with make_item(data, label) and read(id))")
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
        if use_service and batch_size != job.rank_batch:
            warnings.warn(f"nopfs: DataLoader batch_size={batch_size} differs from the job's "
                          f"per-rank batch {job.rank_batch} (NOPFS_BATCH/NOPFS_RANKS): the order "
                          "is right, but resume steps count the job's batches", stacklevel=2)
        self.nopfs_sampler = sampler
        self.nopfs_fallback = not use_service
        stream = StreamDataset(dataset, sampler, batch_size, fallback=not use_service,
                               socket=socket, timeout=timeout_per_sample,
                               fallback_on_loss=bool(fallback))
        super().__init__(stream, batch_size=batch_size, num_workers=num_workers,
                         drop_last=drop_last, **kwargs)

    def __iter__(self):
        s = self.nopfs_sampler
        self.dataset.set_pass(s.epoch, s.start_step)
        s.start_step = 0  # a resume applies to one pass
        return super().__iter__()
