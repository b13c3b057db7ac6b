// What root and slurmstepd do with paths the job's user controls (spank/job_files.h), attacked
// the way a user would: links, FIFOs, other owners' files, oversized files, swapped directories,
// rewritten command lines and reused pids.
#include "spank/job_files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>

#include "spank/ledger.h"

namespace nopfs::spank {
namespace {

using namespace std::chrono_literals;

constexpr uid_t kOtherUid = 54321;  // no process of the test runs as it

class JobFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-job-files-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    ASSERT_EQ(::chmod(root_.c_str(), 0755), 0);
  }
  void TearDown() override { ASSERT_TRUE(RemoveBelow("/tmp", root_.substr(5)).ok()); }
  void Write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  std::string root_;
};

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(JobFilesTest, ReadUserFileReadsTheUsersOwnRegularFile) {
  Write(root_ + "/ready", "pid=1\nsamples=120\n");
  Result<std::string> r = ReadUserFile(root_ + "/ready", ::geteuid(), 4096);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "pid=1\nsamples=120\n");
  r = ReadUserFile(root_ + "/absent", ::geteuid(), 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

// `failed` made a link to a root-only file: its content never comes back.
TEST_F(JobFilesTest, ReadUserFileRefusesALinkAndNeverShowsItsTarget) {
  const std::string secret = root_ + "/shadow";
  Write(secret, "root-only line\n");
  ASSERT_EQ(::chmod(secret.c_str(), 0600), 0);
  ASSERT_EQ(::symlink(secret.c_str(), (root_ + "/failed").c_str()), 0);
  Result<std::string> r = ReadUserFile(root_ + "/failed", ::geteuid(), 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(r.status().message().find("symbolic link"), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find("root-only"), std::string::npos);
}

// A FIFO at `ready` is refused at once: the read never waits for a writer. Run in a child with
// an alarm, so that a blocking implementation fails the test instead of hanging it.
TEST_F(JobFilesTest, ReadUserFileRefusesAFifoWithoutBlocking) {
  const std::string fifo = root_ + "/ready";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t child = ::fork();
  if (child == 0) {
    ::alarm(5);
    Result<std::string> r = ReadUserFile(fifo, ::geteuid(), 4096);
    _exit(!r.ok() && r.status().code() == StatusCode::kPermissionDenied &&
                  r.status().message().find("FIFO") != std::string::npos
              ? 0
              : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status)) << "blocked on the FIFO (killed by signal " << WTERMSIG(status)
                                 << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

TEST_F(JobFilesTest, ReadUserFileRefusesOtherOwnersDirectoriesAndLargeFiles) {
  const std::string theirs = root_ + "/theirs";
  Write(theirs, "x");
  ASSERT_EQ(::chown(theirs.c_str(), kOtherUid, kOtherUid), 0);
  Result<std::string> r = ReadUserFile(theirs, ::geteuid(), 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("belongs to uid 54321"), std::string::npos);
  // The same file is fine for its owner (a hard link the user made to their own file is theirs).
  EXPECT_TRUE(ReadUserFile(theirs, kOtherUid, 4096).ok());

  ASSERT_EQ(::mkdir((root_ + "/dir").c_str(), 0700), 0);
  r = ReadUserFile(root_ + "/dir", ::geteuid(), 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("a directory"), std::string::npos);

  Write(root_ + "/big", std::string(5000, 'x'));
  r = ReadUserFile(root_ + "/big", ::geteuid(), 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than 4096"), std::string::npos);
}

TEST_F(JobFilesTest, TrustedDirWalkChecksEveryComponent) {
  const std::string run = root_ + "/a/b/run";
  Result<UniqueFd> fd = MakeTrustedDir(run, 0755);
  ASSERT_TRUE(fd.ok()) << fd.status().message();
  EXPECT_GE(fd->get(), 0);
  EXPECT_TRUE(OpenTrustedDir(run).ok());
  EXPECT_TRUE(OpenTrustedDir(run + "/").ok());
  EXPECT_EQ(OpenTrustedDir(run + "/x").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(OpenTrustedDir("relative/path").status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(OpenTrustedDir(root_ + "/a/../a/b").ok());

  // A component another user owns: he could rename it and put a link in its place.
  ASSERT_EQ(::chown((root_ + "/a").c_str(), kOtherUid, kOtherUid), 0);
  fd = OpenTrustedDir(run);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(fd.status().message().find(root_ + "/a belongs to uid 54321"), std::string::npos)
      << fd.status().message();
  EXPECT_FALSE(MakeTrustedDir(run, 0755).ok());
  ASSERT_EQ(::chown((root_ + "/a").c_str(), 0, 0), 0);

  // Writable by others: refused, unless sticky above the last component.
  ASSERT_EQ(::chmod((root_ + "/a").c_str(), 0777), 0);
  fd = OpenTrustedDir(run);
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("writable by group or others"), std::string::npos);
  ASSERT_EQ(::chmod((root_ + "/a").c_str(), 01777), 0);
  EXPECT_TRUE(OpenTrustedDir(run).ok());
  ASSERT_EQ(::chmod(run.c_str(), 01777), 0);
  EXPECT_FALSE(OpenTrustedDir(run).ok());  // the last one may not be, by default
  EXPECT_TRUE(OpenTrustedDir(run, /*last_may_be_sticky=*/true).ok());
  ASSERT_EQ(::chmod(run.c_str(), 0755), 0);

  // A component that is a link, even to a good directory, is refused.
  ASSERT_EQ(::symlink((root_ + "/a").c_str(), (root_ + "/link").c_str()), 0);
  fd = OpenTrustedDir(root_ + "/link/b/run");
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("symbolic link"), std::string::npos);
}

// bob owns a parent of rundir and swaps it for a link to a root-owned tree while alice's job
// runs: removing the job's directory through that path must delete nothing.
TEST_F(JobFilesTest, RemovalRefusesASwappedParent) {
  const std::string bobs = root_ + "/bobs";
  ASSERT_EQ(::mkdir(bobs.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((bobs + "/run").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((bobs + "/run/n1").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((bobs + "/run/n1/42").c_str(), 0700), 0);
  const std::string victim = root_ + "/victim";
  ASSERT_EQ(::mkdir(victim.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((victim + "/n1").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((victim + "/n1/42").c_str(), 0700), 0);
  Write(victim + "/n1/42/precious", "keep");
  ASSERT_EQ(::chown(bobs.c_str(), kOtherUid, kOtherUid), 0);
  ASSERT_EQ(::rename((bobs + "/run").c_str(), (bobs + "/run.old").c_str()), 0);
  ASSERT_EQ(::symlink(victim.c_str(), (bobs + "/run").c_str()), 0);

  Status s = RemoveBelow(bobs + "/run/n1", "42");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(ReadText(victim + "/n1/42/precious"), "keep");
  EXPECT_FALSE(OpenTrustedDir(bobs + "/run/n1").ok());
  // Even with bob's directory root-owned again, the link in the path is refused.
  ASSERT_EQ(::chown(bobs.c_str(), 0, 0), 0);
  EXPECT_FALSE(RemoveBelow(bobs + "/run/n1", "42").ok());
  EXPECT_EQ(ReadText(victim + "/n1/42/precious"), "keep");
}

TEST_F(JobFilesTest, WriteFileAsRefusesALinkedOrForeignDirectory) {
  const std::string real = root_ + "/real";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(real.c_str(), (root_ + "/run").c_str()), 0);
  EXPECT_FALSE(WriteFileAs(root_ + "/run", "failed", "x\n", ::geteuid(), ::getegid()).ok());
  EXPECT_NE(::access((real + "/failed").c_str(), F_OK), 0);
  ASSERT_EQ(::chown(real.c_str(), kOtherUid, kOtherUid), 0);
  EXPECT_FALSE(WriteFileAs(real, "failed", "x\n", kOtherUid + 1, kOtherUid + 1).ok());
  ASSERT_TRUE(WriteFileAs(real, "failed", "why\n", kOtherUid, kOtherUid).ok());
  struct stat st {};
  ASSERT_EQ(::lstat((real + "/failed").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kOtherUid);
  EXPECT_EQ(ReadText(real + "/failed"), "why\n");
}

// The metrics directory takes files from root alone: MakeFileAs makes it root's 0755 when absent,
// refuses one that others may write (sticky or not), and makes the job's file the user's, empty
// and readable by node_exporter, replacing only what root left there, never following a link.
TEST_F(JobFilesTest, MakeFileAsMakesTheJobsFileInADirectoryOnlyRootWrites) {
  const std::string dir = root_ + "/metrics";
  const std::string name = dir + "/nopfs_7.prom";
  auto check = [&] {
    struct stat st {};
    ASSERT_EQ(::lstat(name.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_uid, kOtherUid);
    EXPECT_EQ(st.st_gid, kOtherUid);
    EXPECT_EQ(st.st_mode & 07777, 0644u);
    EXPECT_EQ(st.st_size, 0);
  };
  ASSERT_TRUE(MakeFileAs(dir, "nopfs_7.prom", kOtherUid, kOtherUid).ok());
  check();
  struct stat ds {};
  ASSERT_EQ(::stat(dir.c_str(), &ds), 0);
  EXPECT_EQ(ds.st_mode & 07777, 0755u);
  EXPECT_EQ(ds.st_uid, ::geteuid());
  // A file the job wrote (a leftover of a job whose epilog never ran): made afresh, empty.
  Write(name, "nopfs_uptime_seconds 1\n");
  ASSERT_TRUE(MakeFileAs(dir, "nopfs_7.prom", kOtherUid, kOtherUid).ok());
  check();
  // A link or a directory tree under the name is removed, never followed.
  const std::string theirs = root_ + "/theirs.prom";
  Write(theirs, "their figures\n");
  ASSERT_EQ(::unlink(name.c_str()), 0);
  ASSERT_EQ(::symlink(theirs.c_str(), name.c_str()), 0);
  ASSERT_TRUE(MakeFileAs(dir, "nopfs_7.prom", kOtherUid, kOtherUid).ok());
  check();
  ASSERT_EQ(::unlink(name.c_str()), 0);
  ASSERT_EQ(::mkdir(name.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(theirs.c_str(), (name + "/link").c_str()), 0);
  ASSERT_TRUE(MakeFileAs(dir, "nopfs_7.prom", kOtherUid, kOtherUid).ok());
  check();
  EXPECT_EQ(ReadText(theirs), "their figures\n");
  // A directory others may write, sticky like /tmp or not, is refused, and nothing made in it.
  for (mode_t mode : {01777, 0777, 0775}) {
    SCOPED_TRACE(mode);
    ASSERT_EQ(::unlink(name.c_str()), 0);
    ASSERT_EQ(::chmod(dir.c_str(), mode), 0);
    const Status s = MakeFileAs(dir, "nopfs_7.prom", kOtherUid, kOtherUid);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
    EXPECT_NE(s.message().find(dir + " is writable by group or others"), std::string::npos)
        << s.message();
    struct stat st {};
    EXPECT_NE(::lstat(name.c_str(), &st), 0);
    ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
    ASSERT_TRUE(MakeFileAs(dir, "nopfs_7.prom", kOtherUid, kOtherUid).ok());
  }
  // A directory another user owns is refused too.
  ASSERT_EQ(::chown(dir.c_str(), kOtherUid, kOtherUid), 0);
  EXPECT_FALSE(MakeFileAs(dir, "nopfs_8.prom", kOtherUid, kOtherUid).ok());
  EXPECT_FALSE(MakeFileAs(root_, "../x", kOtherUid, kOtherUid).ok());
}

pid_t Spin(const char* argv0) {
  const pid_t p = ::fork();
  if (p == 0) {
    ::signal(SIGTERM, SIG_IGN);  // kept across exec: only SIGKILL stops it
    ::execl("/bin/sh", argv0, "-c", "while :; do sleep 0.05; done", nullptr);
    _exit(127);
  }
  // Back once it runs the shell (its SIGTERM ignored), seen from its command line.
  for (int i = 0; i < 500; ++i) {
    if (ReadText("/proc/" + std::to_string(p) + "/cmdline").rfind(argv0, 0) == 0) break;
    ::usleep(10000);
  }
  return p;
}

// The epilog stops the process the ledger names, whatever its command line says (the user can
// rewrite it), and never a process that merely has the recorded pid (a reused pid).
TEST_F(JobFilesTest, StopProcessesGoesByPidAndStartTimeNotArgv) {
  const pid_t p = Spin("not-nopfsd --run-dir /elsewhere");
  std::optional<uint64_t> start;
  for (int i = 0; i < 100 && !start; ++i) {
    start = ProcessStartTime(p);
    if (!start) ::usleep(10000);
  }
  ASSERT_TRUE(start.has_value());
  // A wrong start time: the pid now belongs to another process; it is left alone.
  EXPECT_TRUE(StopProcesses({{p, *start + 1}}, 100ms).empty());
  EXPECT_TRUE(IsProcessAlive(p, *start));
  // The right one: SIGTERM is ignored, SIGKILL after the grace.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(StopProcesses({{p, *start}}, 300ms).empty());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms);
  EXPECT_FALSE(IsProcessAlive(p, *start));
  ::waitpid(p, nullptr, WNOHANG);
  EXPECT_TRUE(StopProcesses({{p, *start}}, 100ms).empty());  // gone: nothing to do
  EXPECT_TRUE(StopProcesses({{0, 0}}, 100ms).empty());
}

TEST(PrintableTest, ControlBytesAreEscapedAndTheLengthCapped) {
  EXPECT_EQ(Printable("a\nb\x1b[31m\xff"), "a\\x0ab\\x1b[31m\\xff");
  EXPECT_EQ(Printable(std::string(500, 'x'), 10), std::string(10, 'x') + "...");
}

}  // namespace
}  // namespace nopfs::spank
