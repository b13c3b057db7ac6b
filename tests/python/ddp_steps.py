"""One rank of a real DistributedDataParallel-style run (torch.distributed, gloo, CPU) over the
nopfs service, started by `nopfs run`: every step all-reduces (epoch, step, 1) with the other
ranks. Ranks that run different numbers of steps pair a step with another rank's different step
(the sums disagree) or wait forever for a partner (the collective times out); either fails."""

import datetime
import os
import sys

import torch
import torch.distributed as dist

from nopfs.torch import DataLoader
from nopfs.torch import DistributedSampler
from nopfs.torch import ImageFolder


def main():
    data, per_rank_batch = sys.argv[1], int(sys.argv[2])
    rank, world = int(os.environ["NOPFS_RANK"]), int(os.environ["NOPFS_RANKS"])
    epochs = int(os.environ["NOPFS_EPOCHS"])
    drop_last = os.environ.get("NOPFS_DROP_LAST") == "1"
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=30))
    torch.set_num_threads(1)
    dataset = ImageFolder(data, transform=lambda img: torch.zeros(1))
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank,
                                 seed=int(os.environ["NOPFS_SEED"]), drop_last=drop_last)
    loader = DataLoader(dataset, batch_size=per_rank_batch, sampler=sampler, num_workers=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        steps = samples = 0
        for step, (x, _) in enumerate(loader):
            assert len(x) > 0, f"rank {rank} epoch {epoch} step {step}: an empty batch"
            t = torch.tensor([epoch, step, 1], dtype=torch.int64)
            dist.all_reduce(t)
            want = [epoch * world, step * world, world]
            assert t.tolist() == want, (f"rank {rank} epoch {epoch} step {step}: all_reduce "
                                        f"gave {t.tolist()}, want {want}: ranks are out of step")
            steps += 1
            samples += len(x)
        counts = torch.tensor([steps], dtype=torch.int64)
        lo, hi = counts.clone(), counts.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        assert lo.item() == hi.item() == steps, f"steps differ across ranks: {lo.item()}..{hi.item()}"
        sys.stdout.write(f"rank {rank} epoch {epoch}: {steps} steps, {samples} samples\n")
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
