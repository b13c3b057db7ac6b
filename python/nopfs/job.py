"""The job a rank belongs to: the sampling parameters that fix its order (docs/algorithm.md).

`nopfs run` and the Slurm plugin export them as NOPFS_* variables; Job.from_env() reads them, and
fills what is missing from the caller's defaults (what a plain DistributedSampler would use), so
that the fallback reader plans the same order without a service.
"""

import dataclasses
import os
import re
from typing import TYPE_CHECKING, Optional

from . import _client

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


def service_available() -> bool:
    """True if the environment names a nopfs service (NOPFS_SOCKET)."""
    return bool(os.environ.get("NOPFS_SOCKET"))


def fallback_requested() -> bool:
    """True if NOPFS_FALLBACK asks for the plain file reader when there is no service."""
    return os.environ.get("NOPFS_FALLBACK", "").strip().lower() in ("1", "true", "yes", "on")


def service_samples(socket: Optional[str] = None) -> int:
    """The number of samples the service's catalog holds (NOPFS_SAMPLES, else asked from the
    service: the Slurm plugin cannot export it, the catalog is scanned after the job starts)."""
    value = _env_int("NOPFS_SAMPLES")
    if value:
        return value
    text = _client.connect(socket).status()
    m = re.search(r"^dataset: .*, (\d+) samples", text, re.MULTILINE)
    if m is None:
        raise _client.Error("nopfs: the service's status does not say how many samples it has")
    return int(m.group(1))


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"nopfs: {name}={value!r} is not an integer") from None


@dataclasses.dataclass
class Job:
    """One rank's view of the job. batch is B, the global batch (all ranks together)."""

    seed: int
    samples: int
    ranks: int
    rank: int
    batch: int
    scheme: str = "strided"
    drop_last: bool = False

    @classmethod
    def from_env(cls, samples: Optional[int] = None, ranks: Optional[int] = None,
                 rank: Optional[int] = None, batch: Optional[int] = None, seed: int = 0,
                 scheme: str = "strided", drop_last: bool = False) -> "Job":
        """NOPFS_* variables win; the arguments are the defaults for what the environment lacks."""
        env_drop = os.environ.get("NOPFS_DROP_LAST")
        job = cls(
            seed=_env_int("NOPFS_SEED") if _env_int("NOPFS_SEED") is not None else seed,
            samples=_env_int("NOPFS_SAMPLES") or samples,
            ranks=_env_int("NOPFS_RANKS") or ranks or 1,
            rank=_env_int("NOPFS_RANK") if _env_int("NOPFS_RANK") is not None else (rank or 0),
            batch=_env_int("NOPFS_BATCH") or batch or 1,
            scheme=os.environ.get("NOPFS_SCHEME") or scheme,
            drop_last=(env_drop == "1") if env_drop in ("0", "1") else bool(drop_last),
        )
        if not job.samples:
            raise ValueError("nopfs: the number of samples is unknown (NOPFS_SAMPLES is not set "
                             "and no dataset length was given)")
        if not 0 <= job.rank < job.ranks:
            raise ValueError(f"nopfs: rank {job.rank} is out of range for {job.ranks} ranks")
        return job

    @property
    def rank_batch(self) -> int:
        """ceil(B/N): a rank's share of a global batch, the size of one of its steps."""
        return -(-self.batch // self.ranks)

    def order(self, epoch: int, step: int = 0) -> "npt.NDArray[np.uint32]":
        """The sample ids this rank reads in `epoch` from `step` on (numpy uint32), exactly what
        the service delivers and `nopfs stream` prints."""
        return _client.epoch_order(self.seed, self.samples, self.ranks, self.batch, self.scheme,
                                   self.drop_last, self.rank, epoch, step)

    def steps_per_epoch(self) -> int:
        return _client.steps_per_epoch(self.seed, self.samples, self.ranks, self.batch,
                                       self.scheme, self.drop_last)

    def epoch_length(self) -> int:
        return _client.rank_epoch_length(self.samples, self.ranks, self.batch, self.scheme,
                                         self.drop_last, self.rank)
