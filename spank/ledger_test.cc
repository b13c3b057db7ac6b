#include "spank/ledger.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "spank/job_files.h"

namespace nopfs::spank {
namespace {

using namespace std::chrono_literals;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-ledger-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/ledger";
  }
  void TearDown() override { ASSERT_TRUE(RemoveBelow("/tmp", root_.substr(5)).ok()); }
  std::string root_;
  std::string dir_;
};

LedgerEntry Entry(uint64_t job, uint64_t ram) {
  LedgerEntry e;
  e.job_id = job;
  e.uid = 1000;
  e.node_index = 2;
  e.ram = ram;
  e.ssd = ram * 10;
  e.boot_id = BootId();
  e.pid = ::getpid();
  e.start_time = ProcessStartTime(::getpid()).value_or(0);
  return e;
}

// Sum of the RAM of every entry (UINT64_MAX when the ledger cannot be read).
uint64_t ReservedRam(const Ledger& l) {
  Result<std::vector<LedgerEntry>> entries = l.Entries();
  if (!entries.ok()) return UINT64_MAX;
  const std::vector<LedgerEntry> list = std::move(*entries);
  uint64_t used = 0;
  for (const LedgerEntry& e : list)
    used += e.ram;
  return used;
}

TEST_F(LedgerTest, EntriesRoundTripAndMalformedFilesAreDropped) {
  Result<Ledger> l = Ledger::Lock(dir_, 1s);
  ASSERT_TRUE(l.ok()) << l.status().message();
  struct stat st {};
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_TRUE(l->Put(Entry(7, 100)).ok());
  ASSERT_TRUE(l->Put(Entry(8, 200)).ok());
  ASSERT_TRUE(l->Put(Entry(8, 300)).ok());  // replaces
  std::ofstream(dir_ + "/9") << "job=9\nram=oops\n";
  Result<std::vector<LedgerEntry>> e = l->Entries();
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e->size(), 2u);
  uint64_t total = 0;
  for (const LedgerEntry& x : *e) {
    total += x.ram;
    EXPECT_EQ(x.node_index, 2u);
    EXPECT_EQ(x.boot_id, BootId());
    EXPECT_TRUE(IsProcessAlive(static_cast<pid_t>(x.pid), x.start_time));
  }
  EXPECT_EQ(total, 400u);
  EXPECT_NE(::access((dir_ + "/9").c_str(), F_OK), 0) << "malformed entry kept";
  ASSERT_TRUE(l->Remove(7).ok());
  ASSERT_TRUE(l->Remove(7).ok());  // idempotent
  Result<std::vector<LedgerEntry>> after = l->Entries();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size(), 1u);
  EXPECT_FALSE(ParseEntry("job=1\n").ok());
}

// The epilog tears a job down from its entry alone (no node config): the SSD paths recorded at
// admission come back, and an entry without them (an older launcher's) still parses.
TEST_F(LedgerTest, EntryKeepsTheSsdPaths) {
  LedgerEntry e = Entry(11, 100);
  e.ssd_paths = {"/nvme0/nopfs", "/nvme1/nopfs", "bad\npath"};
  Result<LedgerEntry> back = ParseEntry(FormatEntry(e));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ssd_paths, (std::vector<std::string>{"/nvme0/nopfs", "/nvme1/nopfs"}));
  e.ssd_paths.clear();
  back = ParseEntry(FormatEntry(e));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->ssd_paths.empty());
  EXPECT_FALSE(ParseEntry(FormatEntry(e) + "ssd_path=\n").ok());
}

// ... and so does the metrics directory, whose file the epilog removes without the config.
TEST_F(LedgerTest, EntryKeepsTheMetricsDirectory) {
  LedgerEntry e = Entry(12, 100);
  e.metrics_dir = "/var/lib/node_exporter/textfile";
  Result<LedgerEntry> back = ParseEntry(FormatEntry(e));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->metrics_dir, "/var/lib/node_exporter/textfile");
  e.metrics_dir.clear();
  back = ParseEntry(FormatEntry(e));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->metrics_dir.empty());
  EXPECT_FALSE(ParseEntry(FormatEntry(e) + "metrics_dir=\n").ok());
  e.metrics_dir = "bad\ndir";  // never recorded
  back = ParseEntry(FormatEntry(e));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->metrics_dir.empty());
}

// ... and so does the keep grant, within which the epilog keeps from a killed nopfsd's record;
// an entry without one keeps nothing.
TEST_F(LedgerTest, EntryKeepsTheKeepGrant) {
  LedgerEntry e = Entry(13, 100);
  Result<LedgerEntry> back = ParseEntry(FormatEntry(e));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_FALSE(back->keep);
  e.keep = true;
  e.keep_max_bytes = 50'000'000;
  e.keep_dataset = "/pfs/imagenet/train";
  back = ParseEntry(FormatEntry(e));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->keep);
  EXPECT_EQ(back->keep_max_bytes, 50'000'000u);
  EXPECT_EQ(back->keep_dataset, "/pfs/imagenet/train");
  e.keep_dataset = "bad\npath";  // never recorded
  back = ParseEntry(FormatEntry(e));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->keep_dataset.empty());
  EXPECT_FALSE(ParseEntry(FormatEntry(e) + "keep=2\n").ok());
  EXPECT_FALSE(ParseEntry(FormatEntry(e) + "keep_dataset=\n").ok());
}

// ... and the dataset its tiers serve to its user's other jobs, for placement's marks.
TEST_F(LedgerTest, EntryKeepsTheSiblingDataset) {
  LedgerEntry e = Entry(14, 100);
  Result<LedgerEntry> back = ParseEntry(FormatEntry(e));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->sibling_dataset.empty());
  e.sibling_dataset = "/pfs/imagenet/train";
  back = ParseEntry(FormatEntry(e));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->sibling_dataset, "/pfs/imagenet/train");
  e.sibling_dataset = "bad\npath";  // never recorded
  back = ParseEntry(FormatEntry(e));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->sibling_dataset.empty());
  EXPECT_FALSE(ParseEntry(FormatEntry(e) + "sibling_dataset=\n").ok());
}

// An entry a newer launcher wrote, with a key this version does not know, is read by this one
// (after a downgrade) as the entry it is: its reservation counts, its job's epilog finds it, and
// a rewrite keeps the unknown line as it was. What is neither a known key nor a key's form is
// still corruption, and removed.
TEST_F(LedgerTest, AnUnknownKeySurvivesAReadAndARewrite) {
  Result<Ledger> l = Ledger::Lock(dir_, 1s);
  ASSERT_TRUE(l.ok()) << l.status().message();
  const LedgerEntry base = Entry(21, 700);
  std::ofstream(dir_ + "/21") << FormatEntry(base)
                              << "gpu_bytes=123\nfuture_dataset=/pfs/a=b c\nempty_later=\n";
  Result<std::vector<LedgerEntry>> e = l->Entries();
  ASSERT_TRUE(e.ok()) << e.status().message();
  ASSERT_EQ(e->size(), 1u) << "a newer launcher's entry was dropped";
  EXPECT_EQ(ReservedRam(*l), 700u);
  LedgerEntry back = (*e)[0];
  EXPECT_EQ(back.job_id, 21u);
  EXPECT_EQ(back.unknown, (std::vector<std::string>{"gpu_bytes=123", "future_dataset=/pfs/a=b c",
                                                    "empty_later="}));
  // The launcher's own rewrite (nopfsd's pid) keeps them.
  back.pid = ::getpid();
  ASSERT_TRUE(l->Put(back).ok());
  const std::string text = ReadText(dir_ + "/21");
  EXPECT_NE(text.find("\ngpu_bytes=123\nfuture_dataset=/pfs/a=b c\nempty_later=\n"),
            std::string::npos)
      << text;
  Result<LedgerEntry> again = ParseEntry(text);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->unknown, back.unknown);
  // Not a key's form: corruption, as before; a known key keeps its checks.
  for (const char* bad :
       {"Gpu=1\n", "=1\n", "gpu bytes=1\n", "noequals\n", "ram=oops\n", "sibling_dataset=\n"}) {
    EXPECT_FALSE(ParseEntry(FormatEntry(base) + bad).ok()) << bad;
  }
  std::ofstream(dir_ + "/22") << FormatEntry(Entry(22, 5)) << "Bad Key=1\n";
  e = l->Entries();
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->size(), 1u);
  EXPECT_NE(::access((dir_ + "/22").c_str(), F_OK), 0) << "malformed entry kept";
  // A line this version's code holds can never become two lines (nor one of a known key's).
  LedgerEntry forged = base;
  forged.unknown = {"x=1\nuid=0", "uid=0"};
  Result<LedgerEntry> parsed = ParseEntry(FormatEntry(forged));
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->uid, base.uid);
}

TEST_F(LedgerTest, LockExcludesOtherProcessesAndTimesOut) {
  Result<Ledger> l = Ledger::Lock(dir_, 1s);
  ASSERT_TRUE(l.ok());
  const pid_t child = ::fork();
  if (child == 0) {
    Result<Ledger> other = Ledger::Lock(dir_, 100ms);
    _exit(!other.ok() && other.status().code() == StatusCode::kTimedOut ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Many processes race to reserve from one capacity; the sum never exceeds it.
TEST_F(LedgerTest, ConcurrentReservationsNeverExceedCapacity) {
  constexpr uint64_t kCapacity = 1000;
  constexpr int kProcs = 12;
  ASSERT_TRUE(Ledger::Lock(dir_, 1s).ok());
  std::vector<pid_t> kids;
  for (int i = 0; i < kProcs; ++i) {
    const pid_t p = ::fork();
    if (p == 0) {
      Result<Ledger> l = Ledger::Lock(dir_, 10s);
      if (!l.ok()) _exit(2);
      const uint64_t used = ReservedRam(*l);
      const uint64_t want = 150;
      if (used + want <= kCapacity) {
        ::usleep(2000);  // widen the window a missing lock would leave open
        if (!l->Put(Entry(100 + static_cast<uint64_t>(i), want)).ok()) _exit(3);
      }
      _exit(0);
    }
    kids.push_back(p);
  }
  for (pid_t p : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(p, &status, 0), p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  Result<Ledger> l = Ledger::Lock(dir_, 1s);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(ReservedRam(*l), 900u);  // six of 150 fit in 1000, the others saw it full
}

TEST_F(LedgerTest, DeadProcessIsNotAlive) {
  const pid_t p = ::fork();
  if (p == 0) _exit(0);
  const std::optional<uint64_t> start = ProcessStartTime(p);
  int status = 0;
  ::waitpid(p, &status, 0);
  EXPECT_FALSE(IsProcessAlive(p, start.value_or(0)));
  EXPECT_TRUE(IsProcessAlive(::getpid(), ProcessStartTime(::getpid()).value_or(1)));
  EXPECT_FALSE(IsProcessAlive(::getpid(), ProcessStartTime(::getpid()).value_or(1) + 1));
}

TEST_F(LedgerTest, RemoveBelowNeverFollowsLinks) {
  const std::string outside = root_ + "/outside";
  ASSERT_EQ(::mkdir(outside.c_str(), 0700), 0);
  std::ofstream(outside + "/precious") << "keep";
  const std::string job = root_ + "/job";
  ASSERT_EQ(::mkdir(job.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((job + "/sub").c_str(), 0700), 0);
  std::ofstream(job + "/sub/file") << "x";
  ASSERT_EQ(::symlink(outside.c_str(), (job + "/link").c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (root_ + "/job2").c_str()), 0);
  ASSERT_TRUE(RemoveBelow(root_, "job").ok());
  ASSERT_TRUE(RemoveBelow(root_, "job2").ok());  // the link itself goes, not its target
  ASSERT_TRUE(RemoveBelow(root_, "job").ok());   // idempotent
  EXPECT_NE(::access(job.c_str(), F_OK), 0);
  EXPECT_EQ(ReadText(outside + "/precious"), "keep");
  EXPECT_FALSE(RemoveBelow(root_, "..").ok());
  EXPECT_FALSE(RemoveBelow(root_, "a/b").ok());
}

TEST_F(LedgerTest, UserDirRemovalChecksOwnerAndLinks) {
  const std::string outside = root_ + "/outside";
  ASSERT_EQ(::mkdir(outside.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((outside + "/7.0").c_str(), 0700), 0);
  // A user dir that is a link to elsewhere is refused, and its target kept.
  ASSERT_EQ(::symlink(outside.c_str(), (root_ + "/nopfs-1").c_str()), 0);
  EXPECT_FALSE(RemoveBelowUserDir(root_, "nopfs-1", ::getuid(), "7.0").ok());
  EXPECT_EQ(::access((outside + "/7.0").c_str(), F_OK), 0);
  // A user dir of another owner is refused.
  EXPECT_FALSE(RemoveBelowUserDir(root_, "outside", ::getuid() + 1, "7.0").ok());
  EXPECT_EQ(::access((outside + "/7.0").c_str(), F_OK), 0);
  // The real thing: the job dir goes, and the user dir with it once empty.
  ASSERT_EQ(::mkdir((root_ + "/nopfs-2").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((root_ + "/nopfs-2/7.0").c_str(), 0700), 0);
  std::ofstream(root_ + "/nopfs-2/7.0/data.0") << "x";
  ASSERT_TRUE(RemoveBelowUserDir(root_, "nopfs-2", ::getuid(), "7.0").ok());
  EXPECT_NE(::access((root_ + "/nopfs-2").c_str(), F_OK), 0);
  EXPECT_TRUE(RemoveBelowUserDir(root_, "nopfs-2", ::getuid(), "7.0").ok());  // idempotent
}

TEST_F(LedgerTest, WriteFileAsReplacesAPlantedLink) {
  const std::string target = root_ + "/target";
  std::ofstream(target) << "precious";
  ASSERT_EQ(::symlink(target.c_str(), (root_ + "/failed").c_str()), 0);
  ASSERT_EQ(::link(target.c_str(), (root_ + "/refused").c_str()), 0);
  ASSERT_TRUE(WriteFileAs(root_, "failed", "why\n", ::getuid(), ::getgid()).ok());
  ASSERT_TRUE(WriteFileAs(root_, "refused", "why\n", ::getuid(), ::getgid()).ok());
  EXPECT_EQ(ReadText(target), "precious");
  EXPECT_EQ(ReadText(root_ + "/failed"), "why\n");
  EXPECT_EQ(ReadText(root_ + "/refused"), "why\n");
}

}  // namespace
}  // namespace nopfs::spank
