#include "kept/node.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>

#include <gtest/gtest.h>

namespace nopfs::kept {
namespace {

namespace fs = std::filesystem;

const uint32_t kMe = ::getuid();
constexpr size_t kMiB = 1 << 20;
const std::string kA = "000000000000000a", kB = "000000000000000b", kC = "000000000000000c";

class NodeKeptTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(testing::TempDir()).lexically_normal().string() + "/node_kept_" +
            testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root_);
    fs::create_directories(root_ + "/ssd");
    kept_ = root_ + "/ssd/nopfs-" + std::to_string(kMe) + "/kept";
    fs::create_directories(kept_);
    Result<lua::NodeConfig> c =
        lua::LoadNodeConfigFromString("classes = { ram { capacity = \"1G\" }, ssd { path = \"" +
                                          root_ + "/ssd\", capacity = \"100M\" } }\n",
                                      "node.conf.lua", uint64_t{8} << 30);
    ASSERT_TRUE(c.ok()) << c.status().message();
    config_ = std::make_unique<lua::NodeConfig>(*c);
  }

  std::string Policy(const std::string& keep_body) {
    const std::string path = root_ + "/policy.lua";
    std::ofstream(path) << "function admit(job, node) return {} end\n"
                        << (keep_body.empty()
                                ? ""
                                : "function keep(user, node) " + keep_body + " end\n");
    return path;
  }

  // A kept dataset that root's record says was last used at `last_used`. Its MANIFEST says what
  // a user may write there: last used ten years ahead, which must change nothing.
  void Kept(const std::string& key, const std::string& dataset, size_t bytes, int64_t last_used) {
    const std::string dir = kept_ + "/" + key;
    fs::create_directories(dir);
    std::ofstream(dir + "/data.0", std::ios::binary) << std::string(bytes, 'x');
    KeptManifest m;
    m.key = key;
    m.dataset = dataset;
    m.created = m.last_used = ::time(nullptr) + 10 * 365 * 86400;
    m.samples = 1;
    ASSERT_TRUE(WriteFileDurably(dir, "MANIFEST", EncodeKeptManifest(m)).ok());
    Record(key, last_used);
  }

  void Record(const std::string& key, int64_t last_used, uint32_t uid = kMe) {
    std::string note;
    Result<RootRecord> r = RootRecord::Open(root_ + "/ssd", std::chrono::seconds(5), &note);
    ASSERT_TRUE(r.ok()) << r.status().message();
    r->times()[{uid, key}] = RootTimes{last_used, last_used};
    r->Touch();
    ASSERT_TRUE(r->Save().ok());
  }

  std::optional<RootTimes> Recorded(const std::string& key) {
    std::string note;
    Result<RootRecord> r = RootRecord::Open(root_ + "/ssd", std::chrono::seconds(5), &note);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return std::nullopt;
    auto it = r->times().find({kMe, key});
    if (it == r->times().end()) return std::nullopt;
    return it->second;
  }

  std::string UserDir() const { return root_ + "/ssd/nopfs-" + std::to_string(kMe); }

  std::set<std::string> Left() const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(kept_))
      out.insert(e.path().filename().string());
    return out;
  }

  lua::NodeState Node(uint64_t reserved = 0) const {
    lua::NodeState ns;
    ns.name = "n1";
    ns.ssd_total = 100 * kMiB;
    ns.ssd_reserved = reserved;
    return ns;
  }

  std::vector<std::string> Paths() const { return {root_ + "/ssd"}; }

  std::string root_, kept_;
  std::unique_ptr<lua::NodeConfig> config_;
};

TEST_F(NodeKeptTest, AJobThatNeedsTheSpaceEvictsOthersButAdoptsItsOwn) {
  const int64_t now = ::time(nullptr);
  Kept(kA, "/pfs/mine", 10 * kMiB, now - 300);   // the job's dataset, the oldest
  Kept(kB, "/pfs/other", 10 * kMiB, now - 200);  // evicted first
  Kept(kC, "/pfs/third", 10 * kMiB, now - 100);  // evicted next, if still needed
  lua::NodeState ns = Node(50 * kMiB);
  NodeKept kept(KeepJob{kMe, "/pfs/mine", true, Policy("return { quota = '1G' }")}, *config_,
                Paths(), {}, &ns);
  EXPECT_GE(ns.ssd_kept, 30 * kMiB);
  EXPECT_EQ(Left(), (std::set<std::string>{kA, kB, kC})) << "nothing over quota or expired";
  // 50 MiB reserved + a 39 MiB grant leave 11 MiB, plus the 10 MiB of its own it adopts: one of
  // the others (10 MiB and a MANIFEST each) must go, the least recently used (kB).
  lua::Admission adm;
  adm.admitted = true;
  adm.ssd = 39 * kMiB;
  const KeepPlan plan = kept.Admitted(ns, adm);
  EXPECT_EQ(Left(), (std::set<std::string>{kA, kC}));
  EXPECT_TRUE(plan.keep);
  EXPECT_EQ(plan.max_bytes, 39 * kMiB) << "never more than the SSD grant";
  EXPECT_NE(plan.note.find("keeps up to"), std::string::npos) << plan.note;
  EXPECT_NE(plan.note.find("adopts"), std::string::npos) << plan.note;
  EXPECT_NE(plan.note.find("kept datasets removed: uid " + std::to_string(kMe) + " " + kB +
                           " (/pfs/other, "),
            std::string::npos)
      << plan.note;
  EXPECT_NE(plan.note.find(", space)"), std::string::npos) << plan.note;
}

// The same node and grant for a job that keeps nothing: it reads its own copy and leaves it kept,
// so the copy's disk stays beside the grant: both others must go, and the copy stays.
TEST_F(NodeKeptTest, AJobThatKeepsNothingLeavesItsOwnCopyBesideItsGrant) {
  const int64_t now = ::time(nullptr);
  Kept(kA, "/pfs/mine", 10 * kMiB, now - 300);
  Kept(kB, "/pfs/other", 10 * kMiB, now - 200);
  Kept(kC, "/pfs/third", 10 * kMiB, now - 100);
  lua::NodeState ns = Node(50 * kMiB);
  NodeKept kept(KeepJob{kMe, "/pfs/mine", false, Policy("return { quota = '1G' }")}, *config_,
                Paths(), {}, &ns);
  lua::Admission adm;
  adm.admitted = true;
  adm.ssd = 39 * kMiB;
  const KeepPlan plan = kept.Admitted(ns, adm);
  EXPECT_EQ(Left(), (std::set<std::string>{kA}));
  EXPECT_FALSE(plan.keep);
  EXPECT_NE(plan.note.find("keeps nothing (--nopfs-keep=no); reads 10"), std::string::npos)
      << plan.note;
  EXPECT_NE(plan.note.find(" kept and leaves it kept"), std::string::npos) << plan.note;
}

TEST_F(NodeKeptTest, QuotaBoundsTheKeepAndTheOptionOrTheAbsentHookKeepNothing) {
  lua::NodeState ns = Node();
  lua::Admission adm;
  adm.admitted = true;
  adm.ssd = 40 * kMiB;
  {
    NodeKept kept(KeepJob{kMe, "/pfs/d", true, Policy("return { quota = '5M' }")}, *config_,
                  Paths(), {}, &ns);
    const KeepPlan plan = kept.Admitted(ns, adm);
    EXPECT_TRUE(plan.keep);
    EXPECT_EQ(plan.max_bytes, 5u << 20);  // '5M', as --mem
  }
  {
    NodeKept kept(KeepJob{kMe, "/pfs/d", false, Policy("return { quota = '5M' }")}, *config_,
                  Paths(), {}, &ns);
    const KeepPlan plan = kept.Admitted(ns, adm);
    EXPECT_FALSE(plan.keep);
    EXPECT_EQ(plan.max_bytes, 0u);
    EXPECT_EQ(plan.note, "keeps nothing (--nopfs-keep=no)");
  }
  {
    lua::Admission no_ssd = adm;
    no_ssd.ssd = 0;
    NodeKept kept(KeepJob{kMe, "/pfs/d", true, Policy("return { quota = '5M' }")}, *config_,
                  Paths(), {}, &ns);
    EXPECT_FALSE(kept.Admitted(ns, no_ssd).keep);
  }
  // No keep hook: nothing may be kept, and what the user kept before goes.
  Kept(kA, "/pfs/d", kMiB, ::time(nullptr));
  NodeKept kept(KeepJob{kMe, "/pfs/d", true, Policy("")}, *config_, Paths(), {}, &ns);
  EXPECT_TRUE(Left().empty());
  EXPECT_EQ(ns.ssd_kept, 0u);
  const KeepPlan plan = kept.Admitted(ns, adm);
  EXPECT_FALSE(plan.keep);
  EXPECT_NE(plan.note.find("over quota"), std::string::npos) << plan.note;
}

TEST_F(NodeKeptTest, AFailingHookLeavesTheUsersDataAndKeepsNothingMore) {
  Kept(kA, "/pfs/d", kMiB, 1000);  // long ago
  lua::NodeState ns = Node();
  NodeKept kept(KeepJob{kMe, "/pfs/d", true, Policy("error('typo')")}, *config_, Paths(), {}, &ns);
  EXPECT_EQ(Left(), std::set<std::string>{kA});
  lua::Admission adm;
  adm.admitted = true;
  adm.ssd = 40 * kMiB;
  const KeepPlan plan = kept.Admitted(ns, adm);
  EXPECT_FALSE(plan.keep);
  EXPECT_NE(plan.note.find("keeps nothing (the policy's keep failed)"), std::string::npos)
      << plan.note;
  EXPECT_NE(plan.note.find("typo"), std::string::npos) << plan.note;
}

TEST_F(NodeKeptTest, AfterTheJobTheQuotaAndTheLifetimeApply) {
  const int64_t now = ::time(nullptr);
  Kept(kA, "/pfs/a", 2 * kMiB, now - 7200);   // expired with a lifetime of 1h
  Kept(kB, "/pfs/b", 2 * kMiB, now - 60);     // over a 3 MB quota with kC
  Kept(kC, "/pfs/c", 2 * kMiB, now);          // just kept
  fs::create_directories(kept_ + "/.tmp.1");  // a keep of another job, in its first minute
  const std::string notes = AfterJob(Policy("return { quota = '3M', lifetime = '1h' }"), *config_,
                                     "n1", Paths(), kMe, "/pfs/c", {});
  EXPECT_EQ(Left(), (std::set<std::string>{kC, ".tmp.1"}));
  EXPECT_NE(notes.find(kA + " (/pfs/a, "), std::string::npos) << notes;
  EXPECT_NE(notes.find("expired)"), std::string::npos) << notes;
  EXPECT_NE(notes.find(kB + " (/pfs/b, "), std::string::npos) << notes;
  EXPECT_NE(notes.find("over quota)"), std::string::npos) << notes;
  EXPECT_NE(notes.find("kept "), std::string::npos) << notes;
  fs::remove_all(kept_);
  EXPECT_EQ(AfterJob(Policy("return { quota = '3M' }"), *config_, "n1", Paths(), kMe, "/pfs/c", {}),
            "");
}

TEST_F(NodeKeptTest, TheEpilogRecordsTheUseOfTheJobsDatasetNotOfOthers) {
  const int64_t now = ::time(nullptr);
  Kept(kA, "/pfs/a", kMiB, now - 7200);  // root last saw it used two hours ago
  Kept(kB, "/pfs/b", kMiB, now - 7200);
  // The job ran on /pfs/a (it adopted kA): kA's last use is now, kB's stays and expires.
  const std::string notes = AfterJob(Policy("return { quota = '1G', lifetime = '1h' }"), *config_,
                                     "n1", Paths(), kMe, "/pfs/a", {});
  EXPECT_EQ(Left(), std::set<std::string>{kA}) << notes;
  const std::optional<RootTimes> t = Recorded(kA);
  ASSERT_TRUE(t.has_value());
  EXPECT_GE(t->last_used, now);
  EXPECT_EQ(t->first_seen, now - 7200);
  EXPECT_FALSE(Recorded(kB).has_value()) << "the record of a removed dataset stays";
}

TEST_F(NodeKeptTest, ThePrologCountsWhatAUserLeftAndRemovesStrays) {
  Kept(kA, "/pfs/a", 4 * kMiB, ::time(nullptr));
  std::ofstream(UserDir() + "/junk", std::ios::binary) << std::string(3 * kMiB, 'x');
  fs::create_directories(UserDir() + "/12.0");  // a running job's tier: its reservation's
  std::ofstream(UserDir() + "/12.0/data.0", std::ios::binary) << std::string(20 * kMiB, 'x');
  fs::create_directories(UserDir() + "/held");  // held by a live process: counted, kept
  std::ofstream(UserDir() + "/held/data", std::ios::binary) << std::string(2 * kMiB, 'x');
  Result<int> lock = LockKeptEntry(UserDir() + "/held");
  ASSERT_TRUE(lock.ok()) << lock.status().message();
  lua::NodeState ns = Node(20 * kMiB);
  NodeKept kept(KeepJob{kMe, "/pfs/a", true, Policy("return { quota = '1G' }")}, *config_, Paths(),
                {LiveJob{kMe, 12, 0}}, &ns);
  EXPECT_FALSE(fs::exists(UserDir() + "/junk"));
  EXPECT_TRUE(fs::exists(UserDir() + "/12.0/data.0"));
  EXPECT_TRUE(fs::exists(UserDir() + "/held/data"));
  EXPECT_GE(ns.ssd_kept, 4 * kMiB);
  EXPECT_LT(ns.ssd_kept, 5 * kMiB) << "the dataset only: junk is gone, held is reserved";
  EXPECT_GE(ns.ssd_reserved, 22 * kMiB) << "the live job's 20 MiB and the 2 MiB held";
  EXPECT_LT(ns.ssd_reserved, 23 * kMiB) << "the live job's directory counted twice";
  lua::Admission adm;
  adm.admitted = true;
  adm.ssd = 10 * kMiB;
  const KeepPlan plan = kept.Admitted(ns, adm);
  EXPECT_NE(plan.note.find("nopfs-" + std::to_string(kMe) + "/junk ("), std::string::npos)
      << plan.note;
  EXPECT_NE(plan.note.find("stray)"), std::string::npos) << plan.note;
  ::close(*lock);
}

}  // namespace
}  // namespace nopfs::kept
