"""The ImageFolder scan, as nopfsd's catalog does it (service/catalog_scan.cc, docs/catalog.md).

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
          out: List[str]) -> None:
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
            out.append(rel_prefix + name)


def scan_image_folder(root: str) -> Tuple[List[str], List[Tuple[str, int]]]:
    """Returns (classes, samples): samples[i] = (absolute path, label) of sample id i."""
    root = os.path.abspath(root)
    classes = list_classes(root)
    rst = os.stat(root)
    samples: List[Tuple[str, int]] = []
    for label, cls in enumerate(classes):
        rel: List[str] = []
        _walk(os.path.join(root, cls), cls + "/", ((rst.st_dev, rst.st_ino),), rel)
        rel.sort(key=os.fsencode)
        samples.extend((os.path.join(root, r), label) for r in rel)
    return classes, samples
