// Tests of the POSIX Env and the FaultInjectionEnv on real files in a temporary directory.
#include "service/env/env.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace nopfs::service {
namespace {

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-env-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& content) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }

  std::string dir_;
};

std::string ToString(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

TEST_F(EnvTest, StatNamesMatchesStatOfEachPath) {
  Write("a.txt", "hello");
  ASSERT_EQ(::mkdir((dir_ + "/sub").c_str(), 0755), 0);
  ASSERT_EQ(::symlink("a.txt", (dir_ + "/link").c_str()), 0);
  const std::vector<std::string> names = {"a.txt", "sub", "link", "gone"};
  Env* env = Env::Default();
  std::vector<Result<FileStat>> got = env->StatNames(dir_, names);
  ASSERT_EQ(got.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    Result<FileStat> one = env->Stat(dir_ + "/" + names[i]);
    ASSERT_EQ(got[i].ok(), one.ok()) << names[i];
    if (!one.ok()) {
      EXPECT_EQ(got[i].status().code(), StatusCode::kNotFound);
      EXPECT_EQ(got[i].status().message(), one.status().message());
      continue;
    }
    EXPECT_EQ(got[i]->size, one->size) << names[i];
    EXPECT_EQ(got[i]->inode, one->inode) << names[i];
    EXPECT_EQ(got[i]->mtime_ns, one->mtime_ns) << names[i];
    EXPECT_EQ(got[i]->is_dir, one->is_dir) << names[i];
    EXPECT_EQ(got[i]->is_regular, one->is_regular) << names[i];
  }
  EXPECT_TRUE(got[2]->is_regular);  // the link is followed

  // A directory that is not there fails every name, naming the directory.
  got = env->StatNames(dir_ + "/nodir", names);
  ASSERT_EQ(got.size(), names.size());
  for (const auto& r : got) {
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find(dir_ + "/nodir"), std::string::npos);
  }

  // The fault-injecting Env keeps its per-path faults and counts each name that reached the real
  // Env as a Stat (all but the failed one).
  FaultInjectionEnv faulty(Env::Default());
  faulty.SetError(dir_ + "/sub", Status::IoError("injected"));
  got = faulty.StatNames(dir_, names);
  EXPECT_TRUE(got[0].ok());
  EXPECT_EQ(got[1].status().code(), StatusCode::kIoError);
  EXPECT_EQ(faulty.stats(), names.size() - 1);
}

// OpenDir stats the directory, lists it with each entry's type, and stats names relative to it,
// as Stat, ListDir and StatNames do by path; the default (path-based) one agrees except that it
// reports no types.
TEST_F(EnvTest, OpenDirGivesTheStampTheTypedListingAndStatsRelativeToIt) {
  Write("a.txt", "hello");
  ASSERT_EQ(::mkdir((dir_ + "/sub").c_str(), 0755), 0);
  ASSERT_EQ(::symlink("a.txt", (dir_ + "/link").c_str()), 0);
  ASSERT_EQ(::symlink("sub", (dir_ + "/dirlink").c_str()), 0);
  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0644), 0);
  Env* env = Env::Default();
  Result<std::unique_ptr<OpenedDir>> d = env->OpenDir(dir_);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  Result<FileStat> st = env->Stat(dir_);
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE((*d)->stat().is_dir);
  EXPECT_EQ((*d)->stat().inode, st->inode);
  EXPECT_EQ((*d)->stat().mtime_ns, st->mtime_ns);
  std::map<std::string, EntryType> types;
  for (const DirEntry& e : (*d)->entries())
    types[e.name] = e.type;
  // tmpfs and ext4 report d_type; a link's type is its target's, so it is left unknown.
  EXPECT_EQ(types, (std::map<std::string, EntryType>{{"a.txt", EntryType::kRegular},
                                                     {"dirlink", EntryType::kUnknown},
                                                     {"fifo", EntryType::kOther},
                                                     {"link", EntryType::kUnknown},
                                                     {"sub", EntryType::kDirectory}}));
  const std::vector<std::string> names = {"a.txt", "dirlink", "link", "gone"};
  std::vector<Result<FileStat>> got = (*d)->StatNames(names);
  ASSERT_EQ(got.size(), names.size());
  EXPECT_EQ(got[0]->size, 5u);
  EXPECT_TRUE(got[1]->is_dir);      // followed
  EXPECT_TRUE(got[2]->is_regular);  // followed
  EXPECT_EQ(got[3].status().code(), StatusCode::kNotFound);
  EXPECT_NE(got[3].status().message().find(dir_ + "/gone"), std::string::npos);
  // Resolved relative to the descriptor: the directory renamed after the open still answers.
  ASSERT_EQ(::rename(dir_.c_str(), (dir_ + "-moved").c_str()), 0);
  got = (*d)->StatNames({"a.txt"});
  ASSERT_EQ(::rename((dir_ + "-moved").c_str(), dir_.c_str()), 0);
  ASSERT_TRUE(got[0].ok()) << got[0].status().ToString();
  EXPECT_EQ(got[0]->size, 5u);

  EXPECT_NE(env->OpenDir(dir_ + "/a.txt").status().message().find("Not a directory"),
            std::string::npos);
  EXPECT_EQ(env->OpenDir(dir_ + "/nodir").status().code(), StatusCode::kNotFound);

  // The default, through the fault-injecting Env: a Stat, a ListDir, then a Stat per name.
  FaultInjectionEnv faulty(Env::Default());
  Result<std::unique_ptr<OpenedDir>> f = faulty.OpenDir(dir_);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->stat().inode, st->inode);
  EXPECT_EQ((*f)->entries().size(), 5u);
  for (const DirEntry& e : (*f)->entries())
    EXPECT_EQ(e.type, EntryType::kUnknown) << e.name;
  EXPECT_EQ((*f)->StatNames({"a.txt", "gone"})[0]->size, 5u);
  EXPECT_EQ(faulty.stats(), 3u);
  EXPECT_EQ(faulty.list_dirs(), 1u);
  faulty.SetError(dir_, Status::IoError("injected"));
  EXPECT_EQ(faulty.OpenDir(dir_).status().code(), StatusCode::kIoError);
}

TEST_F(EnvTest, StatListAndReadFile) {
  const std::string p = Write("a.txt", "hello world");
  ASSERT_EQ(::mkdir((dir_ + "/sub").c_str(), 0755), 0);
  Env* env = Env::Default();
  Result<FileStat> st = env->Stat(p);
  ASSERT_TRUE(st.ok()) << st.status().message();
  EXPECT_EQ(st->size, 11u);
  EXPECT_TRUE(st->is_regular);
  EXPECT_FALSE(st->is_dir);
  EXPECT_GT(st->mtime_ns, 0);
  struct stat raw {};
  ASSERT_EQ(::stat(p.c_str(), &raw), 0);
  EXPECT_EQ(st->inode, raw.st_ino);
  EXPECT_EQ(st->device, raw.st_dev);
  Result<FileStat> dst = env->Stat(dir_ + "/sub");
  ASSERT_TRUE(dst.ok());
  EXPECT_TRUE(dst->is_dir);

  Result<std::vector<std::string>> names = env->ListDir(dir_);
  ASSERT_TRUE(names.ok());
  std::sort(names->begin(), names->end());
  EXPECT_EQ(*names, (std::vector<std::string>{"a.txt", "sub"}));

  Result<std::string> text = env->ReadFile(p);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "hello world");
}

TEST_F(EnvTest, ReadAtReadsExactlyTheRange) {
  std::string content;
  for (int i = 0; i < 200000; ++i)
    content.push_back(static_cast<char>('a' + i % 26));
  const std::string p = Write("big", content);
  std::vector<std::byte> buf(70000);
  ASSERT_TRUE(Env::Default()->ReadAt(p, 12345, buf).ok());
  EXPECT_EQ(ToString(buf), content.substr(12345, 70000));
}

TEST_F(EnvTest, ShortFileSaysSizeAndRange) {
  const std::string p = Write("short", "0123456789");
  std::vector<std::byte> buf(8);
  const Status s = Env::Default()->ReadAt(p, 5, buf);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), p + ": file is 10 bytes, sample needs bytes 5..13");
}

TEST_F(EnvTest, MissingFileIsNotFoundNamingThePath) {
  const std::string p = dir_ + "/nope";
  std::vector<std::byte> buf(4);
  const Status s = Env::Default()->ReadAt(p, 0, buf);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
  EXPECT_EQ(Env::Default()->Stat(p).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Env::Default()->ListDir(p).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Env::Default()->ReadFile(p).status().code(), StatusCode::kNotFound);
}

TEST_F(EnvTest, FaultInjectionErrorsCorruptionDelayAndCounters) {
  const std::string p = Write("f", "abcdefgh");
  FaultInjectionEnv env(Env::Default());
  std::vector<std::byte> buf(8);
  ASSERT_TRUE(env.ReadAt(p, 0, buf).ok());
  EXPECT_EQ(ToString(buf), "abcdefgh");
  EXPECT_EQ(env.reads(), 1u);
  EXPECT_EQ(env.bytes_read(), 8u);

  env.SetError(p, Status::IoError(p + ": injected"));
  EXPECT_EQ(env.ReadAt(p, 0, buf).message(), p + ": injected");
  EXPECT_EQ(env.Stat(p).status().code(), StatusCode::kIoError);
  env.ClearError(p);
  ASSERT_TRUE(env.Stat(p).ok());

  env.SetCorrupt(p);
  ASSERT_TRUE(env.ReadAt(p, 0, buf).ok());
  const std::string got = ToString(buf);
  int differing = 0;
  for (size_t i = 0; i < got.size(); ++i)
    differing += got[i] != "abcdefgh"[i];
  EXPECT_EQ(differing, 1);
  env.ClearCorrupt(p);
  ASSERT_TRUE(env.ReadAt(p, 0, buf).ok());
  EXPECT_EQ(ToString(buf), "abcdefgh");

  env.SetDelay(std::chrono::milliseconds(30));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(env.ReadAt(p, 0, buf).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(30));
  env.ClearFaults();
  EXPECT_EQ(env.reads(), 4u);  // the injected error never reached the wrapped Env
  EXPECT_EQ(env.bytes_read(), 32u);
  EXPECT_EQ(env.stats(), 1u);  // the failed Stat never reached the wrapped Env
}

}  // namespace
}  // namespace nopfs::service
