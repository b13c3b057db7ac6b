// The keep record's format and root's finishing of a kept entry from it (kept/finish.h), against
// real directories: a whole record becomes a complete entry; every prefix or flipped byte of a
// record, a hostile tier directory (links, extra hard links, ranges past a data file's end) and a
// finish killed at each of its steps leave nothing a later job trusts.
#include "kept/finish.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/checksum.h"
#include "common/unique_fd.h"
#include "kept/area.h"

namespace nopfs::kept {
namespace {

namespace fs = std::filesystem;

constexpr char kKey[] = "0123456789abcdef";
constexpr uint64_t kSample = 5000;  // each sample's length; its slot is 8192 bytes

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t Hash(const std::string& s) {
  return ColdXxh3(std::as_bytes(std::span(s.data(), s.size())));
}

// The bytes of sample k.
std::string SampleBytes(uint32_t k) {
  std::string s(kSample, '\0');
  for (size_t i = 0; i < s.size(); ++i)
    s[i] = static_cast<char>('a' + (k * 7 + i) % 26);
  return s;
}

class FinishTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()).lexically_normal().string() + "/kept_finish_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root_);
    user_ = root_ + "/nopfs-" + std::to_string(::geteuid());
    tier_ = user_ + "/7.0";
    fs::create_directories(tier_);
    MakeTier();
  }
  void TearDown() override { fs::remove_all(root_); }

  // Two data files of 3 slots each (8 KiB apart); samples 0-2 in data.0, 3-5 in data.1.
  void MakeTier() {
    samples_.clear();
    for (uint32_t f = 0; f < 2; ++f) {
      std::string bytes(3 * 8192, 'z');
      for (uint32_t i = 0; i < 3; ++i)
        bytes.replace(i * 8192, kSample, SampleBytes(f * 3 + i));
      std::ofstream(tier_ + "/data." + std::to_string(f), std::ios::binary) << bytes;
    }
    for (uint32_t k = 0; k < 6; ++k) {
      KeptSample s;
      s.relative_path = "c/img" + std::to_string(k) + ".bin";
      s.length = kSample;
      s.xxh3 = Hash(SampleBytes(k));
      s.file_size = kSample;
      s.mtime_ns = 1;
      s.ctime_ns = 2;
      s.inode = 100 + k;
      s.data_file = k / 3;
      s.data_offset = (k % 3) * 8192;
      samples_.push_back(s);
    }
  }

  std::string Record(const std::vector<KeptSample>& samples, uint32_t data_files = 2) const {
    const std::string index = EncodeKeptIndex(samples);
    KeptManifest m;
    m.key = kKey;
    m.dataset = "/the/users/own/word";
    m.created = 5;
    m.last_used = 4'000'000'000;
    m.samples = samples.size();
    m.index_bytes = index.size();
    m.index_xxh3 = Hash(index);
    m.data_files = data_files;
    return EncodeKeepRecord(m, index);
  }
  void WriteRecord(const std::string& bytes) const {
    ASSERT_TRUE(WriteFileDurably(tier_, kKeepRecordName, bytes).ok());
  }

  Result<FinishResult> Finish(uint64_t max_bytes = 0, uint32_t abandon_after = 0) const {
    const UniqueFd ufd(::open(user_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    EXPECT_TRUE(ufd.valid());
    FinishRequest r;
    r.user_dir_fd = ufd.get();
    r.user_dir = user_;
    r.uid = ::geteuid();
    r.tier_name = "7.0";
    r.dataset = "/pfs/ledger/dataset";
    r.max_bytes = max_bytes;
    r.now = 1'800'000'000;
    r.abandon_after = abandon_after;
    return FinishKept(r);
  }

  // The complete entries of the user's kept area.
  std::vector<KeptDataset> Complete() const {
    std::vector<KeptDataset> out;
    Result<std::vector<KeptDataset>> l = ListKept(user_ + "/kept");
    EXPECT_TRUE(l.ok());
    if (!l.ok()) return out;
    for (KeptDataset& k : *l)
      if (k.complete) out.push_back(std::move(k));
    return out;
  }

  // The samples of the complete entry of kKey, each checked against its bytes: the count of
  // those whose bytes are what their record says (a wrong one fails the test).
  uint64_t VerifiedSamples() const {
    const std::string dir = user_ + "/kept/" + kKey;
    Result<KeptManifest> m = ParseKeptManifest(ReadAll(dir + "/MANIFEST"));
    EXPECT_TRUE(m.ok()) << m.status().message();
    if (!m.ok()) return 0;
    const std::string index = ReadAll(dir + "/index");
    EXPECT_EQ(index.size(), m->index_bytes);
    EXPECT_EQ(Hash(index), m->index_xxh3);
    Result<std::vector<KeptSample>> samples = ParseKeptIndex(index);
    EXPECT_TRUE(samples.ok());
    if (!samples.ok()) return 0;
    uint64_t good = 0;
    for (const KeptSample& s : *samples) {
      const std::string data = ReadAll(dir + "/data." + std::to_string(s.data_file));
      EXPECT_LE(s.data_offset + s.length, data.size());
      EXPECT_EQ(Hash(data.substr(s.data_offset, s.length)), s.xxh3) << s.relative_path;
      good += Hash(data.substr(s.data_offset, s.length)) == s.xxh3;
    }
    return good;
  }

  // Nothing of the kept area would be adopted, and no private entry of the finish is left.
  void ExpectNothingKept() const {
    EXPECT_TRUE(Complete().empty());
    EXPECT_FALSE(fs::exists(user_ + "/kept/.tmp.finish.7.0"));
  }

  std::string root_, user_, tier_;
  std::vector<KeptSample> samples_;
};

TEST_F(FinishTest, RecordRoundTripsAndEveryPrefixOrFlippedByteIsRefused) {
  const std::string rec = Record(samples_);
  Result<KeepRecord> r = ParseKeepRecord(rec);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->manifest.key, kKey);
  ASSERT_EQ(r->samples.size(), samples_.size());
  EXPECT_EQ(r->samples[4].relative_path, samples_[4].relative_path);
  EXPECT_EQ(r->samples[4].data_offset, samples_[4].data_offset);
  // A write cut at any byte (what a torn file would hold) is never a record.
  for (size_t n = 0; n < rec.size(); ++n) {
    EXPECT_FALSE(ParseKeepRecord(rec.substr(0, n)).ok()) << n;
  }
  for (size_t i = 0; i < rec.size(); ++i) {
    std::string bad = rec;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    EXPECT_FALSE(ParseKeepRecord(bad).ok()) << i;
  }
  EXPECT_FALSE(ParseKeepRecord(rec + "x").ok());
}

TEST_F(FinishTest, RecordBecomesACompleteEntryWithRootsDatasetAndTimes) {
  WriteRecord(Record(samples_));
  Result<FinishResult> f = Finish();
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f->found);
  EXPECT_EQ(f->key, kKey);
  EXPECT_EQ(f->samples, 6u);
  EXPECT_EQ(f->dropped, 0u);
  EXPECT_EQ(f->dir, user_ + "/kept/" + kKey);
  const std::vector<KeptDataset> c = Complete();
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].dataset, "/pfs/ledger/dataset");  // root's record, not the user's
  EXPECT_EQ(c[0].created, 1'800'000'000);
  EXPECT_EQ(c[0].last_used, 1'800'000'000);
  EXPECT_EQ(c[0].samples, 6u);
  EXPECT_EQ(VerifiedSamples(), 6u);
  // Moved, not copied; the record is gone.
  EXPECT_FALSE(fs::exists(tier_ + "/data.0"));
  EXPECT_FALSE(fs::exists(tier_ + "/" + std::string(kKeepRecordName)));
  EXPECT_FALSE(fs::exists(user_ + "/kept/.tmp.finish.7.0"));
  // A second finish finds nothing to do.
  Result<FinishResult> again = Finish();
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->found);
}

TEST_F(FinishTest, NoTierOrNoRecordIsNothingToDo) {
  Result<FinishResult> f = Finish();
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_FALSE(f->found);
  fs::remove_all(tier_);
  f = Finish();
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_FALSE(f->found);
  EXPECT_FALSE(fs::exists(user_ + "/kept"));
}

// A record larger than nopfsd ever writes (a user's file: it may say anything) is refused with
// its size and the limit, before root reads a byte of it, and nothing is kept.
TEST_F(FinishTest, ARecordLargerThanARealOneIsRefusedUnread) {
  { std::ofstream f(tier_ + "/" + kKeepRecordName, std::ios::binary | std::ios::trunc); }
  fs::resize_file(tier_ + "/" + kKeepRecordName, kMaxKeepRecordBytes + 1);  // sparse
  Result<FinishResult> f = Finish();
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(f.status().message().find(
                "keep holds " + std::to_string(kMaxKeepRecordBytes + 1) +
                " bytes, more than the 256 MiB a keep record may hold (nopfsd writes none larger)"),
            std::string::npos)
      << f.status().message();
  ExpectNothingKept();
}

TEST_F(FinishTest, TheGrantBoundsWhatIsKeptAndTheRestIsPunchedOut) {
  WriteRecord(Record(samples_));
  Result<FinishResult> f = Finish(/*max_bytes=*/2 * 8192);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->samples, 2u);
  EXPECT_EQ(f->dropped, 4u);
  EXPECT_EQ(VerifiedSamples(), 2u);
  // data.1 holds no kept sample: it stays behind, with the tier.
  EXPECT_FALSE(fs::exists(user_ + "/kept/" + std::string(kKey) + "/data.1"));
  EXPECT_TRUE(fs::exists(tier_ + "/data.1"));
  struct stat st {};
  ASSERT_EQ(::stat((user_ + "/kept/" + kKey + "/data.0").c_str(), &st), 0);
  EXPECT_LE(uint64_t(st.st_blocks) * 512, 2u * 8192) << "the third slot was not punched out";
  EXPECT_LE(f->bytes, 2u * 8192);
}

TEST_F(FinishTest, AnOlderEntryOfTheKeyIsReplaced) {
  const std::string old = user_ + "/kept/" + kKey;
  fs::create_directories(old);
  std::ofstream(old + "/data.0") << "old";
  WriteRecord(Record(samples_));
  Result<FinishResult> f = Finish();
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(VerifiedSamples(), 6u);
}

// Each hostile shape of the tier's directory is refused: nothing is kept, nothing outside the
// user's directory is touched, and the finish's private entry is gone.
TEST_F(FinishTest, HostileTierDirectoriesKeepNothing) {
  const std::string outside = root_ + "/outside";
  fs::create_directories(outside);
  std::ofstream(outside + "/secret", std::ios::binary) << std::string(3 * 8192, 's');
  struct Case {
    const char* name;
    std::function<void()> make;
  };
  const std::vector<Case> cases = {
      {"a data file that is a link",
       [&] {
         fs::remove(tier_ + "/data.0");
         fs::create_symlink(outside + "/secret", tier_ + "/data.0");
         WriteRecord(Record(samples_));
       }},
      {"a data file with a second link",
       [&] {
         fs::create_hard_link(tier_ + "/data.1", outside + "/second");
         WriteRecord(Record(samples_));
       }},
      {"a sample past its data file's end",
       [&] {
         std::vector<KeptSample> s = samples_;
         s[2].data_offset = 3 * 8192 - 100;
         WriteRecord(Record(s));
       }},
      {"a sample in a data file the record does not have",
       [&] {
         std::vector<KeptSample> s = samples_;
         s[5].data_file = 2;
         WriteRecord(Record(s));
       }},
      {"a missing data file",
       [&] {
         fs::remove(tier_ + "/data.1");
         WriteRecord(Record(samples_));
       }},
      {"a record that is a link",
       [&] {
         std::ofstream(outside + "/record", std::ios::binary) << Record(samples_);
         fs::create_symlink(outside + "/record", tier_ + "/" + std::string(kKeepRecordName));
       }},
      {"a corrupt record",
       [&] {
         std::string r = Record(samples_);
         r[r.size() / 2] ^= 1;
         WriteRecord(r);
       }},
      {"a kept area that is a link",
       [&] {
         fs::create_symlink(outside, user_ + "/kept");
         WriteRecord(Record(samples_));
       }},
      {"a tier directory that is a link",
       [&] {
         WriteRecord(Record(samples_));
         fs::rename(tier_, user_ + "/elsewhere");
         fs::create_symlink(user_ + "/elsewhere", tier_);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    fs::remove_all(user_);
    fs::remove(outside + "/second");
    fs::remove(outside + "/record");
    fs::create_directories(tier_);
    MakeTier();
    c.make();
    Result<FinishResult> f = Finish();
    EXPECT_FALSE(f.ok() && f->found && !f->key.empty() && f->samples > 0) << "kept";
    if (!f.ok()) {
      EXPECT_FALSE(f.status().message().empty());
    }
    if (fs::is_directory(user_ + "/kept") && !fs::is_symlink(user_ + "/kept")) {
      ExpectNothingKept();
    }
    EXPECT_EQ(ReadAll(outside + "/secret"), std::string(3 * 8192, 's'));
    EXPECT_EQ(
        std::distance(fs::directory_iterator(outside), fs::directory_iterator()),
        std::ptrdiff_t(1 + fs::exists(outside + "/second") + fs::exists(outside + "/record")));
  }
}

// A finish killed after each of its changes on disk (the epilog's own SIGKILL, a node crash):
// never a complete entry but after the last rename, and an older entry of the key is never
// replaced by a part of one.
TEST_F(FinishTest, KilledAtEveryStepLeavesNothingTrusted) {
  // mkdir, two data files moved, index, MANIFEST: five points before the rename into place.
  for (uint32_t step = 1; step <= 5; ++step) {
    SCOPED_TRACE(step);
    fs::remove_all(user_);
    fs::create_directories(tier_);
    MakeTier();
    WriteRecord(Record(samples_));
    Result<FinishResult> f = Finish(0, step);
    ASSERT_FALSE(f.ok());
    EXPECT_NE(f.status().message().find("abandoned"), std::string::npos);
    EXPECT_TRUE(Complete().empty());
    Result<std::vector<KeptDataset>> l = ListKept(user_ + "/kept");
    ASSERT_TRUE(l.ok());
    ASSERT_EQ(l->size(), 1u);
    EXPECT_EQ((*l)[0].key, ".tmp.finish.7.0");
    // The next finish (a prolog cleaning up after the job) starts over from what is left: the
    // incomplete entry goes, and whatever is still whole is kept or nothing is.
    Result<FinishResult> again = Finish();
    if (again.ok() && again->found) {
      EXPECT_EQ(VerifiedSamples(), again->samples);
    } else {
      ExpectNothingKept();
    }
  }
  // Past the last step: complete.
  fs::remove_all(user_);
  fs::create_directories(tier_);
  MakeTier();
  WriteRecord(Record(samples_));
  Result<FinishResult> f = Finish(0, 6);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(VerifiedSamples(), 6u);
}

// nopfsd killed in the middle of a commit leaves its temporary file beside the last whole record:
// the finish uses the whole one and ignores the other.
TEST_F(FinishTest, ACommitCutShortLeavesTheLastWholeRecord) {
  std::vector<KeptSample> first(samples_.begin(), samples_.begin() + 2);
  WriteRecord(Record(first));
  const std::string next = Record(samples_);
  for (size_t n : {size_t{0}, size_t{1}, next.size() / 2, next.size() - 1}) {
    std::ofstream(tier_ + "/.tmp." + std::string(kKeepRecordName), std::ios::binary)
        << next.substr(0, n);
  }
  Result<FinishResult> f = Finish();
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->samples, 2u);
  EXPECT_EQ(VerifiedSamples(), 2u);
}

}  // namespace
}  // namespace nopfs::kept
