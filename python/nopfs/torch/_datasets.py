"""The datasets nopfs.torch reads (ImageFolder, ManifestDataset) and the decodes it has fast
paths for (pil_decode, uint8_tensor)."""

import io
import os
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Tuple, Union

import torch.utils.data as tud

from ..folder import list_classes, read_manifest, scan_image_folder
from ..job import service_available, service_samples

if TYPE_CHECKING:
    import torch


def pil_decode(data: Any) -> Any:
    """Decodes image bytes (any buffer) to an RGB PIL image, as torchvision's default loader."""
    from PIL import Image  # imported lazily: only image datasets need PIL

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


class _SampleDataset(tud.Dataset):
    """What ImageFolder and ManifestDataset share: an item is made from a sample's bytes and
    label by decode, transform and target_transform; `read(i)` (the subclass's) gives them."""

    decode: Callable[[Any], Any]
    transform: Optional[Callable[[Any], Any]]
    target_transform: Optional[Callable[[int], Any]]

    def read(self, sample_id: int) -> Tuple[bytes, int]:
        raise NotImplementedError

    def make_item(self, data: Any, label: int) -> Tuple[Any, Any]:
        """(transform(decode(data)), target_transform(label)): one item from a sample's bytes."""
        x = self.decode(data)
        if self.transform is not None:
            x = self.transform(x)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return x, label

    def __getitem__(self, index: int) -> Tuple[Any, Any]:
        data, label = self.read(index)
        return self.make_item(data, label)


class ImageFolder(_SampleDataset):
    """An ImageFolder dataset (root/<class>/<files>) whose samples may come from nopfs.

    Labels are class indices in sorted class order, as torchvision's. `decode(buffer)` turns a
    sample's bytes into the object `transform` receives (default: pil_decode); it must not keep a
    reference to the buffer (copy what it keeps). Indexing (dataset[i]) reads the file directly.
    """

    def __init__(self, root: Union[str, "os.PathLike[str]"],
                 transform: Optional[Callable[[Any], Any]] = None,
                 target_transform: Optional[Callable[[int], Any]] = None,
                 decode: Callable[[Any], Any] = pil_decode) -> None:
        self.root = os.path.abspath(root)
        self.transform = transform
        self.target_transform = target_transform
        self.decode = decode
        self.classes = list_classes(self.root)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._samples: Optional[List[Tuple[str, int]]] = None

    @property
    def samples(self) -> List[Tuple[str, int]]:
        """[(path, label)] in sample-id order (scans the tree on first use)."""
        if self._samples is None:
            classes, samples = scan_image_folder(self.root)
            if classes != self.classes:
                raise RuntimeError(f"nopfs: {self.root}: the class directories changed")
            self._samples = samples
        return self._samples

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

    def read(self, sample_id: int) -> Tuple[bytes, int]:
        """(bytes, label) of a sample, read from its file."""
        path, label = self.samples[sample_id]
        with open(path, "rb") as fh:
            return fh.read(), label


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
        if isinstance(source, (str, bytes, os.PathLike)):
            if labels is not None:
                raise ValueError("nopfs: ManifestDataset(manifest, labels=...): a manifest "
                                 "carries its labels; pass labels only with a list of files")
            self.manifest: Optional[str] = os.path.abspath(os.fsdecode(source))
            self._files: Optional[List[str]] = None
            self._labels: Optional[List[int]] = None
        else:
            files = [os.path.abspath(os.fsdecode(f)) for f in source]
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
        """[(path, label, offset, length)] in sample-id order (read on first use)."""
        if self._samples is None:
            if self.manifest is not None:
                self._samples = read_manifest(self.manifest)
            else:
                assert self._files is not None and self._labels is not None
                rows = sorted((lab, os.fsencode(f), os.stat(f).st_size, f)
                              for f, lab in zip(self._files, self._labels))
                self._samples = [(f, lab, 0, size) for lab, _, size, f in rows]
        return self._samples

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

    def read(self, sample_id: int) -> Tuple[bytes, int]:
        """(bytes, label) of a sample, read from its file."""
        path, label, offset, length = self.samples[sample_id]
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(length)
        if len(data) != length:
            raise OSError(f"{path}: {len(data)} bytes at offset {offset}, the sample has {length}")
        return data, label
