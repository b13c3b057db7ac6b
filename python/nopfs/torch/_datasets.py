"""The datasets nopfs.torch reads (ImageFolder, ManifestDataset), the decodes it has fast
paths for (pil_decode, uint8_tensor), and the hooks a subclass may override."""

import io
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple, Union

import torch.utils.data as tud

from .. import _client
from ..folder import file_identity, list_classes, read_manifest, scan_image_folder_files
from ..job import service_available, service_samples

if TYPE_CHECKING:
    import torch


def pil_decode(data: Any) -> Any:
    """Decodes image bytes (any buffer) to an RGB PIL image, as torchvision's default loader:
    the pixels, mode and size of PIL's Image.open(...).convert("RGB"). A JPEG of one or three
    channels is decoded by nopfs itself, with PIL's libjpeg and PIL's settings, without the GIL
    (nopfs._client.decode_jpeg_rgb); its image's `info` (JFIF, EXIF, ICC metadata) is then
    empty. Everything else is decoded by PIL."""
    from PIL import Image  # imported lazily: only image datasets need PIL

    if _uses_pils_libjpeg(Image):
        got = _client.decode_jpeg_rgb(data, int(Image.MAX_IMAGE_PIXELS or 0))
        if got is not None:
            return Image.frombytes("RGB", got[0], got[1])
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


def _pil_decode_batch(batch: Any) -> Optional[List[Any]]:
    """pil_decode of each sample of a nopfs._client Batch (not released), in one call for the
    JPEGs nopfs decodes (Batch.decode_jpegs: in a stream opened read_once each decode copies
    only the part of its sample it reads, not the whole sample); the others through pil_decode
    of a copy. None where nopfs decodes no JPEG (PIL has no libjpeg): use pil_decode."""
    from PIL import Image

    if not _uses_pils_libjpeg(Image):
        return None
    got = batch.decode_jpegs(int(Image.MAX_IMAGE_PIXELS or 0))
    copies = None
    images = []
    for k, image in enumerate(got):
        if image is None:
            if copies is None:
                copies = batch.tobytes()
            images.append(pil_decode(copies[k]))
        else:
            images.append(Image.frombytes("RGB", image[0], image[1]))
    return images


_pils_libjpeg: Optional[bool] = None


def _uses_pils_libjpeg(image: Any) -> bool:
    """True once nopfs._client decodes JPEG with the libjpeg PIL's C module (of its module Image)
    uses; False if it has none (a PIL built without JPEG)."""
    global _pils_libjpeg
    if _pils_libjpeg is None:
        module = getattr(image.core, "__file__", None)
        _pils_libjpeg = (hasattr(image.core, "jpeg_decoder") and module is not None
                         and _client.use_libjpeg_of(module))
    return _pils_libjpeg


# The sample a loader hands to a subclass's __getitem__, per thread: (dataset, id, bytes, label).
# read(id) returns it (and clears it) instead of reading the file.
_served = threading.local()

_HOOKS = ("override make_item(self, data, label) to change how a sample's bytes and label become "
          "an item, or __getitem__(self, index) calling self.read(index) (or "
          "super().__getitem__(index)) for the sample's bytes and label (docs/python.md, "
          "\"Subclassing a dataset\")")


class _SampleDataset(tud.Dataset):
    """What ImageFolder and ManifestDataset share: an item is made from a sample's bytes and
    label by decode, transform and target_transform.

    The hooks a subclass may override (the loader calls them in every mode):
    - make_item(data, label): the item made from a sample's bytes (a buffer) and label;
    - __getitem__(index): the item of sample `index`, which gets the sample's bytes and label
      from self.read(index) (or super().__getitem__(index)): from the service, or from the file.
    read() itself is not a hook: under a service the loader never reads the files.
    """

    decode: Callable[[Any], Any]
    transform: Optional[Callable[[Any], Any]]
    target_transform: Optional[Callable[[int], Any]]

    def read(self, sample_id: int) -> Tuple[Any, int]:
        """(bytes, label) of a sample: inside the loader, what it delivered for that sample (the
        service's bytes, or in fallback the file's, checked); else read from its file."""
        slot = getattr(_served, "slot", None)
        if slot is not None and slot[0] is self and slot[1] == sample_id:
            _served.slot = None
            return slot[2], slot[3]
        return self._read_file(sample_id)

    def _read_file(self, sample_id: int) -> Tuple[bytes, int]:
        raise NotImplementedError

    def make_item(self, data: Any, label: int) -> Tuple[Any, Any]:
        """(transform(decode(data)), target_transform(label)): one item from a sample's bytes."""
        return self._item_of_decoded(self.decode(data), label)

    def _item_of_decoded(self, x: Any, label: int) -> Tuple[Any, Any]:
        """make_item's item once its decode has made x of the bytes."""
        if self.transform is not None:
            x = self.transform(x)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return x, label

    def __getitem__(self, index: int) -> Any:
        data, label = self.read(index)
        return self.make_item(data, label)


def getitem_overridden(dataset: Any) -> bool:
    """True if a subclass of a nopfs dataset overrides __getitem__ (the loader then calls it)."""
    return (isinstance(dataset, _SampleDataset)
            and type(dataset).__getitem__ is not _SampleDataset.__getitem__)


def check_hooks(dataset: Any) -> None:
    """Raises TypeError if a subclass overrides what the loader cannot honour (read)."""
    if isinstance(dataset, _SampleDataset) and type(dataset).read is not _SampleDataset.read:
        name = type(dataset).__name__
        raise TypeError(f"nopfs: {name} overrides read(), which the loader does not call: the "
                        f"service reads the files itself, so {name}.read would change the items "
                        f"only without a service; {_HOOKS}")


def item_of(dataset: Any, sample_id: int, data: Any, label: int) -> Any:
    """dataset[sample_id] of a subclass whose __getitem__ is its own, given the sample's bytes
    and label (self.read(sample_id) returns them)."""
    _served.slot = (dataset, sample_id, data, label)
    try:
        item = dataset[sample_id]
    finally:
        left, _served.slot = _served.slot, None
    if left is not None:
        name = type(dataset).__name__
        raise TypeError(f"nopfs: {name}.__getitem__({sample_id}) did not call "
                        f"self.read({sample_id}): it reads the sample some other way, which the "
                        f"loader cannot serve; {_HOOKS}")
    return item


def _changed(sample_id: int, path: str, what: str) -> "_client.Error":
    return _client.Error(
        f"nopfs: sample {sample_id} ({path}) {what} since the dataset was listed: the files "
        "read without a service are exactly the ones the job listed at its start, and this one "
        "is not that file any more, so nopfs stops rather than read another one; restore the "
        "file, or start the training again (a new job lists the dataset anew)")


def read_checked(sample_id: int, path: str, offset: int, length: int,
                 ident: Optional[Tuple[int, int, int, int]]) -> bytes:
    """`length` bytes at `offset` of the file at `path`, which must still be the file `ident`
    (file_identity() at the listing): else nopfs.Error naming what changed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _changed(sample_id, path, "is gone") from None
    try:
        st = os.fstat(fd)
        if ident is not None:
            dev, ino, size, mtime = ident
            if (st.st_dev, st.st_ino) != (dev, ino):
                raise _changed(sample_id, path, f"is another file (inode {st.st_ino}, listed "
                               f"as inode {ino})")
            if st.st_size != size:
                raise _changed(sample_id, path, f"is {st.st_size} bytes, listed with {size}")
            if st.st_mtime_ns != mtime:
                raise _changed(sample_id, path, "was modified")
        if offset + length > st.st_size:
            raise _changed(sample_id, path, f"is {st.st_size} bytes, the sample needs bytes "
                           f"{offset}..{offset + length}")
        parts = []
        got = 0
        while got < length:
            chunk = os.pread(fd, length - got, offset + got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        data = b"".join(parts)
    finally:
        os.close(fd)
    if len(data) != length:
        raise _changed(sample_id, path, f"gave {len(data)} bytes at offset {offset}, the sample "
                       f"has {length}")
    return data


class ImageFolder(_SampleDataset):
    """An ImageFolder dataset (root/<class>/<files>) whose samples may come from nopfs.

    Labels are class indices in sorted class order, as torchvision's. `decode(buffer)` turns a
    sample's bytes into the object `transform` receives (default: pil_decode); it must not keep a
    reference to the buffer (copy what it keeps). Indexing (dataset[i]) reads the file directly.
    The root's real path is resolved when the dataset is made (a link re-pointed later changes
    nothing); `samples` lists the files below it when first used, with each file's identity,
    which every later read checks.
    """

    def __init__(self, root: Union[str, "os.PathLike[str]"],
                 transform: Optional[Callable[[Any], Any]] = None,
                 target_transform: Optional[Callable[[int], Any]] = None,
                 decode: Callable[[Any], Any] = pil_decode) -> None:
        self.root = os.path.abspath(root)
        self.real_root = os.path.realpath(self.root)
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.classes = list_classes(self.real_root)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._samples: Optional[List[Tuple[str, int]]] = None
        self._idents: List[Tuple[int, int, int, int]] = []

    @property
    def samples(self) -> List[Tuple[str, int]]:
        """[(path, label)] in sample-id order, below the root's real path (scans the tree on
        first use: the DataLoader does at construction when it may read the files)."""
        if self._samples is None:
            classes, samples, idents = scan_image_folder_files(self.real_root)
            if classes != self.classes:
                raise RuntimeError(f"nopfs: {self.root}: the class directories changed since "
                                   f"the dataset was made: {self.classes} then, {classes} now")
            self._samples, self._idents = samples, idents
        return self._samples

    def sample_ranges(self) -> List[Tuple[str, int, int]]:
        """[(path, offset, length)] in sample-id order: what the service's catalog names."""
        return [(path, 0, ident[2]) for (path, _), ident in zip(self.samples, self._idents)]

    @property
    def targets(self) -> List[int]:
        return [label for _, label in self.samples]

    def __len__(self) -> int:
        # Under a service the catalog already counted the files: do not walk the PFS again.
        if self._samples is None and service_available():
            return service_samples()
        return len(self.samples)

    def check_served(self) -> None:
        """Raises ValueError if the job's service serves another directory than this root."""
        served = os.environ.get("NOPFS_DATASET")
        if served and os.path.isdir(served) and \
                os.path.realpath(served) != os.path.realpath(self.root):
            raise ValueError(f"nopfs: the job's service serves {served}, not {self.root}")

    def _read_file(self, sample_id: int) -> Tuple[bytes, int]:
        """(bytes, label) of a sample, read from its file, checked against the listing."""
        path, label = self.samples[sample_id]
        ident = self._idents[sample_id]
        return read_checked(sample_id, path, 0, ident[2], ident), label


def uint8_tensor(data: Any) -> "torch.Tensor":
    """Decodes a sample's bytes (any buffer) to a 1-D torch.uint8 tensor (a copy)."""
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class ManifestDataset(_SampleDataset):
    """A dataset of files or byte ranges of files, from a manifest or a list of files.

    `source` is a manifest file (the format nopfsd serves, docs/catalog.md: one sample per line,
    `path[<TAB>label[<TAB>offset<TAB>length]]`) or a list of file paths (`labels`: one integer per
    file, default -1: none). Ids are in the catalog's order: (label, path, offset, length), as
    nopfsd numbers the samples of the same manifest. An item is (decode(bytes), label):
    decode=bytes (the default) yields bytes, decode=uint8_tensor a torch.uint8 tensor, any other
    callable whatever it returns (it must copy what it keeps of the buffer); `transform` and
    `target_transform` then apply as in ImageFolder. Indexing (dataset[i]) reads the file directly.
    """

    def __init__(self, source: Union[str, "os.PathLike[str]", Sequence[str]],
                 labels: Optional[Sequence[int]] = None,
                 decode: Callable[[Any], Any] = bytes,
                 transform: Optional[Callable[[Any], Any]] = None,
                 target_transform: Optional[Callable[[int], Any]] = None) -> None:
        self.decode = decode
        self.transform = transform
        self.target_transform = target_transform
        self._samples: Optional[List[Tuple[str, int, int, int]]] = None
        self._idents: List[Tuple[int, int, int, int]] = []
        if isinstance(source, (str, bytes, os.PathLike)):
            if labels is not None:
                raise ValueError("nopfs: ManifestDataset(manifest, labels=...): a manifest "
                                 "carries its labels; pass labels only with a list of files")
            self.manifest: Optional[str] = os.path.abspath(os.fsdecode(source))
            self._real_manifest = os.path.realpath(self.manifest)
            self._files: Optional[List[str]] = None
            self._labels: Optional[List[int]] = None
        else:
            files = [os.path.realpath(os.fsdecode(f)) for f in source]
            if not files:
                raise ValueError("nopfs: ManifestDataset([]): the list of files is empty")
            lab = [-1] * len(files) if labels is None else [int(x) for x in labels]
            if len(lab) != len(files):
                raise ValueError(f"nopfs: ManifestDataset: {len(files)} files but {len(lab)} "
                                 "labels: give one label per file")
            self.manifest = None
            self._files, self._labels = files, lab

    @property
    def samples(self) -> List[Tuple[str, int, int, int]]:
        """[(path, label, offset, length)] in sample-id order (read on first use: the DataLoader
        does at construction when it may read the files), with each file's identity, which every
        later read checks. The manifest's real path is resolved when the dataset is made."""
        if self._samples is None:
            if self.manifest is not None:
                samples = read_manifest(self._real_manifest)
            else:
                assert self._files is not None and self._labels is not None
                rows = sorted((lab, os.fsencode(f), os.stat(f).st_size, f)
                              for f, lab in zip(self._files, self._labels))
                samples = [(f, lab, 0, size) for lab, _, size, f in rows]
            stats = {p: file_identity(os.stat(p)) for p in {s[0] for s in samples}}
            self._samples, self._idents = samples, [stats[s[0]] for s in samples]
        return self._samples

    def sample_ranges(self) -> List[Tuple[str, int, int]]:
        """[(path, offset, length)] in sample-id order: what the service's catalog names."""
        return [(path, offset, length) for path, _, offset, length in self.samples]

    @property
    def targets(self) -> List[int]:
        return [s[1] for s in self.samples]

    def __len__(self) -> int:
        if self._samples is None and self.manifest is not None and service_available():
            return service_samples()
        return len(self.samples)

    def check_served(self) -> None:
        """Raises ValueError if the job's service serves another dataset than this one."""
        served = os.environ.get("NOPFS_DATASET")
        if not served or not os.path.exists(served):
            return
        if self.manifest is not None:
            if os.path.realpath(served) != os.path.realpath(self.manifest):
                raise ValueError(f"nopfs: the job's service serves {served}, not "
                                 f"{self.manifest}")
            return
        if not os.path.isfile(served):
            raise ValueError(f"nopfs: the job's service serves the directory {served}; a list "
                             "of files is served only as a manifest listing the same files "
                             "(sbatch --nopfs=MANIFEST, nopfs run --dataset MANIFEST)")
        theirs = [(os.path.realpath(p), lab, off, n) for p, lab, off, n in read_manifest(served)]
        mine = [(os.path.realpath(p), lab, off, n) for p, lab, off, n in self.samples]
        if theirs != mine:
            raise ValueError(f"nopfs: the job's service serves the manifest {served}, whose "
                             "samples are not these files: pass ManifestDataset(manifest path)")

    def _read_file(self, sample_id: int) -> Tuple[bytes, int]:
        """(bytes, label) of a sample, read from its file, checked against the listing."""
        path, label, offset, length = self.samples[sample_id]
        return read_checked(sample_id, path, offset, length, self._idents[sample_id]), label


def check_against_catalog(dataset: Any, client: Any) -> None:
    """Raises nopfs.Error if the dataset's listing (dataset.sample_ranges()) is not what the
    service's catalog names: the number of samples, their bytes in all, and the path, offset and
    length of 16 samples spread over the ids (the first and the last among them)."""
    ranges = dataset.sample_ranges()
    where = getattr(dataset, "root", None) or getattr(dataset, "manifest", None)
    info = client.report()["dataset"]
    theirs = (int(info["samples"]), int(info["bytes"]))
    mine = (len(ranges), sum(r[2] for r in ranges))
    fix = ("the files read without a service would not be the ones the service serves; "
           "restore the dataset as the job found it, or start a new job (it lists the "
           "dataset anew)")
    if mine != theirs:
        raise _client.Error(f"nopfs: {where} now holds {mine[0]} samples of {mine[1]} bytes, the "
                            f"job's catalog {theirs[0]} of {theirs[1]} (listed when the job "
                            f"started): the dataset changed since; {fix}")
    n = len(ranges)
    for sample_id in sorted({(n - 1) * k // 15 for k in range(16)}):
        d = client.describe(sample_id)
        got = (d["path"], int(d["offset"]), int(d["length"]))
        if got != tuple(ranges[sample_id]):
            raise _client.Error(
                f"nopfs: sample {sample_id} is {got[0]} (bytes {got[1]}..{got[1] + got[2]}) in "
                f"the job's catalog, but {ranges[sample_id][0]} (bytes {ranges[sample_id][1]}.."
                f"{ranges[sample_id][1] + ranges[sample_id][2]}) below {where} now: the dataset's "
                f"path leads elsewhere or its files changed since the job started; {fix}")
