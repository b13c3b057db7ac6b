// Tests of the dataset catalog on real files and a real RocksDB in a temporary directory.
#include "service/catalog/catalog.h"
#include "service/catalog/catalog_codec.h"
#include "service/catalog/catalog_test_util.h"
#include "service/catalog/db_fault_fs_test_util.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace nopfs::service {
namespace {

namespace fs = std::filesystem;

// Deterministic content of `n` bytes for `key`.
std::string Content(const std::string& key, uint64_t n) {
  std::string s(n, '\0');
  uint64_t x = XXH3_64bits(key.data(), key.size());
  for (uint64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    s[i] = static_cast<char>(x >> 56);
  }
  return s;
}

std::string AsString(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

struct Expected {
  int64_t label;
  std::string rel;
  uint64_t offset;
  uint64_t length;
  std::string bytes;
};

bool ByOrder(const Expected& a, const Expected& b) {
  return std::tie(a.label, a.rel, a.offset) < std::tie(b.label, b.rel, b.offset);
}

class CatalogTest : public testing::DatasetDirTest {
 protected:
  // Sets every mtime under data_ an hour back, as if the dataset was written long ago.
  void AgeTree() {
    const auto old = fs::file_time_type::clock::now() - std::chrono::hours(1);
    for (const auto& e : fs::recursive_directory_iterator(data_))
      fs::last_write_time(e.path(), old);
    fs::last_write_time(data_, old);
  }

  // An ImageFolder of three classes (one with a nested directory) and ~300 files of varied sizes,
  // plus entries the scan must skip. Returns the samples in the order the catalog must use.
  std::vector<Expected> MakeImageFolder() {
    const std::vector<std::string> classes = {"zebra", "Ant", "cat"};  // bytewise: Ant cat zebra
    std::vector<Expected> want;
    for (size_t c = 0; c < classes.size(); ++c) {
      const int64_t label = c == 0 ? 2 : c == 1 ? 0 : 1;
      for (int i = 0; i < 100; ++i) {
        const std::string rel = classes[c] + (i % 10 == 3 ? "/deep/er/" : "/") + "img_" +
                                std::to_string(i * 7 % 100) + ".jpg";
        const std::string bytes = Content(rel, static_cast<uint64_t>((i * 397) % 5000 + 1));
        WriteFile(rel, bytes);
        want.push_back({label, rel, 0, bytes.size(), bytes});
      }
    }
    WriteFile("cat/.hidden.jpg", "skip me");
    WriteFile("cat/.git/objects", "skip me too");
    WriteFile(".trash/x/y.jpg", "hidden class dir");
    WriteFile("README.txt", "files directly under the root are ignored");
    std::sort(want.begin(), want.end(), ByOrder);
    return want;
  }

  CatalogOptions Options(bool cached = true, const std::string& work = "work") const {
    CatalogOptions o;
    o.dataset = data_;
    o.cache_dir = cached ? cache_ : "";
    o.work_dir = tmp_ + "/" + work;
    o.scan_threads = 4;
    return o;
  }

  static void ExpectCatalog(const Catalog& cat, const std::vector<Expected>& want) {
    ASSERT_EQ(cat.size(), want.size());
    for (policy::SampleId id = 0; id < want.size(); ++id) {
      SCOPED_TRACE(want[id].rel);
      EXPECT_EQ(cat.relative_path(id), want[id].rel);
      EXPECT_EQ(cat.label(id), want[id].label);
      EXPECT_EQ(cat.offset(id), want[id].offset);
      EXPECT_EQ(cat.length(id), want[id].length);
      EXPECT_EQ(cat.sizes()[id], want[id].length);
      std::vector<std::byte> buf(cat.length(id));
      ASSERT_TRUE(cat.Read(id, buf).ok());
      EXPECT_EQ(AsString(buf), want[id].bytes);
    }
  }
};

TEST_F(CatalogTest, ImageFolderOrderSizesAndBytes) {
  const std::vector<Expected> want = MakeImageFolder();
  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Options(false), Env::Default());
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  EXPECT_FALSE((*cat)->reused());
  EXPECT_EQ((*cat)->class_names(), (std::vector<std::string>{"Ant", "cat", "zebra"}));
  EXPECT_EQ((*cat)->path(0), fs::canonical(data_).string() + "/" + want[0].rel);
  EXPECT_EQ((*cat)->db_path(), tmp_ + "/work/catalog");
  ExpectCatalog(**cat, want);
}

TEST_F(CatalogTest, SymbolicLinksAreFollowedOnce) {
  std::vector<Expected> want = MakeImageFolder();
  const std::string outside = tmp_ + "/outside.bin";
  const std::string bytes = Content("outside", 321);
  std::ofstream(outside, std::ios::binary) << bytes;
  fs::create_symlink(outside, data_ + "/Ant/linked.jpg");
  fs::create_symlink(tmp_ + "/nothing-here", data_ + "/Ant/dangling.jpg");
  fs::create_symlink(data_ + "/cat", data_ + "/cat/deep/loop");  // a directory cycle
  want.push_back({0, "Ant/linked.jpg", 0, bytes.size(), bytes});
  // One outside directory linked from two classes counts under both paths.
  fs::create_directories(tmp_ + "/shared");
  std::ofstream(tmp_ + "/shared/s.bin", std::ios::binary) << bytes;
  fs::create_directory_symlink(tmp_ + "/shared", data_ + "/Ant/shared");
  fs::create_directory_symlink(tmp_ + "/shared", data_ + "/zebra/shared");
  want.push_back({0, "Ant/shared/s.bin", 0, bytes.size(), bytes});
  want.push_back({2, "zebra/shared/s.bin", 0, bytes.size(), bytes});
  std::sort(want.begin(), want.end(), ByOrder);
  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Options(false), Env::Default());
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  ExpectCatalog(**cat, want);
}

TEST_F(CatalogTest, ReusedWithoutScanningWhenUnchanged) {
  const std::vector<Expected> want = MakeImageFolder();
  AgeTree();
  uint64_t fingerprint = 0;
  std::string db_path;
  {
    Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Options(), Env::Default());
    ASSERT_TRUE(cat.ok()) << cat.status().message();
    EXPECT_FALSE((*cat)->reused());
    fingerprint = (*cat)->fingerprint();
    db_path = (*cat)->db_path();
    EXPECT_EQ(db_path.rfind(cache_ + "/" + std::to_string(::getuid()) + "/", 0), 0u) << db_path;
    struct stat st {};
    ASSERT_EQ(::stat((cache_ + "/" + std::to_string(::getuid())).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
  }
  // Another job (another work_dir) reuses it: no directory is listed, no file is read.
  FaultInjectionEnv env(Env::Default());
  Result<std::unique_ptr<Catalog>> again = Catalog::Open(Options(true, "work2"), &env);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_TRUE((*again)->reused()) << (*again)->rescan_reason();
  EXPECT_EQ(env.list_dirs(), 0u);
  EXPECT_EQ(env.reads(), 0u);
  EXPECT_EQ((*again)->fingerprint(), fingerprint);
  EXPECT_EQ((*again)->db_path(), db_path);
  EXPECT_EQ((*again)->class_names(), (std::vector<std::string>{"Ant", "cat", "zebra"}));
  ExpectCatalog(**again, want);
}

// With defer_store (nopfsd), Open leaves the catalog DB to StorePending: none before, the same DB
// after, which the next job reuses without a scan.
TEST_F(CatalogTest, DeferredStoreIsWrittenByStorePendingAndReused) {
  const std::vector<Expected> want = MakeImageFolder();
  AgeTree();
  CatalogOptions o = Options();
  o.defer_store = true;
  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(o, Env::Default());
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  EXPECT_FALSE((*cat)->reused());
  ExpectCatalog(**cat, want);
  EXPECT_EQ((*cat)->db_path(), "");  // not written yet
  EXPECT_EQ((*cat)->open_phases().find("store"), std::string::npos) << (*cat)->open_phases();
  const std::string user_dir = cache_ + "/" + std::to_string(::getuid());
  const auto entries = [&] {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(user_dir, ec))
      n += e.path().filename().string()[0] != '.';
    return n;
  };
  EXPECT_EQ(entries(), 0u);
  (*cat)->StorePending();
  EXPECT_EQ((*cat)->store_error(), "");
  EXPECT_EQ((*cat)->db_path().rfind(user_dir + "/", 0), 0u) << (*cat)->db_path();
  EXPECT_GT((*cat)->pending_store_seconds(), 0.0);
  EXPECT_EQ(entries(), 1u);
  (*cat)->StorePending();  // nothing pending: a no-op
  FaultInjectionEnv env(Env::Default());
  Result<std::unique_ptr<Catalog>> again = Catalog::Open(Options(true, "work3"), &env);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_TRUE((*again)->reused()) << (*again)->rescan_reason();
  EXPECT_EQ(env.list_dirs(), 0u);
  EXPECT_EQ((*again)->db_path(), (*cat)->db_path());
  EXPECT_EQ((*again)->fingerprint(), (*cat)->fingerprint());
  ExpectCatalog(**again, want);
}

// A damaged catalog DB is not used, and the reason nopfsd logs says it was corrupt and where.
TEST_F(CatalogTest, CorruptEntryIsRebuiltAndSaysWhy) {
  const std::vector<Expected> want = MakeImageFolder();
  AgeTree();
  std::string db_path;
  {
    Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Options(false), Env::Default());
    ASSERT_TRUE(cat.ok()) << cat.status().message();
    db_path = (*cat)->db_path();
  }
  int damaged = 0;
  for (const auto& e : fs::directory_iterator(db_path)) {
    if (e.path().extension() != ".sst") continue;
    const auto size = fs::file_size(e.path());
    std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << std::string(size, 'x');
    ++damaged;
  }
  ASSERT_GT(damaged, 0) << "no table file in " << db_path;
  Result<std::unique_ptr<Catalog>> again = Catalog::Open(Options(false), Env::Default());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_FALSE((*again)->reused());
  EXPECT_NE((*again)->rescan_reason().find("the cached catalog " + db_path + " is corrupt"),
            std::string::npos)
      << (*again)->rescan_reason();
  ExpectCatalog(**again, want);
}

TEST_F(CatalogTest, AddedFileCausesRescan) {
  std::vector<Expected> want = MakeImageFolder();
  AgeTree();
  ASSERT_TRUE(Catalog::Open(Options(), Env::Default()).ok());
  const std::string rel = "cat/deep/er/new.jpg";
  const std::string bytes = Content(rel, 1234);
  WriteFile(rel, bytes);
  want.push_back({1, rel, 0, bytes.size(), bytes});
  std::sort(want.begin(), want.end(), ByOrder);

  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Options(), Env::Default());
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  EXPECT_FALSE((*cat)->reused());
  EXPECT_NE((*cat)->rescan_reason().find("/cat/deep/er changed"), std::string::npos)
      << (*cat)->rescan_reason();
  ExpectCatalog(**cat, want);
  cat = Status::Internal("closed");  // one open Catalog per work_dir

  // That scan saw a directory modified a moment ago, so its catalog is not trusted later...
  AgeTree();
  Result<std::unique_ptr<Catalog>> third = Catalog::Open(Options(), Env::Default());
  ASSERT_TRUE(third.ok()) << third.status().message();
  EXPECT_FALSE((*third)->reused());
  third = Status::Internal("closed");
  // ...but the next scan of the settled tree is.
  Result<std::unique_ptr<Catalog>> fourth = Catalog::Open(Options(), Env::Default());
  ASSERT_TRUE(fourth.ok());
  EXPECT_TRUE((*fourth)->reused()) << (*fourth)->rescan_reason();
  ExpectCatalog(**fourth, want);
}

TEST_F(CatalogTest, RacingJobsBothGetACorrectCatalog) {
  const std::vector<Expected> want = MakeImageFolder();
  AgeTree();
  std::vector<Result<std::unique_ptr<Catalog>>> got;
  got.reserve(3);
  for (int i = 0; i < 3; ++i)
    got.emplace_back(Status::Internal("not run"));
  std::vector<std::thread> jobs;
  for (int i = 0; i < 3; ++i) {
    jobs.emplace_back([&, i] {
      got[i] = Catalog::Open(Options(true, "race" + std::to_string(i)), Env::Default());
    });
  }
  for (auto& t : jobs)
    t.join();
  for (auto& r : got) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    ExpectCatalog(**r, want);
  }
  Result<std::unique_ptr<Catalog>> later = Catalog::Open(Options(true, "later"), Env::Default());
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE((*later)->reused()) << (*later)->rescan_reason();
  // No temporary or replaced entries are left behind.
  for (const auto& e : fs::directory_iterator(cache_ + "/" + std::to_string(::getuid()))) {
    EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
  }
}

TEST_F(CatalogTest, ManifestWithOffsetsIntoOneFile) {
  std::vector<Expected> want;
  // 200 samples packed into one file, listed out of order, with labels.
  std::string big;
  std::vector<std::string> lines = {"# packed samples", ""};
  for (int i = 0; i < 200; ++i) {
    const std::string bytes = Content("packed" + std::to_string(i), (i * 211) % 3000 + 1);
    const int64_t label = (i * 13) % 5;
    want.push_back({label, "shards/big.bin", big.size(), bytes.size(), bytes});
    lines.push_back("shards/big.bin\t" + std::to_string(label) + "\t" + std::to_string(big.size()) +
                    "\t" + std::to_string(bytes.size()));
    big += bytes;
  }
  WriteFile("shards/big.bin", big);
  // Whole files, with and without labels.
  for (int i = 0; i < 50; ++i) {
    const std::string rel = "loose/f" + std::to_string(i) + ".bin";
    const std::string bytes = Content(rel, static_cast<uint64_t>(i * 31 + 5));
    WriteFile(rel, bytes);
    const int64_t label = i % 3 == 0 ? -1 : i % 4;
    want.push_back({label, rel, 0, bytes.size(), bytes});
    lines.push_back(i % 3 == 0 ? (i % 2 ? rel : rel + "\t-") : rel + "\t" + std::to_string(label));
  }
  std::reverse(lines.begin() + 2, lines.end());
  std::string text;
  for (const auto& l : lines)
    text += l + "\n";
  WriteFile("train.manifest", text);
  std::sort(want.begin(), want.end(), ByOrder);
  AgeTree();

  CatalogOptions o = Options();
  o.dataset = data_ + "/train.manifest";
  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(o, Env::Default());
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  EXPECT_FALSE((*cat)->reused());
  EXPECT_TRUE((*cat)->class_names().empty());
  ExpectCatalog(**cat, want);

  o.work_dir = tmp_ + "/work2";
  Result<std::unique_ptr<Catalog>> again = Catalog::Open(o, Env::Default());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->reused()) << (*again)->rescan_reason();
  ExpectCatalog(**again, want);

  // A listed file replaced by rename (how rsync publishes) is seen through its directory.
  again = Status::Internal("closed");
  const std::string fresh = Content("replacement", 77);
  WriteFile("loose/.f5.bin.tmp", fresh);
  fs::rename(data_ + "/loose/.f5.bin.tmp", data_ + "/loose/f5.bin");
  Result<std::unique_ptr<Catalog>> replaced = Catalog::Open(o, Env::Default());
  ASSERT_TRUE(replaced.ok()) << replaced.status().message();
  EXPECT_FALSE((*replaced)->reused());
  bool seen = false;
  for (policy::SampleId id = 0; id < (*replaced)->size(); ++id) {
    if ((*replaced)->relative_path(id) != "loose/f5.bin") continue;
    seen = true;
    EXPECT_EQ((*replaced)->length(id), fresh.size());
  }
  EXPECT_TRUE(seen);
  replaced = Status::Internal("closed");

  // Editing the manifest (here: dropping its last sample line) is seen.
  WriteFile("train.manifest", text.substr(0, text.rfind('\n', text.size() - 2) + 1));
  o.work_dir = tmp_ + "/work3";
  Result<std::unique_ptr<Catalog>> edited = Catalog::Open(o, Env::Default());
  ASSERT_TRUE(edited.ok());
  EXPECT_FALSE((*edited)->reused());
  EXPECT_EQ((*edited)->size(), want.size() - 1);
}

TEST_F(CatalogTest, ManifestErrorsNameFileLineAndFix) {
  WriteFile("a.bin", "0123456789");
  struct Case {
    std::string line;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"a.bin\t1\t2", "expected 1, 2 or 4 tab-separated fields"},
      {"/etc/passwd", "absolute paths are not allowed"},
      {"x/../a.bin", "\"..\" components are not allowed"},
      {"./a.bin", "write a/b"},
      {"a.bin\tcat", "write an integer >= 0, or - for none"},
      {"a.bin\t-3", "write an integer >= 0, or - for none"},
      {"a.bin\t1\tx\t4", "write the byte offset as an integer >= 0"},
      {"a.bin\t1\t0\t0", "write the byte length as an integer >= 1"},
      {"a.bin\t1\t8\t4", "is 10 bytes, the line needs bytes 8..12"},
      {"missing.bin\t1", "missing.bin: No such file or directory"},
      {"no/such/dir/x.bin", "no/such/dir/x.bin: No such file or directory"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.line);
    WriteFile("m.txt", "# header\n\na.bin\t0\n" + c.line + "\n");
    CatalogOptions o = Options(false);
    o.dataset = data_ + "/m.txt";
    Result<std::unique_ptr<Catalog>> cat = Catalog::Open(o, Env::Default());
    ASSERT_FALSE(cat.ok());
    const std::string& m = cat.status().message();
    EXPECT_NE(m.find(fs::canonical(data_).string() + "/m.txt line 4: "), std::string::npos) << m;
    EXPECT_NE(m.find(c.says), std::string::npos) << m;
  }
  WriteFile("m.txt", "a.bin\n# only a comment after\na.bin\n");
  CatalogOptions o = Options(false);
  o.dataset = data_ + "/m.txt";
  Result<std::unique_ptr<Catalog>> dup = Catalog::Open(o, Env::Default());
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("listed twice"), std::string::npos);
  WriteFile("m.txt", "# nothing\n\n");
  Result<std::unique_ptr<Catalog>> empty = Catalog::Open(o, Env::Default());
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("lists no samples"), std::string::npos);
}

TEST_F(CatalogTest, EmptyDatasetsAreErrors) {
  Result<std::unique_ptr<Catalog>> none = Catalog::Open(Options(false), Env::Default());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no class directories"), std::string::npos);
  fs::create_directories(data_ + "/a");
  fs::create_directories(data_ + "/b/sub");
  Result<std::unique_ptr<Catalog>> empty = Catalog::Open(Options(false), Env::Default());
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("has no files"), std::string::npos);
  CatalogOptions o = Options(false);
  o.dataset = tmp_ + "/does-not-exist";
  Result<std::unique_ptr<Catalog>> missing = Catalog::Open(o, Env::Default());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(o.dataset), std::string::npos);
}

TEST_F(CatalogTest, ReadErrorsNameSampleAndPath) {
  const std::vector<Expected> want = MakeImageFolder();
  FaultInjectionEnv env(Env::Default());
  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Options(false), &env);
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  const Catalog& c = **cat;
  std::vector<std::byte> buf(c.length(7));
  const std::string prefix7 = "sample 7 (" + c.path(7) + "): ";

  env.SetError(c.path(7), Status::IoError(c.path(7) + ": Input/output error"));
  Status s = c.Read(7, buf);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.message().rfind(prefix7, 0), 0u) << s.message();
  env.ClearFaults();

  env.SetCorrupt(c.path(7));
  ASSERT_TRUE(c.Read(7, buf).ok());
  EXPECT_NE(AsString(buf), want[7].bytes);
  env.ClearFaults();

  // A vanished file.
  fs::remove(c.path(7));
  s = c.Read(7, buf);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message().rfind(prefix7, 0), 0u) << s.message();

  // A file that shrank after the scan.
  std::ofstream(c.path(8), std::ios::binary | std::ios::trunc) << "x";
  std::vector<std::byte> buf8(c.length(8));
  s = c.Read(8, buf8);
  EXPECT_EQ(s.message().rfind("sample 8 (" + c.path(8) + "): ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("file is 1 bytes"), std::string::npos) << s.message();

  std::vector<std::byte> wrong(c.length(9) + 1);
  EXPECT_EQ(c.Read(9, wrong).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Read(static_cast<policy::SampleId>(c.size()), buf).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(CatalogTest, ScanErrorsNameThePath) {
  MakeImageFolder();
  FaultInjectionEnv env(Env::Default());
  const std::string dir = fs::canonical(data_).string() + "/cat/deep";
  env.SetError(dir, Status::PermissionDenied(dir + ": Permission denied"));
  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Options(false), &env);
  ASSERT_FALSE(cat.ok());
  EXPECT_EQ(cat.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(cat.status().message(), "scanning the dataset: " + dir + ": Permission denied");
  // A slow PFS changes nothing but time.
  env.ClearFaults();
  env.SetDelay(std::chrono::microseconds(200));
  cat = Catalog::Open(Options(false), &env);
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  std::vector<std::byte> buf((*cat)->length(0));
  EXPECT_TRUE((*cat)->Read(0, buf).ok());
}

TEST_F(CatalogTest, ChecksumsSurviveReopenOfTheWorkDir) {
  MakeImageFolder();
  {
    Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Options(false), Env::Default());
    ASSERT_TRUE(cat.ok()) << cat.status().message();
    for (policy::SampleId id = 0; id < 10; ++id) {
      ASSERT_TRUE((*cat)->RecordChecksum(id, 1000 + id).ok());
    }
    ASSERT_TRUE((*cat)->Flush().ok());
    ASSERT_TRUE((*cat)->RecordChecksum(20, 77).ok());  // flushed by the destructor
    EXPECT_TRUE((*cat)->RecordChecksum(3, 1003).ok());
    const Status differ = (*cat)->RecordChecksum(3, 4);
    EXPECT_EQ(differ.code(), StatusCode::kCorruption);
    EXPECT_EQ(differ.message().rfind("sample 3 (" + (*cat)->path(3) + "): ", 0), 0u);
    EXPECT_FALSE((*cat)->checksum(11).has_value());
  }
  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Options(false), Env::Default());
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  for (policy::SampleId id = 0; id < 10; ++id)
    EXPECT_EQ((*cat)->checksum(id), 1000u + id);
  EXPECT_EQ((*cat)->checksum(20), 77u);
  EXPECT_FALSE((*cat)->checksum(11).has_value());
  EXPECT_EQ((*cat)->checksum(3), 1003u);  // the first value was kept
  cat = Status::Internal("closed");

  // A changed dataset makes a different catalog: its old checksums are forgotten.
  WriteFile("Ant/aaa_first.jpg", "new first sample");
  Result<std::unique_ptr<Catalog>> changed = Catalog::Open(Options(false), Env::Default());
  ASSERT_TRUE(changed.ok());
  for (policy::SampleId id = 0; id < 10; ++id)
    EXPECT_FALSE((*changed)->checksum(id).has_value());
}

TEST_F(CatalogTest, ConcurrentReadsAndChecksums) {
  const std::vector<Expected> want = MakeImageFolder();
  FaultInjectionEnv env(Env::Default());
  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Options(false), &env);
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  Catalog& c = **cat;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Every thread visits every sample, from a different start, so records collide.
      for (uint64_t k = 0; k < c.size(); ++k) {
        const auto id =
            static_cast<policy::SampleId>((k + static_cast<uint64_t>(t) * 77) % c.size());
        std::vector<std::byte> buf(c.length(id));
        if (!c.Read(id, buf).ok() || AsString(buf) != want[id].bytes) ++failures;
        if (!c.RecordChecksum(id, XXH3_64bits(buf.data(), buf.size())).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(env.reads(), 4 * c.size());
  ASSERT_TRUE(c.Flush().ok());
  for (policy::SampleId id = 0; id < c.size(); ++id) {
    EXPECT_EQ(c.checksum(id), XXH3_64bits(want[id].bytes.data(), want[id].bytes.size()));
  }
}

TEST(CatalogCodecTest, RoundTripsAndRejectsMalformedRecords) {
  codec::CatalogMeta m;
  m.kind = codec::DatasetKind::kManifest;
  m.reusable = true;
  m.samples = 1'281'167;
  m.classes = 1000;
  m.stamps = 1001;
  m.fingerprint = 0x0123456789abcdefULL;
  m.dataset = "/pfs/imagenet/train.tsv";
  m.root = "/pfs/imagenet";
  const std::string mv = codec::EncodeCatalogMeta(m);
  Result<codec::CatalogMeta> m2 = codec::DecodeCatalogMeta(mv);
  ASSERT_TRUE(m2.ok()) << m2.status().message();
  EXPECT_EQ(m2->samples, m.samples);
  EXPECT_EQ(m2->fingerprint, m.fingerprint);
  EXPECT_EQ(m2->dataset, m.dataset);
  EXPECT_EQ(m2->root, m.root);
  EXPECT_TRUE(m2->reusable);
  EXPECT_EQ(m2->kind, codec::DatasetKind::kManifest);
  EXPECT_FALSE(codec::DecodeCatalogMeta(mv.substr(0, mv.size() - 1)).ok());
  std::string future = mv;
  future[0] = 2;  // format 2
  EXPECT_EQ(codec::DecodeCatalogMeta(future).status().code(), StatusCode::kFailedPrecondition);
  // The reusable flag is 0 or 1; any other byte is corruption (found by fuzz/fuzz_catalog.cc;
  // fuzz/corpus/catalog/regress-meta-reusable-flag).
  std::string flag = mv;
  flag[5] = 0x25;
  EXPECT_EQ(codec::DecodeCatalogMeta(flag).status().code(), StatusCode::kCorruption);

  // Keys sort in id order.
  EXPECT_LT(codec::SampleKey(255), codec::SampleKey(256));
  EXPECT_LT(codec::SampleKey(65535), codec::SampleKey(0x01000000));
  EXPECT_EQ(codec::DecodeIdKey(codec::SampleKey(0xdeadbeef), 'S').value(), 0xdeadbeefu);
  EXPECT_FALSE(codec::DecodeIdKey(codec::ChecksumKey(1), 'S').ok());

  const std::string sv = codec::EncodeSampleValue(1ULL << 40, 4711, -1, "a/b.jpg");
  Result<codec::SampleValue> s2 = codec::DecodeSampleValue(sv);
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ(s2->offset, 1ULL << 40);
  EXPECT_EQ(s2->length, 4711u);
  EXPECT_EQ(s2->label, -1);
  EXPECT_EQ(s2->relative_path, "a/b.jpg");
  EXPECT_FALSE(codec::DecodeSampleValue(sv.substr(0, 24)).ok());

  const codec::Stamp st{-5, 7, 8, 9};
  EXPECT_EQ(codec::DecodeStamp(codec::EncodeStamp(st)).value(), st);
  EXPECT_FALSE(codec::DecodeStamp("short").ok());
  EXPECT_EQ(codec::DecodeChecksum(codec::EncodeChecksum(42)).value(), 42u);
}

TEST_F(CatalogTest, RejectsBadOptions) {
  CatalogOptions o = Options();
  o.scan_threads = 0;
  EXPECT_EQ(Catalog::Open(o, Env::Default()).status().code(), StatusCode::kInvalidArgument);
}

// A cache directory that is missing, or a per-user directory that another user made first (in a
// 1777 cache directory), means no cache: the catalog is scanned and correct, the job goes on.
TEST_F(CatalogTest, UnusableCacheMeansScanningNotFailing) {
  const std::vector<Expected> want = MakeImageFolder();
  CatalogOptions o = Options();
  o.cache_dir = tmp_ + "/no-such-cache";
  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(o, Env::Default());
  ASSERT_TRUE(cat.ok()) << cat.status().ToString();
  EXPECT_FALSE((*cat)->reused());
  EXPECT_NE((*cat)->rescan_reason().find("catalog cache not used: catalog cache directory " +
                                         o.cache_dir + " does not exist"),
            std::string::npos)
      << (*cat)->rescan_reason();
  ExpectCatalog(**cat, want);
  cat->reset();

  // Squatted: <cache>/<uid> made by another uid, writable by all.
  ASSERT_EQ(::chmod(cache_.c_str(), 01777), 0);
  const uint32_t victim = 4242;
  const std::string squat = cache_ + "/" + std::to_string(victim);
  ASSERT_EQ(::mkdir(squat.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(squat.c_str(), 0777), 0);
  o = Options();
  o.uid = victim;
  for (int run = 0; run < 2; ++run) {
    cat = Catalog::Open(o, Env::Default());
    ASSERT_TRUE(cat.ok()) << cat.status().ToString();
    EXPECT_FALSE((*cat)->reused());
    EXPECT_NE((*cat)->rescan_reason().find("catalog cache not used: " + squat +
                                           " must be a directory owned by uid 4242"),
              std::string::npos)
        << (*cat)->rescan_reason();
    ExpectCatalog(**cat, want);
    cat->reset();
  }
  // Nothing was written into the squatted directory.
  EXPECT_TRUE(fs::is_empty(squat));
}

// Faults in the catalog's own DBs (a full or failing local disk): the job keeps a correct catalog
// and its checksums; only the work the DBs save is lost.
class CatalogDbFaultTest : public CatalogTest {
 protected:
  void SetUp() override {
    CatalogTest::SetUp();
    fault_ = std::make_shared<testing::DbFaultFs>();
    env_ = testing::DbFaultFs::NewEnv(fault_);
  }
  CatalogOptions Faulty(bool cached = true, const std::string& work = "work") const {
    CatalogOptions o = Options(cached, work);
    o.db_env = env_.get();
    return o;
  }
  // Entries of the user's cache directory (stored catalogs and leftovers of failed stores).
  std::vector<std::string> CacheEntries() const {
    std::vector<std::string> names;
    const fs::path dir = fs::path(cache_) / std::to_string(::getuid());
    if (!fs::exists(dir)) return names;
    for (const auto& e : fs::directory_iterator(dir))
      names.push_back(e.path().filename());
    return names;
  }

  std::shared_ptr<testing::DbFaultFs> fault_;
  std::unique_ptr<rocksdb::Env> env_;
};

TEST_F(CatalogDbFaultTest, AFullDiskWhileStoringLeavesTheJobItsScannedCatalog) {
  const std::vector<Expected> want = MakeImageFolder();
  AgeTree();
  for (const uint64_t after : {uint64_t{0}, uint64_t{1000}}) {  // at once, and part-way through
    SCOPED_TRACE("writes fail after " + std::to_string(after) + " bytes");
    fault_->FailWrites(cache_, rocksdb::IOStatus::NoSpace("injected ENOSPC"), after);
    Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Faulty(), Env::Default());
    ASSERT_TRUE(cat.ok()) << cat.status().message();
    EXPECT_GT(fault_->failed_writes(), 0u);
    EXPECT_FALSE((*cat)->reused());
    EXPECT_NE((*cat)->store_error().find("injected ENOSPC"), std::string::npos)
        << (*cat)->store_error();
    ExpectCatalog(**cat, want);
    // Nothing half-written is left where a later job would look.
    EXPECT_TRUE(CacheEntries().empty()) << CacheEntries().front();
    fault_->Clear();
  }
  // The disk has room again: the next job scans and stores, the one after reuses.
  Result<std::unique_ptr<Catalog>> next = Catalog::Open(Faulty(true, "work2"), Env::Default());
  ASSERT_TRUE(next.ok()) << next.status().message();
  EXPECT_FALSE((*next)->reused());
  EXPECT_EQ((*next)->store_error(), "");
  next = Status::Internal("closed");
  Result<std::unique_ptr<Catalog>> third = Catalog::Open(Faulty(true, "work3"), Env::Default());
  ASSERT_TRUE(third.ok()) << third.status().message();
  EXPECT_TRUE((*third)->reused());
  ExpectCatalog(**third, want);
}

TEST_F(CatalogDbFaultTest, AStoredCatalogReadBackWrongOrNotAtAllIsScannedAgain) {
  const std::vector<Expected> want = MakeImageFolder();
  AgeTree();
  ASSERT_TRUE(Catalog::Open(Faulty(), Env::Default()).ok());
  {
    fault_->FlipReads(cache_);
    Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Faulty(true, "flip"), Env::Default());
    ASSERT_TRUE(cat.ok()) << cat.status().message();
    EXPECT_GT(fault_->flipped_reads(), 0u);
    EXPECT_FALSE((*cat)->reused());
    EXPECT_NE((*cat)->rescan_reason(), "");
    ExpectCatalog(**cat, want);
    fault_->Clear();
  }
  {
    fault_->FailReads(cache_, rocksdb::IOStatus::IOError("injected EIO"));
    Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Faulty(true, "eio"), Env::Default());
    ASSERT_TRUE(cat.ok()) << cat.status().message();
    EXPECT_FALSE((*cat)->reused());
    EXPECT_NE((*cat)->rescan_reason().find("injected EIO"), std::string::npos)
        << (*cat)->rescan_reason();
    ExpectCatalog(**cat, want);
    fault_->Clear();
  }
  // The faults were in flight, not on the disk: the stored catalog is good and is reused.
  Result<std::unique_ptr<Catalog>> again = Catalog::Open(Faulty(true, "again"), Env::Default());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_TRUE((*again)->reused());
  ExpectCatalog(**again, want);
}

TEST_F(CatalogDbFaultTest, AChecksumDbThatCannotBeMadeKeepsChecksumsInMemory) {
  const std::vector<Expected> want = MakeImageFolder();
  fault_->FailWrites(tmp_ + "/work/checksums", rocksdb::IOStatus::IOError("injected EIO"));
  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Faulty(false), Env::Default());
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  EXPECT_FALSE((*cat)->checksums_persisted());
  ExpectCatalog(**cat, want);
  ASSERT_TRUE((*cat)->RecordChecksum(3, 0xabc).ok());
  EXPECT_EQ((*cat)->checksum(3), 0xabcu);
  // A different value is still caught: the checks do not depend on the DB.
  EXPECT_EQ((*cat)->RecordChecksum(3, 0xabd).code(), StatusCode::kCorruption);
  EXPECT_TRUE((*cat)->Flush().ok());
}

TEST_F(CatalogDbFaultTest, TheChecksumDbFillingUpMidJobNeverFailsARecord) {
  // Enough samples for more than one batch of checksums (4,096 per write).
  for (int i = 0; i < 5000; ++i)
    WriteFile("c/" + std::to_string(i), std::to_string(i));
  Result<std::unique_ptr<Catalog>> cat = Catalog::Open(Faulty(false), Env::Default());
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  ASSERT_TRUE((*cat)->checksums_persisted());
  fault_->FailWrites(tmp_ + "/work/checksums", rocksdb::IOStatus::NoSpace("injected ENOSPC"));
  for (policy::SampleId id = 0; id < 5000; ++id) {
    ASSERT_TRUE((*cat)->RecordChecksum(id, id * 3 + 1).ok()) << id;
  }
  EXPECT_GT(fault_->failed_writes(), 0u);
  EXPECT_FALSE((*cat)->checksums_persisted());
  for (policy::SampleId id = 0; id < 5000; ++id)
    EXPECT_EQ((*cat)->checksum(id), id * 3 + 1);
  EXPECT_TRUE((*cat)->Flush().ok());  // nothing left to persist
  fault_->Clear();
  cat = Status::Internal("closed");
  // The next job with this work directory trusts only what was written whole.
  Result<std::unique_ptr<Catalog>> next = Catalog::Open(Faulty(false), Env::Default());
  ASSERT_TRUE(next.ok()) << next.status().message();
  EXPECT_TRUE((*next)->checksums_persisted());
  for (policy::SampleId id = 0; id < 5000; ++id) {
    const std::optional<uint64_t> sum = (*next)->checksum(id);
    if (sum) {
      EXPECT_EQ(*sum, id * 3 + 1) << id;
    }
  }
}

}  // namespace
}  // namespace nopfs::service
