"""Opening a rank's stream on the process's one connection to nopfsd, and the streams a pass
leaves open for the next epoch (kept streams)."""

import os
import threading
import weakref
from typing import Any, Dict, Optional, Tuple

from .. import _client


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
