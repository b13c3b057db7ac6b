"""One rank of a real two-process gloo run under `nopfs run`: makes a nopfs DistributedSampler
with torch.distributed initialised as argv[2] says, and prints what happened.

  agree    the process group numbers the processes as the job does (NOPFS_RANK, NOPFS_RANKS)
  swapped  the process group's ranks are the job's swapped (rank 1 - NOPFS_RANK)
  explicit swapped, and the sampler is given the job's rank and replicas explicitly (a group
           that is not the data-parallel one)
"""

import datetime
import os
import sys

import torch.distributed as dist

from nopfs.torch import DataLoader, DistributedSampler, ImageFolder


def say(line):
    sys.stdout.write(line + "\n")  # one write: the two ranks share the output
    sys.stdout.flush()


def main():
    data, mode = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["NOPFS_RANK"]), int(os.environ["NOPFS_RANKS"])
    group_rank = rank if mode == "agree" else world - 1 - rank
    dist.init_process_group("gloo", rank=group_rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    try:
        dataset = ImageFolder(data, decode=bytes)
        if mode == "explicit":
            sampler = DistributedSampler(dataset, num_replicas=world, rank=rank)
        else:
            sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=list)
        samples = sum(len(b) for b in loader)
        say(f"rank {rank} group {group_rank}: sampler rank {sampler.rank} of "
            f"{sampler.num_replicas}, {samples} samples")
    except ValueError as e:
        say(f"rank {rank} group {group_rank}: refused: {e}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
