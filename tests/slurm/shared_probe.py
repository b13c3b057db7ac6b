#!/usr/bin/python3
"""What a hostile user does to a node's shared copy (tests/slurm/shared_test.py runs it as bob or
carol): speaks the share protocol (share/wire.h) by hand over the service's socket.

  shared_probe.py write SOCKET DATASET REL         get REL's copy as the protocol allows, then try
                                                    every way to change it; prints what worked
  shared_probe.py forge SOCKET DATASET REL OWN     forged requests: OWN's proof named REL, an O_PATH
                                                    proof, garbage, too many descriptors, ...;
                                                    prints what each got
  shared_probe.py race SOCKET DATASET REL TARGET SECONDS
                                                    swaps DATASET/REL between a file of the
                                                    caller's and a link to TARGET while asking for
                                                    REL; prints the distinct copies it was given
Each prints one JSON object on its last line.
"""
import hashlib
import json
import mmap
import os
import socket
import struct
import sys
import threading
import time

MAGIC, VERSION = 0x4853504E, 1
PING, OPEN, WARM = 1, 2, 3
OUTCOMES = {0: "ready", 1: "denied", 2: "not_stored", 3: "busy"}


def s(text):
    b = text.encode()
    return struct.pack("<I", len(b)) + b


def request(op, dataset, files):
    return struct.pack("<IHH", MAGIC, VERSION, op) + s(dataset) + struct.pack(
        "<I", len(files)) + b"".join(s(f) for f in files)


def dial(path):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    c.settimeout(30)
    c.connect(path)
    return c


def ask(sock_path, data, fds):
    """Sends one message; returns (status, [outcome...], [fd...]) or an error string."""
    c = dial(sock_path)
    try:
        socket.send_fds(c, [data], fds)
        msg, got, _, _ = socket.recv_fds(c, 65536, 260)
    except OSError as e:
        return f"error: {e}"
    finally:
        c.close()
    if len(msg) < 12:
        return f"short reply ({len(msg)} bytes)"
    _, _, status, count = struct.unpack_from("<IHHI", msg)
    outcomes = [OUTCOMES.get(msg[12 + 17 * i], "?") for i in range(count)]
    return status, outcomes, got


def copy_of(sock_path, dataset, rel):
    fd = os.open(os.path.join(dataset, rel), os.O_RDONLY)
    r = ask(sock_path, request(OPEN, dataset, [rel]), [fd])
    os.close(fd)
    if isinstance(r, str) or r[1] != ["ready"]:
        raise SystemExit(f"no copy of {rel}: {r}")
    return r[2][0]


def try_(what, fn, worked):
    try:
        fn()
        worked.append(what)
    except (OSError, ValueError, TypeError) as e:
        pass


def cmd_write(sock_path, dataset, rel):
    fd = copy_of(sock_path, dataset, rel)
    worked = []
    try_("write", lambda: os.write(fd, b"X"), worked)
    try_("pwrite", lambda: os.pwrite(fd, b"X", 0), worked)
    try_("ftruncate", lambda: os.ftruncate(fd, 0), worked)
    try_("fchmod", lambda: os.fchmod(fd, 0o666), worked)
    try_("fchown", lambda: os.fchown(fd, os.getuid(), os.getgid()), worked)
    try_("reopen O_RDWR", lambda: os.open(f"/proc/self/fd/{fd}", os.O_RDWR), worked)
    try_("reopen O_WRONLY", lambda: os.open(f"/proc/self/fd/{fd}", os.O_WRONLY), worked)
    try_("mmap shared writable",
         lambda: mmap.mmap(fd, 1, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE),
         worked)
    try_("fallocate punch hole",
         lambda: os.posix_fallocate(fd, 0, 1 << 20), worked)
    target = os.readlink(f"/proc/self/fd/{fd}")
    try_("open by name", lambda: os.open(target, os.O_RDONLY), worked)
    try_("unlink by name", lambda: os.unlink(target), worked)
    try_("rename by name", lambda: os.rename(target, target + ".x"), worked)
    try_("link by name", lambda: os.link(target, "/tmp/shared-probe-link"), worked)
    try_("create in its directory",
         lambda: os.open(os.path.join(os.path.dirname(target), "planted"), os.O_CREAT | os.O_WRONLY),
         worked)
    print(json.dumps({"copy": target, "worked": worked}))


def cmd_forge(sock_path, dataset, rel, own):
    out = {}
    # A file of the caller's, with other bytes, named as the dataset's file.
    fd = os.open(own, os.O_RDONLY)
    out["own file named as the dataset's"] = ask(sock_path, request(OPEN, dataset, [rel]), [fd])
    # The same through the names of other files, ".." and absolute paths.
    for name in ("../../../../etc/passwd", "/etc/passwd", rel + "/..", "./" + rel):
        out[f"path {name}"] = ask(sock_path, request(OPEN, dataset, [name]), [fd])
    # Another dataset's name (not declared), with the proof.
    out["undeclared dataset"] = ask(sock_path, request(OPEN, "/etc", ["passwd"]), [fd])
    os.close(fd)
    # An O_PATH descriptor of the file (one needs no read permission for it).
    p = os.open(os.path.join(dataset, rel), os.O_PATH)
    out["O_PATH proof"] = ask(sock_path, request(OPEN, dataset, [rel]), [p])
    out["O_PATH proof, warm"] = ask(sock_path, request(WARM, dataset, [rel]), [p])
    os.close(p)
    # A directory of the dataset as the proof.
    d = os.open(dataset, os.O_RDONLY | os.O_DIRECTORY)
    out["directory proof"] = ask(sock_path, request(OPEN, dataset, [rel]), [d])
    # Malformed: garbage, truncated, a count that does not match, too many descriptors, too long.
    good = request(OPEN, dataset, [rel])
    out["garbage"] = ask(sock_path, os.urandom(200), [d])
    out["truncated"] = ask(sock_path, good[:-3], [d])
    out["2 files, 1 descriptor"] = ask(sock_path, request(OPEN, dataset, [rel, rel]), [d])
    out["251 descriptors"] = ask(sock_path, request(OPEN, dataset, [rel] * 251), [d] * 251)
    out["1 MiB message"] = ask(sock_path, good + b"\0" * (1 << 20), [d])
    out["length past the end"] = ask(sock_path, good[:12] + struct.pack("<I", 1 << 31), [d])
    os.close(d)
    # The service still answers a ping.
    out["ping after"] = ask(sock_path, request(PING, dataset, []), [])
    print(json.dumps({k: (v if isinstance(v, str) else [v[0], v[1], len(v[2])])
                      for k, v in out.items()}))


def cmd_race(sock_path, dataset, rel, target, seconds):
    path = os.path.join(dataset, rel)
    mine = path + ".mine"
    with open(mine, "wb") as f:
        f.write(b"bob's own bytes " * 64)
    stop = time.monotonic() + float(seconds)
    swaps = [0]

    def swapper():
        while time.monotonic() < stop:
            tmp = path + ".tmp"
            try:
                os.symlink(target, tmp)
                os.rename(tmp, path)
                os.link(mine, tmp)
                os.rename(tmp, path)
                swaps[0] += 1
            except OSError:
                pass

    t = threading.Thread(target=swapper)
    t.start()
    seen = {}
    asked = 0
    while time.monotonic() < stop:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        r = ask(sock_path, request(OPEN, dataset, [rel]), [fd])
        os.close(fd)
        asked += 1
        if not isinstance(r, str) and r[1] == ["ready"]:
            data = os.pread(r[2][0], 1 << 20, 0)
            seen[hashlib.sha256(data).hexdigest()] = len(data)
            os.close(r[2][0])
    t.join()
    print(json.dumps({"asked": asked, "swaps": swaps[0], "copies": seen,
                      "mine": hashlib.sha256(open(mine, "rb").read()).hexdigest()}))


if __name__ == "__main__":
    cmd = sys.argv[1]
    {"write": cmd_write, "forge": cmd_forge, "race": cmd_race}[cmd](*sys.argv[2:])
