"""The package as an admin installs it: `cpack -G DEB` in the build tree, `apt-get install
./nopfs_*.deb` changing nothing until `nopfs admin enable` (which says what is missing), the local
cluster running the **installed** plugin, launcher and nopfsd (no path into the build tree), a job
of nopfs-alice reading through them with the installed `nopfs` and Python package, an upgrade
under a running job, then `dpkg -r` leaving nothing but the conffiles and Slurm's commands
working, and `dpkg -P` leaving nothing of nopfs (its state included) and nothing else touched.

Run as root, on a machine where nopfs is not installed otherwise (the test refuses to touch an
installed nopfs it did not install).
"""
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

import clusterlib as cl

PACKAGE = "nopfs"
ENABLED = "/etc/slurm/plugstack.conf.d/nopfs.conf"  # what `nopfs admin enable` writes


def host_slurm_env():
    """Slurm's commands as on a host with Debian's /etc/slurm/plugstack.conf (it includes
    plugstack.conf.d/*.conf), talking to the local cluster."""
    conf = os.path.join(cl.DIR, "etc/slurm-host.conf")
    with open(cl.CONF) as f:
        text = f.read()
    with open(conf, "w") as f:
        f.write(re.sub(r"(?m)^PlugStackConfig=.*$", "PlugStackConfig=/etc/slurm/plugstack.conf",
                       text))
    return dict(os.environ, SLURM_CONF=conf)


def run(*args, check=True, env=None, cwd=None):
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r


def installed():
    r = run("dpkg-query", "-W", "-f=${Status}", PACKAGE, check=False)
    return r.returncode == 0 and "installed" in r.stdout and "not-installed" not in r.stdout


def purge():
    run("dpkg", "-P", PACKAGE, check=False)


def hardening(path):
    """What `path` (an ELF file) lacks of the distribution's hardening, as a list of words."""
    header = run("readelf", "-h", path).stdout
    segments = run("readelf", "-lW", path).stdout
    dynamic = run("readelf", "-dW", path).stdout
    symbols = set(re.findall(r"\b(__\w+_chk(?:_fail)?)\b", run("readelf", "--dyn-syms", "-W",
                                                               path).stdout))
    missing = []
    if "GNU_RELRO" not in segments:
        missing.append("relro")
    if not re.search(r"\(FLAGS(_1)?\)\s+Flags:.*\b(BIND_NOW|NOW)\b", dynamic):
        missing.append("bindnow")
    if not re.search(r"Type:\s+DYN", header):
        missing.append("pie")
    if "__stack_chk_fail" not in symbols:
        missing.append("stackprotector")
    if not symbols - {"__stack_chk_fail"}:
        missing.append("fortify")
    return missing


class PackageTest(cl.ClusterCase):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("the package test installs a .deb: run as root")
        if installed():
            raise AssertionError("nopfs is already installed on this machine: the test installs "
                                 "and removes its own package; remove it first (dpkg -P nopfs)")
        cls.out = tempfile.mkdtemp(prefix="nopfs-package-test-")
        r = run("cpack", "-G", "DEB", "-B", cls.out, cwd=cl.BUILD)
        debs = glob.glob(os.path.join(cls.out, "nopfs_*.deb"))
        if len(debs) != 1:
            raise AssertionError(f"cpack made {debs}:\n{r.stdout}{r.stderr}")
        cls.deb = debs[0]
        # Install before the cluster comes up: the cluster runs the installed plugin.
        run("apt-get", "install", "-y", "--no-install-recommends", cls.deb)
        cls.files = run("dpkg", "-L", PACKAGE).stdout.split("\n")
        cls.conffiles = set(
            line.split()[0] for line in
            run("dpkg-query", "-W", "-f=${Conffiles}\n", PACKAGE).stdout.splitlines()
            if line.strip())
        cls.plugin = next(f for f in cls.files if f.endswith("/spank_nopfs.so"))
        os.environ["NOPFS_PLUGIN"] = cls.plugin
        try:
            super().setUpClass()
        except BaseException:
            purge()
            raise

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        os.environ.pop("NOPFS_PLUGIN", None)
        purge()
        shutil.rmtree(cls.out, ignore_errors=True)

    def setUp(self):
        # The installed defaults find the launcher and nopfsd: no nopfsd= argument.
        cl.cluster("plugstack", extra_args="")

    def test_1_package_metadata_and_layout(self):
        fields = run("dpkg-deb", "-f", self.deb, "Depends", "Recommends").stdout
        for dep in ("libfabric1", "librocksdb", "liblua5.4-0", "libslurm",
                    "slurm-wlm-basic-plugins (>= 22.05)", "slurm-wlm-basic-plugins (<< 22.06)",
                    "python3"):
            self.assertIn(dep, fields)
        self.assertIn("Recommends: python3-torch", fields)
        for path in ("/usr/bin/nopfs", "/usr/sbin/nopfsd", "/usr/libexec/nopfs/nopfs-job",
                     "/etc/nopfs/nopfs.conf.lua", "/etc/nopfs/policy.lua",
                     "/usr/share/nopfs/plugstack.conf",
                     "/usr/lib/systemd/system/nopfs-gc.service",
                     "/usr/lib/systemd/system/nopfs-gc.timer",
                     "/usr/lib/systemd/system/nopfs-node-exporter.service",
                     "/usr/lib/systemd/system/nopfs-placement.service",
                     "/usr/lib/systemd/system/nopfs-placement.timer",
                     "/usr/lib/systemd/system/nopfs-share.service",
                     "/usr/share/doc/nopfs/examples/job_submit.lua",
                     "/usr/share/man/man1/nopfs.1.gz", "/usr/share/man/man8/nopfsd.8.gz",
                     "/usr/share/man/man8/nopfs-spank.8.gz",
                     "/usr/lib/python3/dist-packages/nopfs/torch/__init__.py",
                     "/usr/lib/python3/dist-packages/nopfs/torch/_loader.py",
                     "/usr/share/doc/nopfs/docs/admin.md"):
            self.assertIn(path, self.files)
        self.assertRegex(self.plugin, r"^/usr/lib/[^/]+/slurm-wlm/spank_nopfs\.so$")
        self.assertEqual(self.conffiles, {"/etc/nopfs/nopfs.conf.lua", "/etc/nopfs/policy.lua"})
        # The package's plugstack line names the installed plugin and config, nothing of the
        # build; it is where Slurm does not read it.
        with open("/usr/share/nopfs/plugstack.conf") as f:
            line = [s for s in f if s.startswith("optional ")][0]
        self.assertIn(self.plugin, line)
        self.assertIn("config=/etc/nopfs/nopfs.conf.lua", line)
        self.assertNotIn(cl.BUILD, line)
        # The share service's unit runs the installed launcher with the plugin's enabled line.
        with open("/usr/lib/systemd/system/nopfs-share.service") as f:
            unit = f.read()
        self.assertIn("ExecStart=/usr/libexec/nopfs/nopfs-job share-serve "
                      "--plugstack=/etc/slurm/plugstack.conf.d/nopfs.conf --idle-exit=0\n", unit)
        self.assertNotIn(cl.BUILD, unit)
        # The man pages render without warnings and carry the docs' and --help's text.
        for page, text in (("nopfs", "nopfs run"), ("nopfsd", "--run-dir"),
                           ("nopfs-spank", "--nopfs-ram")):
            r = run("man", "--warnings", page,
                    env=dict(os.environ, MANWIDTH="100", LC_ALL="C.UTF-8", MANPAGER="cat"))
            self.assertEqual(r.stderr.strip(), "", page)
            self.assertIn(text, r.stdout.replace("\u2010", "-"), page)
            # Complete on a node: every document it cites is installed where it says.
            cited = re.findall(r"(\S*)docs/([\w.]+?\.md)", r.stdout.replace("\u2010", "-"))
            self.assertTrue(cited, page)
            for before, name in cited:
                self.assertTrue(before.endswith("/usr/share/doc/nopfs/"), (page, before, name))
                self.assertIn(f"/usr/share/doc/nopfs/docs/{name}", self.files, (page, name))
        # The installed config loads with the installed nopfs.
        run("/usr/bin/nopfs", "config", "/etc/nopfs/nopfs.conf.lua", "--policy",
            "/etc/nopfs/policy.lua")

    def test_1_install_changes_nothing_until_enabled(self):
        self.assertFalse(os.path.lexists(ENABLED), "the package enabled the plugin itself")
        self.assertEqual(glob.glob("/etc/systemd/system/*.wants/nopfs-*"), [])
        r = run("/usr/bin/nopfs", "admin", "status")
        self.assertRegex(r.stdout, r"^nopfs \S+: disabled \(")
        # Every program says its version: the package's.
        version = run("dpkg-query", "-W", "-f=${Version}", PACKAGE).stdout
        for prog in ("/usr/bin/nopfs", "/usr/sbin/nopfsd", "/usr/libexec/nopfs/nopfs-job"):
            self.assertEqual(run(prog, "--version").stdout.split()[-1], version, prog)

    def test_1_binaries_are_hardened(self):
        # As Debian hardens its own packages: full RELRO (GNU_RELRO and BIND_NOW), position-
        # independent executables, the stack protector and _FORTIFY_SOURCE (their checked entry
        # points among the imported symbols).
        for path in ("/usr/bin/nopfs", "/usr/sbin/nopfsd", "/usr/libexec/nopfs/nopfs-job",
                     self.plugin):
            self.assertEqual(hardening(path), [], path)

    def test_2_0_enabling_is_one_step_that_says_what_is_missing(self):
        # Without a slurm.conf to check, nothing is written and the reason is named.
        r = run("/usr/bin/nopfs", "admin", "enable", "--slurm-conf", "/nonexistent/slurm.conf",
                check=False)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("/nonexistent/slurm.conf: cannot be read", r.stderr)
        self.assertFalse(os.path.lexists(ENABLED))
        # The documented step, against the cluster's slurm.conf (PrologFlags=Alloc).
        r = run("/usr/bin/nopfs", "admin", "enable", env=dict(os.environ, SLURM_CONF=cl.CONF))
        self.assertIn(f"enabled: {ENABLED}", r.stdout)
        self.assertIn("no peer_key=", r.stdout)  # said, not refused
        with open(ENABLED) as f:
            self.assertIn(self.plugin, f.read())
        self.assertRegex(run("/usr/bin/nopfs", "admin", "status").stdout, r"^nopfs \S+: enabled \(")
        # Slurm's commands reading the host's plugstack.conf now offer the options.
        r = run("sbatch", "--help", env=host_slurm_env())
        self.assertIn("--nopfs", r.stdout)
        self.assertEqual(r.stderr, "")

    def test_2_1_a_job_runs_on_the_installed_parts(self):
        with open(os.path.join(cl.DIR, "etc/plugstack.conf")) as f:
            line = f.read()
        self.assertIn(self.plugin, line)
        self.assertNotIn(cl.BUILD, line)
        # Each task: which nopfsd serves it, the installed Python package (bytecode allowed, as
        # users run it), and every sample of its stream checked against its file.
        task = os.path.join(cl.JOBS, "package-task.sh")
        with open(task, "w") as f:
            f.write("#!/bin/bash\n"
                    "exe=$(readlink /proc/$(pgrep -u $USER -x nopfsd | head -n 1)/exe)\n"
                    "echo \"$SLURMD_NODENAME: daemon $exe\"\n"
                    "cd / && env -u PYTHONDONTWRITEBYTECODE /usr/bin/python3 -c "
                    "'import nopfs, nopfs.torch; print(\"python\", nopfs.__file__)' "
                    "| sed \"s/^/$SLURMD_NODENAME: /\"\n"
                    "/usr/bin/nopfs cat --verify 2>&1 | tail -n 1 "
                    "| sed \"s/^/$SLURMD_NODENAME: verify: /\"\n")
        os.chmod(task, 0o755)
        r = cl.submit("nopfs-alice",
                      f"-N2 -w n1,n2 --ntasks-per-node=1 --mem=600 --nopfs={cl.DATASET} "
                      "--nopfs-epochs=2 --nopfs-batch=8 --nopfs-scheme=strided",
                      f"srun {task}\n")
        job = r
        cl.wait_done(job, timeout=120)
        out = cl.output(job)
        for node in ("n1", "n2"):
            self.assertIn(f"{node}: daemon /usr/sbin/nopfsd", out)
            self.assertIn(f"{node}: python /usr/lib/python3/dist-packages/nopfs/__init__.py", out)
            m = re.search(rf"^{node}: verify: (\d+) samples, \d+ bytes, (\d+) mismatches", out,
                          re.MULTILINE)
            self.assertIsNotNone(m, out)
            self.assertGreater(int(m.group(1)), 0, out)
            self.assertEqual(m.group(2), "0", out)
        self.assertNothingLeft([job])

    def test_2_2_an_upgrade_under_a_running_job(self):
        """Running jobs keep their nopfsd (its files replaced under it), the plugin stays
        enabled, the new epilog tears the old job down, and the next job gets the new parts."""
        job = cl.submit("nopfs-alice", f"-w n1 --mem=300 --nopfs={cl.DATASET}",
                        f"srun /usr/bin/nopfs cat --verify 2>&1 | tail -n 1\n" +
                        cl.HOLD.format(jobs=cl.JOBS))
        cl.wait_state(job, {"RUNNING"}, 90)
        deadline = time.monotonic() + 60
        before = set()
        while not before and time.monotonic() < deadline:
            before = {p for p, (_, argv) in cl.daemons().items()
                      if f"/n1/{job}" in " ".join(argv)}
            time.sleep(0.2)
        self.assertEqual(len(before), 1, cl.output(job))
        # The same package as a newer version (what an upgrade does to the files and scripts).
        work = tempfile.mkdtemp(prefix="nopfs-upgrade-", dir=self.out)
        run("dpkg-deb", "-R", self.deb, work + "/root")
        control = work + "/root/DEBIAN/control"
        with open(control) as f:
            text = f.read()
        version = re.search(r"(?m)^Version: (.*)$", text).group(1)
        with open(control, "w") as f:
            f.write(text.replace(f"Version: {version}", f"Version: {version}+1"))
        run("dpkg-deb", "-b", work + "/root", work + "/new.deb")
        run("apt-get", "install", "-y", "--no-install-recommends", work + "/new.deb")
        self.assertEqual(run("dpkg-query", "-W", "-f=${Version}", PACKAGE).stdout, version + "+1")
        self.assertTrue(os.path.exists(ENABLED), "an upgrade must leave the plugin enabled")
        after = {p for p, (_, argv) in cl.daemons().items() if f"/n1/{job}" in " ".join(argv)}
        self.assertEqual(after, before, "the running job's nopfsd was touched by the upgrade")
        cl.release(job)
        self.assertEqual(cl.wait_done(job, 120), "COMPLETED", cl.output(job))
        self.assertRegex(cl.output(job), r"\d+ samples, \d+ bytes, 0 mismatches")
        self.assertNothingLeft([job])
        # The next job runs on the upgraded parts.
        nxt = cl.submit("nopfs-alice", f"-w n1 --mem=300 --nopfs={cl.DATASET}",
                        "srun /usr/bin/nopfs cat --verify 2>&1 | tail -n 1\n")
        self.assertEqual(cl.wait_done(nxt, 120), "COMPLETED", cl.output(nxt))
        self.assertRegex(cl.output(nxt), r"\d+ samples, \d+ bytes, 0 mismatches")
        self.assertNothingLeft([nxt])

    def test_3_remove_leaves_only_conffiles_and_purge_nothing(self):
        # Byte-compiled modules made by running the package (above, as a user would) must go too.
        run("env", "-u", "PYTHONDONTWRITEBYTECODE", "/usr/bin/python3", "-c", "import nopfs.torch",
            cwd="/")
        # State for the purge to remove, beside what is not nopfs's: the admin points the
        # config's SSD class and metrics directory at scratch directories of this test.
        scratch = tempfile.mkdtemp(prefix="nopfs-purge-", dir=self.out)
        ssd, metrics, rundir = (os.path.join(scratch, d) for d in ("ssd", "metrics", "run"))
        for path in (f"{ssd}/nopfs-1001/kept/00000000000000aa", f"{ssd}/someone-else",
                     metrics, f"{rundir}/n1/.ledger"):
            os.makedirs(path)
        for path in (f"{ssd}/nopfs-1001/kept/00000000000000aa/data.0", f"{ssd}/someone-else/f",
                     f"{metrics}/nopfs_77.prom", f"{metrics}/node.prom"):
            open(path, "w").close()
        with open("/etc/nopfs/nopfs.conf.lua") as f:
            conf = f.read()
        with open("/etc/nopfs/nopfs.conf.lua", "w") as f:
            f.write(conf.replace('"/local/nvme"', f'"{ssd}"') + f'metrics_dir = "{metrics}"\n')
        with open(ENABLED) as f:
            line = f.read()
        with open(ENABLED, "w") as f:
            f.write(line.replace("rundir=/run/nopfs", f"rundir={rundir}"))
        r = run("dpkg", "-r", PACKAGE)
        self.assertIn("the Slurm plugin is disabled", r.stdout)
        # Slurm's commands work after the removal: no line names the plugin that is gone.
        self.assertFalse(os.path.lexists(ENABLED))
        r = run("sbatch", "--help", env=host_slurm_env())
        self.assertEqual(r.stderr, "")
        self.assertNotIn("--nopfs", r.stdout)
        with open(os.path.join(cl.DIR, "etc/plugstack.conf"), "w") as f:
            f.write("include /etc/slurm/plugstack.conf.d/*.conf\n")  # as the host's
        r = run("srun", "-w", "n1", "true", env=host_slurm_env())
        self.assertEqual(r.stderr, "")
        left = [f for f in self.files
                if f and os.path.lexists(f) and not os.path.isdir(f) and f not in self.conffiles]
        self.assertEqual(left, [], "left behind by dpkg -r")
        self.assertFalse(os.path.exists("/usr/lib/python3/dist-packages/nopfs"))
        self.assertFalse(os.path.exists("/usr/libexec/nopfs"))
        for f in self.conffiles:
            self.assertTrue(os.path.exists(f), f)
        r = run("dpkg", "-P", PACKAGE)
        self.assertEqual([f for f in self.conffiles if os.path.exists(f)], [])
        self.assertFalse(os.path.exists("/etc/nopfs"))
        # Purge removed nopfs's state, said so, and touched nothing else.
        for gone in (f"{ssd}/nopfs-1001", f"{metrics}/nopfs_77.prom", rundir,
                     ENABLED + ".disabled", "/var/lib/nopfs"):
            self.assertFalse(os.path.lexists(gone), gone)
            if not gone.startswith(("/etc", "/var")):
                self.assertIn(f"nopfs: purge: removed {gone}", r.stdout)
        for kept in (f"{ssd}/someone-else/f", f"{metrics}/node.prom"):
            self.assertTrue(os.path.exists(kept), kept)


if __name__ == "__main__":
    unittest.main()
