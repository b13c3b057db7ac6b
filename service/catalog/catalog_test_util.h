// A test fixture shared by the catalog's tests: a fresh temporary directory with a dataset folder
// (data_) and a catalog cache folder (cache_), removed after the test.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace nopfs::service::testing {

class DatasetDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-catalog-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    data_ = tmp_ + "/data";
    cache_ = tmp_ + "/cache";
    std::filesystem::create_directories(data_);
    std::filesystem::create_directories(cache_);
  }
  void TearDown() override { std::filesystem::remove_all(tmp_); }

  // Writes data_/<rel> (making its directories) with `content`.
  void WriteFile(const std::string& rel, const std::string& content) {
    const std::filesystem::path p = std::filesystem::path(data_) / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
  }

  std::string tmp_, data_, cache_;
};

}  // namespace nopfs::service::testing
