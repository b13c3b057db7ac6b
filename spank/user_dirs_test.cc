// PrepareUserDir as root on a real file system, with another uid in the squatter's role.
#include "spank/user_dirs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

namespace nopfs::spank {
namespace {

constexpr uid_t kAlice = 4201;
constexpr gid_t kAliceGid = 4201;
constexpr uid_t kBob = 4202;

class UserDirsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "PrepareUserDir runs as root (the prolog)";
    char tmpl[] = "/tmp/nopfs-userdirs-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  static struct stat Stat(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st;
  }
  void ExpectAlices(const std::string& p) {
    const struct stat st = Stat(p);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_uid, kAlice);
    EXPECT_EQ(st.st_gid, kAliceGid);
    EXPECT_EQ(st.st_mode & 07777, 0700u);
  }
  // The `.squatted.*` entries of dir_.
  std::vector<std::string> Aside() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(".squatted.", 0) == 0) out.push_back(n);
    }
    return out;
  }
  std::string dir_;
};

TEST_F(UserDirsTest, MakesAndKeepsTheUsersDirectory) {
  std::string note;
  ASSERT_TRUE(PrepareUserDir(dir_, "nopfs-4201", kAlice, kAliceGid, &note).ok());
  EXPECT_EQ(note, "made " + dir_ + "/nopfs-4201");
  ExpectAlices(dir_ + "/nopfs-4201");
  std::ofstream(dir_ + "/nopfs-4201/keep") << "x";
  ASSERT_EQ(::chmod((dir_ + "/nopfs-4201").c_str(), 0711), 0);
  ASSERT_TRUE(PrepareUserDir(dir_, "nopfs-4201", kAlice, kAliceGid, &note).ok());
  EXPECT_EQ(note, "");
  ExpectAlices(dir_ + "/nopfs-4201");
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/nopfs-4201/keep"));
}

TEST_F(UserDirsTest, SquattersAreMovedAsideNeverFollowed) {
  // The old setup: a sticky world-writable SSD directory in which bob made alice's directory, a
  // file and a symbolic link to a directory of root's.
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  const std::string target = dir_ + "-root-only";
  ASSERT_EQ(::mkdir(target.c_str(), 0700), 0);
  struct Case {
    std::string name;
    int kind;  // 0 dir, 1 file, 2 link
  };
  for (const Case& c : {Case{"nopfs-4201", 0}, Case{"4201", 1}, Case{"link-4201", 2}}) {
    const std::string p = dir_ + "/" + c.name;
    if (c.kind == 0) {
      ASSERT_EQ(::mkdir(p.c_str(), 0755), 0);
    } else if (c.kind == 1) {
      std::ofstream(p) << "bob";
    } else {
      ASSERT_EQ(::symlink(target.c_str(), p.c_str()), 0);
    }
    ASSERT_EQ(::lchown(p.c_str(), kBob, kBob), 0);
    std::string note;
    const Status s = PrepareUserDir(dir_, c.name, kAlice, kAliceGid, &note);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_NE(note.find(p + " (uid 4202"), std::string::npos) << note;
    EXPECT_NE(note.find("moved aside to " + dir_ + "/.squatted." + c.name + "."), std::string::npos)
        << note;
    // ... and then removed, never followed: nothing is left aside.
    EXPECT_NE(note.find("; removed " + dir_ + "/.squatted." + c.name + "."), std::string::npos)
        << note;
    EXPECT_TRUE(Aside().empty()) << Aside().front();
    ExpectAlices(p);
  }
  // The link's target was not touched.
  const struct stat t = Stat(target);
  EXPECT_EQ(t.st_uid, 0u);
  EXPECT_EQ(t.st_mode & 07777, 0700u);
  std::filesystem::remove_all(target);
}

// What a user planted under a `.squatted.` name in a sticky parent (or an earlier prolog left):
// removed by root as a hostile tree, never following a link out of it.
TEST_F(UserDirsTest, SquattedLeftoversAreRemovedWithoutFollowingALink) {
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  const std::string target = dir_ + "-root-only";
  ASSERT_EQ(::mkdir(target.c_str(), 0700), 0);
  std::ofstream(target + "/precious") << "root's";
  const std::string tree = dir_ + "/.squatted.nopfs-4201.1.2.0";
  std::string deep = tree;
  for (int i = 0; i < 10; ++i) {
    deep += "/d" + std::to_string(i);
    ASSERT_TRUE(std::filesystem::create_directories(deep));
    std::ofstream(deep + "/junk") << "bob's";
    ASSERT_EQ(::symlink(target.c_str(), (deep + "/link").c_str()), 0);
  }
  ASSERT_EQ(::symlink(target.c_str(), (dir_ + "/.squatted.link").c_str()), 0);
  std::ofstream(dir_ + "/.squatted.file") << "bob's";
  ASSERT_EQ(::mkfifo((dir_ + "/.squatted.fifo").c_str(), 0666), 0);
  std::ofstream(dir_ + "/unrelated") << "left alone";
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) {
    ASSERT_EQ(::lchown(e.path().c_str(), kBob, kBob), 0);
  }
  std::string note;
  ASSERT_TRUE(PrepareUserDir(dir_, "nopfs-4201", kAlice, kAliceGid, &note).ok());
  ExpectAlices(dir_ + "/nopfs-4201");
  EXPECT_TRUE(Aside().empty()) << Aside().front();
  for (const char* n :
       {".squatted.nopfs-4201.1.2.0", ".squatted.link", ".squatted.file", ".squatted.fifo"}) {
    EXPECT_NE(note.find("removed " + dir_ + "/" + n), std::string::npos) << note;
  }
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/unrelated"));
  std::ifstream in(target + "/precious");
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "root's");
  // A name that would break slurmd's log line arrives there printable.
  ASSERT_EQ(::mkdir((dir_ + "/.squatted.x\n[fake] line").c_str(), 0755), 0);
  ASSERT_TRUE(PrepareUserDir(dir_, "nopfs-4201", kAlice, kAliceGid, &note).ok());
  EXPECT_EQ(note.find('\n'), std::string::npos) << note;
  EXPECT_TRUE(Aside().empty());
  std::filesystem::remove_all(target);
}

// Two prologs of the same user at once (two jobs starting together on the node), the directory
// absent: both succeed, and what is left is the user's one directory, nothing aside.
TEST_F(UserDirsTest, TwoPrologsAtOnceEndWithTheSameDirectoryAndNothingAside) {
  for (int round = 0; round < 300; ++round) {
    std::filesystem::remove_all(dir_ + "/nopfs-4201");
    std::atomic<int> ready{0};
    Status results[2];
    std::string notes[2];
    std::vector<std::thread> prologs;
    for (int i = 0; i < 2; ++i) {
      prologs.emplace_back([&, i] {
        ready.fetch_add(1);
        while (ready.load() < 2) {
        }
        results[i] = PrepareUserDir(dir_, "nopfs-4201", kAlice, kAliceGid, &notes[i]);
      });
    }
    for (std::thread& t : prologs)
      t.join();
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(results[i].ok()) << round << ": " << results[i].ToString();
      EXPECT_EQ(notes[i].find("moved aside"), std::string::npos) << round << ": " << notes[i];
    }
    ExpectAlices(dir_ + "/nopfs-4201");
    ASSERT_TRUE(Aside().empty()) << round << ": " << Aside().front();
  }
  // A directory of root's that is not empty is no prolog's fresh one: moved aside and removed.
  std::filesystem::remove_all(dir_ + "/nopfs-4201");
  ASSERT_EQ(::mkdir((dir_ + "/nopfs-4201").c_str(), 0700), 0);
  std::ofstream(dir_ + "/nopfs-4201/something") << "x";
  std::string note;
  ASSERT_TRUE(PrepareUserDir(dir_, "nopfs-4201", kAlice, kAliceGid, &note).ok());
  EXPECT_NE(note.find("moved aside"), std::string::npos) << note;
  ExpectAlices(dir_ + "/nopfs-4201");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/nopfs-4201/something"));
  EXPECT_TRUE(Aside().empty());
}

TEST_F(UserDirsTest, ParentsThatOthersMayWriteAreRefused) {
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);  // not sticky: anyone could rename our directory
  std::string note;
  Status s = PrepareUserDir(dir_, "nopfs-4201", kAlice, kAliceGid, &note);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("must be owned by root and writable by no one else"),
            std::string::npos)
      << s.ToString();
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  ASSERT_EQ(::chown(dir_.c_str(), kBob, kBob), 0);  // a user's own directory
  s = PrepareUserDir(dir_, "nopfs-4201", kAlice, kAliceGid, &note);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/nopfs-4201"));
  s = PrepareUserDir(dir_ + "/missing", "nopfs-4201", kAlice, kAliceGid, &note);
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace nopfs::spank
