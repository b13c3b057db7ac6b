#!/usr/bin/env python3
"""Runs the nopfs Python tests (pytest) against a build tree: ctest's entry point.

Usage: run_tests.py BUILD_DIR [test_X.py...] [pytest arguments...]   (pytest runs under
$NOPFS_PYTHON, default /usr/bin/python3: Debian's python3 with python3-torch; test files named
run alone, else all of tests/python)

The package under test is the build tree's (<build>/python on PYTHONPATH), or, with
NOPFS_TEST_INSTALLED=DIR, the one installed in DIR (a venv's site-packages, where $NOPFS_PYTHON
finds it: wheel_test.py); test_package.py checks it imports that one (NOPFS_PACKAGE_DIR).

nopfsd refuses to run as root and the client only talks to a service of its own uid, so as root
this re-runs itself as the unprivileged user `nobody` (setpriv), with a private HOME; everything
the tests create lives in a fresh temporary directory that user owns.
"""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: run_tests.py BUILD_DIR [pytest arguments...]")
    build = os.path.abspath(sys.argv[1])
    work = tempfile.mkdtemp(prefix="nopfs-python-test-")
    try:
        env = dict(os.environ)
        installed = env.pop("NOPFS_TEST_INSTALLED", "")
        if installed:
            env.pop("PYTHONPATH", None)
            env["NOPFS_PACKAGE_DIR"] = os.path.join(installed, "nopfs")
        else:
            env["PYTHONPATH"] = os.path.join(build, "python")
            env["NOPFS_PACKAGE_DIR"] = os.path.join(build, "python", "nopfs")
        env["NOPFS_BIN"] = os.path.join(build, "bin")
        env["NOPFS_EXAMPLES"] = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples")
        env["HOME"] = work
        env["TMPDIR"] = work
        for name in list(env):
            # The tests make their own services; none may leak in from the caller.
            if name.startswith("NOPFS_") and name not in ("NOPFS_BIN", "NOPFS_EXAMPLES",
                                                          "NOPFS_PACKAGE_DIR"):
                del env[name]
        python = os.environ.get("NOPFS_PYTHON", "/usr/bin/python3")  # Debian's, with torch
        # Test files named on the command line (e.g. test_client.py) run alone; else all of them.
        extra = [os.path.join(HERE, a) if a.endswith(".py") and os.sep not in a else
                 os.path.abspath(a) if a.endswith(".py") else a for a in sys.argv[2:]]
        files = [] if any(a.endswith(".py") for a in extra) else [HERE]
        argv = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                f"--basetemp={os.path.join(work, 'pytest')}", *files, *extra]
        if os.geteuid() == 0:
            os.chmod(work, 0o700)
            shutil.chown(work, "nobody", "nogroup")
            argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"] + argv
        sys.exit(subprocess.run(argv, env=env, cwd=work).returncode)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
