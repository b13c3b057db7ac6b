"""What the DataLoader benchmarks (loader_bench.py, pipeline_bench.py) share: running as an
unprivileged user, one rank's nopfsd started with `nopfs run`, and the images-per-second
measure."""

import os
import shutil
import signal
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


def measure(loader, set_epoch, passes):
    """Items per second over `passes` epochs after one warm-up epoch."""
    set_epoch(0)
    for _ in loader:  # warm-up: workers start, caches fill
        pass
    n, t = 0, 0.0
    for p in range(passes):
        set_epoch(1 + p)
        t0 = time.perf_counter()
        for x, _ in loader:
            n += x.shape[0]
        t += time.perf_counter() - t0
    return n / t
