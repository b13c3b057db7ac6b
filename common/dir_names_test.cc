#include "common/dir_names.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace nopfs {
namespace {

TEST(DirNames, SortedWithoutDotsAndTheDescriptorStaysUsable) {
  char tmpl[] = "/tmp/nopfs-dirnames-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  for (const char* n : {"b", "a", ".hidden"})
    std::ofstream(dir + "/" + n) << "x";
  ASSERT_EQ(::mkdir((dir + "/c").c_str(), 0700), 0);
  ASSERT_EQ(::symlink("/etc", (dir + "/link").c_str()), 0);
  const UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  const std::vector<std::string> want = {".hidden", "a", "b", "c", "link"};
  Result<std::vector<std::string>> names = DirNames(fd.get(), dir);
  ASSERT_TRUE(names.ok()) << names.status().message();
  EXPECT_EQ(*names, want);
  // Twice through the same descriptor: each listing starts at the beginning.
  names = DirNames(fd.get(), dir);
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, want);
  // A descriptor of the directory opened O_PATH (as some callers hold them) lists too.
  const UniqueFd path_fd(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  names = DirNames(path_fd.get(), dir);
  ASSERT_TRUE(names.ok()) << names.status().message();
  EXPECT_EQ(*names, want);
  // Not a directory: the error names what was shown.
  const UniqueFd file_fd(::open((dir + "/a").c_str(), O_RDONLY | O_CLOEXEC));
  names = DirNames(file_fd.get(), "shown-name");
  ASSERT_FALSE(names.ok());
  EXPECT_NE(names.status().message().find("shown-name"), std::string::npos);
  EXPECT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
}

}  // namespace
}  // namespace nopfs
