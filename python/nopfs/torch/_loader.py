"""DataLoader: a torch DataLoader over StreamDataset, and the iterator that hands its batches on
without torch's when there are no workers."""

import math
import warnings
from typing import Any, Dict, Iterator, Optional

import torch.utils.data as tud

from .. import _client
from ..job import fallback_requested, service_available
from ._batches import _batch_mode, _identity
from ._datasets import check_against_catalog, check_hooks
from ._sampler import DistributedSampler, _mismatch, _set_by
from ._stream_dataset import StreamDataset


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
    seconds to wait for one sample (None: no limit); decode_threads: threads of this process
    that make each batch's items (decode, transform) in parts, without workers (for decodes that
    release the GIL: PIL, torchvision.io, numpy; 0 or 1: none). state_dict()/load_state_dict() are the
    sampler's: the position of the next batch the training loop has not received.
    """

    def __init__(self, dataset: Any, batch_size: Optional[int] = 1,
                 shuffle: Optional[bool] = None, sampler: Optional[DistributedSampler] = None,
                 num_workers: int = 0, drop_last: Optional[bool] = None,
                 fallback: Optional[bool] = None, socket: Optional[str] = None,
                 timeout_per_sample: Optional[float] = None, decode_threads: int = 0,
                 **kwargs: Any) -> None:
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
        check_hooks(dataset)
        if sampler is None:
            sampler = DistributedSampler(dataset)
        if not isinstance(sampler, DistributedSampler):
            raise TypeError("nopfs: DataLoader(sampler=...) must be a nopfs.torch."
                            "DistributedSampler, whose order is the service's")
        if batch_size is None:
            raise ValueError("nopfs: DataLoader(batch_size=None) is not supported")
        if isinstance(decode_threads, bool) or not isinstance(decode_threads, int) \
                or decode_threads < 0:
            raise ValueError(f"nopfs: DataLoader(decode_threads={decode_threads!r}): write a "
                             "number of threads >= 0 (0: the items are made in the loader's "
                             "own thread)")
        if decode_threads > 0 and num_workers > 0:
            raise ValueError(
                f"nopfs: DataLoader(decode_threads={decode_threads}, num_workers={num_workers}):"
                " decode threads make the items in the training process, workers make them in "
                f"worker processes; pass one of them: num_workers=0 to decode in threads, or "
                "decode_threads=0 to decode in the workers")
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
        sampler._socket = socket
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
        generator = kwargs.get("generator")
        if generator is not None and generator.initial_seed() != job.seed:
            warnings.warn(
                f"nopfs: DataLoader(generator=...) is seeded with {generator.initial_seed()}, the "
                f"job's seed is {job.seed}: the order of the samples comes from the job's seed "
                f"({_set_by('seed')}); the generator seeds only the workers' random numbers "
                "(augmentations), as torch's does. Seed it with sampler.seed to say so, or run "
                f"the job with seed {generator.initial_seed()}", UserWarning, stacklevel=2)
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
        client = None
        if use_service and (num_workers > 0 or fallback):
            client = _client.connect(socket)
        if client is not None and num_workers > 0:
            limit = int(client.report()["refusals"]["streams_per_rank"])
            if num_workers > limit:
                raise ValueError(
                    f"nopfs: DataLoader(num_workers={num_workers}): each worker opens a stream "
                    f"of rank {job.rank}, and this job's service allows {limit} streams per rank "
                    f"(limits.streams_per_rank = {limit} in the node config, shown by `nopfs "
                    f"status` as 'limits: {limit} streams per rank'): write num_workers={limit} "
                    "or fewer, or ask the admin to raise limits.streams_per_rank in the node "
                    "config (docs/config.md; each stream costs a ring, docs/service.md, "
                    "\"Limits\")")
        if fallback and hasattr(dataset, "sample_ranges"):
            # The files the fallback may read are listed now, once, and every read is checked
            # against the listing; under a service the listing must be its catalog's.
            dataset.sample_ranges()
            if client is not None:
                check_against_catalog(dataset, client)
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
                               read_once=not kwargs.get("persistent_workers", False),
                               decode_threads=decode_threads)
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
