"""Batch modes: how a loader's batches are made from the stream (per-sample items and a collate,
or one tensor per batch), and the batch tensors of the one-tensor modes."""

from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

import torch.utils.data as tud

from ._datasets import _SampleDataset, getitem_overridden, uint8_tensor

if TYPE_CHECKING:
    import torch


def _identity(batch: Any) -> Any:
    """The DataLoader's collate_fn: StreamDataset yields batches already collated."""
    return batch


def _batch_mode(dataset: Any, collate_fn: Optional[Callable[[List[Any]], Any]]) -> str:
    """How StreamDataset makes a batch's items: "getitem" (a subclass's own __getitem__, given
    each sample's bytes as a bytes object), "tensor", "bytes" or "views" (pil_decode's too: it
    decodes a JPEG straight from the view)."""
    if getitem_overridden(dataset):
        return "getitem"
    plain = (getattr(dataset, "transform", None) is None
             and getattr(dataset, "target_transform", None) is None
             and type(dataset).make_item is _SampleDataset.make_item)
    decode = getattr(dataset, "decode", None)
    if plain and decode is uint8_tensor and collate_fn in (None, tud.default_collate):
        return "tensor"
    if plain and decode is bytes:
        return "bytes"
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
