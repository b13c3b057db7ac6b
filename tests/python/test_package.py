"""The package as installed: where it comes from, its version, its typing files, and the stub
(_client.pyi) against the compiled extension's own signatures."""

import ast
import inspect
import os
import re

import nopfs
import nopfs._client as ext

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.dirname(os.path.abspath(nopfs.__file__))


def test_the_package_under_test_is_the_expected_install():
    # run_tests.py names it: the build tree's copy, or a venv's site-packages (wheel_test.py).
    expected = os.environ.get("NOPFS_PACKAGE_DIR")
    assert expected, "run the tests through tests/python/run_tests.py, which sets NOPFS_PACKAGE_DIR"
    assert PACKAGE == os.path.realpath(expected) or PACKAGE == os.path.abspath(expected)
    assert os.path.dirname(os.path.abspath(ext.__file__)) == PACKAGE


def test_version_is_the_cmake_projects():
    with open(os.path.join(SOURCE, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"^project\(nopfs\s+VERSION\s+([0-9.]+)", f.read(), re.MULTILINE)
    assert m is not None
    assert nopfs.__version__ == m.group(1)


def test_typing_files_sit_beside_the_package():
    assert os.path.isfile(os.path.join(PACKAGE, "py.typed"))
    assert os.path.isfile(os.path.join(PACKAGE, "_client.pyi"))


def _split_params(text):
    """'a: Dict[str, int] = 1, b: int' -> ['a: Dict[str, int] = 1', 'b: int'] (top-level commas)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _compiled_params(obj, name):
    """[(name, default or None)] from pybind11's signature line, without `self`."""
    doc = obj.__doc__ or ""
    m = re.match(rf"{re.escape(name)}\((.*)\) -> ", doc.splitlines()[0] if doc else "")
    assert m, f"{name}: no signature in the extension's docstring: {doc!r}"
    out = []
    for p in _split_params(m.group(1)):
        pname = p.split(":")[0].strip()
        default = p.split(" = ", 1)[1].strip() if " = " in p else None
        out.append((pname, default))
    return [p for p in out if p[0] != "self"]


def _stub_params(fn):
    a = fn.args
    out = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    for arg, default in zip(positional, defaults):
        out.append((arg.arg, default))
    if a.vararg:
        out.append(("*" + a.vararg.arg, None))
    return [p for p in out if p[0] != "self"]


def _is_property(fn):
    return any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)


def test_the_stub_matches_the_extension():
    with open(os.path.join(PACKAGE, "_client.pyi"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    stub = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    public = {n for n in dir(ext) if not n.startswith("_")}
    assert set(stub) == public, "the stub and the extension define different names"

    for name, node in stub.items():
        obj = getattr(ext, name)
        if isinstance(node, ast.FunctionDef):
            assert _stub_params(node) == _compiled_params(obj, name), name
            continue
        assert inspect.isclass(obj), name
        bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
        if issubclass(obj, BaseException):
            assert bases == [b.__name__ for b in obj.__bases__], name
            continue
        members = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
        compiled = {n for n in vars(obj) if not n.startswith("_")}
        assert compiled <= set(members), f"{name}: the stub lacks {compiled - set(members)}"
        for mname, fn in members.items():
            assert mname in vars(obj), f"{name}.{mname} is in the stub, not in the extension"
            attr = vars(obj)[mname]
            if _is_property(fn):
                assert isinstance(attr, property), f"{name}.{mname} is not a property"
            else:
                assert _stub_params(fn) == _compiled_params(attr, mname), f"{name}.{mname}"


# nopfs.torch's public names: what a training script may import. A name added or removed here is
# a change of the API (docs/python.md).
TORCH_PUBLIC = [
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


def test_nopfs_torch_public_surface():
    import pickle

    import nopfs.torch as nt

    assert sorted(nt.__all__) == TORCH_PUBLIC
    public = sorted(n for n, v in vars(nt).items()
                    if not n.startswith("_") and not inspect.ismodule(v))
    assert public == TORCH_PUBLIC
    namespace = {}
    exec("from nopfs.torch import *", namespace)
    assert sorted(n for n in namespace if n != "__builtins__") == TORCH_PUBLIC
    for name in TORCH_PUBLIC:
        obj = getattr(nt, name)
        # Named as before the package was split into modules: reprs, and pickles a user made,
        # still say (and find) nopfs.torch.NAME.
        assert obj.__module__ == "nopfs.torch", name
        assert pickle.loads(pickle.dumps(obj)) is obj, name
