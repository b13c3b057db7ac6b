#include "common/units.h"

#include <gtest/gtest.h>

namespace nopfs {
namespace {

TEST(ParseSize, AcceptsBytesSiAndIec) {
  EXPECT_EQ(*ParseSize("0"), 0u);
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("110KB"), 110000u);
  EXPECT_EQ(*ParseSize("110 kb"), 110000u);
  EXPECT_EQ(*ParseSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseSize(" 8 GiB "), 8ull << 30);
  EXPECT_EQ(*ParseSize("1.5GB"), 1500000000u);
  EXPECT_EQ(*ParseSize("2TiB"), 2ull << 40);
  EXPECT_EQ(*ParseSize("1e3"), 1000u);
  EXPECT_EQ(*ParseSize("16B"), 16u);
}

TEST(ParseSize, RejectsGarbageWithAHint) {
  for (const char* bad : {"", "GB", "12 parsecs", "-1", "1.2.3MB", "5 MBs", "1e400"}) {
    Result<uint64_t> r = ParseSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("write"), std::string::npos) << r.status().message();
  }
}

TEST(ParseBandwidth, UnitsAndBareNumbers) {
  EXPECT_DOUBLE_EQ(*ParseBandwidth("800MB/s"), 800e6);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("1.2 GB/s"), 1.2e9);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("1GiB/s"), 1073741824.0);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("250", 1e6), 250e6);  // bare number in the caller's unit
  EXPECT_DOUBLE_EQ(*ParseBandwidth("250MB"), 250e6);
  EXPECT_FALSE(ParseBandwidth("0MB/s").ok());
  EXPECT_FALSE(ParseBandwidth("fast").ok());
}

TEST(FormatBytes, ThreeSignificantDigits) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(110000), "110 KB");
  EXPECT_EQ(FormatBytes(1.5e9), "1.50 GB");
  EXPECT_EQ(FormatBytes(14.2e12), "14.2 TB");
}

}  // namespace
}  // namespace nopfs
