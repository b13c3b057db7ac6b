#!/usr/bin/python3
"""Clang's thread-safety analysis over every C++ translation unit of a build tree.

  scripts/thread_safety.py [BUILD_DIR [SOURCE...]]     (default: build, every source)

Reads BUILD_DIR/compile_commands.json (CMake writes it), and compiles each .cc with
`clang++ -fsyntax-only -Wthread-safety -Werror=thread-safety` and the entry's own defines, include
paths, language standard and target flags (-m..., which decide what the intrinsics headers declare:
common/checksum_simd.cc is built with -mavx2 and -mavx512f); the entry's warning and other
code-generation flags are GCC's and are left out: only the thread-safety diagnostics are this
check's business. Two files at a time, `nice`d.
Exits non-zero, printing clang's diagnostics, if any annotation (common/thread_annotations.h) is
violated: a GUARDED_BY member used without its mutex, a REQUIRES function called without it, a
lock not released. C files hold no annotations and are skipped.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety", "-Wno-unknown-warning-option"]


def clang_args(entry, clang):
    """The clang command for one compile_commands.json entry."""
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = [clang]
    it = iter(args[1:])
    for a in it:
        if a in ("-o", "-c"):
            if a == "-o":
                next(it, None)
            continue
        if a in ("-isystem", "-I", "-D", "-include"):
            out += [a, next(it, "")]
        elif a.startswith(("-I", "-D", "-std=", "-isystem", "-m")):
            out.append(a)
    return out + FLAGS + [entry["file"]]


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(SRC, "build"))
    db = os.path.join(build, "compile_commands.json")
    if not os.path.exists(db):
        sys.exit(f"thread_safety: {db} not found: build the tree first (scripts/build.sh release)")
    clang = shutil.which("clang++")
    if clang is None:
        sys.exit("thread_safety: clang++ not found: apt-get install clang")
    with open(db, encoding="utf-8") as f:
        entries = [e for e in json.load(f) if e["file"].endswith((".cc", ".cpp"))]
    only = {os.path.abspath(p) for p in sys.argv[2:]}
    if only:
        entries = [e for e in entries if os.path.abspath(e["file"]) in only]

    def check(entry):
        cmd = ["nice", "-n", "10"] + clang_args(entry, clang)
        r = subprocess.run(cmd, cwd=entry["directory"], capture_output=True, text=True)
        return entry["file"], r.returncode, r.stderr

    failed = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        for path, rc, err in pool.map(check, entries):
            if rc != 0:
                failed.append(path)
                sys.stderr.write(err)
    if failed:
        print(f"thread_safety: {len(failed)} of {len(entries)} files fail clang's thread-safety "
              "analysis:", file=sys.stderr)
        for path in failed:
            print("  " + os.path.relpath(path, SRC), file=sys.stderr)
        return 1
    print(f"thread_safety: {len(entries)} files pass clang -Wthread-safety")
    return 0


if __name__ == "__main__":
    sys.exit(main())
