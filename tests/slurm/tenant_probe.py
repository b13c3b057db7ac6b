#!/usr/bin/python3
"""The other user's attempts on a job of the same node, for tests/slurm/tenants_test.py: run as
nopfs-bob (in a job of his own), against what the test names of nopfs-alice's running job.

    tenant_probe.py [--socket PATH] [--pid PID] [--read PATH] [--list DIR] [--plant PATH]
                    [--shm-uid UID]        (each may repeat)

--socket: connect to it; --pid (nopfsd, a rank): list and open its /proc/PID/fd entries, open
/proc/PID/mem, environ, maps, map_files and cwd, pidfd_getfd each of its first 64 descriptors,
process_vm_readv and PTRACE_ATTACH; --read: open and read a file; --list: list a directory;
--plant: make a symbolic link at the path (as a user who wants root's prolog or epilog to follow
it); --shm-uid: open every /dev/shm entry of that uid. Prints one line per attempt,
`ALLOWED: <attempt>` or `failed: <attempt>: <errno name>`, and last `attempts: N, allowed: K`.
"""
import argparse
import ctypes
import errno
import glob
import os
import socket

libc = ctypes.CDLL(None, use_errno=True)
SYS_PIDFD_GETFD = 438
SYS_PROCESS_VM_READV = 310
PTRACE_ATTACH = 16
counts = {"attempts": 0, "allowed": 0}


def attempt(what, f):
    counts["attempts"] += 1
    try:
        f()
    except OSError as e:
        print(f"failed: {what}: {errno.errorcode.get(e.errno, e.errno)}", flush=True)
        return
    counts["allowed"] += 1
    print(f"ALLOWED: {what}", flush=True)


def syscall_ok(rc):
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def read_file(path):
    with open(path, "rb") as f:
        f.read(1)


def connect(path):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
    finally:
        s.close()


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def vm_read(pid):
    """process_vm_readv of the first page of the process's first mapping (from its stat: the
    start of its code)."""
    buf = ctypes.create_string_buffer(4096)
    local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 4096)
    with open(f"/proc/{pid}/stat") as f:
        start_code = int(f.read().rsplit(")", 1)[1].split()[23])
    remote = IoVec(start_code, 4096)
    syscall_ok(libc.syscall(SYS_PROCESS_VM_READV, pid, ctypes.byref(local), 1,
                            ctypes.byref(remote), 1, 0))


def probe_pid(pid):
    attempt(f"list /proc/{pid}/fd", lambda: os.listdir(f"/proc/{pid}/fd"))
    attempt(f"list /proc/{pid}/map_files", lambda: os.listdir(f"/proc/{pid}/map_files"))
    for name in ("mem", "environ", "maps", "pagemap"):
        attempt(f"read /proc/{pid}/{name}", lambda n=name: read_file(f"/proc/{pid}/{n}"))
    attempt(f"list /proc/{pid}/cwd", lambda: os.listdir(f"/proc/{pid}/cwd"))
    fds_opened = 0
    for n in range(64):
        try:
            os.close(os.open(f"/proc/{pid}/fd/{n}", os.O_RDONLY))
            fds_opened += 1
            print(f"ALLOWED: open /proc/{pid}/fd/{n}", flush=True)
        except OSError:
            pass
    counts["attempts"] += 1
    counts["allowed"] += fds_opened
    print(f"{'ALLOWED' if fds_opened else 'failed'}: open /proc/{pid}/fd/0..63: "
          f"{fds_opened} opened", flush=True)
    pidfd = os.pidfd_open(pid)
    got = 0
    for n in range(64):
        fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, n, 0)
        if fd >= 0:
            os.close(fd)
            got += 1
    os.close(pidfd)
    counts["attempts"] += 1
    counts["allowed"] += got
    print(f"{'ALLOWED' if got else 'failed'}: pidfd_getfd {pid} 0..63: {got} taken", flush=True)
    attempt(f"process_vm_readv {pid}", lambda: vm_read(pid))
    attempt(f"ptrace attach {pid}",
            lambda: syscall_ok(libc.ptrace(PTRACE_ATTACH, pid, None, None)))


def main():
    p = argparse.ArgumentParser()
    for flag in ("--socket", "--read", "--list", "--plant"):
        p.add_argument(flag, action="append", default=[])
    p.add_argument("--pid", action="append", type=int, default=[])
    p.add_argument("--shm-uid", type=int, default=-1)
    a = p.parse_args()
    for path in a.socket:
        attempt(f"connect {path}", lambda x=path: connect(x))
    for pid in a.pid:
        probe_pid(pid)
    for path in a.read:
        attempt(f"read {path}", lambda x=path: read_file(x))
    for path in a.list:
        attempt(f"list {path}", lambda x=path: os.listdir(x))
    for path in a.plant:
        attempt(f"plant a link at {path}", lambda x=path: os.symlink("/etc/shadow", x))
    if a.shm_uid >= 0:
        for path in glob.glob("/dev/shm/*") + glob.glob("/dev/shm/.*"):
            if os.lstat(path).st_uid == a.shm_uid:
                attempt(f"read {path}", lambda x=path: read_file(x))
    print(f"attempts: {counts['attempts']}, allowed: {counts['allowed']}", flush=True)


if __name__ == "__main__":
    main()
