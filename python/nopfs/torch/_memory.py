"""Batch memory reused: the blocks a pass's tensor batches are views of in the training process,
given back when nothing refers to a batch any more, and malloc keeping what a batch frees in
every process that makes batches."""

import os
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


# glibc's mallopt() parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# What malloc keeps in a process that makes batches (keep_freed_memory): the free memory at the
# top of its heap up to this much, and blocks up to this size made in the heap rather than mapped
# one by one (glibc's own ceiling for the threshold it adapts at run time).
TRIM_THRESHOLD = 256 << 20
MMAP_THRESHOLD = 32 << 20
_kept_in: List[int] = []  # the pid whose malloc keep_freed_memory() has set


def keep_freed_memory() -> bool:
    """Makes this process's malloc (glibc's) keep the memory it frees, once per process; True if
    it does. A loader makes every batch anew: each sample's bytes, its item, whatever a decode
    allocates, all freed once the batch is collated or handed over. By default glibc gives the
    top of its heap back to the system as soon as more than twice the largest block freed so far
    is free there (a 64 KiB sample: 128 KiB), and maps each block larger than that on its own, so
    every batch (megabytes, freed at once) is given back and then faulted in again page by page,
    which costs more than the copies and the decode (docs/PERFORMANCE.md, "DataLoader workers").
    The process keeps the heap it grew to instead (no more than the most it used at once, up to
    TRIM_THRESHOLD free at its top). Left as it is if the environment sets malloc's parameters
    (MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_, glibc.malloc tunables in
    GLIBC_TUNABLES), where the C library is not glibc, and where malloc is not glibc's (a
    sanitizer's allocator, whose mallopt() refuses)."""
    import ctypes

    pid = os.getpid()
    if _kept_in and _kept_in[0] == pid:
        return True
    if any(k in os.environ for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                                     "MALLOC_TOP_PAD_")) \
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, ValueError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return False
    _kept_in[:] = [pid]
    return True
