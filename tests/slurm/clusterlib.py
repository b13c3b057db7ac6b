"""Shared pieces of the cluster tests (tests/slurm/*_test.py) and the benches that use the local
cluster or the emulated PFS (bench/shared_bench.py, bench/keep_bench.py): the local cluster's
paths, running commands as the test users, submitting and waiting for jobs, making datasets, the
emulated PFS (docs/pfsemu.md), the node's share service, and ClusterCase, the base class that
brings a real 3-node Slurm cluster (slurmctld, three slurmd, MUNGE) up once per test class and
down at the end, with a dataset every test can read.

Run as root. NOPFS_BINARY_DIR names the build (plugin in lib/, nopfs-job, nopfsd and nopfs in bin/).
"""
import glob
import hashlib
import hmac
import json
import os
import pwd
import re
import socket
import subprocess
import time
import unittest

SRC = os.environ.get("NOPFS_SOURCE_DIR",
                     os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")))
BUILD = os.environ.get("NOPFS_BINARY_DIR", os.path.join(SRC, "build"))
DIR = os.environ.get("NOPFS_TEST_CLUSTER_DIR", "/tmp/nopfs-cluster-test")
CLUSTER = os.path.join(SRC, "contrib/slurm/local-cluster")
CONF = os.path.join(DIR, "etc/slurm.conf")
NODES = ["n1", "n2", "n3"]
DATASET = os.path.join(DIR, "data/ds")
JOBS = os.path.join(DIR, "jobs")
RUN = os.path.join(DIR, "run")
SSD = os.path.join(DIR, "ssd")
METRICS = os.path.join(DIR, "metrics")  # the node config's metrics_dir (shared by the nodes)
MiB = 1 << 20
RAM_CAPACITY = 512 << 20  # the local cluster's config: classes.ram capacity "512M"
# Developer hook: a stand-in daemon before nopfsd is built. The byte check needs the real one.
# The test users local-cluster makes (carol: the one without read access to some datasets).
USERS = ["nopfs-alice", "nopfs-bob", "nopfs-carol"]
NOPFSD = os.environ.get("NOPFS_TEST_NOPFSD", os.path.join(BUILD, "bin/nopfsd"))
REAL_NOPFSD = NOPFSD == os.path.join(BUILD, "bin/nopfsd")


def statuses(job):
    """What `nopfs status --json` said to the first task of each node of `job` (TASK writes it to
    a file: long lines of two nodes' tasks interleave in the job's output): {node: status}."""
    found = {}
    for path in glob.glob(os.path.join(JOBS, f"status-{job}-*-0.json")):
        with open(path) as fh:
            found[path.rsplit("-", 2)[1]] = json.load(fh)
    return found


def env():
    e = dict(os.environ, NOPFS_CLUSTER_DIR=DIR, NOPFS_BUILD_DIR=BUILD,
             NOPFS_CLUSTER_PORT="18817", SLURM_CONF=CONF)
    return e


def cluster(*args, extra_args=""):
    e = env()
    # With NOPFS_PLUGIN (an installed plugin, tests/slurm/package_test.py) the plugin finds its
    # installed launcher and nopfsd itself.
    installed = bool(os.environ.get("NOPFS_PLUGIN"))
    e["NOPFS_PLUGIN_ARGS"] = (extra_args if installed else f"nopfsd={NOPFSD} {extra_args}").strip()
    return subprocess.run([CLUSTER, *args], env=e, capture_output=True, text=True, timeout=120)


def as_user(user, command, check=False, timeout=60):
    """Runs `command` in a login-less shell as `user` in the jobs directory."""
    full = f"cd {JOBS} && export SLURM_CONF={CONF} && {command}"
    return subprocess.run(["runuser", "-u", user, "--", "/bin/bash", "-c", full],
                          capture_output=True, text=True, timeout=timeout, check=check)


def job_status(user, node, job):
    """`nopfs status --json` of `user`'s job `job` on `node` (its nopfsd's socket), or None while
    nopfsd does not answer."""
    r = as_user(user, f"NOPFS_SOCKET={RUN}/{node}/{job}/nopfsd.sock "
                f"{BUILD}/bin/nopfs status --json")
    return json.loads(r.stdout) if r.returncode == 0 else None


def sbatch(user, options, script):
    path = os.path.join(JOBS, f"{user}-{time.monotonic_ns()}.sh")
    with open(path, "w") as f:
        f.write("#!/bin/bash\n" + script)
    os.chmod(path, 0o755)
    r = as_user(user, f"sbatch --parsable -o {JOBS}/job-%j.out {options} {path}")
    return r


def submit(user, options, script):
    r = sbatch(user, options, script)
    if r.returncode != 0:
        raise AssertionError(f"sbatch {options} failed: {r.stderr}")
    return int(r.stdout.strip().split(";")[0])


def job_state(job):
    r = subprocess.run(["scontrol", "-o", "show", "job", str(job)], env=env(),
                       capture_output=True, text=True)
    m = re.search(r"JobState=(\S+)", r.stdout)
    return m.group(1) if m else "GONE"


def wait_state(job, states, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = job_state(job)
        if s in states:
            return s
        time.sleep(0.2)
    raise AssertionError(f"job {job} is {job_state(job)}, not one of {states}, after {timeout}s")


def wait_done(job, timeout=90):
    return wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                            "OUT_OF_MEMORY", "GONE"}, timeout)


def wait_file(path, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return
        time.sleep(0.2)
    raise AssertionError(f"{path} did not appear within {timeout}s")


def release(job):
    open(os.path.join(JOBS, f"release-{job}"), "w").close()


def output(job):
    with open(os.path.join(JOBS, f"job-{job}.out")) as f:
        return f.read()


def daemons():
    """{pid: (user, argv)} of every living process started with --run-dir under the cluster."""
    out = {}
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(d + "/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(d + "/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            uid = os.stat(d).st_uid
        except (OSError, IndexError):
            continue
        argv = [a.decode(errors="replace") for a in argv if a]
        if "--run-dir" in argv and argv[argv.index("--run-dir") + 1].startswith(RUN + "/"):
            out[int(d[6:])] = (pwd.getpwuid(uid).pw_name, argv)
    return out


def size_bytes(text):
    """Bytes of a size as nopfs-job passes it to nopfsd (--ram=200M, 1300K, 1000B, 0)."""
    units = {"B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
    return 0 if text == "0" else int(text[:-1]) * units[text[-1]]


def slurmd_log(node):
    with open(os.path.join(DIR, "log", f"slurmd-{node}.log"), errors="replace") as f:
        return f.read()


def ledger(node):
    entries = {}
    for p in glob.glob(os.path.join(RUN, node, ".ledger", "[0-9]*")):
        if p.endswith(".tmp"):
            continue
        with open(p) as f:
            entries[int(os.path.basename(p))] = dict(
                line.split("=", 1) for line in f.read().split("\n") if line)
    return entries


# Holds a job until the test releases it; prints the task's NOPFS_* and checks the bytes.
HOLD = "while [ ! -e {jobs}/release-$SLURM_JOB_ID ]; do sleep 0.2; done\n"
TASK = ("env | grep ^NOPFS_ | sed \"s/^/$SLURMD_NODENAME: /\" | sort; "
        "if [ -n \"$NOPFS_SOCKET\" ] && [ \"$VERIFY\" = 1 ]; then "
        "{build}/bin/nopfs status --json > "
        "{jobs}/status-$SLURM_JOB_ID-$SLURMD_NODENAME-$SLURM_LOCALID.json; "
        "{build}/bin/nopfs cat --verify 2>&1 | tail -n 1 | sed \"s/^/$SLURMD_NODENAME: verify: /\"; fi")



def submit_two_node_job(user, verify):
    """A held 2-node job on n1 and n3 with peers, 2 tasks a node, each printing its NOPFS_* and,
    with verify, its node's status (statuses()) and `nopfs cat --verify`'s last line."""
    script = (f"export VERIFY={1 if verify else 0}\n"
              f"srun --ntasks-per-node=2 bash -c '{TASK.format(build=BUILD, jobs=JOBS)}'\n"
              + HOLD.format(jobs=JOBS))
    return submit(user,
                  f"-N2 -w n1,n3 --ntasks-per-node=2 --mem=600 --nopfs={DATASET} "
                  "--nopfs-seed=7 --nopfs-epochs=2 --nopfs-batch=8 --nopfs-ranks-per-node=2 "
                  "--nopfs-scheme=strided", script)


def make_dataset(path, seed):
    """An ImageFolder dataset: 3 classes x 40 files of 1..64 KiB of bytes from `seed`, readable
    by all."""
    import random
    rnd = random.Random(seed)
    for c in range(3):
        os.makedirs(os.path.join(path, f"class{c}"), exist_ok=True)
        for i in range(40):
            with open(os.path.join(path, f"class{c}", f"{i:04d}.bin"), "wb") as f:
                f.write(rnd.randbytes(1024 * (1 + (i * 7 + c) % 64)))
    subprocess.run(["chmod", "-R", "a+rX", path], check=True)


def make_files(path, files, size):
    """An ImageFolder dataset for the benches: `files` files of `size` random bytes in 10
    classes (class<k % 10>/img<k>.bin), readable by all."""
    for k in range(files):
        d = os.path.join(path, f"class{k % 10}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"img{k:06d}.bin"), "wb") as fh:
            fh.write(os.urandom(size))
    subprocess.run(["chmod", "-R", "a+rX", path], check=True)


def start_pfsemu(bindir, backing, mnt, bandwidth, getattr_latency_us=None):
    """Mounts the emulated PFS (docs/pfsemu.md) of `backing` on `mnt` at `bandwidth` MB/s and
    returns its process once the mount is there (terminate() and wait() unmount it)."""
    argv = [os.path.join(bindir, "nopfs_pfsemu"), "--bandwidth", str(bandwidth)]
    if getattr_latency_us is not None:
        argv += ["--getattr-latency-us", str(getattr_latency_us)]
    os.makedirs(mnt, exist_ok=True)
    emu = subprocess.Popen(argv + [backing, mnt], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not os.path.ismount(mnt):
        if time.monotonic() > deadline or emu.poll() is not None:
            emu.terminate()
            emu.wait()
            raise SystemExit("pfsemu did not mount " + mnt)
        time.sleep(0.1)
    return emu


def pfs_bytes_read(mnt):
    """The bytes read from the emulated PFS mounted on `mnt` since it was mounted."""
    with open(os.path.join(mnt, ".pfsemu_stats")) as fh:
        return int(dict(line.split(" ", 1) for line in fh.read().splitlines())["bytes_read"])


def share_service_pids():
    """The local cluster's share services (nopfs-job share-serve of a node under RUN)."""
    pids = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(d + "/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"share-serve" in argv and any(a.startswith(f"--dir={RUN}/".encode()) for a in argv):
            pids.append(int(d[6:]))
    return pids



def hold_port(port):
    """A listening socket on 127.0.0.1:`port` (as root: a node's service holding a peer port)."""
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("127.0.0.1", port))
    held.listen(1)
    return held


# --- placement (docs/admin.md, "Placement"): the marks as spank/placement.h defines them, from the
# local cluster's key, and what Slurm says of the nodes' features and a job's nodes.
PLACEMENT_KEY = os.path.join(DIR, "etc/placement.key")


def _mark(message):
    with open(PLACEMENT_KEY, "rb") as f:
        key = f.read()
    return "nopfs_" + hmac.new(key, message.encode(), hashlib.sha256).hexdigest()[:16]


def _mark_path(dataset):
    return "/" + "/".join(p for p in dataset.split("/") if p not in ("", "."))


def mark_of(user, dataset):
    """A user's mark of a dataset."""
    return _mark(f"nopfs placement v1:{pwd.getpwnam(user).pw_uid}:{_mark_path(dataset)}")


def shared_mark(dataset):
    """The mark of a shared dataset's copy, every user's."""
    return _mark(f"nopfs placement v1:shared:{_mark_path(dataset)}")


def features(node):
    """A node's ActiveFeatures."""
    r = subprocess.run(["scontrol", "-o", "show", "node", node], env=env(), capture_output=True,
                       text=True)
    m = re.search(r"ActiveFeatures=(\S*)", r.stdout)
    return set() if not m or m.group(1) == "(null)" else set(m.group(1).split(","))


def marked(mark):
    """The nodes that carry `mark`."""
    return {n for n in NODES if mark in features(n)}


def job_nodes(job):
    """The nodes a job runs or ran on, or None before it has any."""
    r = subprocess.run(["scontrol", "-o", "show", "job", str(job)], env=env(),
                       capture_output=True, text=True)
    m = re.search(r" NodeList=(\S+)", r.stdout)
    if not m or m.group(1) == "(null)":
        return None
    r = subprocess.run(["scontrol", "show", "hostnames", m.group(1)], env=env(),
                       capture_output=True, text=True)
    return r.stdout.split()


class ClusterCase(unittest.TestCase):
    """Brings the 3-node cluster up once per test class (with the test dataset), down at the end;
    cancels every job of the test users after each test."""
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("the cluster tests run as root (they start slurmd)")
        for f in (os.path.join(BUILD, "lib/spank_nopfs.so"), os.path.join(BUILD, "bin/nopfs-job"),
                  NOPFSD, os.path.join(BUILD, "bin/nopfs")):
            if not os.path.exists(f):
                raise AssertionError(f"{f} is missing: build spank_nopfs, nopfs-job, nopfsd and nopfs")
        r = cluster("up", "3")
        if r.returncode != 0:
            raise AssertionError("local-cluster up failed:\n" + r.stdout + r.stderr)
        os.makedirs(DATASET, exist_ok=True)
        # An ImageFolder dataset: 3 classes x 40 files of 1..64 KiB of known bytes.
        for c in range(3):
            os.makedirs(os.path.join(DATASET, f"class{c}"), exist_ok=True)
            for i in range(40):
                with open(os.path.join(DATASET, f"class{c}", f"{i:04d}.bin"), "wb") as f:
                    f.write(os.urandom(1024 * (1 + (i * 7 + c) % 64)))
        subprocess.run(["chmod", "-R", "a+rX", os.path.join(DIR, "data")], check=True)

    @classmethod
    def tearDownClass(cls):
        r = cluster("down")
        if r.returncode != 0:
            print(r.stderr)

    def set_plugin_args(self, extra):
        r = cluster("plugstack", extra_args=extra)
        self.assertEqual(r.returncode, 0, r.stderr)

    def setUp(self):
        self.set_plugin_args("")

    def tearDown(self):
        # A failed test must not leave jobs that block the next one.
        for f in glob.glob(os.path.join(JOBS, "job-*.out")):
            release(int(re.search(r"job-(\d+)", f).group(1)))
        for user in USERS:
            subprocess.run(["scancel", "-u", user], env=env())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = subprocess.run(["squeue", "-h", "-o", "%i"], env=env(), capture_output=True,
                               text=True)
            if not r.stdout.strip():
                break
            time.sleep(0.5)

    def assertNothingLeft(self, jobs):
        deadline = time.monotonic() + 30
        while True:
            left = []
            for pid, (user, argv) in daemons().items():
                left.append(f"process {pid} of {user}: {' '.join(argv[:4])}")
            for node in NODES:
                for job in jobs:
                    if os.path.lexists(os.path.join(RUN, node, str(job))):
                        left.append(f"run dir {node}/{job}")
                    if job in ledger(node):
                        left.append(f"ledger entry {node}/{job}")
            for job in jobs:
                left += glob.glob(os.path.join(SSD, "nopfs-*", f"{job}.*"))
                if os.path.lexists(os.path.join(METRICS, f"nopfs_{job}.prom")):
                    left.append(f"metrics file nopfs_{job}.prom")
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        self.assertEqual(left, [], "left behind after the job")
