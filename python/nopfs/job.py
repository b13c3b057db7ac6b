"""The job a rank belongs to: the sampling parameters that fix its order (docs/algorithm.md).

`nopfs run` and the Slurm plugin export them as NOPFS_* variables; Job.from_env() reads them, and
fills what is missing from the caller's defaults (what a plain DistributedSampler would use), so
that the fallback reader plans the same order without a service.
"""

import dataclasses
import os
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
    return int(_client.connect(socket).report()["dataset"]["samples"])


def _env_int(name: str) -> Optional[int]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"nopfs: {name}={value!r} is not an integer") from None


def _launcher_error(what: str, fix: str) -> ValueError:
    return ValueError(f"nopfs: {what}; {fix} (docs/user.md, \"Launchers\")")


_TORCHRUN = ("run one torchrun per Slurm task with its static rendezvous (the default) and "
             "--nnodes=$SLURM_NTASKS --node_rank=$SLURM_PROCID (expanded in the task: srun bash "
             "-c '...'), so that RANK = node rank x --nproc_per_node + LOCAL_RANK; c10d "
             "rendezvous (--rdzv_backend=c10d, --standalone) ignores --node_rank and numbers the "
             "agents by host name and pid")


def _check_plain_launcher(rank: int) -> None:
    """One process per Slurm task (no LOCAL_RANK/LOCAL_WORLD_SIZE): a RANK or WORLD_SIZE in the
    environment (a script's export, accelerate, Lightning) must be the job's."""
    ranks = _env_int("NOPFS_RANKS")
    world = _env_int("WORLD_SIZE")
    if world is not None and ranks is not None and world != ranks:
        raise _launcher_error(
            f"WORLD_SIZE={world} in the environment is not the job's NOPFS_RANKS={ranks}: every "
            "training process must be one nopfs rank",
            f"write WORLD_SIZE=$NOPFS_RANKS (or leave it unset), or run the job with {world} "
            "ranks (sbatch --nodes x --nopfs-ranks-per-node, nopfs run --ranks)")
    launcher_rank = _env_int("RANK")
    if launcher_rank is not None and launcher_rank != rank:
        raise _launcher_error(
            f"RANK={launcher_rank} in the environment is not this process's nopfs rank {rank} "
            "(NOPFS_RANK: one process per Slurm task, numbered by the job)",
            "write RANK=$NOPFS_RANK (or leave RANK unset: nopfs knows the rank); a launcher "
            "that starts several processes per task must set LOCAL_RANK and LOCAL_WORLD_SIZE")


def env_rank() -> Optional[int]:
    """This process's nopfs rank from the NOPFS_* environment, or None without one.

    One process per Slurm task (`srun python`, `nopfs run`): NOPFS_RANK. Under a launcher that
    starts k processes per task and says so with LOCAL_RANK and LOCAL_WORLD_SIZE = k (torchrun):
    NOPFS_NODE x NOPFS_RANKS_PER_NODE + NOPFS_LOCAL_RANK x k + LOCAL_RANK, where the job's ranks
    per node are tasks per node x k. LOCAL_RANK/LOCAL_WORLD_SIZE equal to NOPFS_LOCAL_RANK and
    NOPFS_RANKS_PER_NODE are the Slurm tasks themselves (exported from SLURM_LOCALID): k = 1.
    A launcher's RANK, WORLD_SIZE or LOCAL_WORLD_SIZE that contradicts the NOPFS_* values is a
    ValueError that says what to write, whatever the launcher (without LOCAL_RANK and
    LOCAL_WORLD_SIZE, RANK must be NOPFS_RANK and WORLD_SIZE NOPFS_RANKS).
    """
    rank = _env_int("NOPFS_RANK")
    local, k = _env_int("LOCAL_RANK"), _env_int("LOCAL_WORLD_SIZE")
    if rank is None:
        return rank
    if local is None or k is None:
        _check_plain_launcher(rank)
        return rank
    ranks = _env_int("NOPFS_RANKS")
    per_node = _env_int("NOPFS_RANKS_PER_NODE")
    node = _env_int("NOPFS_NODE")
    task = _env_int("NOPFS_LOCAL_RANK")
    nodes = _env_int("NOPFS_NODES")
    missing = [n for n, v in (("NOPFS_RANKS", ranks), ("NOPFS_RANKS_PER_NODE", per_node),
                              ("NOPFS_NODE", node), ("NOPFS_LOCAL_RANK", task)) if v is None]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise _launcher_error(
            f"LOCAL_RANK and LOCAL_WORLD_SIZE are set (a launcher started this process) but "
            f"{', '.join(missing)} {verb} not",
            "run the job under sbatch --nopfs or `nopfs run`, which set every NOPFS_* variable")
    if not 0 <= local < k:
        raise _launcher_error(f"LOCAL_RANK={local} is out of range for LOCAL_WORLD_SIZE={k}",
                              "let the launcher set both")
    if local == task and k == per_node:
        k = 1  # the tasks themselves: rank is NOPFS_RANK
        computed = rank
    else:
        if per_node % k != 0:
            raise _launcher_error(
                f"LOCAL_WORLD_SIZE={k} processes per task do not divide the job's "
                f"NOPFS_RANKS_PER_NODE={per_node} ranks per node",
                f"submit with --nopfs-ranks-per-node = tasks per node x {k}, e.g. "
                f"--nopfs-ranks-per-node={k} with --ntasks-per-node=1 and torchrun "
                f"--nproc_per_node={k}")
        if task >= per_node // k:
            raise _launcher_error(
                f"this is Slurm task NOPFS_LOCAL_RANK={task} of its node, but "
                f"NOPFS_RANKS_PER_NODE={per_node} with LOCAL_WORLD_SIZE={k} processes per task "
                f"leaves room for {per_node // k} tasks per node",
                f"submit with --nopfs-ranks-per-node = --ntasks-per-node x {k}")
        computed = node * per_node + task * k + local
    world = _env_int("WORLD_SIZE")
    if world is not None and world != ranks:
        hint = (f"--nopfs-ranks-per-node={world // nodes}" if nodes and world % nodes == 0
                else "--nopfs-ranks-per-node = tasks per node x processes per task")
        raise _launcher_error(
            f"the launcher's WORLD_SIZE={world} is not the job's NOPFS_RANKS={ranks}: every "
            "training process must be one nopfs rank",
            f"submit with {hint} (nodes x ranks per node = WORLD_SIZE), or start "
            f"{ranks} processes in all")
    launcher_rank = _env_int("RANK")
    if launcher_rank is not None and launcher_rank != computed:
        raise _launcher_error(
            f"the launcher's RANK={launcher_rank} is not this process's nopfs rank {computed} "
            f"(NOPFS_NODE={node} x NOPFS_RANKS_PER_NODE={per_node} + NOPFS_LOCAL_RANK={task} x "
            f"LOCAL_WORLD_SIZE={k} + LOCAL_RANK={local})", _TORCHRUN)
    if not 0 <= computed < (ranks or 0):
        raise ValueError(f"nopfs: rank {computed} is out of range for {ranks} ranks")
    return computed


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
        """NOPFS_* variables win (the rank: env_rank()); the arguments are the defaults for what
        the environment lacks."""
        env_drop = os.environ.get("NOPFS_DROP_LAST")
        job = cls(
            seed=_env_int("NOPFS_SEED") if _env_int("NOPFS_SEED") is not None else seed,
            samples=_env_int("NOPFS_SAMPLES") or samples,
            ranks=_env_int("NOPFS_RANKS") or ranks or 1,
            rank=env_rank() if env_rank() is not None else (rank or 0),
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
