// The bandwidth curve and the shaper, on an injected clock; and the option parser.
#include "bench/pfsemu/throttle.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "bench/pfsemu/options.h"

namespace nopfs::pfsemu {
namespace {

using Clock = Throttle::Clock;
using std::chrono::duration;

TEST(BandwidthCurve, InterpolatesAndIsFlatOutside) {
  Result<BandwidthCurve> c = BandwidthCurve::Parse("1:100, 3:200,5:250");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_DOUBLE_EQ(c->BytesPerSecond(0), 100e6);
  EXPECT_DOUBLE_EQ(c->BytesPerSecond(1), 100e6);
  EXPECT_DOUBLE_EQ(c->BytesPerSecond(2), 150e6);
  EXPECT_DOUBLE_EQ(c->BytesPerSecond(4), 225e6);
  EXPECT_DOUBLE_EQ(c->BytesPerSecond(100), 250e6);
  EXPECT_EQ(c->ToString(), "1:100,3:200,5:250");
  Result<BandwidthCurve> flat = BandwidthCurve::Parse("300");
  ASSERT_TRUE(flat.ok());
  EXPECT_DOUBLE_EQ(flat->BytesPerSecond(7), 300e6);
}

TEST(BandwidthCurve, RejectsBadCurves) {
  for (const char* bad :
       {"", "abc", "0:100", "1:0", "1:-5", "2:100,1:200", "1:100,1:200", "1:", "1:100,"}) {
    EXPECT_FALSE(BandwidthCurve::Parse(bad).ok()) << bad;
  }
}

TEST(Throttle, HoldsTheAggregateRate) {
  Throttle t(BandwidthCurve::Parse("1:100").value(), 0);
  const Clock::time_point t0 = Clock::now();
  // 100 reads of 1 MB issued at once must take 100 MB / 100 MB/s = 1 s in all.
  Clock::time_point last;
  for (int i = 0; i < 100; ++i)
    last = t.Reserve(1000000, 1, t0);
  EXPECT_NEAR(duration<double>(last - t0).count(), 1.0, 1e-6);
}

TEST(Throttle, RateFollowsReaders) {
  Throttle t(BandwidthCurve::Parse("1:100,4:200").value(), 0);
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point one = t.Reserve(2000000, 1, t0);    // 20 ms at 100 MB/s
  const Clock::time_point four = t.Reserve(2000000, 4, one);  // 10 ms at 200 MB/s
  EXPECT_NEAR(duration<double>(one - t0).count(), 0.020, 1e-6);
  EXPECT_NEAR(duration<double>(four - one).count(), 0.010, 1e-6);
}

TEST(Throttle, IdleCreditIsBoundedByBurst) {
  Throttle t(BandwidthCurve::Parse("1:100").value(), 1000000);  // 1 MB burst = 10 ms
  const Clock::time_point t0 = Clock::now();
  (void)t.Reserve(1, 1, t0);
  // After a long idle period, 1 MB completes at once, the next 1 MB takes its full 10 ms.
  const Clock::time_point later = t0 + std::chrono::seconds(10);
  EXPECT_LE(t.Reserve(1000000, 1, later), later);
  EXPECT_NEAR(duration<double>(t.Reserve(1000000, 1, later) - later).count(), 0.010, 1e-6);
}

TEST(Options, FlagsOverrideConfigFile) {
  const std::string path = ::testing::TempDir() + "/pfsemu_options_test.conf";
  {
    std::ofstream out(path);
    out << "# emulated PFS\nbandwidth = 1:50,2:80\nopen_latency_us = 300  # per open\n"
        << "max_threads = 4\n";
  }
  Result<Options> o =
      ParseOptions({"pfsemu", "--open-latency-us", "7", "--config", path, "/data", "/mnt"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->bandwidth, "1:50,2:80");
  EXPECT_EQ(o->open_latency_us, 7u);
  EXPECT_EQ(o->max_threads, 4u);
  EXPECT_EQ(o->backing, "/data");
  EXPECT_EQ(o->mountpoint, "/mnt");
  std::remove(path.c_str());
}

TEST(Options, RejectsBadArguments) {
  EXPECT_FALSE(ParseOptions({"pfsemu", "/data"}).ok());
  EXPECT_FALSE(ParseOptions({"pfsemu", "--nonsense", "1", "/a", "/b"}).ok());
  EXPECT_FALSE(ParseOptions({"pfsemu", "--bandwidth", "x", "/a", "/b"}).ok());
  EXPECT_FALSE(ParseOptions({"pfsemu", "--max-threads", "0", "/a", "/b"}).ok());
  EXPECT_FALSE(ParseOptions({"pfsemu", "--open-latency-us", "-1", "/a", "/b"}).ok());
  EXPECT_FALSE(ParseOptions({"pfsemu", "--config", "/nonexistent/pfsemu.conf", "/a", "/b"}).ok());
  EXPECT_FALSE(ParseOptions({"pfsemu", "/a", "/b", "--burst-bytes"}).ok());
}

}  // namespace
}  // namespace nopfs::pfsemu
