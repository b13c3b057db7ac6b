// ReadSmallFile against what may sit at a name: a file, nothing, a link, a FIFO, a directory, a
// file too large or of another owner, and a /proc file (size 0, content on read).
#include "common/small_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/unique_fd.h"

namespace nopfs {
namespace {

class SmallFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-small-file-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  // The error's code and message of reading `path`, which must fail.
  Status Error(const std::string& path, SmallFileRules rules = {}) {
    Result<std::string> r = ReadSmallFile(path, rules);
    EXPECT_FALSE(r.ok()) << path;
    return r.status();
  }

  std::string dir_;
};

TEST_F(SmallFileTest, ReadsARegularFileWhole) {
  const std::string p = Write("f", "pid=1\n");
  Result<std::string> r = ReadSmallFile(p, SmallFileRules{6, ::geteuid()});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "pid=1\n");
  // In a directory, by name.
  const UniqueFd dfd(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  r = ReadSmallFileAt(dfd.get(), "f", {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "pid=1\n");
}

TEST_F(SmallFileTest, SaysWhatWasWrong) {
  Status s = Error(dir_ + "/absent");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), dir_ + "/absent does not exist");

  const std::string target = Write("target", "secret\n");
  ASSERT_EQ(::symlink(target.c_str(), (dir_ + "/link").c_str()), 0);
  s = Error(dir_ + "/link");
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), dir_ + "/link is a symbolic link; not reading it");

  ASSERT_EQ(::mkfifo((dir_ + "/fifo").c_str(), 0600), 0);  // opened without blocking
  s = Error(dir_ + "/fifo");
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), dir_ + "/fifo is a FIFO; not reading it");

  s = Error(dir_);
  EXPECT_EQ(s.message(), dir_ + " is a directory; not reading it");

  s = Error(target, SmallFileRules{4, {}});
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), target + " holds 7 bytes, more than 4; not reading it");

  const uid_t other = ::geteuid() + 1;
  s = Error(target, SmallFileRules{4096, other});
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), target + " belongs to uid " + std::to_string(::geteuid()) + ", not " +
                             std::to_string(other) + "; not reading it");
}

TEST_F(SmallFileTest, ReadsAProcFileUpToTheCap) {
  Result<std::string> r = ReadSmallFile("/proc/self/stat", {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_NE(r->find(')'), std::string::npos);
  r = ReadSmallFile("/proc/self/stat", SmallFileRules{8, {}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->size(), 8u);
}

}  // namespace
}  // namespace nopfs
