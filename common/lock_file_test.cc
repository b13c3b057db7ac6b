#include "common/lock_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace nopfs {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(const std::string& name) {
  const std::string d = fs::temp_directory_path().string() + "/nopfs-lock-file-test-" +
                        std::to_string(::getpid()) + "-" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Whether a second open file description of `path` can take the lock (as another process would).
bool OthersCanLock(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  const bool got = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return got;
}

TEST(LockFileIn, MakesTheFileLockedAndLeavesNothingElse) {
  const std::string d = FreshDir("make");
  Result<int> fd = LockFileIn(d, "lock");
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  ASSERT_GE(*fd, 0);
  struct stat st {};
  ASSERT_EQ(::lstat((d + "/lock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(OthersCanLock(d + "/lock"));
  Result<int> again = LockFileIn(d, "lock");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, -1);  // held
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d))
    names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"lock"});  // no temporary file left behind
  ::close(*fd);
  // An existing, free lock file is taken as it is.
  Result<int> existing = LockFileIn(d, "lock");
  ASSERT_TRUE(existing.ok());
  ASSERT_GE(*existing, 0);
  EXPECT_FALSE(OthersCanLock(d + "/lock"));
  ::close(*existing);
  fs::remove_all(d);
}

TEST(LockFileIn, RefusesASymlinkAndNamesTheFile) {
  const std::string d = FreshDir("symlink");
  fs::create_symlink("/etc/passwd", d + "/lock");
  Result<int> fd = LockFileIn(d, "lock");
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find(d + "/lock"), std::string::npos) << fd.status().message();
  Result<int> missing_dir = LockFileIn(d + "/absent", "lock");
  EXPECT_FALSE(missing_dir.ok());
  fs::remove_all(d);
}

// A cleaner that opens and locks every lock file it sees, as fast as it can, while directories
// are made and locked: it must never find one free. (open(O_CREAT) and then flock() leaves a
// moment in which it can.)
TEST(LockFileIn, ACleanerNeverFindsAFreshLockFree) {
  const std::string d = FreshDir("race");
  constexpr int kDirs = 400;
  std::atomic<int> made{0};
  std::atomic<int> found_free{0};
  std::atomic<bool> done{false};
  std::thread cleaner([&] {
    while (!done.load()) {
      const int n = made.load();
      for (int i = std::max(0, n - 2); i <= n && i < kDirs; ++i) {
        if (OthersCanLock(d + "/" + std::to_string(i) + "/lock")) found_free.fetch_add(1);
      }
    }
  });
  std::vector<int> held;
  std::string failed;
  for (int i = 0; i < kDirs && failed.empty(); ++i) {
    const std::string sub = d + "/" + std::to_string(i);
    if (::mkdir(sub.c_str(), 0700) != 0) failed = "mkdir " + sub;
    made.store(i);
    Result<int> fd = LockFileIn(sub, "lock");
    if (!fd.ok()) {
      failed = fd.status().ToString();
    } else if (*fd < 0) {
      failed = "the cleaner held " + sub + "/lock when it was taken";
    } else {
      held.push_back(*fd);
    }
  }
  done.store(true);
  cleaner.join();
  EXPECT_EQ(failed, "");
  EXPECT_EQ(found_free.load(), 0);
  for (int fd : held)
    ::close(fd);
  fs::remove_all(d);
}

}  // namespace
}  // namespace nopfs
