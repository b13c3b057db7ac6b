#include "spank/shared_decl.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace nopfs::spank {
namespace {

namespace fs = std::filesystem;

lua::NodeConfig Config(const std::string& shared) {
  Result<lua::NodeConfig> c = lua::LoadNodeConfigFromString(
      R"(classes = { ssd { path = "/scratch", capacity = "1T" } }
         shared = { )" +
          shared + " }",
      "test.conf.lua", uint64_t{64} << 30);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return std::move(*c);
}

TEST(SharedDeclTest, TheDatasetIsFoundHoweverItsPathIsSpelled) {
  const lua::NodeConfig c =
      Config(R"({ path = "/pfs/data", ssd = "1G" }, { path = "/pfs//coco/", ssd = "2G" })");
  for (const char* p : {"/pfs/data", "/pfs/data/", "/pfs//data", "//pfs/./data//", "/pfs/data/."}) {
    const lua::SharedDecl* d = SharedDeclFor(c, p);
    ASSERT_NE(d, nullptr) << p;
    EXPECT_EQ(d->path, "/pfs/data") << p;
  }
  // The declaration is normalized the same way.
  const lua::SharedDecl* coco = SharedDeclFor(c, "/pfs/coco");
  ASSERT_NE(coco, nullptr);
  EXPECT_EQ(coco->ssd, uint64_t{2} << 30);
  for (const char* p : {"/pfs/data/sub", "/pfs/dat", "/pfs", "pfs/data", "", "/pfs/data/sub/..",
                        "/pfs/x/../data"}) {
    EXPECT_EQ(SharedDeclFor(c, p), nullptr) << p;
  }
}

TEST(SharedDeclTest, NoLinkIsFollowedToDecideSharing) {
  // A user's link to the declared directory names another path: not shared (the job reads as
  // without a shared copy), whatever the link points to.
  const fs::path tmp = fs::path(testing::TempDir()) / ("shared_decl_" + std::to_string(::getpid()));
  fs::create_directories(tmp / "data");
  fs::create_symlink(tmp / "data", tmp / "link");
  const lua::NodeConfig c = Config("{ path = \"" + (tmp / "data").string() + "\", ssd = \"1G\" }");
  EXPECT_NE(SharedDeclFor(c, (tmp / "data").string()), nullptr);
  EXPECT_EQ(SharedDeclFor(c, (tmp / "link").string()), nullptr);
  EXPECT_EQ(SharedDeclFor(c, (tmp / "link" / "..").string() + "/data"), nullptr);
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace nopfs::spank
