"""PyTorch integration: a script using torchvision's ImageFolder + DistributedSampler + DataLoader
reads through nopfs by changing its imports:

    from nopfs.torch import DataLoader, DistributedSampler, ImageFolder

- ImageFolder(root, transform=..., target_transform=...): the dataset. Its samples are decoded
  from bytes (PIL, RGB, like torchvision's default loader) wherever they come from.
- ManifestDataset(manifest or [files], decode=bytes, ...): any list of files or byte ranges (the
  manifest nopfsd serves), yielding bytes, tensors (decode=uint8_tensor) or what decode returns.
- DistributedSampler(dataset, ...): DistributedSampler semantics (set_epoch, num_samples,
  total_size, ...) whose parameters are the job's (NOPFS_*: an argument that contradicts them
  raises) and whose order is the service's plan; `epochs` is the job's, and an epoch past them
  raises at once; state_dict()/load_state_dict() checkpoint the position of the next batch.
- DataLoader(dataset, batch_size=..., sampler=..., num_workers=...): a torch DataLoader over
  StreamDataset, an IterableDataset: each worker process connects on its own and opens its share
  of the rank's stream (batches w, w+W, ... of the epoch), and the DataLoader's round-robin over
  workers puts the batches back into the planned order. Transforms run in the workers.
  state_dict() counts the batches the training loop received (as torchdata's
  StatefulDataLoader), and load_state_dict() resumes at exactly the next one.

Why iterable and not map-style: the service delivers a stream in a fixed order and each sample
once; a map-style dataset would receive indices from the main process and could only check that
they arrive in the order the stream has them. As an IterableDataset each worker owns its stream
and nothing has to agree at run time: the order is exact by construction.

Without a service (NOPFS_SOCKET unset) the DataLoader raises nopfs.UnavailableError, unless the
fallback is asked for (fallback=True or NOPFS_FALLBACK=1): then each worker reads the files itself,
in the same order (the planner's, computed locally), with the same decoding. A service that dies
during a pass (killed, crashed) is noticed within a second: with the fallback asked for, each
worker warns and reads the rest of its share from the files, in the same order, from where its
stream stopped; without it, the DataLoader raises nopfs.UnavailableError.
"""

from ._batches import read_batch
from ._datasets import ImageFolder, ManifestDataset, pil_decode, uint8_tensor
from ._loader import DataLoader
from ._sampler import DistributedSampler, job_epochs
from ._stream_dataset import StreamDataset
from ._streams import close_streams

__all__ = [
    "DataLoader",
    "DistributedSampler",
    "ImageFolder",
    "ManifestDataset",
    "StreamDataset",
    "close_streams",
    "job_epochs",
    "pil_decode",
    "read_batch",
    "uint8_tensor",
]

# The public names keep the module users import them from (what repr() and pickle name), whichever
# module of the package defines them.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
