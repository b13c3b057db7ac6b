"""The ImageFolder scan, as nopfsd's catalog does it (service/catalog/catalog_scan.cc,
docs/catalog.md).

A sample's id is its index in the (label, relative path) order: classes are the root's visible
(not dot-) directories in byte order, labelled 0, 1, ...; a class's samples are every visible
regular file below its directory (followed through symbolic links, not around a cycle), ordered by
their path relative to the root, compared as bytes. torchvision's ImageFolder orders the same way
but keeps only image extensions; nopfs keeps every file.

Used by the fallback reader (nopfs.torch without a service), which must read the files in the
service's order, id for id.
"""

import os
import stat
from typing import List, Tuple


def _visible(name: str) -> bool:
    return not name.startswith(".")


def list_classes(root: str) -> List[str]:
    """The class directory names of an ImageFolder root, sorted as bytes."""
    names = []
    for name in os.listdir(root):
        if not _visible(name):
            continue
        try:
            st = os.stat(os.path.join(root, name))
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            names.append(name)
    names.sort(key=os.fsencode)
    if not names:
        raise ValueError(f"{root}: no class directories; an ImageFolder dataset holds one "
                         "directory per class (root/<class>/<files>)")
    return names


def _walk(directory: str, rel_prefix: str, ancestors: Tuple[Tuple[int, int], ...],
          out: List[Tuple[str, os.stat_result]]) -> None:
    st = os.stat(directory)
    ident = (st.st_dev, st.st_ino)
    if ident in ancestors:
        return  # a cycle through a symbolic link
    ancestors = ancestors + (ident,)
    for name in os.listdir(directory):
        if not _visible(name):
            continue
        path = os.path.join(directory, name)
        try:
            sst = os.stat(path)
        except FileNotFoundError:
            continue  # gone since the listing, or a dangling link
        if stat.S_ISDIR(sst.st_mode):
            _walk(path, rel_prefix + name + "/", ancestors, out)
        elif stat.S_ISREG(sst.st_mode):
            out.append((rel_prefix + name, sst))


def file_identity(st: os.stat_result) -> Tuple[int, int, int, int]:
    """(device, inode, size, modification time in ns): what says a file is still the one listed."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def scan_image_folder_files(root: str) -> Tuple[List[str], List[Tuple[str, int]],
                                                List[Tuple[int, int, int, int]]]:
    """scan_image_folder's (classes, samples), and each sample's file_identity() at the scan."""
    root = os.path.abspath(root)
    classes = list_classes(root)
    rst = os.stat(root)
    samples: List[Tuple[str, int]] = []
    idents: List[Tuple[int, int, int, int]] = []
    for label, cls in enumerate(classes):
        rel: List[Tuple[str, os.stat_result]] = []
        _walk(os.path.join(root, cls), cls + "/", ((rst.st_dev, rst.st_ino),), rel)
        rel.sort(key=lambda e: os.fsencode(e[0]))
        samples.extend((os.path.join(root, r), label) for r, _ in rel)
        idents.extend(file_identity(st) for _, st in rel)
    return classes, samples, idents


def scan_image_folder(root: str) -> Tuple[List[str], List[Tuple[str, int]]]:
    """Returns (classes, samples): samples[i] = (absolute path, label) of sample id i."""
    classes, samples, _ = scan_image_folder_files(root)
    return classes, samples


def read_manifest(path):
    """Returns samples[i] = (absolute path, label, offset, length) of a manifest's sample id i.

    The format nopfsd's catalog reads (docs/catalog.md): one sample per line, TAB-separated
    `path[<TAB>label[<TAB>offset<TAB>length]]`, paths relative to the manifest's directory, label
    an integer >= 0 or `-` (-1: none); a whole file's length is its size; blank and `#` lines
    skipped. Ids are in the catalog's order: (label, relative path as bytes, offset, length).
    """
    path = os.path.abspath(path)
    base = os.path.dirname(path)
    samples = []
    seen = set()
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = raw.rstrip(b"\n")
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line or line.startswith(b"#"):
                continue
            fields = line.split(b"\t")
            where = f"{path} line {lineno}"
            if len(fields) not in (1, 2, 4):
                raise ValueError(f"{where}: {len(fields)} fields: write path, path<TAB>label or "
                                 "path<TAB>label<TAB>offset<TAB>length")
            rel = os.fsdecode(fields[0])
            parts = rel.split("/")
            if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"{where}: bad path {rel!r}: write a path relative to the "
                                 "manifest's directory, without '.', '..' or empty components")
            label = -1
            if len(fields) >= 2 and fields[1] != b"-":
                try:
                    label = int(fields[1])
                except ValueError:
                    label = -1
                    bad = True
                else:
                    bad = label < 0
                if bad:
                    raise ValueError(f"{where}: bad label {os.fsdecode(fields[1])!r}: write an "
                                     "integer >= 0, or - for none")
            offset, length = 0, None
            if len(fields) == 4:
                try:
                    offset, length = int(fields[2]), int(fields[3])
                except ValueError:
                    offset, length = -1, 0
                if offset < 0 or length < 1:
                    raise ValueError(f"{where}: bad range: write offset >= 0 and length >= 1")
            key = (rel, label, offset, length)
            if key in seen:
                raise ValueError(f"{where}: {rel} is listed twice with the same label and range")
            seen.add(key)
            full = os.path.join(base, rel)
            if length is None:
                length = os.stat(full).st_size
            samples.append((label, os.fsencode(rel), offset, length, full))
    if not samples:
        raise ValueError(f"{path}: the manifest lists no samples")
    samples.sort(key=lambda s: s[:4])  # the catalog's id order (docs/catalog.md, Ordering)
    return [(full, label, offset, length) for label, _, offset, length, full in samples]
