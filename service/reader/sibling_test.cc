// The sibling registry (sibling.h): entries round-trip and malformed ones are refused; FindLive
// returns the live entries of one dataset and catalog, oldest first, removes those of dead
// processes, and never uses a registry another user could have written or a link; a reader tries
// only the entries before its own.
#include "service/reader/sibling.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

namespace nopfs::service {
namespace {

namespace fs = std::filesystem;

class SiblingRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-sibling-registry-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(chmod(dir_.c_str(), 0700), 0);
  }
  void TearDown() override { fs::remove_all(dir_); }

  LiveEntry Entry(const std::string& job, uint32_t pid, int64_t started, uint64_t fp) {
    LiveEntry e;
    e.job = job;
    e.pid = pid;
    e.started_ns = started;
    e.fingerprint = fp;
    e.socket = dir_ + "/" + job + ".sock";
    return e;
  }

  std::string dir_;
  const std::string key_ = "0123456789abcdef";
};

TEST_F(SiblingRegistryTest, EntriesRoundTripAndMalformedOnesAreRefused) {
  const LiveEntry e = Entry("77.0", 1234, 99, 0xfeedbeefULL);
  Result<LiveEntry> back = ParseLiveEntry(EncodeLiveEntry(e));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->job, e.job);
  EXPECT_EQ(back->pid, e.pid);
  EXPECT_EQ(back->started_ns, e.started_ns);
  EXPECT_EQ(back->fingerprint, e.fingerprint);
  EXPECT_EQ(back->socket, e.socket);
  const std::string good = EncodeLiveEntry(e);
  for (const std::string& bad :
       {std::string(), good.substr(0, good.size() - 1), "nopfs-live 2\n" + good.substr(13),
        good + "pid 5\n", good + "extra 1\n",
        std::string("nopfs-live 1\njob a\npid x\nstarted 1\nfingerprint 0000000000000001\n"
                    "socket /s\n"),
        std::string("nopfs-live 1\njob a\npid 1\nstarted 1\nfingerprint 01\nsocket /s\n"),
        std::string("nopfs-live 1\njob a\npid 1\nstarted 1\nfingerprint 0000000000000001\n"
                    "socket relative\n"),
        std::string(kMaxLiveEntryBytes + 1, 'x')}) {
    EXPECT_FALSE(ParseLiveEntry(bad).ok()) << bad;
  }
}

TEST_F(SiblingRegistryTest, FindsLiveEntriesOfOneCatalogOldestFirstAndRemovesTheDead) {
  // A process that is gone: a child that exited and was reaped.
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const uint32_t me = static_cast<uint32_t>(getpid());
  ASSERT_TRUE(RegisterLive(dir_, key_, Entry("2.0", me, 200, 7)).ok());
  ASSERT_TRUE(RegisterLive(dir_, key_, Entry("1.0", me, 100, 7)).ok());
  ASSERT_TRUE(RegisterLive(dir_, key_, Entry("3.0", me, 50, 8)).ok());  // another catalog
  ASSERT_TRUE(RegisterLive(dir_, "fedcba9876543210", Entry("4.0", me, 10, 7)).ok());
  Result<std::string> gone =
      RegisterLive(dir_, key_, Entry("5.0", static_cast<uint32_t>(dead), 1, 7));
  ASSERT_TRUE(gone.ok());
  struct stat st {};
  ASSERT_EQ(stat(LiveDir(dir_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  Result<std::vector<LiveEntry>> found = FindLive(dir_, key_, 7);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->size(), 2u);
  EXPECT_EQ((*found)[0].job, "1.0");
  EXPECT_EQ((*found)[1].job, "2.0");
  EXPECT_EQ((*found)[0].name, key_ + ".1.0");
  EXPECT_FALSE(fs::exists(*gone));  // the dead process's entry is removed

  // Unregistering removes the entry, and the directory with the last one.
  for (const std::string job : {"1.0", "2.0", "3.0"})
    UnregisterLive(LiveDir(dir_) + "/" + key_ + "." + job);
  EXPECT_TRUE(fs::exists(LiveDir(dir_)));
  UnregisterLive(LiveDir(dir_) + "/fedcba9876543210.4.0");
  EXPECT_FALSE(fs::exists(LiveDir(dir_)));
  Result<std::vector<LiveEntry>> none = FindLive(dir_, key_, 7);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_F(SiblingRegistryTest, ARegistryOthersCouldWriteOrALinkIsNeverUsed) {
  const uint32_t me = static_cast<uint32_t>(getpid());
  ASSERT_TRUE(RegisterLive(dir_, key_, Entry("1.0", me, 1, 7)).ok());
  ASSERT_EQ(chmod(LiveDir(dir_).c_str(), 0733), 0);
  Result<std::vector<LiveEntry>> open = FindLive(dir_, key_, 7);
  EXPECT_EQ(open.status().code(), StatusCode::kPermissionDenied) << open.status().ToString();
  EXPECT_FALSE(RegisterLive(dir_, key_, Entry("2.0", me, 2, 7)).ok());
  ASSERT_EQ(chmod(LiveDir(dir_).c_str(), 0700), 0);

  // An entry that is a link to a valid entry elsewhere is skipped.
  const std::string elsewhere = dir_ + "/elsewhere";
  std::ofstream(elsewhere) << EncodeLiveEntry(Entry("9.0", me, 0, 7));
  ASSERT_EQ(symlink(elsewhere.c_str(), (LiveDir(dir_) + "/" + key_ + ".9.0").c_str()), 0);
  Result<std::vector<LiveEntry>> found = FindLive(dir_, key_, 7);
  ASSERT_TRUE(found.ok());
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0].job, "1.0");

  // The registry itself a link to a directory holding a valid entry: nothing found through it,
  // nothing written into it.
  fs::remove_all(LiveDir(dir_));
  const std::string real = dir_ + "/real";
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  std::ofstream(real + "/" + key_ + ".8.0") << EncodeLiveEntry(Entry("8.0", me, 0, 7));
  ASSERT_EQ(symlink(real.c_str(), LiveDir(dir_).c_str()), 0);
  Result<std::vector<LiveEntry>> through = FindLive(dir_, key_, 7);
  EXPECT_TRUE(!through.ok() || through->empty());
  EXPECT_FALSE(RegisterLive(dir_, key_, Entry("1.0", me, 1, 7)).ok());
  EXPECT_EQ(std::distance(fs::directory_iterator(real), fs::directory_iterator()), 1);
}

// SiblingReader tries only the entries before its own in the order (registration time, then
// name): all of them while it is not registered, never another node of its own job; it looks
// again at once after Registering, and otherwise not before look_every. An entry it tries whose
// socket nobody listens on is stale: removed; an entry it does not try stays.
TEST_F(SiblingRegistryTest, AReaderTriesOnlyEntriesBeforeItsOwnAndLooksAgainAfterAWhile) {
  const uint32_t me = static_cast<uint32_t>(getpid());
  SiblingReader::Options o;
  o.user_dir = dir_;
  o.key = key_;
  o.self = Entry("5.0", me, 0, 7);
  o.same_job = "5.";
  o.look_every = std::chrono::milliseconds(1000);
  SiblingReader reader(o);
  std::vector<std::byte> buf(16);
  const auto entry = [&](const std::string& job) { return LiveDir(dir_) + "/" + key_ + "." + job; };
  ASSERT_TRUE(RegisterLive(dir_, key_, Entry("1.0", me, 1000, 7)).ok());
  ASSERT_TRUE(RegisterLive(dir_, key_, Entry("5.1", me, 900, 7)).ok());  // its own job's node
  EXPECT_FALSE(reader.Fetch(0, buf).has_value());
  EXPECT_FALSE(fs::exists(entry("1.0")));  // tried: nobody listens there
  EXPECT_TRUE(fs::exists(entry("5.1")));

  reader.Registering(2000);
  ASSERT_TRUE(RegisterLive(dir_, key_, Entry("7.0", me, 3000, 7)).ok());  // later
  ASSERT_TRUE(RegisterLive(dir_, key_, Entry("6.0", me, 2000, 7)).ok());  // same time, name after
  ASSERT_TRUE(RegisterLive(dir_, key_, Entry("4.0", me, 2000, 7)).ok());  // same time, name before
  EXPECT_FALSE(reader.Fetch(0, buf).has_value());
  EXPECT_TRUE(fs::exists(entry("7.0")));
  EXPECT_TRUE(fs::exists(entry("6.0")));
  EXPECT_FALSE(fs::exists(entry("4.0")));

  ASSERT_TRUE(RegisterLive(dir_, key_, Entry("2.0", me, 1500, 7)).ok());
  EXPECT_FALSE(reader.Fetch(0, buf).has_value());
  EXPECT_TRUE(fs::exists(entry("2.0")));  // not looked for yet
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_FALSE(reader.Fetch(0, buf).has_value());
  EXPECT_FALSE(fs::exists(entry("2.0")));
  EXPECT_TRUE(fs::exists(entry("7.0")));
  EXPECT_TRUE(fs::exists(entry("6.0")));
  EXPECT_FALSE(reader.ever());
  reader.Stop();
  EXPECT_FALSE(reader.Fetch(0, buf).has_value());
}

}  // namespace
}  // namespace nopfs::service
