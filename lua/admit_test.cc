#include "lua/admit.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <limits>
#include <string>

namespace nopfs::lua {
namespace {

constexpr policy::Bytes kGB = policy::Bytes{1} << 30;  // "GB" is 2^30, as in Slurm's --mem

NodeConfig Config(const std::string& limits = "") {
  Result<NodeConfig> c = LoadNodeConfigFromString(
      "classes = { ram { capacity = \"100GB\" }, ssd { path = \"/s\", capacity = \"1TB\" } }\n" +
          limits,
      "node.conf.lua", policy::Bytes{256} << 30);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

NodeState Node(policy::Bytes ram_reserved = 0, policy::Bytes ssd_reserved = 0, uint32_t jobs = 0) {
  NodeState n;
  n.name = "node7";
  n.ram_total = 100 * kGB;
  n.ssd_total = 1000 * kGB;
  n.ram_reserved = ram_reserved;
  n.ssd_reserved = ssd_reserved;
  n.jobs = jobs;
  return n;
}

JobRequest Job() {
  JobRequest j;
  j.job_id = 1234;
  j.uid = 1000;
  j.user = "alice";
  j.account = "ml";
  j.partition = "gpu";
  j.qos = "normal";
  j.dataset = "/pfs/imagenet";
  j.nodes = 4;
  return j;
}

Result<Admission> AskPolicy(const std::string& policy, const JobRequest& job, const NodeState& node,
                            const NodeConfig& config = Config()) {
  return AdmitWithPolicyText(policy, "/etc/nopfs/policy.lua", config, job, node);
}

TEST(AdmitTest, NoPolicyGrantsTheRequestOrEverythingFree) {
  Result<Admission> a = AskPolicy("", Job(), Node(30 * kGB, 0, 1));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a->admitted);
  EXPECT_EQ(a->ram, 70 * kGB);  // everything free
  EXPECT_EQ(a->ssd, 1000 * kGB);

  JobRequest j = Job();
  j.ram = 10 * kGB;
  j.ssd = 5 * kGB;
  a = AskPolicy("", j, Node());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ram, 10 * kGB);
  EXPECT_EQ(a->ssd, 5 * kGB);
  EXPECT_EQ(a->reason, "");
}

TEST(AdmitTest, PolicySeesTheJobAndTheNode) {
  const std::string policy = R"(
    function admit(job, node)
      assert(job.id == 1234 and job.user == "alice" and job.account == "ml")
      assert(job.partition == "gpu" and job.qos == "normal" and job.nodes == 4)
      assert(job.dataset == "/pfs/imagenet" and job.uid == 1000)
      assert(node.name == "node7" and node.ram_free == size("60GB") and node.jobs == 2)
      return { ram = node.ram_free // 2, ssd = "100GB" }
    end
  )";
  Result<Admission> a = AskPolicy(policy, Job(), Node(40 * kGB, 0, 2));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a->admitted);
  EXPECT_EQ(a->ram, 30 * kGB);
  EXPECT_EQ(a->ssd, 100 * kGB);
}

TEST(AdmitTest, RefusalCarriesTheReason) {
  JobRequest j = Job();
  j.partition = "debug";
  Result<Admission> a = AskPolicy(
      "function admit(job) if job.partition == 'debug' then return nil, 'not on debug' end "
      "return {} end",
      j, Node());
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->admitted);
  EXPECT_EQ(a->reason, "not on debug");
  a = AskPolicy("function admit() return false end", j, Node());
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->admitted);
  EXPECT_NE(a->reason.find("policy"), std::string::npos);
}

TEST(AdmitTest, GrantIsClampedToRequestLimitsAndFreeSpace) {
  JobRequest j = Job();
  j.ram = 20 * kGB;
  // The policy tries to hand out more than asked, more than the limit and more than is free.
  Result<Admission> a = AskPolicy("function admit() return { ram = '500GB', ssd = '5TB' } end", j,
                                  Node(0, 900 * kGB), Config("limits = { ssd_per_job = '200GB' }"));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a->admitted);
  EXPECT_EQ(a->ram, 20 * kGB);   // the request
  EXPECT_EQ(a->ssd, 100 * kGB);  // limit 200 GB, but only 100 GB free
  EXPECT_NE(a->reason.find("RAM limited to 20.0 GiB by the request"), std::string::npos)
      << a->reason;
  EXPECT_NE(a->reason.find("SSD limited to 100 GiB by what is free on the node"), std::string::npos)
      << a->reason;
}

TEST(AdmitTest, JobsPerNodeRefusesBeforeThePolicyRuns) {
  Result<Admission> a = AskPolicy("function admit() error('must not be called') end", Job(),
                                  Node(0, 0, 2), Config("limits = { jobs_per_node = 2 }"));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_FALSE(a->admitted);
  EXPECT_NE(a->reason.find("the limit is 2"), std::string::npos) << a->reason;
}

TEST(AdmitTest, JobTableIsReadOnly) {
  Result<Admission> a =
      AskPolicy("function admit(job) job.ram = 1e12 return {} end", Job(), Node());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("read-only"), std::string::npos) << a.status().message();
  a = AskPolicy("function admit(job) setmetatable(job, nil) return {} end", Job(), Node());
  EXPECT_FALSE(a.ok());
}

TEST(AdmitTest, BrokenPoliciesFailWithFileAndLine) {
  Result<Admission> a =
      AskPolicy("function admit(job)\n  return job.nothing.x\nend", Job(), Node());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("/etc/nopfs/policy.lua:2:"), std::string::npos)
      << a.status().message();
  a = AskPolicy("function admit() return 42 end", Job(), Node());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("return { ram = SIZE, ssd = SIZE }"), std::string::npos);
  a = AskPolicy("function admit() return { ram = 'lots' } end", Job(), Node());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("admit() returned ram"), std::string::npos)
      << a.status().message();
  a = AskPolicy("function admit() return { rma = 1 } end", Job(), Node());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("did you mean 'ram'"), std::string::npos);
  a = AdmitWithPolicyText("function admit() while true do end end", "spin.lua", Config(), Job(),
                          Node(),
                          LuaLimits{.memory_bytes = size_t{16} << 20, .instructions = 1'000'000});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kResourceExhausted);
}

// A policy that runs but defines no admit() must not admit every job with the default: the
// caller refuses the job with this error (failing closed), and the message names the fix.
TEST(AdmitTest, FileWithoutAdmitIsAnError) {
  for (const char* text :
       {"-- nothing here\nlocal x = 1", "function Admit(job, node) return nil, 'no' end",
        "admit = { ram = 1 }"}) {
    Result<Admission> a = AskPolicy(text, Job(), Node());
    ASSERT_FALSE(a.ok()) << text;
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("/etc/nopfs/policy.lua"), std::string::npos);
    EXPECT_NE(a.status().message().find("define function admit(job, node)"), std::string::npos)
        << a.status().message();
  }
}

TEST(AdmitTest, RamComesFromTheJobsMemoryAllocation) {
  JobRequest j = Job();
  j.memory = 8 * kGB;
  Result<Admission> a = AskPolicy("", j, Node());
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a->admitted);
  EXPECT_EQ(a->ram, 4 * kGB);  // half the allocation, not the node's 100 GB
  j.ram = 20 * kGB;            // asking for more than the allocation is clamped to it
  a = AskPolicy("", j, Node());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ram, 8 * kGB);
  EXPECT_NE(a->reason.find("memory allocation"), std::string::npos) << a->reason;
  // The policy sees the allocation and cannot grant past it either.
  a = AskPolicy("function admit(job, node) return { ram = job.memory * 4 } end", j, Node());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ram, 8 * kGB);
}

TEST(AdmitTest, ShippedPolicy) {
  const std::string path = std::string(NOPFS_SOURCE_DIR) + "/contrib/config/policy.lua";
  JobRequest j = Job();
  Result<Admission> a = Admit(path, Config(), j, Node(20 * kGB));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a->admitted);
  EXPECT_EQ(a->ram, 40 * kGB);  // half of what is free
  j.partition = "debug";
  a = Admit(path, Config(), j, Node());
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->admitted);
  j.partition = "gpu";
  j.ram = 4 * kGB;
  a = Admit(path, Config(), j, Node());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->ram, 4 * kGB);
  Result<Admission> missing = Admit("/nonexistent/policy.lua", Config(), j, Node());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/policy.lua"), std::string::npos);
}

KeepUser Alice() {
  return KeepUser{1000, 100, "alice"};
}

Result<KeepGrant> AskKeep(const std::string& policy, const KeepUser& user = Alice(),
                          const NodeState& node = Node()) {
  return KeepWithPolicyText(policy, "/etc/nopfs/policy.lua", Config(), user, node);
}

TEST(AdmitTest, SizesAreMiBAsSlurmsMem) {
  // What the policy sees and returns is MiB, whole sizes as integers; size() converts to MiB.
  JobRequest j = Job();
  j.memory = 4 * kGB;                 // --mem=4G
  j.ram = policy::Bytes{1300} << 10;  // --nopfs-ram=1300K: not a whole MiB
  Result<Admission> a = AskPolicy(R"(
    function admit(job, node)
      assert(math.type(job.memory) == "integer" and job.memory == 4096, job.memory)
      assert(job.ram == 1300 / 1024, job.ram)
      assert(size("32G") == 32768 and size("1.5G") == 1536 and size(512) == 512)
      assert(size("512K") == 0.5)
      assert(node.ram_free == 100 * 1024 and node.ssd_total == size("1000G"))
      return { ram = 1, ssd = 2048 }
    end
  )",
                                  j, Node());
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->ram, policy::Bytes{1} << 20);
  EXPECT_EQ(a->ssd, 2 * kGB);
  // A number of bytes, as policies wrote sizes before, is refused with what to write instead.
  a = AskPolicy("function admit() return { ram = 17179869184 } end", Job(), Node());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("17179869184 reads as 16.0 PiB: a number is MiB, as "
                                      "Slurm's --mem; for 17179869184 bytes write \"16.0 GiB\""),
            std::string::npos)
      << a.status().message();
}

TEST(AdmitTest, NoTierWhenTheJobAskedForNone) {
  JobRequest j = Job();
  j.no_ram = true;  // --nopfs-ram=0
  Result<Admission> a = AskPolicy("function admit() return { ram = '10G' } end", j, Node());
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_TRUE(a->admitted);
  EXPECT_EQ(a->ram, 0u);
  EXPECT_GT(a->ssd, 0u);
  EXPECT_NE(a->reason.find("RAM limited to 0 B by the request (--nopfs-ram=0)"), std::string::npos)
      << a->reason;
}

TEST(KeepTest, NoHookOrNoPolicyKeepsNothing) {
  for (const std::string& policy :
       {std::string(""), std::string("function admit(job, node) return {} end")}) {
    Result<KeepGrant> g = AskKeep(policy);
    ASSERT_TRUE(g.ok()) << g.status().message();
    EXPECT_EQ(g->quota, 0u);
    EXPECT_EQ(g->lifetime, 0);
  }
  Result<KeepGrant> g = AskKeep("function keep(user, node) return nil end");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->quota, 0u);
}

TEST(KeepTest, HookSeesTheUserAndTheNodeAndGrantsQuotaAndLifetime) {
  const std::string policy = R"(
    function keep(user, node)
      assert(user.uid == 1000 and user.gid == 100 and user.name == "alice")
      assert(node.name == "node7" and node.ssd_total == size("1000GB"))
      assert(node.ssd_kept == size("3GB") and node.ssd_free == size("990GB"))
      return { quota = node.ssd_total // 10, lifetime = "7d" }
    end
  )";
  NodeState n = Node(0, 10 * kGB);
  n.ssd_kept = 3 * kGB;
  Result<KeepGrant> g = AskKeep(policy, Alice(), n);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->quota, 100 * kGB);
  EXPECT_EQ(g->lifetime, 7 * 86400);
  g = AskKeep("function keep(u, n) return { quota = \"20GB\", lifetime = 3600 } end");
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->quota, 20 * kGB);
  EXPECT_EQ(g->lifetime, 3600);
  g = AskKeep(
      "function keep(u, n) if u.name == 'alice' then return false end "
      "return { quota = 1 } end");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->quota, 0u);
  g = AskKeep(
      "function keep(u, n) if u.name == 'alice' then return false end "
      "return { quota = 1 } end",
      KeepUser{1001, 100, "bob"});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->quota, policy::Bytes{1} << 20);  // a number is MiB
}

TEST(KeepTest, BadAnswersFailWithWhatToWrite) {
  struct Case {
    const char* policy;
    const char* says;
  } cases[] = {
      {"function keep(u, n) return 5 end", "return { quota = SIZE, lifetime = SECONDS } or nil"},
      {"function keep(u, n) return { qouta = '1GB' } end", "qouta"},
      {"function keep(u, n) return { quota = '1 parsec' } end", "quota"},
      {"function keep(u, n) return { lifetime = '3 weeks' } end", "\"7d\""},
      {"function keep(u, n) return { lifetime = -5 } end", "whole seconds"},
      {"function keep(u, n) return { lifetime = true } end", "whole seconds"},
      {"keep = 3", "define function keep(user, node)"},
      {"function keep(u, n) u.uid = 0 end", "read-only"},
      {"function keep(u, n) while true do end end", "instruction budget"},
  };
  for (const Case& c : cases) {
    Result<KeepGrant> g = AskKeep(c.policy);
    ASSERT_FALSE(g.ok()) << c.policy;
    EXPECT_NE(g.status().message().find(c.says), std::string::npos)
        << c.policy << ": " << g.status().message();
    EXPECT_NE(g.status().message().find("/etc/nopfs/policy.lua"), std::string::npos)
        << g.status().message();
  }
}

TEST(KeepTest, GrantsAreAskedOncePerUserAndAFailureLeavesThatUsersDataAlone) {
  const std::string path = testing::TempDir() + "/keep_grants_policy.lua";
  {
    std::ofstream(path) << "calls = 0\n"
                           "function keep(user, node)\n"
                           "  if user.uid == 0 then error('no keeping for ' .. user.name) end\n"
                           "  return { quota = user.uid, lifetime = 60 }\n"
                           "end\n";
  }
  KeepGrants grants(path, Config(), Node());
  EXPECT_EQ(grants.For(4242).quota, policy::Bytes{4242} << 20);  // MiB
  EXPECT_EQ(grants.For(4242).lifetime, 60);
  EXPECT_FALSE(grants.Failed(4242));
  EXPECT_TRUE(grants.errors().empty());
  EXPECT_TRUE(grants.Failed(0));
  EXPECT_EQ(grants.For(0).quota, std::numeric_limits<policy::Bytes>::max());
  EXPECT_EQ(grants.For(0).lifetime, 0);
  ASSERT_EQ(grants.errors().size(), 1u);  // asked once
  EXPECT_NE(grants.errors()[0].find("no keeping for root"), std::string::npos)
      << grants.errors()[0];
  KeepGrants none("", Config(), Node());
  EXPECT_EQ(none.For(4242).quota, 0u);
  EXPECT_FALSE(none.Failed(4242));
}

TEST(KeepTest, Lifetimes) {
  EXPECT_EQ(*ParseLifetime("90"), 90);
  EXPECT_EQ(*ParseLifetime("90s"), 90);
  EXPECT_EQ(*ParseLifetime("30m"), 1800);
  EXPECT_EQ(*ParseLifetime("12h"), 43200);
  EXPECT_EQ(*ParseLifetime("7d"), 604800);
  for (const char* bad : {"", "d", "7 d", "7w", "-1", "1.5h", "99999999999999999999d"}) {
    EXPECT_FALSE(ParseLifetime(bad).ok()) << bad;
  }
}

TEST(KeepTest, ShippedPolicyKeepsNothingUntilTheAdminSetsTheShare) {
  const std::string path = std::string(NOPFS_SOURCE_DIR) + "/contrib/config/policy.lua";
  Result<KeepGrant> g = Keep(path, Config(), Alice(), Node());
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->quota, 0u);
  // The one line its comment says to change.
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string off = "local keep_share = nil";
  ASSERT_NE(text.find(off), std::string::npos);
  text.replace(text.find(off), off.size(), "local keep_share = 10");
  g = KeepWithPolicyText(text, "policy.lua", Config(), Alice(), Node());
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->quota, 100 * kGB);  // a tenth of the node's SSD
  EXPECT_EQ(g->lifetime, 7 * 86400);
}

}  // namespace
}  // namespace nopfs::lua
