// Tests of one scan per job: several Catalogs, one per emulated node, on real files and real
// RocksDBs, joined by an in-process collective exchange with the semantics of PeerLink::Exchange
// (a dead node makes the others' round fail at once).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "service/catalog/catalog.h"
#include "service/catalog/catalog_share.h"
#include "service/catalog/catalog_test_util.h"
#include "service/env/env.h"

namespace nopfs::service {
namespace {

namespace fs = std::filesystem;
using Buffers = std::vector<std::vector<std::byte>>;

// The collective round among `nodes` in-process nodes.
class LocalRounds {
 public:
  explicit LocalRounds(uint32_t nodes, std::chrono::milliseconds timeout = std::chrono::seconds(20))
      : nodes_(nodes), timeout_(timeout) {}

  Result<Buffers> Exchange(uint32_t node, uint64_t round, Buffers out) {
    MutexLock lock(&mu_);
    ++rounds_[node];
    sent_[{round, node}] = std::move(out);
    cv_.SignalAll();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    Buffers in(nodes_);
    for (uint32_t k = 0; k < nodes_; ++k) {
      while (sent_.count({round, k}) == 0 && dead_.count(k) == 0) {
        if (!cv_.WaitUntil(&mu_, deadline)) {
          return Status::TimedOut("round " + std::to_string(round) + ": nothing from node " +
                                  std::to_string(k));
        }
      }
      if (sent_.count({round, k}) == 0) {
        return Status::Unavailable("round " + std::to_string(round) + ": node " +
                                   std::to_string(k) + " is dead");
      }
      in[k] = sent_[{round, k}][node];
    }
    return in;
  }

  void Kill(uint32_t node) {
    MutexLock lock(&mu_);
    dead_.insert(node);
    cv_.SignalAll();
  }

  uint64_t rounds(uint32_t node) {
    MutexLock lock(&mu_);
    return rounds_[node];
  }

 private:
  const uint32_t nodes_;
  const std::chrono::milliseconds timeout_;
  Mutex mu_;
  CondVar cv_;
  std::map<std::pair<uint64_t, uint32_t>, Buffers> sent_ GUARDED_BY(mu_);
  std::set<uint32_t> dead_ GUARDED_BY(mu_);
  std::map<uint32_t, uint64_t> rounds_ GUARDED_BY(mu_);
};

class CatalogShareTest : public testing::DatasetDirTest {
 protected:
  // Seven classes of uneven sizes, some with nested directories, and entries the scan skips.
  // Returns the number of sample files.
  uint64_t MakeImageFolder() {
    uint64_t files = 0;
    for (int c = 0; c < 7; ++c) {
      const std::string cls = "class" + std::to_string(c);
      for (int i = 0; i < 20 + 13 * c; ++i) {
        WriteFile(cls + (i % 5 == 2 ? "/sub/" : "/") + "f" + std::to_string(i) + ".bin",
                  std::string(static_cast<size_t>(1 + (i * 31 + c) % 700), 'x'));
        ++files;
      }
    }
    WriteFile("class3/.hidden", "skip");
    WriteFile("README", "not a class");
    // An hour old: a catalog scanned now may be reused by the next job.
    const auto old = fs::file_time_type::clock::now() - std::chrono::hours(1);
    for (const auto& e : fs::recursive_directory_iterator(data_))
      fs::last_write_time(e.path(), old);
    fs::last_write_time(data_, old);
    return files;
  }

  CatalogOptions Options(uint32_t node, uint32_t nodes, const std::string& dataset,
                         bool cached) const {
    CatalogOptions o;
    o.dataset = dataset;
    o.cache_dir = cached ? cache_ + "/node" + std::to_string(node) : "";
    if (cached) fs::create_directories(o.cache_dir);
    o.work_dir = tmp_ + "/run" + std::to_string(run_) + "-work" + std::to_string(node);
    o.scan_threads = 3;
    o.node = node;
    o.nodes = nodes;
    return o;
  }

  struct NodeResult {
    std::unique_ptr<Catalog> catalog;
    Status status;
    uint64_t stats = 0;
    uint64_t listings = 0;
  };

  // Opens the catalog on `nodes` nodes at once; `hook(node, round)` may kill a node before it
  // sends a round (returns false to make that node's exchange fail as a dead node's would).
  std::vector<NodeResult> OpenOnNodes(
      uint32_t nodes, const std::string& dataset, bool cached,
      const std::function<bool(uint32_t, uint64_t)>& hook = {},
      std::chrono::milliseconds round_timeout = std::chrono::seconds(20),
      const std::function<void(uint32_t, uint64_t, Buffers&)>& rewrite = {}) {
    ++run_;  // a fresh work directory per node: each run finds no catalog of an earlier one
    LocalRounds rounds(nodes, round_timeout);
    std::vector<NodeResult> results(nodes);
    std::vector<std::thread> threads;
    for (uint32_t n = 0; n < nodes; ++n) {
      threads.emplace_back([&, n] {
        FaultInjectionEnv env(Env::Default());
        CatalogOptions o = Options(n, nodes, dataset, cached);
        o.exchange = [&rounds, &hook, &rewrite, n](uint64_t round, Buffers out) -> Result<Buffers> {
          if (hook && !hook(n, round)) {
            rounds.Kill(n);
            return Status::Unavailable("this node died");
          }
          if (rewrite) rewrite(n, round, out);
          return rounds.Exchange(n, round, std::move(out));
        };
        Result<std::unique_ptr<Catalog>> c = Catalog::Open(o, &env);
        results[n].status = c.status();
        if (c.ok()) results[n].catalog = std::move(*c);
        results[n].stats = env.stats();
        results[n].listings = env.list_dirs();
      });
    }
    for (auto& t : threads)
      t.join();
    return results;
  }

  // The catalog one node scanning alone builds, and what that scan cost.
  NodeResult OpenAlone(const std::string& dataset) {
    FaultInjectionEnv env(Env::Default());
    CatalogOptions o = Options(0, 1, dataset, false);
    o.work_dir = tmp_ + "/alone";
    Result<std::unique_ptr<Catalog>> c = Catalog::Open(o, &env);
    NodeResult r;
    r.status = c.status();
    if (c.ok()) r.catalog = std::move(*c);
    r.stats = env.stats();
    r.listings = env.list_dirs();
    return r;
  }

  static void ExpectSame(const Catalog& a, const Catalog& b) {
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(a.fingerprint(), b.fingerprint());
    EXPECT_EQ(a.root(), b.root());
    EXPECT_EQ(a.class_names(), b.class_names());
    for (policy::SampleId id = 0; id < a.size(); ++id) {
      ASSERT_EQ(a.relative_path(id), b.relative_path(id));
      ASSERT_EQ(a.length(id), b.length(id));
      ASSERT_EQ(a.label(id), b.label(id));
    }
  }

  int run_ = 0;
};

TEST_F(CatalogShareTest, OneScanDividedAmongTheNodesGivesEveryNodeTheSameCatalog) {
  const uint64_t files = MakeImageFolder();
  NodeResult alone = OpenAlone(data_);
  ASSERT_TRUE(alone.status.ok()) << alone.status.message();
  ASSERT_EQ(alone.catalog->size(), files);
  for (uint32_t nodes : {2u, 3u, 4u}) {
    SCOPED_TRACE(nodes);
    std::vector<NodeResult> r = OpenOnNodes(nodes, data_, /*cached=*/false);
    uint64_t stats = 0;
    uint64_t listings = 0;
    for (uint32_t n = 0; n < nodes; ++n) {
      ASSERT_TRUE(r[n].status.ok()) << r[n].status.message();
      EXPECT_EQ(r[n].catalog->share_note(), "shared by " + std::to_string(nodes) + " nodes");
      EXPECT_FALSE(r[n].catalog->reused());
      ExpectSame(*r[n].catalog, *alone.catalog);
      // Each node walked a share, not the whole tree.
      EXPECT_LT(r[n].stats, alone.stats);
      stats += r[n].stats;
      listings += r[n].listings;
    }
    // The job stats each entry once: what one node alone does, plus each other node's stat of
    // the dataset root when it opens.
    EXPECT_EQ(stats, alone.stats + (nodes - 1));
    EXPECT_EQ(listings, alone.listings);
  }
}

TEST_F(CatalogShareTest, NodeZeroAloneConsultsTheCacheAndSharesItsHit) {
  MakeImageFolder();
  NodeResult alone = OpenAlone(data_);
  ASSERT_TRUE(alone.status.ok());
  std::vector<NodeResult> first = OpenOnNodes(3, data_, /*cached=*/true);
  for (const NodeResult& r : first) {
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_FALSE(r.catalog->reused());
  }
  std::vector<NodeResult> second = OpenOnNodes(3, data_, /*cached=*/true);
  for (uint32_t n = 0; n < 3; ++n) {
    ASSERT_TRUE(second[n].status.ok()) << second[n].status.message();
    EXPECT_TRUE(second[n].catalog->reused()) << n;
    ExpectSame(*second[n].catalog, *alone.catalog);
    EXPECT_EQ(second[n].listings, 0u) << n;
  }
  // Node 0 re-stats the recorded directories; the others only the dataset root.
  EXPECT_GT(second[0].stats, 1u);
  EXPECT_EQ(second[1].stats, 1u);
  EXPECT_EQ(second[2].stats, 1u);
  EXPECT_FALSE(second[0].catalog->db_path().empty());
  EXPECT_TRUE(second[1].catalog->db_path().empty());
}

TEST_F(CatalogShareTest, APeerDyingMidScanLeavesTheOthersScanningAlone) {
  MakeImageFolder();
  NodeResult alone = OpenAlone(data_);
  ASSERT_TRUE(alone.status.ok());
  // Node 1 dies after node 0's listing (round 1), before sending its part (round 2).
  std::vector<NodeResult> r =
      OpenOnNodes(3, data_, /*cached=*/false,
                  [](uint32_t node, uint64_t round) { return !(node == 1 && round == 2); });
  for (uint32_t n : {0u, 2u}) {
    ASSERT_TRUE(r[n].status.ok()) << r[n].status.message();
    EXPECT_EQ(r[n].catalog->share_note().rfind("alone: ", 0), 0u) << r[n].catalog->share_note();
    EXPECT_NE(r[n].catalog->share_note().find("node 1"), std::string::npos)
        << r[n].catalog->share_note();
    ExpectSame(*r[n].catalog, *alone.catalog);
  }
}

TEST_F(CatalogShareTest, APartNamingNoClassMakesItsReceiversScanAloneNotFail) {
  MakeImageFolder();
  NodeResult alone = OpenAlone(data_);
  ASSERT_TRUE(alone.status.ok());
  // Node 1's part (round 2) names a class the listing does not have: well-formed bytes from an
  // authenticated peer that is wrong (another nopfs, a bug) are that node's fault, not the
  // dataset's.
  scan::ClassesPart forged;
  forged.samples.push_back({"class9/f0.bin", 0, 1, 9});
  // What node 1 sends in that round for such a part (AllGather's framing of one chunk).
  std::vector<std::byte> bytes;
  uint64_t one_round = 2;
  ASSERT_TRUE(share::AllGather(
                  [&bytes](uint64_t, Buffers out) -> Result<Buffers> {
                    bytes = out[0];
                    return out;
                  },
                  2, &one_round, share::EncodePart(forged))
                  .ok());
  std::vector<NodeResult> r = OpenOnNodes(2, data_, /*cached=*/false, {}, std::chrono::seconds(20),
                                          [&bytes](uint32_t node, uint64_t round, Buffers& out) {
                                            if (node == 1 && round == 2) out[0] = bytes;
                                          });
  ASSERT_TRUE(r[0].status.ok()) << r[0].status.message();
  EXPECT_EQ(r[0].catalog->share_note().rfind("alone: ", 0), 0u) << r[0].catalog->share_note();
  EXPECT_NE(r[0].catalog->share_note().find("class9/f0.bin has label 9 of 7 classes"),
            std::string::npos)
      << r[0].catalog->share_note();
  ExpectSame(*r[0].catalog, *alone.catalog);
  ASSERT_TRUE(r[1].status.ok()) << r[1].status.message();
  EXPECT_EQ(r[1].catalog->share_note(), "shared by 2 nodes");
  ExpectSame(*r[1].catalog, *alone.catalog);
}

TEST_F(CatalogShareTest, ANodeStartingLateMakesNoOneWaitForARoundOthersSkipped) {
  MakeImageFolder();
  NodeResult alone = OpenAlone(data_);
  ASSERT_TRUE(alone.status.ok());
  // Node 1 joins the first round after node 0 gave up on it (rounds time out after 1 s); it
  // still finds node 0's lead, walks its share, and learns in the second round that node 0 has
  // no part: both scan alone, neither waits for a round the other skipped.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<NodeResult> r = OpenOnNodes(
      2, data_, /*cached=*/false,
      [](uint32_t node, uint64_t round) {
        if (node == 1 && round == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        return true;
      },
      std::chrono::milliseconds(1000));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (uint32_t n = 0; n < 2; ++n) {
    ASSERT_TRUE(r[n].status.ok()) << r[n].status.message();
    EXPECT_EQ(r[n].catalog->share_note().rfind("alone: ", 0), 0u) << r[n].catalog->share_note();
    ExpectSame(*r[n].catalog, *alone.catalog);
  }
  EXPECT_NE(r[0].catalog->share_note().find("nothing from node 1"), std::string::npos)
      << r[0].catalog->share_note();
  EXPECT_LT(secs, 1.5 + 1.0 + 5.0);  // no second timeout on top of the first
}

TEST_F(CatalogShareTest, ManifestIsScannedByNodeZeroAndShared) {
  MakeImageFolder();
  std::ofstream m(data_ + "/list.txt");
  m << "class0/f0.bin\t0\nclass1/f1.bin\t1\t0\t5\nclass2/sub/f2.bin\n";
  m.close();
  NodeResult alone = OpenAlone(data_ + "/list.txt");
  ASSERT_TRUE(alone.status.ok()) << alone.status.message();
  std::vector<NodeResult> r = OpenOnNodes(2, data_ + "/list.txt", /*cached=*/false);
  for (uint32_t n = 0; n < 2; ++n) {
    ASSERT_TRUE(r[n].status.ok()) << r[n].status.message();
    EXPECT_EQ(r[n].catalog->share_note(), "shared by 2 nodes");
    ExpectSame(*r[n].catalog, *alone.catalog);
  }
  EXPECT_EQ(r[1].stats, 1u);  // the manifest itself, to know what the dataset is
}

TEST_F(CatalogShareTest, DatasetErrorsAreReportedByEveryNode) {
  fs::create_directories(data_ + "/emptyclass");
  std::vector<NodeResult> r = OpenOnNodes(2, data_, /*cached=*/false);
  for (const NodeResult& n : r) {
    EXPECT_EQ(n.status.code(), StatusCode::kInvalidArgument) << n.status.message();
    EXPECT_NE(n.status.message().find("has no files"), std::string::npos) << n.status.message();
  }
}

// An Env whose StatNames takes 20 ms (a PFS's latency, so that the threads' calls overlap) and
// records how many distinct directories were being stat'ed at once, at most.
class DirectoryConcurrencyEnv final : public Env {
 public:
  Result<FileStat> Stat(const std::string& path) override { return Env::Default()->Stat(path); }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    return Env::Default()->ListDir(dir);
  }
  std::vector<Result<FileStat>> StatNames(const std::string& dir,
                                          const std::vector<std::string>& names) override {
    {
      MutexLock lock(&mu_);
      ++active_[dir];
      max_dirs_ = std::max(max_dirs_, active_.size());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::vector<Result<FileStat>> out = Env::Default()->StatNames(dir, names);
    MutexLock lock(&mu_);
    if (--active_[dir] == 0) active_.erase(dir);
    return out;
  }
  Status ReadAt(const std::string& path, uint64_t offset, std::span<std::byte> dst) override {
    return Env::Default()->ReadAt(path, offset, dst);
  }
  Result<std::string> ReadFile(const std::string& path) override {
    return Env::Default()->ReadFile(path);
  }
  size_t max_dirs() {
    MutexLock lock(&mu_);
    return max_dirs_;
  }

 private:
  Mutex mu_;
  std::map<std::string, int> active_ GUARDED_BY(mu_);
  size_t max_dirs_ GUARDED_BY(mu_) = 0;
};

// A file system may serialize lookups within one directory (FUSE without parallel directory
// operations, the emulated PFS among them): the walk's threads take the directories' chunks in
// turn, so that they stat in as many directories at once as there are threads, not all in the
// first directory (which made one node scan 100 classes of 1,000 files at a fifth of its speed).
TEST_F(CatalogShareTest, TheWalksThreadsStatInDifferentDirectoriesAtOnce) {
  for (int c = 0; c < 4; ++c) {
    for (int f = 0; f < 512; ++f) {  // four chunks of 128 names per class
      char rel[32];
      std::snprintf(rel, sizeof rel, "c%d/f%d", c, f);
      WriteFile(rel, "x");
    }
  }
  DirectoryConcurrencyEnv env;
  Result<scan::ScanResult> r = scan::ScanImageFolder(data_, &env, 4);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples.size(), 4u * 512);
  EXPECT_GE(env.max_dirs(), 3u);
}

// The POSIX Env's OpenDir, recording how many directories are open at once and every name the
// walk stat'ed.
class OpenDirCountingEnv final : public Env {
 public:
  Result<FileStat> Stat(const std::string& path) override {
    {
      MutexLock lock(&mu_);
      stat_paths_.insert(path);
    }
    return Env::Default()->Stat(path);
  }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    return Env::Default()->ListDir(dir);
  }
  Result<std::unique_ptr<OpenedDir>> OpenDir(const std::string& dir) override {
    Result<std::unique_ptr<OpenedDir>> d = Env::Default()->OpenDir(dir);
    if (!d.ok()) return d.status();
    MutexLock lock(&mu_);
    max_open_ = std::max(max_open_, ++open_);
    return std::unique_ptr<OpenedDir>(std::make_unique<Counted>(this, dir, std::move(*d)));
  }
  Status ReadAt(const std::string& path, uint64_t offset, std::span<std::byte> dst) override {
    return Env::Default()->ReadAt(path, offset, dst);
  }
  Result<std::string> ReadFile(const std::string& path) override {
    return Env::Default()->ReadFile(path);
  }
  int max_open() {
    MutexLock lock(&mu_);
    return max_open_;
  }
  std::set<std::string> stat_paths() {
    MutexLock lock(&mu_);
    return stat_paths_;
  }

 private:
  class Counted final : public OpenedDir {
   public:
    Counted(OpenDirCountingEnv* env, std::string path, std::unique_ptr<OpenedDir> base)
        : OpenedDir(base->stat(), base->entries()),
          env_(env),
          path_(std::move(path)),
          base_(std::move(base)) {}
    ~Counted() override {
      MutexLock lock(&env_->mu_);
      --env_->open_;
    }
    std::vector<Result<FileStat>> StatNames(const std::vector<std::string>& names) override {
      {
        MutexLock lock(&env_->mu_);
        for (const std::string& n : names)
          env_->stat_paths_.insert(path_ + "/" + n);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a PFS's latency
      return base_->StatNames(names);
    }

   private:
    OpenDirCountingEnv* const env_;
    const std::string path_;
    const std::unique_ptr<OpenedDir> base_;
  };

  Mutex mu_;
  int open_ GUARDED_BY(mu_) = 0;
  int max_open_ GUARDED_BY(mu_) = 0;
  std::set<std::string> stat_paths_ GUARDED_BY(mu_);
};

// Each directory is opened once and its names stat'ed relative to it; a name the listing reports
// as a directory is not stat'ed (the open gives its stamp), at the root (a class) or below; at
// most 4 directories per scan thread are open at once, however many the tree holds.
TEST_F(CatalogShareTest, TheWalkStatsOnlyFilesAndKeepsFewDirectoriesOpen) {
  for (int c = 0; c < 60; ++c) {
    char rel[48];
    std::snprintf(rel, sizeof rel, "c%02d/f", c);
    WriteFile(rel, "x");
    std::snprintf(rel, sizeof rel, "c%02d/sub/g", c);
    WriteFile(rel, "yy");
  }
  ASSERT_EQ(::symlink("c00", (data_ + "/zlink").c_str()), 0);  // a class through a link
  OpenDirCountingEnv env;
  Result<scan::ScanResult> r = scan::ScanImageFolder(data_, &env, 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->class_names.size(), 61u);
  EXPECT_EQ(r->samples.size(), 61u * 2);
  EXPECT_EQ(r->stamps.size(), 1u + 61 * 2);  // the root, each class and its sub
  std::set<std::string> want;
  for (int c = 0; c < 60; ++c) {
    char rel[48];
    std::snprintf(rel, sizeof rel, "/c%02d/f", c);
    want.insert(data_ + rel);
    std::snprintf(rel, sizeof rel, "/c%02d/sub/g", c);
    want.insert(data_ + rel);
  }
  want.insert(data_ + "/zlink");  // its target decides: stat'ed
  want.insert(data_ + "/zlink/f");
  want.insert(data_ + "/zlink/sub/g");
  EXPECT_EQ(env.stat_paths(), want);
  EXPECT_GE(env.max_open(), 2);
  EXPECT_LE(env.max_open(), 1 + 4 * 2);  // the walk's, and the root's while it is listed
}

TEST(CatalogShareCodecTest, LargeMessagesTakeSeveralRoundsAndMalformedOnesAreRejected) {
  // Three nodes whose messages need 1, 3 and 0+1 chunks: every node runs 3 rounds.
  const uint32_t nodes = 3;
  const size_t kChunk = 1000;
  LocalRounds rounds(nodes);
  std::vector<std::vector<std::byte>> mine = {std::vector<std::byte>(10, std::byte{1}),
                                              std::vector<std::byte>(2 * kChunk + 5, std::byte{2}),
                                              {}};
  std::vector<Result<Buffers>> got(nodes, Status::Internal("not run"));
  std::vector<std::thread> threads;
  for (uint32_t n = 0; n < nodes; ++n) {
    threads.emplace_back([&, n] {
      uint64_t round = 1;
      got[n] = share::AllGather(
          [&rounds, n](uint64_t r, Buffers out) { return rounds.Exchange(n, r, std::move(out)); },
          nodes, &round, mine[n], kChunk);
      EXPECT_EQ(round, 4u);
    });
  }
  for (auto& t : threads)
    t.join();
  for (uint32_t n = 0; n < nodes; ++n) {
    ASSERT_TRUE(got[n].ok()) << got[n].status().message();
    EXPECT_EQ(*got[n], mine);
    EXPECT_EQ(rounds.rounds(n), 3u);
  }

  scan::ClassesPart part;
  part.samples.push_back({"a/b", 1, 2, 3});
  part.stamps.push_back({"/x/a", {5, 6, 7, 8}});
  std::vector<std::byte> bytes = share::EncodePart(part);
  Result<scan::ClassesPart> back = share::DecodePart(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->samples[0].relative_path, "a/b");
  EXPECT_EQ(back->samples[0].label, 3);
  EXPECT_EQ(back->stamps[0].stamp, (codec::Stamp{5, 6, 7, 8}));
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_FALSE(share::DecodePart(std::span(bytes).first(cut)).ok()) << cut;
  }
  bytes.push_back(std::byte{0});
  EXPECT_FALSE(share::DecodePart(bytes).ok());
  std::vector<std::byte> lead = share::EncodeLead({});
  lead[0] = std::byte{9};
  Result<share::Lead> bad = share::DecodeLead(lead);
  EXPECT_NE(bad.status().message().find("run the same nopfs on every node"), std::string::npos);
}

TEST(RoundDeadlinesTest, ARoundWaitsAsLongAsTheNodesOwnWorkTookAndNeverLessThanBefore) {
  using std::chrono::seconds;
  const RoundDeadlines::Clock::time_point t0{};
  RoundDeadlines d(t0 + seconds(60), seconds(25), t0);
  // Early in the start-up phase: until its deadline.
  EXPECT_EQ(d.Enter(t0 + seconds(1)), t0 + seconds(60));
  d.Leave(t0 + seconds(2));
  // After a 100 s share of the walk: 100 s more, for a node as slow as this one was.
  EXPECT_EQ(d.Enter(t0 + seconds(102)), t0 + seconds(202));
  d.Leave(t0 + seconds(110));
  // A round right after another: the patience.
  EXPECT_EQ(d.Enter(t0 + seconds(111)), t0 + seconds(136));
}

TEST(CatalogAssembleTest, PartsInAnyOrderGiveTheSamplesSortedByLabelPathOffsetAndLength) {
  scan::RootListing listing;
  listing.class_names = {"a", "b", "c"};
  listing.root_stamp = {1, 2, 3, 4};
  // Every (label, path, offset, length) ordering case: paths that are prefixes of others, '/'
  // against '.', equal paths with other offsets and lengths, a class no part has samples of.
  std::vector<scan::Sample> want = {
      {"a/x", 0, 9, 0},   {"a/x", 4, 1, 0},     {"a/x", 4, 2, 0}, {"a/x.b", 0, 1, 0},
      {"a/x/y", 0, 1, 0}, {"a/xy", 0, 1, 0},    {"c/0", 0, 1, 2}, {"c/00", 0, 1, 2},
      {"c/1", 0, 1, 2},   {"c/sub/z", 0, 1, 2},
  };
  std::vector<scan::Sample> shuffled = want;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    SCOPED_TRACE(trial);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    std::vector<scan::ClassesPart> parts(3);
    for (size_t i = 0; i < shuffled.size(); ++i)
      parts[(i * 7 + static_cast<size_t>(trial)) % 3].samples.push_back(shuffled[i]);
    parts[1].stamps.push_back({"/r/c", {5, 6, 7, 8}});
    parts[0].stamps.push_back({"/r/a", {9, 10, 11, 12}});
    Result<scan::ScanResult> r =
        scan::AssembleImageFolder("/r", listing, std::move(parts), 1 + trial % 4);
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ(r->samples.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(r->samples[i].relative_path, want[i].relative_path) << i;
      EXPECT_EQ(r->samples[i].offset, want[i].offset) << i;
      EXPECT_EQ(r->samples[i].length, want[i].length) << i;
      EXPECT_EQ(r->samples[i].label, want[i].label) << i;
    }
    ASSERT_EQ(r->stamps.size(), 3u);
    EXPECT_EQ(r->stamps[0].path, "/r");
    EXPECT_EQ(r->stamps[1].path, "/r/a");
    EXPECT_EQ(r->stamps[2].path, "/r/c");
    EXPECT_EQ(r->class_names, listing.class_names);
  }

  // A part (a peer's, decoded) whose sample names no class of the listing is refused.
  for (int64_t label : {int64_t{-1}, int64_t{3}}) {
    std::vector<scan::ClassesPart> parts(1);
    parts[0].samples = {{"a/x", 0, 1, 0}, {"q/y", 0, 1, label}};
    Result<scan::ScanResult> r = scan::AssembleImageFolder("/r", listing, std::move(parts), 2);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("q/y has label " + std::to_string(label)),
              std::string::npos)
        << r.status().message();
  }
}

}  // namespace
}  // namespace nopfs::service
