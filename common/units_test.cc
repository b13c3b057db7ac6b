#include "common/units.h"

#include <gtest/gtest.h>

namespace nopfs {
namespace {

TEST(ParseSize, FollowsSlurmMem) {
  // A bare number is MiB, as --mem=250.
  EXPECT_EQ(*ParseSize("0"), 0u);
  EXPECT_EQ(*ParseSize("250"), 250ull << 20);
  EXPECT_EQ(*ParseSize("16"), 16ull << 20);
  // K, M, G, T, P are powers of 1024, in either case, as --mem=16G.
  EXPECT_EQ(*ParseSize("110K"), 110ull << 10);
  EXPECT_EQ(*ParseSize("110k"), 110ull << 10);
  EXPECT_EQ(*ParseSize("512M"), 512ull << 20);
  EXPECT_EQ(*ParseSize("16G"), 16ull << 30);
  EXPECT_EQ(*ParseSize("16g"), 16ull << 30);
  EXPECT_EQ(*ParseSize("2T"), 2ull << 40);
  EXPECT_EQ(*ParseSize("1P"), 1ull << 50);
  // "GB" is what Slurm reads it as (--mem=16GB is 16G), never 10^9; "GiB" the same.
  EXPECT_EQ(*ParseSize("16GB"), 16ull << 30);
  EXPECT_EQ(*ParseSize("16gb"), 16ull << 30);
  EXPECT_EQ(*ParseSize("110 KB"), 110ull << 10);
  EXPECT_EQ(*ParseSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseSize(" 8 GiB "), 8ull << 30);
  EXPECT_EQ(*ParseSize("2TiB"), 2ull << 40);
  // B is bytes; fractions are rounded to the byte.
  EXPECT_EQ(*ParseSize("16B"), 16u);
  EXPECT_EQ(*ParseSize("4096 b"), 4096u);
  EXPECT_EQ(*ParseSize("1.5G"), 3ull << 29);
  EXPECT_EQ(*ParseSize("0.5K"), 512u);
  EXPECT_EQ(*ParseSize("1e3"), 1000ull << 20);
}

TEST(ParseSize, BareNumberInTheCallersUnit) {
  EXPECT_EQ(*ParseSize("4096", 1), 4096u);
  EXPECT_EQ(*ParseSize("110K", 1), 110ull << 10);
  EXPECT_EQ(*ParseSize("16GB", 1), 16ull << 30);
}

TEST(ParseSize, RejectsGarbageWithAHint) {
  for (const char* bad : {"", "GB", "12 parsecs", "-1", "1.2.3MB", "5 MBs", "1e400", "16 GIBs",
                          "1 EB", "16Gi", "16 iB"}) {
    Result<uint64_t> r = ParseSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("write"), std::string::npos) << r.status().message();
  }
  EXPECT_NE(ParseSize("fast").status().message().find("16G"), std::string::npos);
}

TEST(ParseBandwidth, UnitsAndBareNumbers) {
  EXPECT_DOUBLE_EQ(*ParseBandwidth("800M/s"), 800.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(*ParseBandwidth("800MB/s"), 800.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(*ParseBandwidth("1.5 GB/s"), 1.5 * (1 << 30));
  EXPECT_DOUBLE_EQ(*ParseBandwidth("1GiB/s"), 1073741824.0);
  EXPECT_DOUBLE_EQ(*ParseBandwidth("250"), 250.0 * (1 << 20));  // a bare number is MiB/s
  EXPECT_DOUBLE_EQ(*ParseBandwidth("250M"), 250.0 * (1 << 20));
  EXPECT_FALSE(ParseBandwidth("0M/s").ok());
  EXPECT_FALSE(ParseBandwidth("fast").ok());
}

TEST(FormatBytes, BinaryUnitsThreeSignificantDigits) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(110 << 10), "110 KiB");
  EXPECT_EQ(FormatBytes(1.5 * (1 << 30)), "1.50 GiB");
  EXPECT_EQ(FormatBytes(14.2 * (1ull << 40)), "14.2 TiB");
  EXPECT_EQ(FormatBytes(1023.9 * 1024), "1.00 MiB");  // no "1024 KiB"
  EXPECT_EQ(FormatBytes(9.999 * (1 << 20)), "10.0 MiB");
}

TEST(FormatBytes, ReadsBackAsTheSameSize) {
  for (double b : {512.0, 110.0 * 1024, 1.5 * (1 << 30), 16.0 * (1 << 30), 250.0 * (1 << 20)}) {
    EXPECT_EQ(static_cast<double>(*ParseSize(FormatBytes(b))), b) << FormatBytes(b);
  }
}

TEST(SizeArg, ExactAndReadBack) {
  EXPECT_EQ(SizeArg(0), "0");
  EXPECT_EQ(SizeArg(1000), "1000B");
  EXPECT_EQ(SizeArg(1024), "1K");
  EXPECT_EQ(SizeArg(1300 << 10), "1300K");
  EXPECT_EQ(SizeArg(1536ull << 20), "1536M");
  EXPECT_EQ(SizeArg(16ull << 30), "16G");
  EXPECT_EQ(SizeArg(3ull << 50), "3P");
  EXPECT_EQ(SizeArg(2048ull << 50), "2048P");
  for (uint64_t b : {uint64_t{0}, uint64_t{1}, uint64_t{1000}, uint64_t{123456789},
                     uint64_t{16} << 30, uint64_t{1} << 52}) {
    EXPECT_EQ(*ParseSize(SizeArg(b)), b) << SizeArg(b);
  }
}

}  // namespace
}  // namespace nopfs
