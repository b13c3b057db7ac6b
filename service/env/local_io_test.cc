// Tests of the kept area's calls of LocalIo (fstat, lstat, mkdir, mkdtemp, fsync, hole punching)
// and of their faults in FaultInjectionLocalIo, on real files in a temporary directory.
#include "service/env/local_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace nopfs::service {
namespace {

class LocalIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-local-io-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A file of `n` bytes of 'x', opened read-write through `io`.
  UniqueFd MakeFile(LocalIo* io, const std::string& name, size_t n) {
    UniqueFd fd(io->Open(dir_ + "/" + name, O_RDWR | O_CREAT | O_TRUNC, 0600));
    const std::string bytes(n, 'x');
    EXPECT_EQ(io->Pwrite(fd.get(), bytes.data(), bytes.size(), 0), ssize_t(n));
    return fd;
  }

  std::string dir_;
  FaultInjectionLocalIo io_{LocalIo::Default()};
};

TEST_F(LocalIoTest, DefaultCallsWork) {
  LocalIo* io = LocalIo::Default();
  ASSERT_EQ(io->Mkdir(dir_ + "/d", 0700), 0);
  struct stat st {};
  ASSERT_EQ(io->Lstat(dir_ + "/d", &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  std::string tmp = dir_ + "/t.XXXXXX";
  ASSERT_EQ(io->MakeTempDir(tmp), 0);
  EXPECT_NE(tmp.substr(tmp.size() - 6), "XXXXXX");
  EXPECT_TRUE(std::filesystem::is_directory(tmp));

  UniqueFd fd = MakeFile(io, "f", 3 * 4096);
  ASSERT_EQ(io->Fstat(fd.get(), &st), 0);
  EXPECT_EQ(st.st_size, 3 * 4096);
  EXPECT_EQ(io->Fsync(fd.get()), 0);
  if (io->PunchHole(fd.get(), 4096, 4096) == 0) {  // tmpfs and ext4 punch; others may refuse
    char c = 'x';
    ASSERT_EQ(io->Pread(fd.get(), &c, 1, 4096), 1);
    EXPECT_EQ(c, '\0');
    ASSERT_EQ(io->Fstat(fd.get(), &st), 0);
    EXPECT_EQ(st.st_size, 3 * 4096);  // the size is kept
  }
}

TEST_F(LocalIoTest, EachKeptAreaCallFailsWithItsFault) {
  UniqueFd fd = MakeFile(&io_, "f", 4096);
  struct stat st {};
  io_.FailStat(EIO);
  EXPECT_EQ(io_.Fstat(fd.get(), &st), -1);
  EXPECT_EQ(errno, EIO);
  EXPECT_EQ(io_.Lstat(dir_ + "/f", &st), -1);
  EXPECT_EQ(errno, EIO);
  io_.FailMkdir(ENOSPC);
  EXPECT_EQ(io_.Mkdir(dir_ + "/d", 0700), -1);
  EXPECT_EQ(errno, ENOSPC);
  std::string tmp = dir_ + "/t.XXXXXX";
  EXPECT_EQ(io_.MakeTempDir(tmp), -1);
  EXPECT_EQ(errno, ENOSPC);
  io_.FailFsync(EIO);
  EXPECT_EQ(io_.Fsync(fd.get()), -1);
  EXPECT_EQ(errno, EIO);
  io_.FailPunchHole(EOPNOTSUPP);
  EXPECT_EQ(io_.PunchHole(fd.get(), 0, 4096), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(io_.failed_calls(), 6u);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/d"));

  io_.ClearFaults();
  EXPECT_EQ(io_.Fstat(fd.get(), &st), 0);
  EXPECT_EQ(io_.Lstat(dir_ + "/f", &st), 0);
  EXPECT_EQ(io_.Mkdir(dir_ + "/d", 0700), 0);
  EXPECT_EQ(io_.MakeTempDir(tmp), 0);
  EXPECT_EQ(io_.Fsync(fd.get()), 0);
  EXPECT_EQ(io_.failed_calls(), 6u);
}

TEST_F(LocalIoTest, ReadSmallFileReadsAndFailsWithTheReads) {
  { UniqueFd fd = MakeFile(&io_, "f", 10); }
  Result<std::string> r = io_.ReadSmallFile(dir_ + "/f", 10);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, std::string(10, 'x'));
  EXPECT_FALSE(io_.ReadSmallFile(dir_ + "/f", 9).ok());  // larger than the cap
  io_.FailReads(EIO);
  r = io_.ReadSmallFile(dir_ + "/f", 10);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError) << r.status().message();
  EXPECT_EQ(io_.failed_calls(), 1u);
}

TEST_F(LocalIoTest, KeptAreaFaultsHitOnlyTheNamedPaths) {
  io_.OnlyPaths("hit");
  UniqueFd hit = MakeFile(&io_, "hit", 4096);
  UniqueFd spared = MakeFile(&io_, "spared", 4096);
  io_.FailStat(EIO);
  io_.FailFsync(EIO);
  io_.FailMkdir(EIO);
  struct stat st {};
  EXPECT_EQ(io_.Fstat(hit.get(), &st), -1);
  EXPECT_EQ(io_.Fstat(spared.get(), &st), 0);
  EXPECT_EQ(io_.Lstat(dir_ + "/hit", &st), -1);
  EXPECT_EQ(io_.Lstat(dir_ + "/spared", &st), 0);
  EXPECT_EQ(io_.Fsync(hit.get()), -1);
  EXPECT_EQ(io_.Fsync(spared.get()), 0);
  EXPECT_EQ(io_.Mkdir(dir_ + "/hit.d", 0700), -1);
  EXPECT_EQ(io_.Mkdir(dir_ + "/spared.d", 0700), 0);
}

TEST_F(LocalIoTest, AReusedDescriptorNumberIsNotHitByAnOlderPath) {
  io_.OnlyPaths("hit");
  int number = -1;
  {
    UniqueFd hit = MakeFile(&io_, "hit", 4096);
    number = hit.get();
  }  // closed without io_.Close
  UniqueFd spared = MakeFile(&io_, "spared", 4096);
  ASSERT_EQ(spared.get(), number);
  io_.FailStat(EIO);
  struct stat st {};
  EXPECT_EQ(io_.Fstat(spared.get(), &st), 0);
}

}  // namespace
}  // namespace nopfs::service
