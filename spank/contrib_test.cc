// The shipped Slurm config and policy (contrib/slurm/) load and behave as docs/admin.md says.
#include <gtest/gtest.h>

#include <string>

#include "lua/admit.h"
#include "lua/config.h"

namespace nopfs::lua {
namespace {

constexpr policy::Bytes kMiB = 1 << 20;
constexpr policy::Bytes kGiB = kMiB << 10;

std::string Contrib(const char* name) {
  return std::string(NOPFS_SOURCE_DIR) + "/contrib/slurm/" + name;
}

NodeState Node(const NodeConfig& c) {
  NodeState n;
  n.name = "n1";
  n.ram_total = c.CapacityOf(policy::ClassKind::kRam);
  n.ssd_total = c.CapacityOf(policy::ClassKind::kSsd);
  return n;
}

TEST(ContribSlurmTest, ExampleConfigLoads) {
  Result<NodeConfig> c = LoadNodeConfig(Contrib("nopfs.conf.lua"), policy::Bytes{256} << 30);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->CapacityOf(policy::ClassKind::kSsd), 1500 * kGiB);  // "1500G", as --mem
  EXPECT_EQ(c->limits().jobs_per_node, 4u);
}

TEST(ContribSlurmTest, PolicySizesRamFromTheJobsMemory) {
  Result<NodeConfig> c = LoadNodeConfigFromString(
      "classes = { ram { capacity = \"100G\" }, ssd { path = \"/s\", capacity = \"1T\" } }",
      "test.conf.lua", policy::Bytes{256} << 30);
  ASSERT_TRUE(c.ok());
  JobRequest j;
  j.user = "nopfs-alice";
  j.partition = "gpu";  // no partition cap
  j.dataset = "/pfs/x";
  j.memory = 64'000 * kMiB;
  Result<Admission> a = Admit(Contrib("policy.lua"), *c, j, Node(*c));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a->admitted);
  EXPECT_EQ(a->ram, j.memory / 4);  // a quarter of the job's memory, not of the host's
  EXPECT_EQ(a->ssd, 512 * kGiB);    // half of the free SSD

  j.partition = "debug";  // partition cap
  a = Admit(Contrib("policy.lua"), *c, j, Node(*c));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ram, 256 * kMiB);

  j.partition = "gpu";
  j.user = "nopfs-bob";  // per-user cap
  a = Admit(Contrib("policy.lua"), *c, j, Node(*c));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ram, 128 * kMiB);

  j.partition = "interactive";
  a = Admit(Contrib("policy.lua"), *c, j, Node(*c));
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->admitted);
  EXPECT_EQ(a->reason, "nopfs is not offered on partition interactive");

  j.partition = "gpu";
  j.user = "nopfs-mallory";
  a = Admit(Contrib("policy.lua"), *c, j, Node(*c));
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->admitted);
}

}  // namespace
}  // namespace nopfs::lua
