"""DistributedSampler: torch's sampler whose parameters are the job's and whose order is the
service's plan; and the checks of a loader's arguments against the job."""

import os
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch.utils.data as tud

from .. import _client
from ..job import Job, _env_int


def _distributed_default(what: str) -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() if what == "world" else dist.get_rank()
    value = os.environ.get("WORLD_SIZE" if what == "world" else "RANK")
    return int(value) if value else (1 if what == "world" else 0)


# How the job's parameters are set: (variable, sbatch option, `nopfs run` option).
_JOB_OPTIONS = {
    "seed": ("NOPFS_SEED", "--nopfs-seed", "--seed"),
    "drop_last": ("NOPFS_DROP_LAST", "--nopfs-drop-last", "--drop-last"),
    "num_replicas": ("NOPFS_RANKS", "--nodes x --nopfs-ranks-per-node", "--ranks"),
    "batch": ("NOPFS_BATCH", "--nopfs-batch", "--batch"),
    "epochs": ("NOPFS_EPOCHS", "--nopfs-epochs", "--epochs"),
    "scheme": ("NOPFS_SCHEME", "--nopfs-scheme", "--scheme"),
}

# The format of state_dict(): "nopfs_state" holds it. A state without the key is of a nopfs
# that saved only the position ({"epoch", "step"}).
STATE_FORMAT = 1


def _set_by(what: str) -> str:
    var, sbatch, run = _JOB_OPTIONS[what]
    return f"{var}, set by sbatch {sbatch} or nopfs run {run}"


def _mismatch(call: str, given: object, what: str, job_value: object) -> ValueError:
    if what == "rank":
        return ValueError(f"nopfs: {call} contradicts the job, which gives this process rank "
                          f"{job_value} (NOPFS_RANK): leave the argument out (nopfs knows the "
                          "rank), or start one process per rank (docs/user.md)")
    return ValueError(f"nopfs: {call} contradicts the job, whose {what} is {job_value!r} "
                      f"({_set_by(what)}): leave the argument out, or run the job with "
                      f"{what} {given!r}")


def _check_process_group(job: Job) -> None:
    """With torch.distributed initialised, the job's rank and ranks must be the process group's
    (what torch's own sampler would take): else ValueError saying what to write."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    if (rank, world) == (job.rank, job.ranks):
        return
    raise ValueError(
        f"nopfs: torch.distributed's process group makes this process rank {rank} of {world}, "
        f"but the job makes it nopfs rank {job.rank} of {job.ranks} (NOPFS_RANK, "
        f"{_set_by('num_replicas')}): torch's own DistributedSampler would read another share "
        f"than the one nopfs serves here. Initialise the process group with "
        f"rank=nopfs.job.env_rank() and world_size=int(os.environ['NOPFS_RANKS'])"
        + (f", or run the job with {world} ranks" if world != job.ranks else "")
        + "; if the group is not the data-parallel one (model or pipeline parallelism), pass "
        f"DistributedSampler(num_replicas={job.ranks}, rank={job.rank}) to say so")


def job_epochs() -> Optional[int]:
    """The job's number of epochs (NOPFS_EPOCHS), or None outside a nopfs job."""
    return _env_int("NOPFS_EPOCHS")


class DistributedSampler(tud.Sampler):
    """torch's DistributedSampler, with the order nopfs plans.

    Rank, replicas, seed, global batch, scheme, drop_last and epochs come from the NOPFS_*
    environment when it is there; an explicit argument that contradicts it raises ValueError,
    naming the job's value and the option that sets it. Without a job they come from the
    arguments, torch.distributed or RANK/WORLD_SIZE, as torch's sampler does.

    Iterating yields the sample ids of the current epoch in order; set_epoch(e) selects the epoch
    (without it every pass is epoch 0, as with torch, and a second pass over an epoch without
    set_epoch warns once). An epoch >= `epochs` raises at once. resume(epoch, step) makes the next
    pass start at `step` of `epoch`; state_dict() is the position of the next batch the training
    loop has not consumed yet (nopfs's DataLoader counts the batches it hands out).
    shuffle=False is not offered: the service serves the planned shuffle.
    """

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: Optional[int] = None,
                 drop_last: Optional[bool] = None, batch_size: Optional[int] = None,
                 epochs: Optional[int] = None) -> None:
        if not shuffle:
            raise ValueError("nopfs: DistributedSampler(shuffle=False) is not supported: nopfs "
                             "serves the planned shuffle. For an unshuffled pass (validation) use "
                             "torch.utils.data.DistributedSampler (docs/python.md)")
        self.dataset = dataset
        self._seed_default = 0 if seed is None else int(seed)
        self._drop_last_default = bool(drop_last)
        self._num_replicas = num_replicas if num_replicas is not None else _distributed_default(
            "world")
        self._rank = rank if rank is not None else _distributed_default("rank")
        self._batch = batch_size  # per rank; the DataLoader sets it when it is None
        self._job: Optional[Job] = None
        job = self._make_job()
        for what, given, have in (("num_replicas", num_replicas, job.ranks),
                                  ("rank", rank, job.rank), ("seed", seed, job.seed),
                                  ("drop_last", drop_last, job.drop_last)):
            if given is not None and given != have:
                raise _mismatch(f"DistributedSampler({what}={given!r})", given, what, have)
        if batch_size is not None and job.rank_batch != batch_size:
            raise _mismatch(f"DistributedSampler(batch_size={batch_size})", batch_size *
                            job.ranks, "batch", job.batch)
        if num_replicas is None and rank is None:
            _check_process_group(job)
        self._job = job if batch_size is not None else None
        self._epochs = job_epochs()
        if epochs is not None:
            if int(epochs) < 1:
                raise ValueError(f"nopfs: DistributedSampler(epochs={epochs}): write a number "
                                 "of epochs >= 1")
            if self._epochs is not None and int(epochs) != self._epochs:
                raise _mismatch(f"DistributedSampler(epochs={epochs})", epochs, "epochs",
                                self._epochs)
            self._epochs = int(epochs)
        self._identity: Optional[Dict[str, Any]] = None
        self._socket: Optional[str] = None  # the DataLoader's service socket, if it named one
        self.epoch = 0
        self.start_step = 0
        self._pos = (0, 0)  # (epoch, step) of the next batch the training loop consumes
        self._active: Optional[list] = None  # [epoch, start step, batches, consumed] of a pass
        self._epoch_chosen = False  # set_epoch()/resume() since the last pass began
        self._last_pass_epoch: Optional[int] = None
        self._warned_repeat = False

    def _make_job(self) -> Job:
        rank_batch = self._batch or 1
        return Job.from_env(samples=len(self.dataset), ranks=self._num_replicas, rank=self._rank,
                            batch=rank_batch * self._num_replicas, seed=self._seed_default,
                            drop_last=self._drop_last_default)

    @property
    def job(self) -> Job:
        if self._job is None:
            self._job = self._make_job()
        return self._job

    @property
    def num_replicas(self) -> int:
        return self.job.ranks

    @property
    def rank(self) -> int:
        return self.job.rank

    @property
    def seed(self) -> int:
        return self.job.seed

    @property
    def shuffle(self) -> bool:
        """Always True: the service serves the planned shuffle."""
        return True

    @property
    def drop_last(self) -> bool:
        return self.job.drop_last

    @property
    def epochs(self) -> int:
        """The job's number of epochs (NOPFS_EPOCHS), or without a job the `epochs` argument;
        without either, ValueError saying what to write."""
        if self._epochs is None:
            raise ValueError("nopfs: sampler.epochs is unknown: there is no job (NOPFS_EPOCHS is "
                             "not set) and DistributedSampler(..., epochs=N) was not given; pass "
                             "epochs=N (the script's own number of epochs: under a job it must "
                             "be the job's), or set NOPFS_EPOCHS=N")
        return self._epochs

    @property
    def num_samples(self) -> int:
        """The samples this rank reads in one whole epoch, as torch's num_samples."""
        return int(self.job.epoch_length())

    @property
    def total_size(self) -> int:
        """The samples all ranks read in one epoch together, as torch's total_size."""
        j = self.job
        return sum(int(_client.rank_epoch_length(j.samples, j.ranks, j.batch, j.scheme,
                                                 j.drop_last, r)) for r in range(j.ranks))

    def _set_batch_size(self, batch_size: int) -> None:
        if self._batch is None:
            self._batch = batch_size
            self._job = None

    def _check_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"nopfs: epoch {epoch} is negative")
        if self._epochs is not None and epoch >= self._epochs:
            raise ValueError(f"nopfs: epoch {epoch} is past the job's last epoch: the job reads "
                             f"{self._epochs} epochs (0 to {self._epochs - 1}; "
                             f"{_set_by('epochs')}); run the job with more epochs "
                             "to train longer")

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch of the next pass. A pending resume() step is kept for its epoch."""
        epoch = int(epoch)
        self._check_epoch(epoch)
        if epoch != self.epoch:
            self.start_step = 0
        self.epoch = epoch
        self._epoch_chosen = True
        self._active = None
        self._pos = (epoch, self.start_step)

    def resume(self, epoch: int, step: int) -> None:
        """The next pass starts at step `step` of `epoch` (steps of the job's per-rank batch)."""
        epoch, step = int(epoch), int(step)
        if self._epochs is not None and epoch == self._epochs and step == 0:
            pass  # the state after the job's last batch: there is nothing left to read
        else:
            self._check_epoch(epoch)
            steps = self.job.steps_per_epoch()
            if step < 0 or step >= steps:
                raise ValueError(f"nopfs: step {step} is out of range: an epoch has {steps} "
                                 f"steps (0 to {steps - 1})")
        self.epoch = epoch
        self.start_step = step
        self._epoch_chosen = True
        self._active = None
        self._pos = (epoch, step)

    def dataset_identity(self) -> Dict[str, Any]:
        """{"path", "samples", "bytes"} of the dataset: from the service's status under a
        service (its catalog), else from the dataset's listing (sample_ranges())."""
        if self._identity is None:
            from ..job import service_available

            if self._socket is not None or service_available():
                d = _client.connect(self._socket).report()["dataset"]
                path = d["path"]
                self._identity = {"path": os.path.realpath(path) if os.path.exists(path)
                                  else path, "samples": int(d["samples"]),
                                  "bytes": int(d["bytes"])}
            elif hasattr(self.dataset, "sample_ranges"):
                ranges = self.dataset.sample_ranges()
                where = (getattr(self.dataset, "real_root", None)
                         or getattr(self.dataset, "_real_manifest", None) or "")
                self._identity = {"path": where, "samples": len(ranges),
                                  "bytes": sum(r[2] for r in ranges)}
            else:
                self._identity = {"path": "", "samples": len(self.dataset), "bytes": None}
        return self._identity

    def state_dict(self) -> Dict[str, Any]:
        """Where the next batch the training loop has not consumed is ("epoch", "step"), and
        what makes the order it is a position in (docs/python.md, "Checkpoints").

        After the last batch of epoch e the position is (e + 1, 0). Load it with
        load_state_dict()."""
        j = self.job
        return {
            "nopfs_state": STATE_FORMAT,
            "epoch": self._pos[0],
            "step": self._pos[1],
            "order": {"seed": j.seed, "samples": j.samples, "ranks": j.ranks, "batch": j.batch,
                      "scheme": j.scheme, "drop_last": j.drop_last},
            "rank": j.rank,
            "epochs": self._epochs,
            "dataset": dict(self.dataset_identity()),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at the state's position; a state of another order (seed, samples, ranks,
        global batch, scheme, drop_last, dataset) raises ValueError naming each difference and
        what to run instead; a state without them (an older nopfs) is resumed with a
        UserWarning."""
        fmt = state.get("nopfs_state")
        if fmt is None:
            warnings.warn(f"nopfs: this loader state ({dict(state)!r}) does not say which order "
                          "it is a position in (saved by an older nopfs): resuming at epoch "
                          f"{state['epoch']} step {state['step']} of this job's order, which is "
                          "right only if the job has the seed, ranks, batch, scheme, drop_last "
                          "and dataset the checkpoint was saved under", UserWarning,
                          stacklevel=2)
            self.resume(state["epoch"], state["step"])
            return
        if not isinstance(fmt, int) or fmt > STATE_FORMAT:
            raise ValueError(f"nopfs: this loader state is of format {fmt!r}, saved by a newer "
                             f"nopfs (this one reads formats up to {STATE_FORMAT}): resume it "
                             "with that nopfs")
        problems = self._differences(state)
        if problems:
            raise ValueError(
                "nopfs: this loader state was saved in another order than this job's, so its "
                f"position (epoch {state['epoch']}, step {state['step']}) would train again on "
                "some samples and skip others: " + "; ".join(problems) + ". Resume it in a job "
                "run as it was, or start this job's training without the loader state")
        saved = (state.get("dataset") or {}).get("path")
        mine = self.dataset_identity().get("path")
        if saved and mine and saved != mine:
            warnings.warn(f"nopfs: this loader state was saved reading {saved}; this job reads "
                          f"{mine}, which has the same samples and bytes: resuming", UserWarning,
                          stacklevel=2)
        self.resume(state["epoch"], state["step"])

    def _differences(self, state: Dict[str, Any]) -> List[str]:
        """What of the order a state records differs from this job's, with what to run."""
        j = self.job
        order = state.get("order") or {}
        out = []
        for what, mine in (("seed", j.seed), ("num_replicas", j.ranks), ("batch", j.batch),
                           ("scheme", j.scheme), ("drop_last", j.drop_last)):
            key = "ranks" if what == "num_replicas" else what
            if key in order and order[key] != mine:
                var, sbatch, run = _JOB_OPTIONS[what]
                name = "ranks" if key == "ranks" else key.replace("_", " ")
                out.append(f"{name} {order[key]!r} (this job's: {mine!r}): run the job with "
                           f"{var}={order[key]!r} (sbatch {sbatch}, nopfs run {run})")
        saved = state.get("dataset") or {}
        mine_ds = self.dataset_identity()
        samples_saved = saved.get("samples", order.get("samples"))
        if samples_saved is not None and samples_saved != j.samples:
            out.append(f"dataset of {samples_saved} samples (this job's: {j.samples}, "
                       f"{mine_ds.get('path') or 'this dataset'}): run it on the dataset the "
                       f"checkpoint was trained on ({saved.get('path') or 'path not recorded'})")
        elif (saved.get("bytes") is not None and mine_ds.get("bytes") is not None
              and saved["bytes"] != mine_ds["bytes"]):
            out.append(f"dataset of {saved['bytes']} bytes (this job's: {mine_ds['bytes']}, "
                       f"{mine_ds.get('path') or 'this dataset'}): its files changed; run it on "
                       f"the dataset the checkpoint was trained on "
                       f"({saved.get('path') or 'path not recorded'})")
        return out

    def order(self, epoch: Optional[int] = None, step: Optional[int] = None) -> Any:
        """The sample ids of a pass (default: the next one), as a numpy array."""
        return self.job.order(self.epoch if epoch is None else epoch,
                              self.start_step if step is None else step)

    def _begin_pass(self) -> Tuple[int, int]:
        """Starts a pass: checks the epoch, warns once on a repeated epoch; (epoch, step)."""
        self._check_epoch(self.epoch)
        if (not self._epoch_chosen and self._last_pass_epoch == self.epoch
                and not self._warned_repeat):
            self._warned_repeat = True
            warnings.warn(f"nopfs: a second pass over epoch {self.epoch} without set_epoch(): "
                          "every pass reads the same order; call sampler.set_epoch(epoch) "
                          "before each epoch", UserWarning, stacklevel=3)
        self._epoch_chosen = False
        self._last_pass_epoch = self.epoch
        start = self.start_step
        self.start_step = 0  # a resume applies to one pass
        self._pos = (self.epoch, start)
        return self.epoch, start

    def _pass_started(self, epoch: int, start: int, batches: int) -> None:
        self._active = [epoch, start, batches, 0]
        if batches == 0:
            self._pass_done()

    def _batch_consumed(self) -> None:
        a = self._active
        if a is None:
            return
        a[3] += 1
        self._pos = (a[0], a[1] + a[3])
        if a[3] >= a[2]:
            self._pass_done()

    def _pass_done(self) -> None:
        if self._active is not None:
            self._pos = (self._active[0] + 1, 0)
            self._active = None

    def _pass_samples(self) -> int:
        """Samples of the pass under way (a DataLoader's), else of the next one."""
        if self._active is not None:
            return len(self.job.order(self._active[0], self._active[1]))
        return len(self.order())

    def __iter__(self) -> Iterator[int]:
        epoch, start = self._begin_pass()
        return iter(self.job.order(epoch, start).tolist())

    def __len__(self) -> int:
        return len(self.order())
