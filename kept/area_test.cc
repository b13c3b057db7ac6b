#include "kept/area.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace nopfs::kept {
namespace {

namespace fs = std::filesystem;

std::string Fresh(const std::string& name) {
  const std::string dir =
      fs::path(testing::TempDir()).lexically_normal().string() + "/kept_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return fs::canonical(dir).string();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

KeptManifest Manifest(const std::string& key) {
  KeptManifest m;
  m.key = key;
  m.dataset = "/pfs/imagenet/train";
  m.created = 1'700'000'000;
  m.last_used = 1'700'000'100;
  m.samples = 3;
  m.index_bytes = 10;
  m.index_xxh3 = 0x1234;
  m.data_files = 2;
  return m;
}

// A complete kept dataset with one data file of `data_bytes` bytes.
std::string MakeKept(const std::string& kept, const std::string& key, size_t data_bytes) {
  const std::string dir = kept + "/" + key;
  fs::create_directories(dir);
  WriteFile(dir + "/data.0", std::string(data_bytes, 'x'));
  EXPECT_TRUE(WriteFileDurably(dir, "MANIFEST", EncodeKeptManifest(Manifest(key))).ok());
  return dir;
}

TEST(KeptArea, KeyIsStableHexAndIgnoresNothingItIsGiven) {
  const std::string k = KeptKey("/pfs/d", "scan=v1");
  EXPECT_TRUE(IsKeptKey(k)) << k;
  EXPECT_EQ(k, KeptKey("/pfs/d", "scan=v1"));
  EXPECT_NE(k, KeptKey("/pfs/d2", "scan=v1"));
  EXPECT_NE(k, KeptKey("/pfs/d", "scan=v2"));
  EXPECT_NE(KeptKey("/pfs/a", "b/c"), KeptKey("/pfs/a/b", "c"));
  for (const char* bad : {"", "0123456789abcde", "0123456789abcdef0", "0123456789ABCDEF",
                          "0123456789abcdeg", ".tmp.1"}) {
    EXPECT_FALSE(IsKeptKey(bad)) << bad;
  }
  EXPECT_EQ(KeptAreaDir("/scratch/nopfs-1000"), "/scratch/nopfs-1000/kept");
}

TEST(KeptArea, ManifestRoundTripsAndRejectsDamage) {
  const KeptManifest m = Manifest("00000000deadbeef");
  const std::string bytes = EncodeKeptManifest(m);
  Result<KeptManifest> back = ParseKeptManifest(bytes);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->key, m.key);
  EXPECT_EQ(back->dataset, m.dataset);
  EXPECT_EQ(back->created, m.created);
  EXPECT_EQ(back->last_used, m.last_used);
  EXPECT_EQ(back->samples, 3u);
  EXPECT_EQ(back->index_bytes, 10u);
  EXPECT_EQ(back->index_xxh3, 0x1234u);
  EXPECT_EQ(back->data_files, 2u);
  // Every truncation and every flipped byte is refused.
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(ParseKeptManifest(bytes.substr(0, n)).ok()) << n;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    EXPECT_FALSE(ParseKeptManifest(bad).ok()) << i;
  }
  EXPECT_FALSE(ParseKeptManifest(std::string(100, '\0')).ok());
  EXPECT_FALSE(ParseKeptManifest(std::string(kMaxManifestBytes + 1, 'a')).ok());
}

TEST(KeptArea, IndexRoundTripsAndRejectsDamage) {
  std::vector<KeptSample> in(2);
  in[0] = {"n01/a.JPEG", 0, 1000, 0xabc, 1000, 1'700'000'000'123'456'789, 1'700'000'005, 77, 0, 0};
  in[1] = {"n02/b.JPEG", 4096, 50, 0xdef, 9000, -5, 6, 78, 1, 8192};
  const std::string bytes = EncodeKeptIndex(in);
  Result<std::vector<KeptSample>> out = ParseKeptIndex(bytes);
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0].relative_path, "n01/a.JPEG");
  EXPECT_EQ((*out)[0].mtime_ns, in[0].mtime_ns);
  EXPECT_EQ((*out)[1].offset, 4096u);
  EXPECT_EQ((*out)[1].mtime_ns, -5);
  EXPECT_EQ((*out)[1].inode, 78u);
  EXPECT_EQ((*out)[1].data_file, 1u);
  EXPECT_EQ((*out)[1].data_offset, 8192u);
  EXPECT_TRUE(ParseKeptIndex(EncodeKeptIndex({})).ok());
  for (size_t n = 0; n < bytes.size(); n += 7)
    EXPECT_FALSE(ParseKeptIndex(bytes.substr(0, n)).ok()) << n;
  std::string bad = bytes;
  bad[bytes.size() / 2] ^= 0x10;
  EXPECT_FALSE(ParseKeptIndex(bad).ok());
}

TEST(KeptArea, ListsCompleteAndIncompleteEntries) {
  const std::string kept = Fresh("list");
  const std::string a = MakeKept(kept, "00000000000000aa", 10000);
  // No MANIFEST: incomplete.
  fs::create_directories(kept + "/00000000000000bb");
  WriteFile(kept + "/00000000000000bb/data.0", std::string(5000, 'y'));
  // Being written.
  fs::create_directories(kept + "/.tmp.123.job7");
  // A MANIFEST whose key is another directory's: incomplete.
  fs::create_directories(kept + "/00000000000000cc");
  fs::copy_file(a + "/MANIFEST", kept + "/00000000000000cc/MANIFEST");
  // A valid MANIFEST under a name that is not a key: incomplete.
  fs::create_directories(kept + "/notakey");
  fs::copy_file(a + "/MANIFEST", kept + "/notakey/MANIFEST");

  Result<std::vector<KeptDataset>> l = ListKept(kept);
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_EQ(l->size(), 5u);
  const KeptDataset& tmp = (*l)[0];
  EXPECT_EQ(tmp.key, ".tmp.123.job7");
  EXPECT_FALSE(tmp.complete);
  const KeptDataset& ka = (*l)[1];
  EXPECT_EQ(ka.key, "00000000000000aa");
  EXPECT_EQ(ka.dir, a);
  EXPECT_TRUE(ka.complete);
  EXPECT_EQ(ka.dataset, "/pfs/imagenet/train");
  EXPECT_EQ(ka.samples, 3u);
  EXPECT_EQ(ka.created, 1'700'000'000);
  EXPECT_EQ(ka.last_used, 1'700'000'100);
  struct stat st {};
  ASSERT_EQ(::lstat((a + "/data.0").c_str(), &st), 0);
  EXPECT_GE(ka.bytes, uint64_t(st.st_blocks) * 512);
  EXPECT_GT(ka.bytes, 0u);
  EXPECT_FALSE((*l)[2].complete);  // bb
  EXPECT_GT((*l)[2].bytes, 0u);
  EXPECT_FALSE((*l)[3].complete);  // cc
  EXPECT_EQ((*l)[4].key, "notakey");
  EXPECT_FALSE((*l)[4].complete);

  // A missing kept directory is empty.
  Result<std::vector<KeptDataset>> none = ListKept(kept + "/absent");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(KeptArea, TruncatedOrGarbageManifestIsIncomplete) {
  const std::string kept = Fresh("garbage");
  const std::string a = MakeKept(kept, "0000000000000001", 100);
  const std::string b = MakeKept(kept, "0000000000000002", 100);
  const std::string c = MakeKept(kept, "0000000000000003", 100);
  fs::resize_file(a + "/MANIFEST", fs::file_size(a + "/MANIFEST") - 3);
  WriteFile(b + "/MANIFEST", "garbage that is long enough to have a magic and a checksum in it");
  fs::resize_file(c + "/MANIFEST", kMaxManifestBytes + 10);  // too large: never read whole
  Result<std::vector<KeptDataset>> l = ListKept(kept);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 3u);
  for (const KeptDataset& k : *l)
    EXPECT_FALSE(k.complete) << k.key;
}

TEST(KeptArea, SymlinksAreNeverFollowed) {
  const std::string root = Fresh("symlinks");
  const std::string kept = root + "/kept";
  fs::create_directories(kept);
  // Outside the kept area: a complete-looking dataset and a file that must survive.
  const std::string outside = root + "/outside";
  const std::string target = MakeKept(outside, "00000000000000ee", 4096);
  WriteFile(outside + "/precious", "keep me");
  // An entry that is a symlink to a directory holding a valid MANIFEST.
  fs::create_directory_symlink(target, kept + "/00000000000000ee");
  // A MANIFEST that is a symlink to a valid MANIFEST elsewhere.
  fs::create_directories(kept + "/00000000000000ff");
  fs::create_symlink(target + "/MANIFEST", kept + "/00000000000000ff/MANIFEST");
  // A data file that is a symlink to a big file outside.
  fs::create_symlink(outside + "/precious", kept + "/00000000000000ff/data.0");
  // A FIFO as MANIFEST must not block the listing.
  fs::create_directories(kept + "/00000000000000dd");
  ASSERT_EQ(::mkfifo((kept + "/00000000000000dd/MANIFEST").c_str(), 0600), 0);

  Result<std::vector<KeptDataset>> l = ListKept(kept);
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_EQ(l->size(), 3u);
  for (const KeptDataset& k : *l) {
    EXPECT_FALSE(k.complete) << k.key;
    EXPECT_TRUE(k.dataset.empty()) << k.key;
  }
  EXPECT_EQ((*l)[1].key, "00000000000000ee");
  EXPECT_EQ((*l)[1].bytes, 0u);

  // Removing them removes the links, never what they point at.
  for (const char* name : {"00000000000000dd", "00000000000000ee", "00000000000000ff"})
    ASSERT_TRUE(RemoveKept(kept, name).ok()) << name;
  EXPECT_TRUE(fs::is_empty(kept));
  EXPECT_TRUE(fs::exists(target + "/MANIFEST"));
  EXPECT_TRUE(fs::exists(target + "/data.0"));
  EXPECT_TRUE(fs::exists(outside + "/precious"));

  // A kept directory that is itself a symlink is refused.
  const std::string link = root + "/kept_link";
  fs::create_directory_symlink(outside, link);
  EXPECT_FALSE(ListKept(link).ok());
  EXPECT_FALSE(RemoveKept(link, "00000000000000ee").ok());
  EXPECT_TRUE(fs::exists(target + "/MANIFEST"));
}

TEST(KeptArea, EntryInUseWhileItsLockIsHeld) {
  const std::string kept = Fresh("inuse");
  fs::create_directories(kept + "/.tmp.1.a");
  Result<int> fd = LockKeptEntry(kept + "/.tmp.1.a");
  ASSERT_TRUE(fd.ok()) << fd.status().message();
  EXPECT_TRUE(KeptEntryInUse(kept, ".tmp.1.a"));
  // A second lock (as another nopfsd would take it) is refused.
  EXPECT_FALSE(LockKeptEntry(kept + "/.tmp.1.a").ok());
  ::close(*fd);
  EXPECT_FALSE(KeptEntryInUse(kept, ".tmp.1.a"));
  // Without a lock file: in use only while it is fresh.
  fs::create_directories(kept + "/.tmp.2.b");
  EXPECT_TRUE(KeptEntryInUse(kept, ".tmp.2.b"));
  EXPECT_FALSE(KeptEntryInUse(kept, ".tmp.absent"));
  // A lock that is a symlink is not a lock.
  fs::create_directories(kept + "/.tmp.3.c");
  fs::create_symlink(kept + "/.tmp.1.a/lock", kept + "/.tmp.3.c/lock");
  EXPECT_FALSE(KeptEntryInUse(kept, ".tmp.3.c"));
}

TEST(KeptArea, RemoveKeptRemovesEverythingAndNothingOutside) {
  const std::string root = Fresh("remove");
  const std::string kept = root + "/kept";
  const std::string a = MakeKept(kept, "000000000000000a", 100);
  const std::string b = MakeKept(kept, "000000000000000b", 100);
  fs::create_directories(a + "/sub/deeper");
  WriteFile(a + "/sub/deeper/file", "x");
  fs::create_directories(kept + "/.tmp.9.x");
  WriteFile(kept + "/.tmp.9.x/data.0", "y");
  WriteFile(kept + "/stray", "z");
  WriteFile(root + "/sibling", "s");

  ASSERT_TRUE(RemoveKept(kept, "000000000000000a").ok());
  ASSERT_TRUE(RemoveKept(kept, ".tmp.9.x").ok());
  ASSERT_TRUE(RemoveKept(kept, "stray").ok());
  ASSERT_TRUE(RemoveKept(kept, "000000000000000a").ok());  // already gone: ok
  EXPECT_FALSE(fs::exists(a));
  EXPECT_FALSE(fs::exists(kept + "/.tmp.9.x"));
  EXPECT_FALSE(fs::exists(kept + "/stray"));
  EXPECT_TRUE(fs::exists(b + "/MANIFEST"));
  EXPECT_TRUE(fs::exists(b + "/data.0"));
  EXPECT_TRUE(fs::exists(root + "/sibling"));

  for (const char* bad : {"", ".", "..", "../sibling", "a/b"}) {
    const Status s = RemoveKept(kept, bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(fs::exists(root + "/sibling"));
  EXPECT_TRUE(fs::exists(b));
}

}  // namespace
}  // namespace nopfs::kept
