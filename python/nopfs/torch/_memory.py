"""Batch memory reused in the training process: the blocks a pass's tensor batches are views of,
given back when nothing refers to a batch any more."""

import weakref
from typing import TYPE_CHECKING, Any, List, Tuple

if TYPE_CHECKING:
    import torch


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
