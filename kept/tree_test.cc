#include "kept/tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/unique_fd.h"

namespace nopfs::kept {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1 << 20;

std::string Fresh(const std::string& name) {
  const std::string dir =
      fs::path(testing::TempDir()).lexically_normal().string() + "/kept_tree_" + name;
  if (fs::exists(dir)) {
    UniqueFd parent(::open(fs::path(dir).parent_path().c_str(), O_RDONLY | O_DIRECTORY));
    EXPECT_TRUE(RemoveTreeAt(parent.get(), fs::path(dir).filename(), dir).ok());
  }
  fs::create_directories(dir);
  return fs::canonical(dir).string();
}

void WriteFile(int dir_fd, const char* name, uint64_t bytes) {
  UniqueFd fd(::openat(dir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  ASSERT_TRUE(fd.valid());
  const std::string block(64 * 1024, 'x');
  for (uint64_t done = 0; done < bytes; done += block.size())
    ASSERT_EQ(::write(fd.get(), block.data(), block.size()), ssize_t(block.size()));
}

// `levels` nested directories "d" below <dir>/<name>, with `bytes` in a file at the bottom: a
// path far longer than PATH_MAX, made by descriptors.
void MakeDeep(const std::string& dir, const std::string& name, int levels, uint64_t bytes) {
  ASSERT_EQ(::mkdir((dir + "/" + name).c_str(), 0700), 0);
  UniqueFd fd(::open((dir + "/" + name).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  for (int i = 0; i < levels; ++i) {
    ASSERT_EQ(::mkdirat(fd.get(), "d", 0700), 0) << i;
    fd.Reset(::openat(fd.get(), "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(fd.valid()) << i;
  }
  WriteFile(fd.get(), "big", bytes);
}

int OpenDescriptors() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd"))
    ++n;
  return n;
}

TEST(KeptTree, TenThousandLevelsAreCountedAndRemovedWithOneDescriptorAtATime) {
  const std::string dir = Fresh("deep");
  MakeDeep(dir, "entry", 10000, 3 * kMiB);
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const int before = OpenDescriptors();
  const TreeUsage u = UsageAt(d.get(), "entry", dir + "/entry");
  EXPECT_TRUE(u.status.ok()) << u.status.message();
  EXPECT_GE(u.bytes, 3 * kMiB) << "the file at the bottom counts";
  EXPECT_EQ(u.inodes, 10000u + 2u) << "every directory and the file";
  EXPECT_EQ(OpenDescriptors(), before);
  const Status s = RemoveTreeAt(d.get(), "entry", dir + "/entry");
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_FALSE(fs::exists(dir + "/entry"));
  EXPECT_EQ(OpenDescriptors(), before);
}

TEST(KeptTree, LinksToOutsideAreCountedAsLinksAndNeverFollowed) {
  const std::string dir = Fresh("links");
  const std::string outside = Fresh("links_outside");
  {
    UniqueFd o(::open(outside.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    WriteFile(o.get(), "victim", 2 * kMiB);
  }
  fs::create_directories(dir + "/entry/sub");
  fs::create_directory_symlink(outside, dir + "/entry/sub/to_dir");
  fs::create_symlink(outside + "/victim", dir + "/entry/to_file");
  fs::create_directory_symlink(outside, dir + "/top_link");
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const TreeUsage u = UsageAt(d.get(), "entry", dir + "/entry");
  EXPECT_TRUE(u.status.ok()) << u.status.message();
  EXPECT_LT(u.bytes, kMiB) << "the victim's bytes were counted through a link";
  EXPECT_LT(UsageAt(d.get(), "top_link", dir + "/top_link").bytes, kMiB);
  EXPECT_TRUE(RemoveTreeAt(d.get(), "entry", dir + "/entry").ok());
  EXPECT_TRUE(RemoveTreeAt(d.get(), "top_link", dir + "/top_link").ok());
  EXPECT_FALSE(fs::exists(dir + "/entry"));
  EXPECT_FALSE(fs::is_symlink(dir + "/top_link"));
  EXPECT_EQ(fs::file_size(outside + "/victim"), 2 * kMiB) << "the removal followed a link";
}

TEST(KeptTree, HardLinksCountOnceAndFilesAndMissingEntriesWork) {
  const std::string dir = Fresh("hard");
  fs::create_directories(dir + "/entry/a/b");
  {
    UniqueFd e(::open((dir + "/entry").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    WriteFile(e.get(), "f", 4 * kMiB);
  }
  for (const char* n : {"/entry/a/l1", "/entry/a/b/l2", "/entry/l3"})
    fs::create_hard_link(dir + "/entry/f", dir + n);
  UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const TreeUsage u = UsageAt(d.get(), "entry", dir + "/entry");
  EXPECT_GE(u.bytes, 4 * kMiB);
  EXPECT_LT(u.bytes, 5 * kMiB) << "four links of one file count once";
  UniqueFd e(::open((dir + "/entry").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  EXPECT_GE(UsageAt(e.get(), "f", "f").bytes, 4 * kMiB) << "a file alone";
  EXPECT_EQ(UsageAt(d.get(), "missing", "missing").bytes, 0u);
  EXPECT_TRUE(RemoveTreeAt(d.get(), "missing", "missing").ok());
  EXPECT_TRUE(RemoveTreeAt(d.get(), "entry", dir + "/entry").ok());
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(KeptTree, EntriesSwappedForLinksDuringTheWalkNeverLeadOutside) {
  // A user's process swaps a directory and a file of the tree for links to a victim's, over and
  // over, while root measures and removes the tree: the victim's files stay, and never count.
  const std::string dir = Fresh("race");
  const std::string victim = Fresh("race_victim");
  fs::create_directories(victim + "/d");
  {
    UniqueFd v(::open((victim + "/d").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    WriteFile(v.get(), "precious", 8 * kMiB);
  }
  for (int round = 0; round < 20; ++round) {
    fs::create_directories(dir + "/entry/sub/deeper");
    std::ofstream(dir + "/entry/sub/deeper/file") << "user's";
    std::ofstream(dir + "/entry/file") << "user's";
    std::atomic<bool> stop{false};
    std::thread swapper([&] {
      const std::string sub = dir + "/entry/sub", file = dir + "/entry/file";
      while (!stop.load()) {
        (void)::rename(sub.c_str(), (dir + "/aside").c_str());
        if (::symlink((victim + "/d").c_str(), sub.c_str()) != 0) continue;
        (void)::unlink(sub.c_str());
        (void)::rename((dir + "/aside").c_str(), sub.c_str());
        (void)::unlink(file.c_str());
        if (::symlink((victim + "/d/precious").c_str(), file.c_str()) != 0) continue;
      }
    });
    UniqueFd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    const TreeUsage u = UsageAt(d.get(), "entry", dir + "/entry");
    EXPECT_LT(u.bytes, 8 * kMiB) << "counted through a link";
    (void)RemoveTreeAt(d.get(), "entry", dir + "/entry");
    stop = true;
    swapper.join();
    ASSERT_EQ(fs::file_size(victim + "/d/precious"), 8 * kMiB) << "removed through a link";
    ASSERT_TRUE(RemoveTreeAt(d.get(), "entry", dir + "/entry").ok());
    ASSERT_TRUE(RemoveTreeAt(d.get(), "aside", dir + "/aside").ok());
  }
}

}  // namespace
}  // namespace nopfs::kept
