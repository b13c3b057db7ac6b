"""nopfs: read a training rank's samples from the node's nopfs service (nopfsd) without copying.

    import nopfs
    client = nopfs.connect()                  # $NOPFS_SOCKET, set by `nopfs run` / sbatch --nopfs
    with client.open(rank=0) as stream:       # or open(rank, epoch=e, step=s) to resume
        for sample in stream:                 # in the planned order
            with sample:                      # release() on exit
                use(sample.id, sample.label, sample.data)  # data: read-only memoryview, no copy

A Sample's views (sample.data, sample.numpy()) are valid until sample.release(); release() raises
BufferError while a view is still alive (copy with sample.tobytes() to keep the bytes). A sample
the service could not read raises SampleError (a subclass of Error) whose message names the sample
id and its path; the stream goes on with the next sample.

PyTorch users: nopfs.torch (ImageFolder, ManifestDataset, DistributedSampler, DataLoader).
Job parameters come from the NOPFS_* environment (nopfs.Job.from_env). See docs/python.md.

nopfs.__version__ is the project's version (CMakeLists.txt's project()); the package is typed
(py.typed; the extension's types are in _client.pyi).
"""

from ._client import (
    Client,
    Error,
    Sample,
    SampleError,
    Stream,
    TimeoutError,
    UnavailableError,
    connect,
    epoch_order,
    rank_epoch_length,
    step_begin,
    steps_per_epoch,
)
from ._version import __version__
from .folder import scan_image_folder
from .job import Job, fallback_requested, service_available, service_samples

__all__ = [
    "Client",
    "Error",
    "Job",
    "Sample",
    "SampleError",
    "Stream",
    "TimeoutError",
    "UnavailableError",
    "__version__",
    "connect",
    "epoch_order",
    "fallback_requested",
    "rank_epoch_length",
    "scan_image_folder",
    "service_available",
    "service_samples",
    "step_begin",
    "steps_per_epoch",
]
