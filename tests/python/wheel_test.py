#!/usr/bin/env python3
"""The wheel as a user makes and installs it: ctest's python_wheel_test (label python).

Usage: wheel_test.py SOURCE_DIR BUILD_DIR

1. Builds the wheel from python/pyproject.toml offline with Debian's own tools ($NOPFS_PYTHON,
   default /usr/bin/python3: `pip wheel --no-build-isolation --no-deps --no-index`), a fresh CMake
   tree in a temporary directory (ccache keeps it short), and checks what it holds: the package,
   the extension for that Python's ABI, py.typed, _client.pyi, the version; and that the
   extension links no torch and no libpython (one build serves any torch).
2. Makes a fresh venv (--system-site-packages) of another Python with the same ABI: the first
   python3.X on PATH that is not $NOPFS_PYTHON ($NOPFS_WHEEL_PYTHON names one), else $NOPFS_PYTHON
   itself. When its venv cannot import torch, pytest and numpy (a pyenv Python does not see
   Debian's /usr/lib/python3/dist-packages), a .pth file in the venv names the directories where
   $NOPFS_PYTHON finds them: they stand in for the user's own torch. Installs the wheel with the
   venv's pip, offline.
3. Runs test_package.py, test_client.py and test_torch.py with the venv's Python, from a temporary
   directory, through run_tests.py with NOPFS_TEST_INSTALLED: nothing of the build tree or of
   python/ is on sys.path, and test_package.py checks that nopfs comes from the venv.
4. Checks the source tree holds the same files as before (the build wrote nothing there).

As root, the tests run as `nobody` (run_tests.py); a Python under a directory `nobody` cannot
enter (pyenv's under /root) is copied, interpreter and standard library, into the temporary
directory first.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def output(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout.strip()


def source_files(source, build):
    """Every path in the source tree but .git and build trees (with a CMakeCache.txt)."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames[:] = [d for d in dirnames if d != ".git" and
                       os.path.realpath(os.path.join(dirpath, d)) != os.path.realpath(build) and
                       not os.path.exists(os.path.join(dirpath, d, "CMakeCache.txt"))]
        for name in dirnames + filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), source))
    return out


def offline_env():
    """The environment without the machine's pip configuration (find-links, indexes): pip sees
    only what the command names."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.pop("PYTHONPATH", None)
    return env


def build_wheel(python, source, dist):
    env = offline_env()
    env.pop("NOPFS_CMAKE_BUILD_DIR", None)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
    run([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
         "--no-cache-dir", "-w", dist, os.path.join(source, "python")], cwd=dist, env=env)
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    return os.path.join(dist, wheels[0])


def check_wheel(wheel, python, source, work):
    info = output([python, "-c", "import sys, sysconfig; print(sysconfig.get_config_var("
                   "'EXT_SUFFIX')); print('cp%d%d' % sys.version_info[:2])"]).split()
    suffix, tag = info
    with open(os.path.join(source, "CMakeLists.txt"), encoding="utf-8") as f:
        version = re.search(r"^project\(nopfs\s+VERSION\s+([0-9.]+)", f.read(), re.M).group(1)
    name = os.path.basename(wheel)
    # Tagged for the oldest manylinux level that provides what the extension needs (built on
    # Debian 12: glibc 2.34, GLIBCXX 3.4.29), which pip in the venv accepts below.
    m = re.match(rf"nopfs-{re.escape(version)}-{tag}-{tag}-manylinux_2_(\d+)_x86_64\.whl$", name)
    assert m, name
    with zipfile.ZipFile(wheel) as z:
        ext = z.read(f"nopfs/_client{suffix}")
    ext_path = os.path.join(work, "tagged" + suffix)
    with open(ext_path, "wb") as f:
        f.write(ext)
    glibc = max((tuple(map(int, v.split("."))) for v in
                 re.findall(r"Name: GLIBC_([0-9.]+)", output(["readelf", "-VW", ext_path]))),
                default=(2, 17))
    assert glibc <= (2, int(m.group(1))), (name, glibc)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        expected = {f"nopfs/{f}" for f in ("__init__.py", "folder.py", "job.py",
                                           "torch/__init__.py", "torch/_loader.py",
                                           "_version.py", "py.typed", "_client.pyi",
                                           "_client" + suffix)}
        assert expected <= names, f"the wheel lacks {expected - names}"
        assert z.read("nopfs/_version.py").decode() == f'__version__ = "{version}"\n'
        meta = z.read(f"nopfs-{version}.dist-info/METADATA").decode()
        assert f"\nVersion: {version}\n" in meta, meta
        assert "Root-Is-Purelib: false" in z.read(f"nopfs-{version}.dist-info/WHEEL").decode()
        z.extract("nopfs/_client" + suffix, work)
    ext = os.path.join(work, "nopfs", "_client" + suffix)
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", output(["readelf", "-d", ext]))
    print("the extension needs:", ", ".join(needed))
    linked = output(["ldd", ext])
    # The names ldd resolves (not its load addresses, whose hex digits can spell "c10").
    names = re.findall(r"^\s*(\S+)", linked, re.MULTILINE)
    for lib in ("torch", "c10", "libpython"):
        assert not any(lib in n for n in names), f"the extension links {lib}:\n{linked}"
    assert set(needed) <= {"libstdc++.so.6", "libgcc_s.so.1", "libc.so.6", "libm.so.6"}, needed


def runs_as_nobody(python):
    """Whether `nobody` can run `python`, and `python` can start itself again (the tests start
    training processes with sys.executable). The second exec is the one that counts: setpriv's
    own exec of a path under /root can succeed where no process of nobody's can."""
    if os.geteuid() != 0:
        return True
    probe = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True)"
    return subprocess.run(AS_NOBODY + [python, "-c", probe], capture_output=True).returncode == 0


def relocate(python, work):
    """A copy of `python` (its interpreter, libpython and standard library) under work/, which
    `nobody` can run: pyenv's Pythons live under /root."""
    cfg = output([python, "-c", "import os, sys, sysconfig; c = sysconfig.get_config_var; "
                  "print(sys.base_prefix, c('LIBDIR'), c('INSTSONAME') or '-', "
                  "c('Py_ENABLE_SHARED'), 'python%d.%d' % sys.version_info[:2], "
                  "os.path.realpath(sys.executable))"]).split()
    prefix, libdir, soname, shared, stem, exe = cfg
    copy = os.path.join(work, "python-copy")
    os.makedirs(os.path.join(copy, "bin"))
    os.makedirs(os.path.join(copy, "lib"))
    shutil.copy2(exe, os.path.join(copy, "bin", stem))
    if shared == "1":
        shutil.copy2(os.path.join(libdir, soname), os.path.join(copy, "lib", soname))
    skip = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "__pycache__"}
    shutil.copytree(os.path.join(prefix, "lib", stem), os.path.join(copy, "lib", stem),
                    ignore=lambda d, names: [n for n in names if n in skip or
                                             n.startswith("config-")])
    print(f"{python} (under {prefix}) is out of reach of `nobody`: using a copy in {copy}")
    return os.path.join(copy, "bin", stem), os.path.join(copy, "lib")


def other_python(build_python):
    """Another Python with build_python's ABI, or build_python itself."""
    want = output([build_python, "-c", "import sysconfig; print(sysconfig.get_config_var("
                   "'EXT_SUFFIX'))"])
    stem = "python%d.%d" % tuple(map(int, re.search(r"cpython-(\d)(\d+)", want).groups()))
    named = os.environ.get("NOPFS_WHEEL_PYTHON")
    candidates = [named] if named else [shutil.which(stem), shutil.which("python3")]
    mine = os.path.realpath(build_python)
    for c in filter(None, candidates):
        try:
            exe, suffix = output([c, "-c", "import os, sys, sysconfig; print(os.path.realpath("
                                  "sys.executable)); print(sysconfig.get_config_var("
                                  "'EXT_SUFFIX'))"]).split()
        except (subprocess.CalledProcessError, OSError):
            continue
        if exe != mine and suffix == want:
            return exe
        if named:
            sys.exit(f"NOPFS_WHEEL_PYTHON={named} is {exe} ({suffix}); name a Python other than "
                     f"{mine} with the ABI {want}")
    print(f"no Python other than {mine} with the ABI {want} on PATH: the venv uses {mine}")
    return build_python


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: wheel_test.py SOURCE_DIR BUILD_DIR")
    source, build = map(os.path.abspath, sys.argv[1:])
    build_python = os.environ.get("NOPFS_PYTHON", "/usr/bin/python3")
    before = source_files(source, build)
    work = tempfile.mkdtemp(prefix="nopfs-wheel-test-")
    os.chmod(work, 0o755)  # the tests run as nobody and read the venv
    try:
        dist = os.path.join(work, "dist")
        os.makedirs(dist)
        wheel = build_wheel(build_python, source, dist)
        check_wheel(wheel, build_python, source, work)

        env = offline_env()
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written beside the tests in the source
        python = other_python(build_python)
        if not runs_as_nobody(python):
            python, libdir = relocate(python, work)
            env["LD_LIBRARY_PATH"] = libdir + ":" + env.get("LD_LIBRARY_PATH", "")
        venv = os.path.join(work, "venv")
        run([python, "-m", "venv", "--system-site-packages", venv], env=env, cwd=work)
        vpy = os.path.join(venv, "bin", "python")
        site = output([vpy, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                      env=env, cwd=work)
        probe = "import torch, numpy, pytest, PIL"
        if subprocess.run([vpy, "-c", probe], env=env, cwd=work,
                          capture_output=True).returncode != 0:
            dirs = output([build_python, "-c", "import os, torch, numpy, pytest, PIL; print('\\n'"
                           ".join(sorted({os.path.dirname(os.path.dirname(m.__file__)) for m in "
                           "(torch, numpy, pytest, PIL)})))"])
            with open(os.path.join(site, "deps-of-the-test.pth"), "w") as f:
                f.write(dirs + "\n")
            print(f"the venv of {python} does not see torch: added {dirs.split()} (.pth)")
            run([vpy, "-c", probe], env=env, cwd=work)
        run([vpy, "-m", "pip", "install", "--no-index", "--no-cache-dir", wheel], env=env,
            cwd=work)
        where = output([vpy, "-c", "import nopfs; print(nopfs.__file__)"], env=env, cwd=work)
        assert where.startswith(os.path.join(site, "nopfs") + os.sep), where
        print("nopfs imports from", where)
        run(["chmod", "-R", "a+rX", work])

        env["NOPFS_PYTHON"] = vpy
        env["NOPFS_TEST_INSTALLED"] = site
        run([sys.executable, os.path.join(HERE, "run_tests.py"), build, "test_package.py",
             "test_client.py", "test_torch.py"], env=env, cwd=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    after = source_files(source, build)
    assert after == before, f"the wheel build or the tests left {sorted(after - before)} " \
                            f"and removed {sorted(before - after)} in {source}"
    print("the source tree holds the same files as before")


if __name__ == "__main__":
    main()
