"""Type stub of the extension nopfs._client (python/client_module.cc, pybind11).

Kept in step with the module: tests/python/test_package.py compares the names, the parameters and
their defaults with the compiled module's own signatures.
"""

import builtins
from types import TracebackType
from typing import Any, Dict, Optional, Type, Union

import numpy as np
import numpy.typing as npt

class Error(RuntimeError):
    """An error from the nopfs service or client."""

class SampleError(Error):
    """The service could not read one sample; the stream goes on with the next one."""

    sample_id: int
    path: Optional[str]
    code: int

class UnavailableError(Error):
    """No nopfs service answers, or it went away."""

class TimeoutError(Error, builtins.TimeoutError):
    """No sample within the timeout."""

class Sample:
    """One sample of a stream; its bytes are shared memory until release()."""

    @property
    def id(self) -> int: ...
    @property
    def label(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def released(self) -> bool: ...
    @property
    def data(self) -> memoryview: ...
    def numpy(self) -> npt.NDArray[np.uint8]: ...
    def tobytes(self) -> bytes: ...
    def release(self) -> None: ...
    def __len__(self) -> int: ...
    def __enter__(self) -> "Sample": ...
    def __exit__(
        self,
        arg0: Optional[Type[BaseException]],
        arg1: Optional[BaseException],
        arg2: Optional[TracebackType],
    ) -> None: ...

class Stream:
    """One rank's samples, in stream order."""

    def next(self, timeout: Optional[float] = None) -> Optional[Sample]: ...
    def __iter__(self) -> "Stream": ...
    def __next__(self) -> Sample: ...
    def stats(self) -> Dict[str, int]: ...
    @property
    def id(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Stream": ...
    def __exit__(self, *args: Any) -> None: ...

class Client:
    """A connection to the node's nopfsd."""

    def open(
        self,
        rank: int,
        epoch: int = 0,
        step: int = 0,
        worker: int = 0,
        workers: int = 1,
        batch: int = 1,
        epochs: int = 0,
        owner: int = 0,
    ) -> Stream: ...
    def status(self) -> str: ...
    def report(self) -> Dict[str, Any]: ...
    def describe(self, sample_id: int) -> Dict[str, Union[str, int]]: ...
    @property
    def info(self) -> Dict[str, int]: ...

def connect(socket: Optional[str] = None, timeout: float = 30.0) -> Client: ...
def epoch_order(
    seed: int,
    samples: int,
    ranks: int,
    batch: int,
    scheme: str,
    drop_last: bool,
    rank: int,
    epoch: int,
    step: int = 0,
) -> npt.NDArray[np.uint32]: ...
def steps_per_epoch(
    seed: int, samples: int, ranks: int, batch: int, scheme: str, drop_last: bool
) -> int: ...
def rank_epoch_length(
    samples: int, ranks: int, batch: int, scheme: str, drop_last: bool, rank: int
) -> int: ...
def step_begin(
    samples: int, ranks: int, batch: int, scheme: str, drop_last: bool, rank: int, step: int
) -> int: ...
