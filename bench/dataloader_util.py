"""What the DataLoader benchmarks (loader_bench.py, pipeline_bench.py, thread_bench.py) share:
running as an unprivileged user, one rank's nopfsd started with `nopfs run`, and the
images-per-second measures; and the stall statistics of nopfs_compare.py and e2e/e2e.py."""

import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def rerun_as_nobody(script, prefix):
    """As root, runs `script` again with this process's arguments as `nobody` (nopfsd refuses
    root) and exits with its status; otherwise returns."""
    if os.geteuid() != 0:
        return
    work = tempfile.mkdtemp(prefix=prefix)
    shutil.chown(work, "nobody", "nogroup")
    env = {**os.environ, "HOME": work, "TMPDIR": work}
    try:
        sys.exit(subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                 "--", sys.executable, os.path.abspath(script), *sys.argv[1:]],
                                env=env).returncode)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def start_service(build, root, run_dir, epochs, batch, name):
    """`nopfs run` serving `root` to one rank (seed 3, strided) until it is stopped; returns the
    process once nopfsd is ready, or exits with nopfsd's error."""
    service = subprocess.Popen(
        [os.path.join(build, "bin", "nopfs"), "run", "--dataset", root, "--run-dir", run_dir,
         "--seed", "3", "--epochs", str(epochs), "--ranks", "1", "--batch", str(batch),
         "--scheme", "strided", "-q", "--", "sleep", "3600"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(run_dir, "ready")):
        if service.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"{name}: nopfsd did not start: " + service.stderr.read())
        time.sleep(0.05)
    return service


def stop_service(service):
    """Stops what start_service started (if it still runs) and waits for nopfsd's teardown."""
    if service is not None and service.poll() is None:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=60)


def percentile(xs, q):
    """The q-quantile of xs (the nearest rank: p99 is the value 99 % of xs are at most); nan if
    xs is empty."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q * len(xs))) - 1)]


def stall_stats(ranks):
    """The stall per batch of a run, in seconds: {"first_median", "first_p99"} over every rank's
    steps of its first epoch, {"median", "p99"} over those of its later epochs. `ranks` lists
    each rank's epochs, each a dict whose "stalls" are its steps' stalls. The median of no steps
    is 0, their p99 nan."""
    first = [s for epochs in ranks for s in epochs[0]["stalls"]]
    later = [s for epochs in ranks for ep in epochs[1:] for s in ep["stalls"]]
    return {"first_median": statistics.median(first) if first else 0.0,
            "first_p99": percentile(first, 0.99),
            "median": statistics.median(later) if later else 0.0,
            "p99": percentile(later, 0.99)}


def cpu_seconds(pid=None):
    """CPU seconds (user + system) used so far by this process and its waited-for children (a
    DataLoader's workers, once a pass has joined them), plus process `pid`'s (nopfsd's) if given."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    if pid is not None:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


class Rate:
    """Items, wall seconds and CPU seconds of the measured passes of one loader."""

    def __init__(self):
        self.items, self.seconds, self.cpu, self.passes = 0, 0.0, 0.0, []
        self.cpu_passes = []  # each round's CPU ms per item

    @property
    def per_second(self):
        return self.items / self.seconds

    @property
    def cpu_ms_per_item(self):
        return 1e3 * self.cpu / self.items


def measure_interleaved(loaders, passes, nopfsd_pid=None, count=None):
    """Measures several loaders over the same epochs with their passes interleaved, so that the
    machine's drift (other load, the host's) falls on all of them alike: one warm-up pass each
    (epoch 0), then `passes` rounds in which every loader makes one pass of epoch 1 + round, in
    turn, the order reversed every other round (A B, B A, ...). `loaders` maps a name to
    (loader, set_epoch) or (loader, set_epoch, before), `before` a function called before each
    of that loader's passes (e.g. to set its environment); returns a Rate per name, whose
    `passes` lists each round's items per second. CPU counts this process, its joined workers
    and nopfsd (`nopfsd_pid`), whatever loader runs: nopfsd's work for one loader is charged to
    that loader's pass (`cpu_passes` lists each round's). `count(batch)` is a batch's items (default: the length of its first
    element, a batch being (x, labels))."""
    def start(name, epoch):
        loader, set_epoch, *before = loaders[name]
        for f in before:
            f()
        set_epoch(epoch)
        return loader

    for name in loaders:
        for _ in start(name, 0):  # warm-up: workers start, caches fill
            pass
    rates = {name: Rate() for name in loaders}
    names = list(loaders)
    for r in range(passes):
        for name in (names if r % 2 == 0 else names[::-1]):
            loader = start(name, 1 + r)
            n = 0
            c0, t0 = cpu_seconds(nopfsd_pid), time.perf_counter()
            for batch in loader:
                n += batch[0].shape[0] if count is None else count(batch)
            t = time.perf_counter() - t0
            rate = rates[name]
            rate.items += n
            rate.seconds += t
            cpu = cpu_seconds(nopfsd_pid) - c0
            rate.cpu += cpu
            rate.passes.append(n / t)
            rate.cpu_passes.append(1e3 * cpu / n)
    return rates


def nopfsd_pid(run_dir):
    """The pid of the nopfsd that start_service started."""
    with open(os.path.join(run_dir, "nopfsd.pid")) as f:
        return int(f.read().split()[0])
