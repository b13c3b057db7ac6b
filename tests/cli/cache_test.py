#!/usr/bin/env python3
"""`nopfs cache ls|rm` and `nopfs gc` on datasets a real nopfsd kept (`nopfs run --keep`): the
user lists and removes their own, never another user's; gc applies the policy's keep(user, node)
(quota, lifetime) and removes what a crash left; bad arguments say what to write instead.

As root, the runs and the user's commands go through setpriv as `nobody`, and gc runs as root
(as an admin runs it); as another user, gc's root-only parts are not checked.

Usage: cache_test.py BUILD_BIN_DIR
"""

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

BIN = None
AS_ROOT = os.geteuid() == 0
USER_UID = 65534 if AS_ROOT else os.geteuid()  # nobody


def as_user(argv):
    if not AS_ROOT:
        return argv
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"] + argv


def nopfs(*args, root=False, check=True):
    argv = [os.path.join(BIN, "nopfs"), *map(str, args)]
    p = subprocess.run(argv if root else as_user(argv), capture_output=True, text=True,
                       timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {p.returncode}\nstdout:\n{p.stdout}\n"
                             f"stderr:\n{p.stderr}")
    return p


class CacheTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="nopfs-cache-test-")
        os.chmod(cls.tmp, 0o755)
        rnd = random.Random(5)
        cls.datasets = []
        for name in ("ds1", "ds2"):
            root = os.path.join(cls.tmp, name)
            for c in range(3):
                os.makedirs(os.path.join(root, f"c{c}"))
                for i in range(30):
                    with open(os.path.join(root, f"c{c}", f"{i:03d}.bin"), "wb") as f:
                        f.write(rnd.randbytes(rnd.randint(2000, 60000)))
            cls.datasets.append(root)
        for root, dirs, files in os.walk(cls.tmp):
            os.chmod(root, 0o755)
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.work = tempfile.mkdtemp(dir=self.tmp)
        os.chmod(self.work, 0o755)
        self.scratch = os.path.join(self.work, "scratch")
        os.mkdir(self.scratch)
        os.chmod(self.scratch, 0o1777 if not AS_ROOT else 0o755)
        if AS_ROOT:  # as the prolog makes it
            os.mkdir(os.path.join(self.scratch, f"nopfs-{USER_UID}"), 0o700)
            os.chown(os.path.join(self.scratch, f"nopfs-{USER_UID}"), USER_UID, 65534)
        self.conf = os.path.join(self.work, "node.conf.lua")
        with open(self.conf, "w") as f:
            f.write('staging = { capacity = "16M", threads = 2 }\n'
                    f'classes = {{ ram {{ capacity = "1K" }}, ssd {{ path = "{self.scratch}", '
                    'capacity = "1G", threads = 2 } }\n')
        os.chmod(self.conf, 0o644)
        self.policy = os.path.join(self.work, "policy.lua")
        self.write_policy("return { quota = '1G', lifetime = '1d' }")

    def write_policy(self, keep_body):
        with open(self.policy, "w") as f:
            f.write("function admit(job, node) return {} end\n"
                    f"function keep(user, node) {keep_body} end\n")

    def keep_run(self, dataset, extra=()):
        p = nopfs("run", "--dataset", dataset, "--ranks", 1, "--seed", 3, "--config", self.conf,
                  "--keep", *extra, "--", os.path.join(BIN, "nopfs"), "cat", "--verify")
        self.assertRegex(p.stdout + p.stderr, r"\d+ samples, \d+ bytes, 0 mismatches")
        return p

    def ls(self):
        return json.loads(nopfs("cache", "ls", "--config", self.conf, "--json").stdout)

    def kept_dir(self):
        return os.path.join(self.scratch, f"nopfs-{USER_UID}", "kept")

    def test_ls_shows_what_was_kept_and_rm_removes_it(self):
        self.assertEqual(self.ls(), [])
        self.assertIn("no kept datasets", nopfs("cache", "ls", "--config", self.conf).stdout)
        self.keep_run(self.datasets[0])
        self.keep_run(self.datasets[1])
        listed = self.ls()
        self.assertEqual(len(listed), 2, listed)
        self.assertEqual(sorted(e["dataset"] for e in listed), sorted(self.datasets))
        for e in listed:
            self.assertTrue(e["complete"], e)
            self.assertRegex(e["key"], r"^[0-9a-f]{16}$")
            self.assertEqual(e["samples"], 90, e)
            self.assertGreater(e["bytes"], 90 * 2000, e)
            self.assertLessEqual(e["last_used"], time.time() + 1)
            self.assertEqual(e["dir"], os.path.join(self.kept_dir(), e["key"]))
        text = nopfs("cache", "ls", "--config", self.conf).stdout
        self.assertRegex(text, r"(?m)^KEY +SIZE +SAMPLES +AGE +LAST USE +DATASET$")
        for e in listed:
            self.assertRegex(text, rf"(?m)^{e['key']} .* 90 .* ago +{e['dataset']}$")
        # rm of one key, then of the rest.
        p = nopfs("cache", "rm", "--config", self.conf, listed[0]["key"])
        self.assertIn(f"removed {listed[0]['key']}", p.stdout)
        self.assertEqual([e["key"] for e in self.ls()], [listed[1]["key"]])
        p = nopfs("cache", "rm", "--config", self.conf, "0123456789abcdef", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("no such kept dataset here (nopfs cache ls)", p.stderr)
        nopfs("cache", "rm", "--config", self.conf, "--all")
        self.assertEqual(self.ls(), [])
        self.assertEqual(os.listdir(self.kept_dir()), [])

    def test_a_dataset_path_that_is_not_utf8_is_written_exactly_in_json(self):
        # JSON carries each byte that is not UTF-8 as \udcXX (PEP 383): Python's json reads it
        # and os.fsencode gives back the path's bytes, in `cache ls --json` as in
        # `status --json`.
        raw = os.path.join(os.fsencode(self.work), b"bad\xffname")
        rnd = random.Random(9)
        for c in range(2):
            os.makedirs(os.path.join(raw, b"c%d" % c))
            for i in range(10):
                with open(os.path.join(raw, b"c%d" % c, b"%03d.bin" % i), "wb") as f:
                    f.write(rnd.randbytes(3000))
        for root, _, files in os.walk(raw):
            os.chmod(root, 0o755)
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)
        dataset = os.fsdecode(raw)
        self.keep_run(dataset)
        text = nopfs("cache", "ls", "--config", self.conf, "--json").stdout
        self.assertIn("bad\\udcffname", text)
        [entry] = json.loads(text)
        self.assertEqual(os.fsencode(entry["dataset"]), raw)
        out = os.path.join(self.work, "status")
        os.mkdir(out, 0o777)
        os.chmod(out, 0o777)
        status = os.path.join(out, "status.json")
        nopfs("run", "--dataset", dataset, "--ranks", 1, "--config", self.conf, "--",
              "sh", "-c", f"exec {os.path.join(BIN, 'nopfs')} status --json > {status}")
        with open(status, "rb") as f:
            doc = json.loads(f.read())
        self.assertEqual(os.fsencode(doc["dataset"]["path"]), raw)

    def test_bad_arguments_say_what_to_write(self):
        p = nopfs("cache", "rm", "--config", self.conf, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("give the keys to remove (as nopfs cache ls shows them) or --all", p.stderr)
        p = nopfs("cache", "rm", "--config", self.conf, "--all", "0123456789abcdef", check=False)
        self.assertEqual(p.returncode, 2)
        p = nopfs("cache", "rm", "--config", self.conf, "../..", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertTrue(os.path.isdir(self.scratch))
        p = nopfs("cache", "ls", "--config", "/nonexistent.lua", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("give the node's config with --config FILE", p.stderr)
        p = nopfs("run", "--dataset", self.datasets[0], "--ranks", 1, "--keep-max-bytes", 5,
                  "--", "true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--keep", p.stderr)
        p = nopfs("run", "--dataset", self.datasets[0], "--ranks", 1, "--keep",
                  "--keep-max-bytes", "10XB", "--", "true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("'10XB' is not a size: write a number of MiB or a number with a unit, as "
                      "for Slurm's --mem",
                      p.stderr)
        # A size with a unit is taken (and bounds what is kept: data, index and MANIFEST).
        self.keep_run(self.datasets[0], ("--keep-max-bytes", "64KiB"))
        kept = [e for e in self.ls() if e["dataset"].endswith(os.path.basename(self.datasets[0]))]
        self.assertEqual(len(kept), 1, self.ls())
        self.assertLessEqual(kept[0]["bytes"], 64 * 1024 + 32 * 1024, kept)

    @unittest.skipUnless(AS_ROOT, "gc runs as root")
    def test_gc_applies_lifetime_quota_and_removes_crash_leftovers(self):
        gc = ["gc", "--config", self.conf, "--policy", self.policy, "--node", "n7"]
        # The times that count are root's own record: when gc (or a prolog or an epilog) first
        # saw a dataset, never the MANIFEST's.
        self.keep_run(self.datasets[0])
        nopfs(*gc, root=True)
        time.sleep(1.1)  # root's record is in seconds: ds2 is the more recent
        self.keep_run(self.datasets[1])
        keys = {e["dataset"]: e["key"] for e in self.ls()}
        # What a crash leaves: a .tmp.* entry whose lock nobody holds, a key without MANIFEST.
        tmp = os.path.join(self.kept_dir(), ".tmp.crashed")
        os.mkdir(tmp)
        with open(os.path.join(tmp, "lock"), "w"):
            pass
        os.mkdir(os.path.join(self.kept_dir(), "00000000000000aa"))
        p = nopfs(*gc, root=True)
        self.assertRegex(p.stdout, r"removed .*/kept/\.tmp\.crashed \(uid \d+, .*, incomplete\)")
        self.assertRegex(p.stdout, r"removed .*/kept/00000000000000aa \(uid \d+, .*, incomplete\)")
        self.assertRegex(p.stdout, r"(?m)^kept on n7: 2 entries, .* of 1 users$")
        self.assertEqual(sorted(os.listdir(self.kept_dir())), sorted(keys.values()))
        # A quota that holds one: the least recently used (ds1) goes.
        one = max(e["bytes"] for e in self.ls())
        self.write_policy(f"return {{ quota = '{one + 4096}B' }}")  # a bare number is MiB
        p = nopfs(*gc, root=True)
        self.assertRegex(p.stdout, rf"removed .*/kept/{keys[self.datasets[0]]} .*over quota\)")
        self.assertEqual(os.listdir(self.kept_dir()), [keys[self.datasets[1]]])
        # A lifetime of 1 s: the rest expires.
        self.write_policy("return { quota = '1G', lifetime = 1 }")
        time.sleep(2.1)
        p = nopfs(*gc, root=True)
        self.assertRegex(p.stdout, rf"removed .*/kept/{keys[self.datasets[1]]} .*expired\)")
        self.assertEqual(os.listdir(self.kept_dir()), [])
        # A policy whose keep fails leaves the user's datasets alone and says so.
        self.keep_run(self.datasets[0])
        self.write_policy("error('broken')")
        p = nopfs(*gc, root=True, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("broken", p.stderr)
        self.assertIn("that user's datasets are left alone", p.stderr)
        self.assertEqual(len(os.listdir(self.kept_dir())), 1)
        # Without a keep function, nothing may be kept: gc removes it.
        with open(self.policy, "w") as f:
            f.write("function admit(job, node) return {} end\n")
        p = nopfs(*gc, root=True)
        self.assertIn("over quota", p.stdout)
        self.assertEqual(os.listdir(self.kept_dir()), [])
        # As a user, gc says what to use instead.
        p = nopfs(*gc, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("nopfs cache rm", p.stderr)

    @unittest.skipUnless(AS_ROOT, "needs a second user")
    def fake_slurm(self, shared, yours=None):
        """sbatch, sinfo, squeue and scontrol on PATH, answering as slurmctld with placement
        would: the user's mark (`yours`, default M) and, for a shared dataset, the shared copy's
        mark S; n1 (this node) carries M, n2 M and a job of the user runs there, n3 M and S, n4 S
        alone, n5 another mark; n2 is listed twice (two partitions). Returns M, S and the file
        of sbatch's arguments."""
        bin_dir = os.path.join(self.work, "slurm-bin")
        os.mkdir(bin_dir)
        if AS_ROOT:  # for sbatch.args
            os.chown(bin_dir, USER_UID, 65534)
        mark, smark = "nopfs_00000000000000aa", "nopfs_00000000000000bb"
        answer = f"mark {yours or mark}" + (f"; shared {smark}" if shared else "")
        scripts = {
            "sbatch": "#!/bin/sh\n"
                      f'echo "$@" >> {bin_dir}/sbatch.args\n'
                      'case "$*" in *"--comment=nopfs where:"*) '
                      f'echo "sbatch: nopfs where: {answer}" >&2; '
                      'echo "sbatch: Job 3 to start at 2026-11-29T10:00:00 using 1 processors '
                      'on nodes n5 in partition debug" >&2;; '
                      '*) echo "sbatch: Job 4 to start at 2026-11-29T10:42:07 using 1 processors '
                      'on nodes n3 in partition debug" >&2;; esac\n',
            "sinfo": "#!/bin/sh\n"
                     f"printf 'n1 idle {mark}\\nn2 mixed nvme,{mark}\\n"
                     f"n2 mixed nvme,{mark}\\nn3 idle {mark},{smark}\\n"
                     f"n4 allocated {smark}\\nn5 idle nopfs_00000000000000cc\\n'\n",
            "squeue": "#!/bin/sh\nprintf '12 n[2,5]\\n13 n6\\n'\n",
            "scontrol": '#!/bin/sh\n[ "$3" = "n[2,5]" ] && printf "n2\\nn5\\n"\n',
        }
        for name, text in scripts.items():
            with open(os.path.join(bin_dir, name), "w") as f:
                f.write(text)
            os.chmod(os.path.join(bin_dir, name), 0o755)
        os.environ["PATH"] = bin_dir + ":" + self.path
        return mark, smark, os.path.join(bin_dir, "sbatch.args")

    def test_where_tells_a_kept_copy_a_running_jobs_tiers_and_the_shared_copy_apart(self):
        self.path = os.environ["PATH"]
        self.addCleanup(os.environ.__setitem__, "PATH", self.path)
        dataset = self.datasets[0]
        self.keep_run(dataset)
        mark, smark, args = self.fake_slurm(shared=True)
        where = [os.path.join(BIN, "nopfs"), "where", dataset + "/./", "--config", self.conf,
                 "--node", "n1"]
        # nopfs where from inside a running job on the dataset (job 4711 here): n1's own kept
        # area and sibling registry say what it holds.
        out_dir = os.path.join(self.work, "out")
        os.mkdir(out_dir)
        if AS_ROOT:
            os.chown(out_dir, USER_UID, 65534)
        out = os.path.join(out_dir, "where.out")
        p = nopfs("run", "--dataset", dataset, "--ranks", 1, "--config", self.conf, "--job-id",
                  4711, "--", "sh", "-c", f"{' '.join(where)} > {out} 2>&1; echo $? >> {out}")
        with open(out) as f:
            text = f.read()
        self.assertEqual(
            re.sub(r"[\d.]+ [KM]iB, last used \w+ ago", "SIZE", text),
            f"copies of {dataset} are on 4 nodes (your mark {mark}, the shared copy's {smark}):\n"
            "  n1 (idle): your kept copy, SIZE; the tiers of your running job 4711 (until it "
            "ends)\n"
            "  n2 (mixed): your kept copy, or the tiers of your job 12 running there, or both "
            "(`nopfs where` on n2 tells)\n"
            "  n3 (idle): your kept copy (size and last use: `nopfs cache ls` on n3); the shared "
            "copy (every user's)\n"
            "  n4 (allocated): the shared copy (every user's)\n"
            "a 1-node job on them could start on n3 at 2026-11-29T10:42:07\n0\n")
        with open(args) as f:
            self.assertIn(f"--constraint={mark}|{smark}", f.read())
        # Once the job has ended, n1 holds the kept copy alone.
        p = nopfs(*where[1:])
        self.assertIn("  n1 (idle): your kept copy, ", p.stdout)
        self.assertNotIn("4711", p.stdout)
        # A shared dataset the user cannot read: its copy's nodes are of no use, and not listed.
        p = nopfs("where", os.path.join(self.work, "no-such-dataset"), "--config", self.conf,
                  "--node", "n1")
        self.assertIn("is shared on this cluster, but you cannot read it (No such file or "
                      "directory)", p.stdout)
        self.assertNotIn("n4", p.stdout)
        self.assertNotIn(smark, p.stdout)
        # A dataset that is not shared: the user's mark alone.
        shutil.rmtree(os.path.dirname(args))
        self.fake_slurm(shared=False)
        p = nopfs(*where[1:])
        self.assertIn(f"copies of {dataset} are on 3 nodes (your mark {mark}):\n", p.stdout)
        self.assertNotIn("shared", p.stdout)
        with open(args) as f:
            self.assertIn(f"--constraint={mark} ", f.read())
        # Another user's view of the shared dataset: the shared copy's nodes alone, and the
        # start asked of them alone (Slurm refuses a constraint no node's features meet by name).
        shutil.rmtree(os.path.dirname(args))
        other = "nopfs_00000000000000dd"
        self.fake_slurm(shared=True, yours=other)
        p = nopfs(*where[1:])
        self.assertEqual(p.stdout,
                         f"copies of {dataset} are on 2 nodes (your mark {other}, the shared "
                         f"copy's {smark}):\n  n3 (idle): the shared copy (every user's)\n"
                         "  n4 (allocated): the shared copy (every user's)\n"
                         "a 1-node job on them could start on n3 at 2026-11-29T10:42:07\n")
        with open(args) as f:
            self.assertIn(f"--constraint={smark} ", f.read())

    def test_another_user_sees_and_removes_nothing_of_it(self):
        self.keep_run(self.datasets[0])
        key = self.ls()[0]["key"]
        other = ["setpriv", "--reuid=daemon", "--regid=daemon", "--clear-groups", "--",
                 os.path.join(BIN, "nopfs"), "cache"]
        p = subprocess.run(other + ["ls", "--config", self.conf, "--json"], capture_output=True,
                           text=True)
        self.assertEqual(json.loads(p.stdout), [], p.stderr)
        p = subprocess.run(other + ["rm", "--config", self.conf, "--all"], capture_output=True,
                           text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        p = subprocess.run(other + ["rm", "--config", self.conf, key], capture_output=True,
                           text=True)
        self.assertEqual(p.returncode, 1)
        self.assertEqual([e["key"] for e in self.ls()], [key])
        p = subprocess.run(["setpriv", "--reuid=daemon", "--regid=daemon", "--clear-groups", "--",
                            "ls", self.kept_dir()], capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0)


if __name__ == "__main__":
    BIN = sys.argv.pop(1)
    unittest.main()
