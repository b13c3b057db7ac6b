"""The package as an admin installs it: `cpack -G DEB` in the build tree, `apt-get install
./nopfs_*.deb`, the local cluster running the **installed** plugin, launcher and nopfsd (no path
into the build tree), a job of nopfs-alice reading through them with the installed `nopfs` and
Python package, then `dpkg -r` leaving nothing but the conffiles and `dpkg -P` leaving nothing.

Run as root, on a machine where nopfs is not installed otherwise (the test refuses to touch an
installed nopfs it did not install).
"""
import glob
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import clusterlib as cl

PACKAGE = "nopfs"


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
                     "/etc/slurm/plugstack.conf.d/nopfs.conf",
                     "/usr/share/man/man1/nopfs.1.gz", "/usr/share/man/man8/nopfsd.8.gz",
                     "/usr/share/man/man8/nopfs-spank.8.gz",
                     "/usr/lib/python3/dist-packages/nopfs/torch/__init__.py",
                     "/usr/lib/python3/dist-packages/nopfs/torch/_loader.py",
                     "/usr/share/doc/nopfs/docs/admin.md"):
            self.assertIn(path, self.files)
        self.assertRegex(self.plugin, r"^/usr/lib/[^/]+/slurm-wlm/spank_nopfs\.so$")
        self.assertEqual(self.conffiles, {"/etc/nopfs/nopfs.conf.lua", "/etc/nopfs/policy.lua",
                                          "/etc/slurm/plugstack.conf.d/nopfs.conf"})
        # The installed plugstack line names the installed plugin and config, nothing of the build.
        with open("/etc/slurm/plugstack.conf.d/nopfs.conf") as f:
            line = [s for s in f if s.startswith("optional ")][0]
        self.assertIn(self.plugin, line)
        self.assertIn("config=/etc/nopfs/nopfs.conf.lua", line)
        self.assertNotIn(cl.BUILD, line)
        # The man pages render without warnings and carry the docs' and --help's text.
        for page, text in (("nopfs", "nopfs run"), ("nopfsd", "--run-dir"),
                           ("nopfs-spank", "--nopfs-ram")):
            r = run("man", "--warnings", page,
                    env=dict(os.environ, MANWIDTH="100", LC_ALL="C.UTF-8", MANPAGER="cat"))
            self.assertEqual(r.stderr.strip(), "", page)
            self.assertIn(text, r.stdout.replace("\u2010", "-"), page)
        # The installed config loads with the installed nopfs.
        run("/usr/bin/nopfs", "config", "/etc/nopfs/nopfs.conf.lua", "--policy",
            "/etc/nopfs/policy.lua")

    def test_1_binaries_are_hardened(self):
        # As Debian hardens its own packages: full RELRO (GNU_RELRO and BIND_NOW), position-
        # independent executables, the stack protector and _FORTIFY_SOURCE (their checked entry
        # points among the imported symbols).
        for path in ("/usr/bin/nopfs", "/usr/sbin/nopfsd", "/usr/libexec/nopfs/nopfs-job",
                     self.plugin):
            self.assertEqual(hardening(path), [], path)

    def test_2_a_job_runs_on_the_installed_parts(self):
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

    def test_3_remove_leaves_only_conffiles_and_purge_nothing(self):
        # Byte-compiled modules made by running the package (above, as a user would) must go too.
        run("env", "-u", "PYTHONDONTWRITEBYTECODE", "/usr/bin/python3", "-c", "import nopfs.torch",
            cwd="/")
        run("dpkg", "-r", PACKAGE)
        left = [f for f in self.files
                if f and os.path.lexists(f) and not os.path.isdir(f) and f not in self.conffiles]
        self.assertEqual(left, [], "left behind by dpkg -r")
        self.assertFalse(os.path.exists("/usr/lib/python3/dist-packages/nopfs"))
        self.assertFalse(os.path.exists("/usr/libexec/nopfs"))
        for f in self.conffiles:
            self.assertTrue(os.path.exists(f), f)
        run("dpkg", "-P", PACKAGE)
        self.assertEqual([f for f in self.conffiles if os.path.exists(f)], [])
        self.assertFalse(os.path.exists("/etc/nopfs"))


if __name__ == "__main__":
    unittest.main()
