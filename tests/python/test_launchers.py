"""One process per rank: the rank under torchrun (nopfs.job.env_rank) and nopfsd refusing a
second process's open of a rank's stream (docs/user.md, "Launchers"; docs/wire.md)."""

import os
import signal
import subprocess
import sys
import time

import pytest

import nopfs
from nopfs.job import env_rank
from conftest import BIN, JOB, nopfs as run_nopfs

# A process that opens a rank's stream: prints "opened" or "refused: <message>", then reads
# `hold` samples and waits for stdin to close (or is killed) before it exits.
OPENER = r"""
import sys, nopfs
sock, rank, epoch, epochs, owner, hold = sys.argv[1], *map(int, sys.argv[2:])
try:
    stream = nopfs.connect(sock).open(rank, epoch=epoch, epochs=epochs, owner=owner)
except nopfs.Error as e:
    print("refused:", e, flush=True)
    sys.exit(0)
print("opened", flush=True)
for _ in range(hold):
    stream.next(timeout=30).release()
print("read", flush=True)
sys.stdin.read()
"""


def opener(service, rank, epoch=0, epochs=1, owner=0, hold=0):
    p = subprocess.Popen([sys.executable, "-c", OPENER, service.socket, str(rank), str(epoch),
                          str(epochs), str(owner), str(hold)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    return p, first


def finish(p):
    # Not communicate(): it reads the pipe's descriptor and would miss what readline() buffered.
    p.stdin.close()  # the opener exits
    out, err = p.stdout.read(), p.stderr.read()
    p.wait(timeout=60)
    assert p.returncode == 0, err
    return out


def ids(stream):
    out = []
    for s in stream:
        with s:
            out.append(s.id)
    return out


def refused_owners(client):
    return client.report()["refusals"]["owners"]


def test_a_second_process_is_refused_and_the_first_reads_on(service):
    epoch_len = len(service.stream(0)) // JOB["epochs"]
    want = service.stream(0)[:epoch_len]
    client = nopfs.connect(service.socket)
    refused = refused_owners(client)
    with client.open(0, epoch=0, epochs=1) as first:
        head = first.next(timeout=30)
        got = [head.id]
        head.release()
        t0 = time.monotonic()
        p, line = opener(service, 0)
        assert line.startswith("refused: "), line
        assert (f"rank 0's stream is already open by pid {os.getpid()} (epoch 0); each process "
                "needs its own rank") in line
        assert "--nopfs-ranks-per-node" in line
        assert time.monotonic() - t0 >= 1.5  # it waited for the first stream to close
        finish(p)
        # Another epoch of the same rank, and another rank, are not this stream's.
        p, line = opener(service, 0, epoch=1)
        assert line == "opened\n", line
        finish(p)
        p, line = opener(service, 1)
        assert line == "opened\n", line
        finish(p)
        # A DataLoader worker names the process whose rank it reads: accepted.
        p, line = opener(service, 0, owner=os.getpid())
        assert line == "opened\n", line
        finish(p)
        # The first opener was not harmed: the rest of its epoch, in order.
        got += ids(first)
    assert got == want
    assert refused_owners(client) == refused + 1
    # Closed: another process may read the rank again (a restart).
    p, line = opener(service, 0, hold=3)
    assert line == "opened\n", line
    assert finish(p) == "read\n"


def test_a_rank_reopened_right_after_its_reader_was_killed(service):
    p, line = opener(service, 1, epochs=0, hold=2)
    assert line == "opened\n", line
    assert p.stdout.readline() == "read\n"
    p.send_signal(signal.SIGKILL)
    p.wait()
    # The restarted process opens at once: the dead one's streams close with its connection.
    client = nopfs.connect(service.socket)
    with client.open(1, epoch=0, epochs=1) as stream:
        assert ids(stream) == service.stream(1)[: len(service.stream(1)) // JOB["epochs"]]


TORCHRUN_SCRIPT = r"""
import os, sys
from nopfs.torch import DataLoader, DistributedSampler, ImageFolder
root, out = sys.argv[1], sys.argv[2]
by_bytes = {}
for i, (path, _) in enumerate(ImageFolder(root).samples):
    with open(path, "rb") as fh:
        by_bytes[fh.read()] = i
dataset = ImageFolder(root, decode=bytes)
sampler = DistributedSampler(dataset, rank=int(os.environ["RANK"]),
                             num_replicas=int(os.environ["WORLD_SIZE"]))
loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2,
                    collate_fn=lambda b: b)
got = [by_bytes[data] for batch in loader for data, _ in batch]
with open(f"{out}.{os.environ['RANK']}", "w") as fh:
    fh.write(f"{sampler.rank}\n" + " ".join(map(str, got)) + "\n")
"""


def torchrun_argv(script, *args, port):
    # Debian's torch 1.13 under Python 3.11: Std.from_str("0") finds no member (IntFlag no longer
    # iterates the zero member), so --redirects and --tee must not be 0.
    return [sys.executable, "-m", "torch.distributed.run", "--redirects=2", "--tee=2",
            "--nproc_per_node=2", "--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1",
            f"--master_port={port}", script, *args]


def test_torchrun_processes_read_distinct_ranks(images, tmp_path):
    """One Slurm task per node that runs torchrun --nproc_per_node=2, as the plugin sets it up
    (--ntasks-per-node=1 --nopfs-ranks-per-node=2): `nopfs run --ranks 2` starts two tasks; task
    0 runs torchrun, task 1 exits. Each torchrun process reads its own rank, through
    DataLoader workers; together they read the epoch exactly as `nopfs stream` prints it."""
    root, paths = images
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    out = tmp_path / "out"
    cmd = " ".join(torchrun_argv(str(script), root, str(out), port=29651))
    p = subprocess.run(
        [os.path.join(BIN, "nopfs"), "run", "--dataset", root, "--ranks", "2", "--seed", "7",
         "--epochs", "1", "--batch", "8", "--scheme", "strided", "--run-dir",
         str(tmp_path / "run"), "--", "sh", "-c",
         f'if [ "$NOPFS_LOCAL_RANK" = 0 ]; then exec {cmd}; fi'],
        capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    seen = []
    for rank in (0, 1):
        lines = (tmp_path / f"out.{rank}").read_text().splitlines()
        assert int(lines[0]) == rank
        got = [int(x) for x in lines[1].split()]
        want = run_nopfs("stream", "--seed", 7, "--samples", len(paths), "--epochs", 1,
                         "--ranks", 2, "--rank", rank, "--batch", 8, "--scheme", "strided")
        assert got == [int(x) for x in want.stdout.split()]
        seen += got
    assert sorted(seen) == list(range(len(paths)))


LAUNCHER = {"NOPFS_RANK": "4", "NOPFS_LOCAL_RANK": "0", "NOPFS_RANKS": "8",
            "NOPFS_RANKS_PER_NODE": "4", "NOPFS_NODE": "1", "NOPFS_NODES": "2"}


def set_env(monkeypatch, **env):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE") + tuple(LAUNCHER):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, str(v))


def test_the_rank_under_a_launcher(monkeypatch):
    # srun python: NOPFS_RANK; a RANK and WORLD_SIZE exported too must agree with it.
    set_env(monkeypatch, **LAUNCHER)
    assert env_rank() == 4
    set_env(monkeypatch, **LAUNCHER, RANK=4, WORLD_SIZE=8)
    assert env_rank() == 4
    # torchrun --nproc_per_node=4 in the one task of node 1: 1 x 4 + 0 x 4 + LOCAL_RANK.
    for local in range(4):
        set_env(monkeypatch, **LAUNCHER, LOCAL_RANK=local, LOCAL_WORLD_SIZE=4, RANK=4 + local,
                WORLD_SIZE=8)
        assert env_rank() == 4 + local
        assert nopfs.Job.from_env(samples=100).rank == 4 + local
    # Two tasks per node, two processes each: task 1 of node 1.
    set_env(monkeypatch, **{**LAUNCHER, "NOPFS_LOCAL_RANK": "1", "NOPFS_RANK": "5"},
            LOCAL_RANK=1, LOCAL_WORLD_SIZE=2, RANK=7, WORLD_SIZE=8)
    assert env_rank() == 7
    # LOCAL_* exported from SLURM_LOCALID for one process per task: the tasks themselves.
    set_env(monkeypatch, **{**LAUNCHER, "NOPFS_LOCAL_RANK": "3", "NOPFS_RANK": "7"},
            LOCAL_RANK=3, LOCAL_WORLD_SIZE=4, RANK=7, WORLD_SIZE=8)
    assert env_rank() == 7
    # No nopfs environment: nothing to say (torch's own variables are the sampler's default).
    set_env(monkeypatch, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2, RANK=1, WORLD_SIZE=2)
    assert env_rank() is None


@pytest.mark.parametrize("env,message", [
    # torchrun --nproc_per_node=4 in a job submitted without --nopfs-ranks-per-node.
    ({**LAUNCHER, "NOPFS_RANKS": "2", "NOPFS_RANKS_PER_NODE": "1", "NOPFS_RANK": "1",
      "LOCAL_RANK": 1, "LOCAL_WORLD_SIZE": 4, "RANK": 5, "WORLD_SIZE": 8},
     "LOCAL_WORLD_SIZE=4 processes per task do not divide the job's NOPFS_RANKS_PER_NODE=1 "
     "ranks per node; submit with --nopfs-ranks-per-node = tasks per node x 4, e.g. "
     "--nopfs-ranks-per-node=4 with --ntasks-per-node=1"),
    # Two tasks per node each running torchrun --nproc_per_node=2, ranks per node left at 2.
    ({**LAUNCHER, "NOPFS_RANKS": "4", "NOPFS_RANKS_PER_NODE": "2", "NOPFS_LOCAL_RANK": "1",
      "NOPFS_RANK": "3", "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 2, "RANK": 6, "WORLD_SIZE": 8},
     "this is Slurm task NOPFS_LOCAL_RANK=1 of its node, but NOPFS_RANKS_PER_NODE=2 with "
     "LOCAL_WORLD_SIZE=2 processes per task leaves room for 1 tasks per node"),
    # torchrun --nnodes=4 where the job has 2 nodes of 4 ranks.
    ({**LAUNCHER, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 4, "RANK": 4, "WORLD_SIZE": 16},
     "the launcher's WORLD_SIZE=16 is not the job's NOPFS_RANKS=8: every training process must "
     "be one nopfs rank; submit with --nopfs-ranks-per-node=8"),
    # c10d rendezvous numbered node 1's agent first.
    ({**LAUNCHER, "LOCAL_RANK": 2, "LOCAL_WORLD_SIZE": 4, "RANK": 2, "WORLD_SIZE": 8},
     "the launcher's RANK=2 is not this process's nopfs rank 6 (NOPFS_NODE=1 x "
     "NOPFS_RANKS_PER_NODE=4 + NOPFS_LOCAL_RANK=0 x LOCAL_WORLD_SIZE=4 + LOCAL_RANK=2); run one "
     "torchrun per Slurm task with its static rendezvous (the default) and "
     "--nnodes=$SLURM_NTASKS --node_rank=$SLURM_PROCID"),
    ({**LAUNCHER, "LOCAL_RANK": 4, "LOCAL_WORLD_SIZE": 4},
     "LOCAL_RANK=4 is out of range for LOCAL_WORLD_SIZE=4"),
    # srun or nopfs run, one process per task, with a RANK the script or a library (accelerate,
    # Lightning) exported otherwise than the job numbers its processes.
    ({**LAUNCHER, "RANK": 0},
     "RANK=0 in the environment is not this process's nopfs rank 4 (NOPFS_RANK: one process per "
     "Slurm task, numbered by the job); write RANK=$NOPFS_RANK (or leave RANK unset"),
    ({**LAUNCHER, "RANK": 4, "WORLD_SIZE": 4},
     "WORLD_SIZE=4 in the environment is not the job's NOPFS_RANKS=8: every training process "
     "must be one nopfs rank; write WORLD_SIZE=$NOPFS_RANKS (or leave it unset)"),
    # LOCAL_RANK alone (no LOCAL_WORLD_SIZE): one process per task as far as nopfs can tell.
    ({**LAUNCHER, "LOCAL_RANK": 0, "RANK": 5},
     "RANK=5 in the environment is not this process's nopfs rank 4"),
    ({"NOPFS_RANK": "0", "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 2},
     "LOCAL_RANK and LOCAL_WORLD_SIZE are set (a launcher started this process) but "
     "NOPFS_RANKS, NOPFS_RANKS_PER_NODE, NOPFS_NODE, NOPFS_LOCAL_RANK are not"),
])
def test_a_launcher_that_contradicts_the_job_is_an_error(monkeypatch, env, message):
    set_env(monkeypatch, **env)
    with pytest.raises(ValueError) as e:
        env_rank()
    assert message in str(e.value)
    assert 'docs/user.md, "Launchers"' in str(e.value)
    with pytest.raises(ValueError):
        nopfs.Job.from_env(samples=100)
