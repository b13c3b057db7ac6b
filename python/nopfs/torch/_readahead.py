"""The read-ahead thread: makes a pass's batches ahead of the training loop, as deep as the loop's
pace says it pays."""

import os
import queue
import threading
import time
from typing import Any, Generator, Iterable, Iterator, List, Optional, Tuple


_END = object()  # _ahead's end of the items

# How long _join_exited waits for one thread's teardown once Python has let it go.
_EXIT_WAIT = 5.0


def _join_exited(threads: Iterable[threading.Thread]) -> None:
    """Joins `threads` (all but the calling one) and returns once each has left this process's
    threads as the operating system lists them (/proc/self/task), not only Python's: join()
    returns when the thread gives up its Python state, before the C library and a sanitizer's
    runtime tear the thread down (ASan returns its allocator caches then, under the allocator's
    locks). A fork meanwhile (a later DataLoader's workers) copies such a lock held by no thread
    of the child, whose next allocation of that size then waits forever. Waits at most
    _EXIT_WAIT seconds per thread; where there is no /proc, only joins."""
    me = threading.current_thread()
    for t in threads:
        if t is me:
            continue
        t.join()
        task = f"/proc/self/task/{t.native_id}"
        deadline = time.monotonic() + _EXIT_WAIT
        while t.native_id is not None and os.path.exists(task) and time.monotonic() < deadline:
            time.sleep(0.0001)


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
    stream) itself. The thread has exited when the pass ends (_join_exited)."""
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
        _join_exited([thread])  # not if the collector runs this in the thread itself
