"""StreamDataset: the IterableDataset each DataLoader process reads its share of the rank's
stream through, from the service or, in fallback, from the files in the same order."""

import functools
import multiprocessing
import os
import threading
import warnings
import weakref
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch.utils.data as tud

from .. import _client
from ._batches import _batch_mode, _batch_tensor
from ._datasets import _pil_decode_batch, _SampleDataset, item_of, pil_decode
from ._memory import _Blocks, keep_freed_memory
from ._readahead import _ahead, _join_exited, _Pace
from ._sampler import DistributedSampler
from ._streams import _close_quietly, _Kept, _open_stream

if TYPE_CHECKING:
    import torch


def _items_of_bytes(dataset: Any, samples: List[Tuple[Any, int]]) -> List[Any]:
    """dataset.make_item(data, label) of each (data, label)."""
    return [dataset.make_item(data, label) for data, label in samples]


def _items_of_ids(dataset: Any, samples: List[Tuple[int, Any, int]]) -> List[Any]:
    """dataset[id] of each (id, data, label), a subclass's own __getitem__ (item_of)."""
    return [item_of(dataset, i, data, label) for i, data, label in samples]


class _DecodePool:
    """A pass's decode threads (decode_threads >= 2, in the training process): started by the
    pass's first batch of two or more samples, ended with the pass. close() returns once every
    one of them has exited (_join_exited), so that no thread of a pass that ended is still
    tearing itself down when the process forks next: a later DataLoader's workers, each of which
    would otherwise copy whatever lock that thread held at the fork."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._executor: Optional[ThreadPoolExecutor] = None
        self._started: List[threading.Thread] = []

    def _note_started(self) -> None:
        self._started.append(threading.current_thread())

    def map_parts(self, make: Callable[[Any, List[Any]], List[Any]], dataset: Any,
                  samples: List[Any]) -> List[Any]:
        """make(dataset, samples) in as many parts as there are threads (sizes differing by at
        most one), all finished before this returns; the items in order."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="nopfs-decode",
                                                initializer=self._note_started)
        n, threads = len(samples), self.threads
        cuts = [k * n // threads for k in range(threads + 1)]
        parts = [self._executor.submit(make, dataset, samples[a:b])
                 for a, b in zip(cuts, cuts[1:]) if b > a]
        futures.wait(parts)
        return [item for part in parts for item in part.result()]

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)  # may run in one of its threads (the collector)
            _join_exited(self._started)
        self._started = []


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
                 read_once: bool = False, decode_threads: int = 0) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = int(batch_size)
        # The batch's collate (torch's default_collate unless given); applied here, per batch.
        self.collate_fn = collate_fn
        # How a batch's samples become items (_batch_mode): "tensor" fills one uint8 tensor per
        # batch (default collate of uint8_tensor items), "bytes" makes the bytes in one call,
        # "views" hands decode (pil_decode too) one view per sample.
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
        # Threads of the training process that make each batch's items (decode, transform, a
        # subclass's __getitem__) in parts, for decodes that release the GIL; 0 or 1: none.
        self.decode_threads = int(decode_threads)
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
        # Each batch's memory is freed at once: malloc keeps it rather than give it back to the
        # system and fault it in again for the next batch (set once per process: the training
        # process's first pass, each worker's).
        keep_freed_memory()
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
        # Decode threads (the training process only) live for this pass.
        pool = (_DecodePool(self.decode_threads)
                if self.decode_threads > 1 and tud.get_worker_info() is None else None)
        if self.mode == "tensor":
            take = self._tensor_batch
        else:
            take = functools.partial(self._item_batch, read_once=read_once, pool=pool)

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
                    epochs = self.sampler._epochs
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
            if pool is not None:
                pool.close()
        yield from self._batches_of(self._iter_files(epoch, step, worker, workers,
                                                     skip=delivered))

    def _item_batch(self, stream: Any, want: int, read_once: bool = False,
                    pool: Optional[_DecodePool] = None) -> Tuple[Any, int]:
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
            if self.mode == "getitem":
                # A subclass's own __getitem__: given each sample's id, its read() returns the
                # bytes (a copy: the item may keep them) and label delivered.
                copies = batch.tobytes()
                ids = batch.ids.tolist()
                batch.release()
                items.extend(self._items(_items_of_ids, self.dataset,
                                         list(zip(ids, copies, labels)), pool))
                continue
            if self._decodes_pil() and (self.decode_threads <= 1
                                        or tud.get_worker_info() is not None):
                # pil_decode's images in one call (decode threads make them in parts instead,
                # below): of the ring in place, or read_once of copies of the part of each
                # sample that its decode reads (the image, which may be far less).
                images = _pil_decode_batch(batch)
                if images is not None:
                    batch.release()
                    items.extend(self.dataset._item_of_decoded(x, label)
                                 for x, label in zip(images, labels))
                    continue
            if read_once:
                # What a decode given views gets: a read-only view (of a copy).
                copies = [memoryview(c) for c in batch.tobytes()]
                batch.release()
                items.extend(self._items(_items_of_bytes, self.dataset,
                                         list(zip(copies, labels)), pool))
                continue
            views = batch.views()
            try:
                items.extend(self._items(_items_of_bytes, self.dataset, list(zip(views, labels)),
                                         pool))
            finally:
                for view in views:
                    view.release()
                del views
                batch.release()
        return (self._collate(items) if items else None), len(items)

    def _decodes_pil(self) -> bool:
        """Whether the items are made by make_item as it is with pil_decode as the decode (so
        that a batch's images may be decoded in one call, _pil_decode_batch)."""
        d = self.dataset
        return (isinstance(d, _SampleDataset) and getattr(d, "decode", None) is pil_decode
                and type(d).make_item is _SampleDataset.make_item)

    def _items(self, make: Callable[[Any, List[Any]], List[Any]], dataset: Any,
               samples: List[Any], pool: Optional[_DecodePool]) -> List[Any]:
        """make(dataset, samples): the items of a batch's samples, in order; with the pass's
        decode threads (the training process only), made by them in as many parts, all finished
        before this returns (the samples may be views the caller releases next). A lone sample
        is made in this thread."""
        if pool is None or len(samples) < 2:
            return make(dataset, samples)
        return pool.map_parts(make, dataset, samples)

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
                data, label = (self.dataset._read_file(sample_id)
                               if hasattr(self.dataset, "_read_file")
                               else self.dataset.read(sample_id))
            except OSError as e:
                path = self.dataset.samples[sample_id][0]
                err = _client.SampleError(f"sample {sample_id} ({path}): {e.strerror or e}")
                err.sample_id, err.path, err.code = sample_id, path, None
                raise err from e
            if self.mode == "getitem":
                yield item_of(self.dataset, sample_id, data, label)
            else:
                yield self.dataset.make_item(data, label)
