#include "lua/config.h"

#include <gtest/gtest.h>

#include <string>

#include "common/units.h"

namespace nopfs::lua {
namespace {

constexpr policy::Bytes kHost = policy::Bytes{64} << 30;  // a 64 GiB node

Result<NodeConfig> Load(const std::string& text) {
  return LoadNodeConfigFromString(text, "/etc/nopfs/test.conf.lua", kHost);
}

void ExpectError(const std::string& text, const std::string& needle) {
  Result<NodeConfig> c = Load(text);
  ASSERT_FALSE(c.ok()) << "accepted: " << text;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().message();
  EXPECT_NE(c.status().message().find(needle), std::string::npos)
      << "message: " << c.status().message() << "\nexpected to contain: " << needle;
  EXPECT_NE(c.status().message().find("/etc/nopfs/test.conf.lua"), std::string::npos)
      << c.status().message();
}

TEST(NodeConfigTest, FullConfig) {
  Result<NodeConfig> c = Load(R"(
    log_level = "debug"
    catalog_cache = "/var/cache/nopfs"
    metrics_dir = "/var/lib/prometheus/node-exporter"
    planner = "fill-once"
    verify = "always"
    pfs = { {1, "250MB/s"}, {16, "2GB/s"} }
    network = "10GB/s"
    preprocess = 4096
    staging = { capacity = "2GiB", threads = 3, write = "6GB/s" }
    classes = {
      ram { capacity = "25%", threads = 2, read = { {1, "8GB/s"}, {4, "20GB/s"} } },
      ssd { name = "nvme", path = "/local/scratch", capacity = "800GB", threads = 8,
            write = 1000 },
    }
    limits = { jobs_per_node = 4, ram_per_job = "50%", ssd_per_job = "1TB",
               streams_per_rank = 16 }
  )");
  ASSERT_TRUE(c.ok()) << c.status().message();
  const policy::SystemModel& m = c->model();
  EXPECT_EQ(c->log_level(), "debug");
  EXPECT_EQ(c->catalog_cache(), "/var/cache/nopfs");
  EXPECT_EQ(c->metrics_dir(), "/var/lib/prometheus/node-exporter");
  EXPECT_EQ(c->planner(), policy::Planner::kFillOnce);
  EXPECT_EQ(c->ram_verify(), RamVerify::kAlways);
  // Units as Slurm's --mem, per second: MB is MiB, GB GiB, a number MiB/s.
  EXPECT_DOUBLE_EQ(m.pfs.At(1), 250.0 * kMiB);
  EXPECT_DOUBLE_EQ(m.pfs.At(16), 2.0 * kGiB);
  EXPECT_DOUBLE_EQ(m.pfs.At(100), 2.0 * kGiB);  // clamped
  EXPECT_DOUBLE_EQ(m.network_bandwidth, 10.0 * kGiB);
  EXPECT_DOUBLE_EQ(m.preprocess_rate, 4.0 * kGiB);
  EXPECT_EQ(m.staging.capacity, policy::Bytes{2} << 30);
  EXPECT_EQ(m.staging.threads, 3u);
  EXPECT_DOUBLE_EQ(m.staging.write.At(7), 6.0 * kGiB);
  ASSERT_EQ(m.classes.size(), 2u);
  EXPECT_EQ(m.classes[0].name, "ram");
  EXPECT_EQ(m.classes[0].kind, policy::ClassKind::kRam);
  EXPECT_EQ(m.classes[0].capacity, kHost / 4);
  EXPECT_EQ(m.classes[0].threads, 2u);
  EXPECT_DOUBLE_EQ(m.classes[0].read.At(2.5), 14.0 * kGiB);  // interpolated
  EXPECT_EQ(m.classes[1].name, "nvme");
  EXPECT_EQ(m.classes[1].kind, policy::ClassKind::kSsd);
  EXPECT_EQ(m.classes[1].path, "/local/scratch");
  EXPECT_EQ(m.classes[1].capacity, 800 * kGiB);
  EXPECT_DOUBLE_EQ(m.classes[1].write.At(3), 1000.0 * kMiB);
  EXPECT_FALSE(m.classes[1].read.empty());  // the default table
  EXPECT_EQ(c->limits().jobs_per_node, 4u);
  EXPECT_EQ(c->limits().streams_per_rank, 16u);
  EXPECT_EQ(c->limits().ram_per_job, kHost / 2);
  EXPECT_EQ(c->limits().ssd_per_job, kGiB << 10);
  EXPECT_EQ(c->CapacityOf(policy::ClassKind::kRam), kHost / 4);
  EXPECT_EQ(c->CapacityOf(policy::ClassKind::kSsd), 800 * kGiB);
  EXPECT_TRUE(m.Validate().ok());
}

TEST(NodeConfigTest, JobLogs) {
  Result<NodeConfig> c = Load(R"(job_logs = { dir = "/var/log/nopfs", days = 3 })");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->job_log_dir(), "/var/log/nopfs");
  EXPECT_EQ(c->job_log_days(), 3u);
  c = Load(R"(job_logs = { dir = "/var/log/nopfs" })");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->job_log_days(), 14u);
  c = Load("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->job_log_dir(), "");  // not kept
  ExpectError(R"(job_logs = { dir = "logs" })", "job_logs: dir: \"logs\" must be an absolute");
  ExpectError(R"(job_logs = { days = 3 })", "job_logs: give dir =");
  ExpectError(R"(job_logs = { dir = "/l", days = 0 })", "job_logs: days");
  ExpectError(R"(job_logs = { dir = "/l", keep = 3 })", "job_logs");
  ExpectError(R"(job_logs = "/var/log/nopfs")", "job_logs: expected a table");
}

TEST(NodeConfigTest, EmptyFileMeansNoTiersAndDefaultModel) {
  Result<NodeConfig> c = Load("-- nothing\n");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->model().classes.empty());
  EXPECT_GT(c->model().pfs.At(1), 0);
  EXPECT_EQ(c->model().network_bandwidth, 0);
  EXPECT_EQ(c->log_level(), "info");
  EXPECT_EQ(c->planner(), policy::Planner::kFrequency);
  EXPECT_EQ(c->ram_verify(), RamVerify::kOnFill);
  EXPECT_EQ(c->limits().streams_per_rank, 32u);
  EXPECT_TRUE(c->model().Validate().ok());
}

TEST(NodeConfigTest, ScriptsMayComputeValues) {
  Result<NodeConfig> c = Load(R"(
    local G = 1024  -- a number is MiB
    local scratch = os.getenv("NOPFS_TEST_UNSET_VARIABLE") or "/tmp/scratch"
    classes = { ssd { path = scratch, capacity = 3 * G } }
  )");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model().classes[0].capacity, 3 * kGiB);
  EXPECT_EQ(c->model().classes[0].path, "/tmp/scratch");
}

TEST(NodeConfigTest, NumbersAreMiBAndBytesAreRefusedWithAHint) {
  Result<NodeConfig> c = Load(R"(classes = { ram { capacity = 512 } } network = 100)");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->model().classes[0].capacity, 512 * kMiB);
  EXPECT_DOUBLE_EQ(c->model().network_bandwidth, 100.0 * kMiB);
  ExpectError(R"(classes = { ssd { path = "/s", capacity = 800000000000 } })",
              "capacity: 800000000000 reads as 745 PiB: a number is MiB, as Slurm's --mem; for "
              "800000000000 bytes write \"745 GiB\"");
  ExpectError(R"(network = 1e9)", "network: 1000000000 reads as 954 TiB/s: a number is MiB/s");
}

TEST(NodeConfigTest, DefaultsAreAnEighthOfMemoryInRam) {
  NodeConfig c = DefaultNodeConfig(kHost);
  ASSERT_EQ(c.model().classes.size(), 1u);
  EXPECT_EQ(c.model().classes[0].kind, policy::ClassKind::kRam);
  EXPECT_EQ(c.model().classes[0].capacity, kHost / 8);
  EXPECT_TRUE(c.model().Validate().ok());
  EXPECT_EQ(c.source(), "built-in defaults");
  EXPECT_GT(HostMemoryBytes(), policy::Bytes{1} << 20);
}

TEST(NodeConfigTest, ErrorsNameTheFieldAndTheLine) {
  ExpectError("classes = {\n  ram { capacity = \"20 parsecs\" }\n}",
              "test.conf.lua:2: classes[1] (\"ram\"): capacity");
  ExpectError("classes = {\n ram { capacity = \"1GB\" },\n ssd { capacity = \"1GB\" } }",
              ":3: classes[2] (\"ssd\"): an SSD class needs path");
  ExpectError("classes = { ram { capacity = \"1GB\", path = \"/x\" } }", "a RAM class has no path");
  ExpectError("classes = { ssd { capacity = \"1GB\", path = \"scratch\" } }",
              "must be an absolute directory");
  ExpectError("classes = { ram { capcity = \"1GB\" } }",
              "unknown field 'capcity' (did you mean "
              "'capacity'?)");
  ExpectError("classes = { ram { } }", "no capacity");
  ExpectError("limits = { streams_per_rank = 0 }", "limits: streams_per_rank: 0 is out of range");
  ExpectError("classes = { { capacity = \"1GB\" } }", "no kind; write ram { ... } or ssd");
  ExpectError("classes = { { kind = \"tape\", capacity = 1 } }", "kind \"tape\" is unknown");
  ExpectError("classes = { ram { capacity = \"1GB\", threads = 0 } }",
              "threads: 0 is out of "
              "range");
  ExpectError("classes = { ram { capacity = \"1GB\", threads = 2.5 } }",
              "expected a whole "
              "number");
  ExpectError("classes = { ram { capacity = \"1GB\" }, ram { capacity = \"2GB\" } }", "ram");
  ExpectError("classes = { ssd { path = \"/s\", capacity = \"5%\" } }",
              "a percentage is only allowed for RAM");
  ExpectError("classes = { ram { capacity = \"120%\" } }", "between 0% and 100%");
  ExpectError("pfs = { {4, \"1GB/s\"}, {1, \"2GB/s\"} }", "pfs");
  ExpectError("pfs = { }", "pfs: an empty table");
  ExpectError("pfs = { {1} }", "pfs[1]: expected a pair");
  ExpectError("pfs = { {1, \"fast\"} }", "pfs[1]");
  ExpectError("network = true", "network: expected a bandwidth");
  ExpectError("staging = { capacity = \"1GB\", thread = 2 }", "did you mean 'threads'?");
  ExpectError("limits = { jobs = 2 }", "limits: unknown field 'jobs'");
  ExpectError("log_level = \"verbose\"", "write one of trace, debug, info");
  ExpectError("catalog_cache = \"cache\"", "must be an absolute path");
  ExpectError("metrics_dir = \"prom\"", "metrics_dir: \"prom\" must be an absolute path");
  ExpectError("metric_dir = \"/x\"", "(did you mean 'metrics_dir'?)");
  ExpectError("planner = \"frequncy\"", "(did you mean 'frequency'?)");
  ExpectError("planner = \"lru\"", "write frequency (cache the node's most read samples)");
  ExpectError("verify = \"never\"", "write verify = \"on_fill\"");
  ExpectError("verify = true", "verify");
  ExpectError("verfy = \"always\"", "(did you mean 'verify'?)");
  ExpectError("planner = 3", "planner");
  ExpectError("planer = \"staging\"", "unknown setting 'planer' (did you mean 'planner'?)");
  ExpectError("clases = {}", "unknown setting 'clases' (did you mean 'classes'?)");
  ExpectError("classes = { ram { capacity = \"1GB\", kind = \"ssd\" } }", "leave out 'kind'");
  ExpectError("x = = 1", "test.conf.lua:1:");
}

TEST(NodeConfigTest, RunawayConfigIsStopped) {
  Result<NodeConfig> c = LoadNodeConfigFromString(
      "while true do end", "spin.lua", kHost,
      LuaLimits{.memory_bytes = size_t{16} << 20, .instructions = 1'000'000});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
}

TEST(NodeConfigTest, SharedDatasetsAreDeclaredWithTheirSsd) {
  Result<NodeConfig> c = Load(R"(
    classes = { ssd { path = "/scratch", capacity = "1T" } }
    shared = { { path = "/pfs/imagenet/", ssd = "200G" }, { path = "/pfs/coco", ssd = "20G" } }
  )");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->shared().size(), 2u);
  EXPECT_EQ(c->shared()[0].path, "/pfs/imagenet");
  EXPECT_EQ(c->shared()[0].ssd, uint64_t{200} << 30);
  EXPECT_EQ(c->shared_store_dir(), "/scratch/.nopfs-shared");
  ExpectError(R"(classes = { ssd { path = "/s", capacity = "1TB" } }
                 shared = { { path = "pfs/x", ssd = "1GB" } })",
              "absolute directory");
  ExpectError(R"(classes = { ssd { path = "/s", capacity = "1TB" } }
                 shared = { { path = "/pfs/x" } })",
              "give ssd =");
  ExpectError(R"(classes = { ssd { path = "/s", capacity = "1TB" } }
                 shared = { { path = "/pfs/x", ssd = "1GB", sdd = 1 } })",
              "sdd");
  ExpectError(R"(shared = { { path = "/pfs/x", ssd = "1GB" } })", "add an ssd{");
  ExpectError(R"(classes = { ssd { path = "/s", capacity = "1TB" } }
                 shared = { { path = "/x", ssd = "1GB" }, { path = "/x/", ssd = "2GB" } })",
              "declared twice");
}

TEST(NodeConfigTest, TheSharedQuotasComeOutOfTheSsdOfferedToJobs) {
  Result<NodeConfig> c = Load(R"(
    classes = { ssd { path = "/scratch", capacity = "1T" }, ssd { name = "nvme2", path = "/n2",
                capacity = "100G" } }
    shared = { { path = "/pfs/imagenet", ssd = "200G" }, { path = "/pfs/coco", ssd = "24G" } }
  )");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->CapacityOf(policy::ClassKind::kSsd), uint64_t{1124} << 30);
  EXPECT_EQ(c->SsdForJobs(), uint64_t{900} << 30);
  Result<NodeConfig> none = Load(R"(classes = { ssd { path = "/scratch", capacity = "1T" } })");
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ(none->SsdForJobs(), uint64_t{1} << 40);
  // Quotas that do not fit in the class holding the copies (the first SSD class) are refused.
  ExpectError(R"(classes = { ssd { path = "/s", capacity = "100G" }, ssd { name = "b", path = "/b",
                 capacity = "1T" } }
                 shared = { { path = "/x", ssd = "60G" }, { path = "/y", ssd = "50G" } })",
              "exceed the capacity of the SSD class ssd");
}

TEST(NodeConfigTest, MissingFile) {
  Result<NodeConfig> c = LoadNodeConfig("/nonexistent/nopfs.conf.lua", kHost);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("/nonexistent/nopfs.conf.lua"), std::string::npos);
}

TEST(NodeConfigTest, ShippedConfigsLoad) {
  const std::string dir = std::string(NOPFS_SOURCE_DIR) + "/contrib/config/";
  for (const char* name : {"nopfs.conf.lua", "demo.conf.lua", "nocache.conf.lua"}) {
    Result<NodeConfig> c = LoadNodeConfig(dir + name, kHost);
    EXPECT_TRUE(c.ok()) << name << ": " << c.status().message();
  }
  Result<NodeConfig> demo = LoadNodeConfig(dir + "demo.conf.lua", kHost);
  ASSERT_TRUE(demo.ok());
  ASSERT_EQ(demo->model().classes.size(), 2u);
  EXPECT_EQ(demo->model().classes[0].capacity, 20 * kGiB);
  EXPECT_EQ(demo->model().classes[1].capacity, 60 * kGiB);
}

}  // namespace
}  // namespace nopfs::lua
