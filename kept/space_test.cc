#include "kept/space.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>

namespace nopfs::kept {
namespace {

namespace fs = std::filesystem;

const uint32_t kMe = ::getuid();

std::string Fresh(const std::string& name) {
  const std::string dir =
      fs::path(testing::TempDir()).lexically_normal().string() + "/kept_space_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return fs::canonical(dir).string();
}

std::string UserKept(const std::string& ssd, uint32_t uid = kMe) {
  const std::string kept = ssd + "/nopfs-" + std::to_string(uid) + "/kept";
  fs::create_directories(kept);
  return kept;
}

// A complete kept dataset of `bytes` data bytes last used at `last_used`.
void MakeKept(const std::string& kept, const std::string& key, size_t bytes, int64_t last_used) {
  const std::string dir = kept + "/" + key;
  fs::create_directories(dir);
  std::ofstream(dir + "/data.0", std::ios::binary) << std::string(bytes, 'x');
  KeptManifest m;
  m.key = key;
  m.dataset = "/pfs/" + key;
  m.created = last_used - 10;
  m.last_used = last_used;
  m.samples = 1;
  ASSERT_TRUE(WriteFileDurably(dir, "MANIFEST", EncodeKeptManifest(m)).ok());
}

std::set<std::string> Keys(const KeptNode& n) {
  std::set<std::string> out;
  for (const KeptEntry& e : n.entries())
    out.insert(e.data.key);
  return out;
}

std::set<std::string> OnDisk(const std::string& kept) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(kept))
    out.insert(e.path().filename().string());
  return out;
}

const std::string kA = "000000000000000a", kB = "000000000000000b", kC = "000000000000000c";
constexpr size_t kMiB = 1 << 20;

TEST(KeptSpace, ScanListsEveryUserAreaAndSkipsWhatIsNotTheirs) {
  const std::string ssd = Fresh("scan");
  const std::string kept = UserKept(ssd);
  MakeKept(kept, kA, kMiB, 1000);
  fs::create_directories(kept + "/.tmp.123");
  // A directory named for another uid but owned by this one, and a link named for a user: never
  // listed (and never followed).
  MakeKept(UserKept(ssd, kMe + 777), kB, kMiB, 1000);
  const std::string elsewhere = Fresh("scan_elsewhere");
  MakeKept(elsewhere + "/kept", kC, kMiB, 1000);
  fs::create_directory_symlink(elsewhere, ssd + "/nopfs-" + std::to_string(kMe + 778));
  fs::create_directories(ssd + "/not-a-user");

  KeptNode n = KeptNode::Scan({ssd, ssd + "/missing"});
  EXPECT_TRUE(n.errors().empty()) << n.errors().front();
  EXPECT_EQ(Keys(n), (std::set<std::string>{kA, ".tmp.123"}));
  EXPECT_EQ(n.Users(), std::vector<uint32_t>{kMe});
  EXPECT_GE(n.BytesOf(kMe), kMiB);
  EXPECT_EQ(n.Bytes(), n.BytesOf(kMe));
  for (const KeptEntry& e : n.entries()) {
    EXPECT_EQ(e.data.dir, kept + "/" + e.data.key) << "shown paths are the real ones";
    EXPECT_EQ(e.Complete(), e.data.key == kA);
    EXPECT_EQ(e.Pending(), e.data.key == ".tmp.123");
  }
  EXPECT_EQ(Keys(KeptNode::Scan({ssd}, kMe)), Keys(n));
  EXPECT_TRUE(KeptNode::Scan({ssd}, kMe + 1).entries().empty());
}

TEST(KeptSpace, SweepRemovesIncompleteExpiredAndOverQuotaLeastRecentlyUsedFirst) {
  const std::string ssd = Fresh("sweep");
  const std::string kept = UserKept(ssd);
  MakeKept(kept, kA, 2 * kMiB, 1000);  // oldest
  MakeKept(kept, kB, 2 * kMiB, 3000);
  MakeKept(kept, kC, 2 * kMiB, 2000);
  fs::create_directories(kept + "/00000000000000dd");  // a key without MANIFEST
  fs::create_directories(kept + "/.tmp.99");           // a keep under way, or a crashed one
  std::ofstream(kept + "/stray") << "x";
  Result<int> lock = LockKeptEntry(kept + "/.tmp.99");
  ASSERT_TRUE(lock.ok()) << lock.status().message();

  // A .tmp.* entry whose lock a live nopfsd holds stays; nothing is over a large quota or past
  // a long lifetime.
  KeptNode n = KeptNode::Scan({ssd});
  std::vector<Removal> r = n.Sweep([](uint32_t) { return KeepLimits{100 * kMiB, 100000}; }, 4000);
  for (const Removal& x : r) {
    EXPECT_TRUE(x.status.ok()) << x.status.message();
    EXPECT_EQ(x.why, "incomplete") << x.entry.data.key;
  }
  EXPECT_EQ(OnDisk(kept), (std::set<std::string>{kA, kB, kC, ".tmp.99"}));

  // Its nopfsd gone (the lock released), the .tmp.* goes. A lifetime of 2500 s at t=4000
  // expires kA (last used 1000).
  ::close(*lock);
  n = KeptNode::Scan({ssd});
  r = n.Sweep([](uint32_t) { return KeepLimits{100 * kMiB, 2500}; }, 4000);
  EXPECT_EQ(OnDisk(kept), (std::set<std::string>{kB, kC}));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(Keys(n), (std::set<std::string>{kB, kC}));

  // A quota that holds one dataset: the least recently used (kC, 2000) goes, kB stays.
  n = KeptNode::Scan({ssd});
  r = n.Sweep([](uint32_t) { return KeepLimits{3 * kMiB, 0}; }, 4000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].why, "over quota");
  EXPECT_EQ(r[0].entry.data.key, kC);
  EXPECT_EQ(OnDisk(kept), (std::set<std::string>{kB}));

  // A quota of 0 (the policy keeps nothing for this user): everything goes.
  n = KeptNode::Scan({ssd});
  r = n.Sweep([](uint32_t) { return KeepLimits{}; }, 4000);
  EXPECT_TRUE(OnDisk(kept).empty());
  EXPECT_EQ(n.Bytes(), 0u);
}

TEST(KeptSpace, MakeRoomEvictsLeastRecentlyUsedAcrossAreasAndSparesWhatItIsTold) {
  const std::string ssd1 = Fresh("room1"), ssd2 = Fresh("room2");
  const std::string k1 = UserKept(ssd1), k2 = UserKept(ssd2);
  MakeKept(k1, kA, 2 * kMiB, 1000);
  MakeKept(k2, kB, 2 * kMiB, 500);  // the oldest, but spared
  MakeKept(k2, kC, 2 * kMiB, 3000);
  KeptNode n = KeptNode::Scan({ssd1, ssd2});
  const uint64_t one = n.Bytes() / 3;
  std::vector<Removal> r =
      n.MakeRoom(n.Bytes() - 1, [](const KeptEntry& e) { return e.data.key == kB; });
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].entry.data.key, kA);
  EXPECT_EQ(r[0].why, "space");
  EXPECT_EQ(OnDisk(k1), std::set<std::string>{});
  EXPECT_EQ(OnDisk(k2), (std::set<std::string>{kB, kC}));
  EXPECT_TRUE(n.MakeRoom(2 * one).empty());
  r = n.MakeRoom(one);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].entry.data.key, kB);
  EXPECT_EQ(OnDisk(k2), std::set<std::string>{kC});
  n.MakeRoom(0);
  EXPECT_TRUE(OnDisk(k2).empty());
}

// A kept dataset that a job which keeps nothing reads where it is (its lock held) is in use:
// counted, never evicted nor expired; once the lock is let go it is a kept dataset again.
TEST(KeptSpace, AKeptDatasetWhoseLockIsHeldIsInUse) {
  const std::string ssd = Fresh("borrowed");
  const std::string kept = UserKept(ssd);
  MakeKept(kept, kA, 2 * kMiB, 1000);
  MakeKept(kept, kB, 2 * kMiB, 2000);
  Result<int> lock = LockKeptEntry(kept + "/" + kA);
  ASSERT_TRUE(lock.ok()) << lock.status().message();
  {
    KeptNode n = KeptNode::Scan({ssd});
    ASSERT_EQ(n.entries().size(), 2u);
    for (const KeptEntry& e : n.entries())
      EXPECT_EQ(e.in_use, e.data.key == kA) << e.data.key;
    EXPECT_GE(n.HeldBytes(), 2 * kMiB);
    EXPECT_LT(n.HeldBytes(), 3 * kMiB);
    // The least recently used, but held: the other goes, and then nothing more.
    std::vector<Removal> r = n.MakeRoom(0);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].entry.data.key, kB);
    EXPECT_TRUE(n.Sweep([](uint32_t) { return KeepLimits{0, 1}; }, 1'000'000).empty());
    EXPECT_EQ(OnDisk(kept), std::set<std::string>{kA});
  }
  ::close(*lock);
  KeptNode n = KeptNode::Scan({ssd});
  ASSERT_EQ(n.entries().size(), 1u);
  EXPECT_FALSE(n.entries()[0].in_use);
  EXPECT_EQ(n.MakeRoom(0).size(), 1u);
  EXPECT_TRUE(OnDisk(kept).empty());
}

TEST(KeptSpace, AUserDirectorySwappedForALinkAfterTheScanMovesNothingElsewhere) {
  const std::string ssd = Fresh("swap");
  const std::string kept = UserKept(ssd);
  MakeKept(kept, kA, kMiB, 1000);
  KeptNode n = KeptNode::Scan({ssd});
  ASSERT_EQ(n.entries().size(), 1u);
  // The user renames the directory away and puts a link to a victim's in its place.
  const std::string victim = Fresh("swap_victim");
  MakeKept(victim + "/kept", kA, kMiB, 1000);
  const std::string user_dir = ssd + "/nopfs-" + std::to_string(kMe);
  fs::rename(user_dir, ssd + "/moved");
  fs::create_directory_symlink(victim, user_dir);
  const Removal r = n.Remove(n.entries()[0], "asked");
  EXPECT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_TRUE(fs::exists(victim + "/kept/" + kA)) << "the removal followed the link";
  EXPECT_FALSE(fs::exists(ssd + "/moved/kept/" + kA)) << "the held directory's entry stays";
}

TEST(KeptSpace, WhatAUserWroteReachesRootsLinesPrintableOnOneLine) {
  // A user's MANIFEST whose dataset forges a line of root's log, and an entry whose name holds a
  // newline: the prolog's, epilog's and gc's description of their removal stays one line.
  const std::string ssd = Fresh("printable");
  const std::string kept = UserKept(ssd);
  MakeKept(kept, kA, 1024, 1000);
  KeptManifest m;
  m.key = kA;
  m.dataset = "/x\n[2026-11-28T22:00:00.000] nopfs: epilog: n1: INJECTED alice job 99, \x1b[2K";
  m.created = 990;
  m.last_used = 1000;
  m.samples = 1;
  ASSERT_TRUE(WriteFileDurably(kept + "/" + kA, "MANIFEST", EncodeKeptManifest(m)).ok());
  fs::create_directories(kept + "/bad\nname");
  KeptNode n = KeptNode::Scan({ssd});
  const std::vector<Removal> r = n.Sweep(
      [](uint32_t) {
        return KeepLimits{0, 100000};
      },
      2000);  // quota 0: all of it goes
  ASSERT_EQ(r.size(), 2u);
  const std::string line = DescribeRemovals(r);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(line.find('\x1b'), std::string::npos) << line;
  EXPECT_NE(line.find("/x\\x0a[2026-11-28T22:00:00.000] nopfs: epilog"), std::string::npos) << line;
  EXPECT_NE(line.find("bad\\x0aname"), std::string::npos) << line;
}

// Ends a KeptNode's hold of root's record, as the end of a prolog or an epilog does.
void Release(KeptNode& n) {
  KeptNode gone = std::move(n);
}

ScanOptions RootView(int64_t now, std::vector<std::pair<uint32_t, std::string>> live = {}) {
  ScanOptions o;
  o.root = true;
  o.now = now;
  o.live = [live](uint32_t uid, const std::string& name) {
    for (const auto& [u, n] : live) {
      if (u == uid && n == name) return true;
    }
    return false;
  };
  return o;
}

void Forge(const std::string& kept, const std::string& key, int64_t last_used) {
  KeptManifest m;
  m.key = key;
  m.dataset = "/pfs/" + key;
  m.created = m.last_used = last_used;
  m.samples = 1;
  ASSERT_TRUE(WriteFileDurably(kept + "/" + key, "MANIFEST", EncodeKeptManifest(m)).ok());
}

TEST(KeptSpace, RootsRecordNotTheManifestGivesTheLifetimeAndTheEvictionOrder) {
  const std::string ssd = Fresh("record");
  const std::string kept = UserKept(ssd);
  MakeKept(kept, kA, kMiB, 1000);
  MakeKept(kept, kB, kMiB, 1000);
  // Root first sees both at t=10000: recorded as first seen and last used then, whatever the
  // MANIFESTs say.
  {
    KeptNode n = KeptNode::Scan({ssd}, RootView(10000));
    ASSERT_EQ(n.entries().size(), 2u);
    for (const KeptEntry& e : n.entries()) {
      EXPECT_EQ(e.times.first_seen, 10000);
      EXPECT_EQ(e.times.last_used, 10000);
    }
    // A job used kA at t=10000 (the epilog).
    n.MarkUsed(kMe, [](const KeptEntry& e) { return e.data.key == kA; });
  }
  {
    KeptNode n = KeptNode::Scan({ssd}, RootView(10050));
    n.MarkUsed(kMe, [](const KeptEntry& e) { return e.data.key == kA; });  // and again at 10050
  }
  // The user forges kB's MANIFEST: last used ten years ahead. Nothing changes.
  Forge(kept, kB, 10000 + 10 * 365 * 86400);
  KeptNode n = KeptNode::Scan({ssd}, RootView(10060));
  for (const KeptEntry& e : n.entries()) {
    EXPECT_EQ(e.times.last_used, e.data.key == kA ? 10050 : 10000) << e.data.key;
    if (e.data.key == kB) {
      EXPECT_GT(e.data.last_used, 10060) << "the MANIFEST's, shown as is";
    }
  }
  // The eviction order: kB (root: last used 10000) before kA (10050).
  std::vector<Removal> r = n.MakeRoom(n.Bytes() - 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].entry.data.key, kB);
  // The lifetime: 60 s after root's last use, whatever the MANIFEST says.
  MakeKept(kept, kB, kMiB, 10000 + 10 * 365 * 86400);
  Release(n);
  n = KeptNode::Scan({ssd}, RootView(10070));  // kB is new to root again: used "now"
  r = n.Sweep([](uint32_t) { return KeepLimits{100 * kMiB, 60}; }, 10115);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].entry.data.key, kA);
  EXPECT_EQ(r[0].why, "expired");
  EXPECT_EQ(OnDisk(kept), std::set<std::string>{kB});
  Release(n);
  r = KeptNode::Scan({ssd}, RootView(10200))
          .Sweep(
              [](uint32_t) {
                return KeepLimits{100 * kMiB, 60};
              },
              10200);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].entry.data.key, kB) << "forged ten years ahead, expired all the same";
  EXPECT_TRUE(OnDisk(kept).empty());
  // The record forgets what is gone.
  std::string note;
  Result<RootRecord> rec = RootRecord::Open(ssd, std::chrono::seconds(5), &note);
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  EXPECT_TRUE(rec->times().empty());
  struct stat st {};
  ASSERT_EQ(::stat((ssd + "/.nopfs-root").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
}

TEST(KeptSpace, ARecordDirectoryThatIsNotRootsOwnIsRemovedNotTrusted) {
  const std::string ssd = Fresh("squat");
  // A user made .nopfs-root first (mode 0755 here: someone else could write records into it),
  // with a forged record and a link to a victim's file.
  fs::create_directories(ssd + "/.nopfs-root");
  fs::permissions(ssd + "/.nopfs-root", fs::perms(0755));
  std::ofstream(ssd + "/.nopfs-root/kept") << kMe << " " << kA << " 99999999999 99999999999\n";
  const std::string victim = Fresh("squat_victim");
  std::ofstream(victim + "/file") << "precious";
  fs::create_symlink(victim + "/file", ssd + "/.nopfs-root/link");
  std::string note;
  Result<RootRecord> rec = RootRecord::Open(ssd, std::chrono::seconds(5), &note);
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  EXPECT_NE(note.find("not root's directory) removed"), std::string::npos) << note;
  EXPECT_TRUE(rec->times().empty()) << "a forged record was read";
  EXPECT_TRUE(fs::exists(victim + "/file"));
}

TEST(KeptSpace, EverythingInTheUsersDirectoryCountsAndStraysGo) {
  const std::string ssd = Fresh("strays");
  const std::string kept = UserKept(ssd);
  const std::string user = ssd + "/nopfs-" + std::to_string(kMe);
  MakeKept(kept, kA, kMiB, 1000);
  // 3 MiB ten levels down inside a complete dataset.
  std::string deep = kept + "/" + kA;
  for (int i = 1; i <= 10; ++i)
    deep += "/" + std::to_string(i);
  fs::create_directories(deep);
  std::ofstream(deep + "/big", std::ios::binary) << std::string(3 * kMiB, 'x');
  // A loose file, a renamed job directory, a live job's directory, a directory someone holds.
  std::ofstream(user + "/junk", std::ios::binary) << std::string(2 * kMiB, 'x');
  fs::create_directories(user + "/77.0.renamed/a/b");
  std::ofstream(user + "/77.0.renamed/a/b/data.0", std::ios::binary) << std::string(2 * kMiB, 'x');
  fs::create_directories(user + "/88.0");
  std::ofstream(user + "/88.0/data.0", std::ios::binary) << std::string(5 * kMiB, 'x');
  fs::create_directories(user + "/held");
  std::ofstream(user + "/held/data", std::ios::binary) << std::string(kMiB, 'x');
  Result<int> lock = LockKeptEntry(user + "/held");
  ASSERT_TRUE(lock.ok()) << lock.status().message();

  KeptNode n = KeptNode::Scan({ssd}, RootView(5000, {{kMe, "88.0"}}));
  EXPECT_TRUE(n.errors().empty()) << n.errors().front();
  // kA with its nested 3 MiB, junk, the renamed directory, held; never the live job's 88.0.
  EXPECT_GE(n.BytesOf(kMe), 9 * kMiB);
  EXPECT_LT(n.BytesOf(kMe), 10 * kMiB) << "the live job's directory is its reservation's";
  EXPECT_GE(n.HeldBytes(), kMiB);
  EXPECT_LT(n.HeldBytes(), 2 * kMiB);
  for (const KeptEntry& e : n.entries()) {
    if (e.data.key == kA) {
      EXPECT_GE(e.data.bytes, 4 * kMiB) << "nested bytes count";
    }
  }
  // The user's view lists kept/ only, as before.
  EXPECT_EQ(Keys(KeptNode::Scan({ssd}, kMe)), std::set<std::string>{kA});

  std::vector<Removal> r = n.Sweep([](uint32_t) { return KeepLimits{100 * kMiB, 0}; }, 5000);
  std::set<std::string> gone;
  for (const Removal& x : r) {
    EXPECT_TRUE(x.status.ok()) << x.status.message();
    EXPECT_EQ(x.why, "stray");
    gone.insert(x.entry.data.key);
  }
  EXPECT_EQ(gone, (std::set<std::string>{"junk", "77.0.renamed"}));
  EXPECT_NE(DescribeRemovals(r).find("uid " + std::to_string(kMe) + " nopfs-" +
                                     std::to_string(kMe) + "/junk ("),
            std::string::npos)
      << DescribeRemovals(r);
  EXPECT_EQ(OnDisk(user), (std::set<std::string>{"kept", "88.0", "held"}));
  // Over a 3 MiB quota, the dataset with its nested bytes goes; held stays, counted.
  r = n.Sweep([](uint32_t) { return KeepLimits{3 * kMiB, 0}; }, 5000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].entry.data.key, kA);
  EXPECT_EQ(r[0].why, "over quota");
  EXPECT_TRUE(OnDisk(kept).empty());
  // Its holder gone, `held` is a stray like any other; `kept` a file is one too.
  ::close(*lock);
  fs::remove(kept);
  std::ofstream(kept) << "not a directory";
  Release(n);
  n = KeptNode::Scan({ssd}, RootView(5000, {{kMe, "88.0"}}));
  r = n.Sweep([](uint32_t) { return KeepLimits{100 * kMiB, 0}; }, 5000);
  EXPECT_EQ(r.size(), 2u);
  EXPECT_EQ(OnDisk(user), std::set<std::string>{"88.0"});
}

TEST(KeptSpace, TheSiblingRegistryOfLiveJobsStaysAndTheRestIsStray) {
  const std::string ssd = Fresh("live");
  const std::string user = ssd + "/nopfs-" + std::to_string(kMe);
  fs::create_directories(user + "/live");
  std::ofstream(user + "/live/" + kA + ".88.0") << "pid=1\n";       // a live job's entry
  std::ofstream(user + "/live/.tmp." + kB + ".88.0") << "pid=1\n";  // one being written
  std::ofstream(user + "/live/" + kA + ".55.0") << "pid=2\n";       // a job that is over
  std::ofstream(user + "/live/junk", std::ios::binary) << std::string(kMiB, 'x');
  fs::create_directory_symlink(ssd, user + "/live/link");
  const int64_t later = ::time(nullptr) + 120;  // past the grace of a fresh entry
  KeptNode n = KeptNode::Scan({ssd}, RootView(later, {{kMe, "88.0"}}));
  std::set<std::string> strays;
  for (const KeptEntry& e : n.entries()) {
    EXPECT_TRUE(e.stray);
    EXPECT_EQ(e.under, "live");
    strays.insert(e.data.key);
  }
  EXPECT_EQ(strays, (std::set<std::string>{kA + ".55.0", "junk", "link"}));
  EXPECT_GE(n.BytesOf(kMe), kMiB);
  const std::vector<Removal> r = n.Sweep([](uint32_t) { return KeepLimits{100 * kMiB, 0}; }, later);
  EXPECT_EQ(r.size(), 3u);
  EXPECT_NE(DescribeRemovals(r).find("nopfs-" + std::to_string(kMe) + "/live/junk ("),
            std::string::npos)
      << DescribeRemovals(r);
  EXPECT_EQ(OnDisk(user + "/live"), (std::set<std::string>{kA + ".88.0", ".tmp." + kB + ".88.0"}));
  EXPECT_TRUE(fs::exists(ssd + "/nopfs-" + std::to_string(kMe))) << "the link was followed";
  Release(n);
  // Without the ledger (`nopfs gc`), live/ is counted and left alone.
  ScanOptions gc;
  gc.root = true;
  gc.now = later;
  n = KeptNode::Scan({ssd}, gc);
  ASSERT_EQ(n.entries().size(), 1u);
  EXPECT_TRUE(n.entries()[0].in_use);
  EXPECT_TRUE(n.Sweep([](uint32_t) { return KeepLimits{}; }, later).empty());
  EXPECT_EQ(OnDisk(user + "/live").size(), 2u);
}

TEST(KeptSpace, Ages) {
  EXPECT_EQ(FormatAge(-3), "0s");
  EXPECT_EQ(FormatAge(59), "59s");
  EXPECT_EQ(FormatAge(600), "10m");
  EXPECT_EQ(FormatAge(5 * 3600), "5h");
  EXPECT_EQ(FormatAge(3 * 86400), "3d");
}

}  // namespace
}  // namespace nopfs::kept
