// The files nopfsd writes on the node (the run directory's pid, ready and plan files, its log, the
// metrics file) on a disk that fails under them, through FaultInjectionLocalIo: a file a reader
// trusts is written whole or not at all, a start file that cannot be written is a start failure
// that names it, and the log and the metrics file cost the job nothing but a warning.
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "client/client.h"
#include "launch/run_files.h"
#include "service/daemon/daemon.h"
#include "service/daemon/log_file.h"
#include "service/daemon/metrics.h"
#include "service/daemon/run_dir.h"
#include "service/env/local_io.h"

namespace nopfs::service {
namespace {

using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

// The names in `dir`, sorted.
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

class RunDirFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-rundir-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  FaultInjectionLocalIo io_{LocalIo::Default()};
};

// One way for the disk to fail, set on io.
struct Fault {
  const char* what;
  void (*set)(FaultInjectionLocalIo* io);
  const char* error;  // strerror's text, in the message
};

const Fault kFaults[] = {
    {"full at once", [](FaultInjectionLocalIo* io) { io->FailWrites(ENOSPC); },
     "No space left on device"},
    {"full after 3 bytes (a short write, then ENOSPC)",
     [](FaultInjectionLocalIo* io) { io->FailWrites(ENOSPC, 3); }, "No space left on device"},
    {"EIO after 2 bytes, writes halved",
     [](FaultInjectionLocalIo* io) {
       io->ShortWrites(true);
       io->FailWrites(EIO, 2);
     },
     "Input/output error"},
    {"the file cannot be created", [](FaultInjectionLocalIo* io) { io->FailOpen(ENOSPC); },
     "No space left on device"},
    {"the rename fails", [](FaultInjectionLocalIo* io) { io->FailRename(EIO); },
     "Input/output error"},
};

TEST_F(RunDirFaultTest, EachStartFileIsWrittenWholeOrNotAtAllAndItsFailureNamesIt) {
  const std::string ready = launch::FormatReady({4242, 1281167, 0, false, {}});
  const std::pair<const char*, std::string> files[] = {
      {launch::kPidName, "4242\n"},
      {launch::kReadyName, ready},
      {kPlanName, "nopfs: plan: 1281167 samples, RAM 64 GB, SSD 1.5 TB\n"}};
  for (const auto& [name, text] : files) {
    const std::string path = dir_ + "/" + name;
    for (const Fault& f : kFaults) {
      SCOPED_TRACE(std::string(name) + ", " + f.what);
      // No previous file: none appears.
      f.set(&io_);
      Status s = WriteFileAtomically(dir_, name, text, &io_);
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.message().find(path + " "), std::string::npos) << s.message();
      EXPECT_NE(s.message().find(f.error), std::string::npos) << s.message();
      EXPECT_FALSE(Exists(path));
      EXPECT_TRUE(Names(dir_).empty()) << "left behind: " << Names(dir_).front();
      // A previous file stays whole.
      io_.ClearFaults();
      ASSERT_TRUE(WriteFileAtomically(dir_, name, "previous\n", &io_).ok());
      f.set(&io_);
      EXPECT_FALSE(WriteFileAtomically(dir_, name, text, &io_).ok());
      EXPECT_EQ(Slurp(path), "previous\n");
      EXPECT_EQ(Names(dir_), std::vector<std::string>{name});
      io_.ClearFaults();
      ASSERT_EQ(::unlink(path.c_str()), 0);
    }
    // Writes that move half of what is asked each time still give the whole text.
    io_.ShortWrites(true);
    ASSERT_TRUE(WriteFileAtomically(dir_, name, text, &io_).ok());
    io_.ClearFaults();
    EXPECT_EQ(Slurp(path), text);
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ASSERT_EQ(::unlink(path.c_str()), 0);
  }
  // And the tasks parse the ready file written through short writes.
  io_.ShortWrites(true);
  ASSERT_TRUE(WriteFileAtomically(dir_, launch::kReadyName, ready, &io_).ok());
  io_.ClearFaults();
  Result<launch::ReadyInfo> info = launch::ParseReady(Slurp(dir_ + "/" + launch::kReadyName));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->pid, 4242);
  EXPECT_EQ(info->samples, 1281167u);
  EXPECT_GT(io_.failed_calls(), 0u);
}

TEST_F(RunDirFaultTest, AStaleFileThatCannotBeRemovedIsAStartFailureThatNamesIt) {
  std::ofstream(dir_ + "/" + launch::kReadyName) << "pid=1\nsamples=1\n";
  io_.FailUnlink(EIO);
  io_.OnlyPaths("/" + std::string(launch::kReadyName));
  const Status s = ClearStaleState(dir_, &io_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("removing " + dir_ + "/ready: Input/output error"), std::string::npos)
      << s.message();
  io_.ClearFaults();
  EXPECT_TRUE(ClearStaleState(dir_, &io_).ok());
  EXPECT_FALSE(Exists(dir_ + "/" + launch::kReadyName));
}

// --- the log ---

TEST_F(RunDirFaultTest, ALogThatCannotBeWrittenWarnsOnceAndLaterSaysWhatWasLost) {
  const std::string path = dir_ + "/" + launch::kLogName;
  std::vector<std::string> warnings;
  Result<std::shared_ptr<LogFileSink>> sink = LogFileSink::Open(
      path, &io_, [&](const std::string& w) { warnings.push_back(w); }, 1h);
  ASSERT_TRUE(sink.ok()) << sink.status().ToString();
  spdlog::logger log("nopfsd", *sink);
  log.set_pattern("%l: %v");
  log.info("before");
  // The disk fills part-way through a line: 1,000 lines are lost, with one warning.
  io_.FailWrites(ENOSPC, 4);
  for (int i = 0; i < 1000; ++i)
    log.info("line {}", i);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("cannot write the log " + path + ": No space left on device"),
            std::string::npos)
      << warnings[0];
  EXPECT_EQ((*sink)->lost_lines(), 1000u);
  // Space again: the next line says what was lost, on a line of its own.
  io_.ClearFaults();
  log.info("after");
  EXPECT_EQ(Slurp(path),
            "info: before\ninfo\n[nopfsd: 1000 log lines lost: No space left on device]\n"
            "info: after\n");
  // A second failure warns again.
  io_.FailWrites(EIO);
  log.warn("gone");
  EXPECT_EQ(warnings.size(), 2u);
  io_.ClearFaults();
}

TEST_F(RunDirFaultTest, ALogThatCannotBeOpenedIsAStartFailureThatNamesIt) {
  io_.FailOpen(EIO);
  const std::string path = dir_ + "/" + launch::kLogName;
  Result<std::shared_ptr<LogFileSink>> sink = LogFileSink::Open(path, &io_);
  ASSERT_FALSE(sink.ok());
  EXPECT_EQ(sink.status().message(), "opening the log " + path + ": Input/output error");
}

// --- the metrics file ---

report::StatusReport SomeReport(uint64_t samples) {
  report::StatusReport r;
  r.dataset_samples = samples;
  return r;
}

// Each metrics fault: what it does to the previous file (a whole text or none, never half).
struct MetricsFault {
  const char* what;
  void (*set)(FaultInjectionLocalIo*);
  const char* error;
  bool previous_stays;  // false: the file is left empty
};
const MetricsFault kMetricsFaults[] = {
    {"no space for the larger text", [](FaultInjectionLocalIo* io) { io->FailFallocate(ENOSPC); },
     "No space left on device", true},
    {"the file cannot be opened", [](FaultInjectionLocalIo* io) { io->FailOpen(EACCES); },
     "Permission denied", true},
    {"full at the first write", [](FaultInjectionLocalIo* io) { io->FailWrites(ENOSPC); },
     "No space left on device", false},
    {"EIO after 2 bytes, writes halved",
     [](FaultInjectionLocalIo* io) {
       io->ShortWrites(true);
       io->FailWrites(EIO, 2);
     },
     "Input/output error", false},
};

// A report whose text grows with `samples` (so that a rewrite needs more space).
report::StatusReport LargerReport(uint64_t samples) {
  report::StatusReport r = SomeReport(samples);
  r.pfs_bytes = samples * 1'000'000'007ULL;
  r.corrupt = samples * 3'000'000'017ULL;
  return r;
}

TEST_F(RunDirFaultTest, MetricsThatCannotBeWrittenLeaveAWholeTextOrNoneAndTheSameMessage) {
  MetricsWriter w(dir_, {"77", "alice", "n1"}, &io_);
  const std::string path = dir_ + "/nopfs_77.prom";
  ASSERT_EQ(w.path(), path);
  ASSERT_TRUE(w.Write(SomeReport(10)).ok());
  for (const MetricsFault& f : kMetricsFaults) {
    SCOPED_TRACE(f.what);
    io_.ClearFaults();
    ASSERT_TRUE(w.Write(SomeReport(10)).ok());
    const std::string first = Slurp(path);
    ASSERT_NE(first.find("slurm_job_id=\"77\""), std::string::npos);
    f.set(&io_);
    const Status a = w.Write(LargerReport(20'000'000'000ULL));
    const Status b = w.Write(LargerReport(20'000'000'000ULL));
    io_.ClearFaults();
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.message().find(path + ": " + f.error), std::string::npos) << a.message();
    // The same fault, the same words: the daemon logs it once, not every period.
    EXPECT_EQ(a.message(), b.message());
    EXPECT_EQ(Slurp(path), f.previous_stays ? first : "");
    // Nothing but the file itself: nopfsd makes no other name in the directory.
    EXPECT_EQ(Names(dir_), std::vector<std::string>{"nopfs_77.prom"});
  }
  io_.ShortWrites(true);
  ASSERT_TRUE(w.Write(SomeReport(40)).ok());
  io_.ClearFaults();
  EXPECT_EQ(Slurp(path), RenderMetrics(SomeReport(40), {"77", "alice", "n1"}));
  // A shorter text after a longer one: nothing of the longer one's tail is left.
  ASSERT_TRUE(w.Write(LargerReport(20'000'000'000ULL)).ok());
  ASSERT_TRUE(w.Write(SomeReport(1)).ok());
  EXPECT_EQ(Slurp(path), RenderMetrics(SomeReport(1), {"77", "alice", "n1"}));
}

// The file root made for the job is rewritten in place, its owner, inode and mode kept; a link
// under the name is never written through.
TEST_F(RunDirFaultTest, MetricsAreRewrittenInPlaceAndNeverThroughALink) {
  const std::string path = dir_ + "/nopfs_78.prom";
  { std::ofstream(path) << ""; }
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  MetricsWriter w(dir_, {"78", "alice", "n1"}, &io_);
  ASSERT_TRUE(w.Write(SomeReport(3)).ok());
  struct stat after {};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(after.st_mode & 07777, 0644u);  // readable by node_exporter
  EXPECT_EQ(Slurp(path), RenderMetrics(SomeReport(3), {"78", "alice", "n1"}));

  const std::string target = dir_ + "/target";
  { std::ofstream(target) << "untouched\n"; }
  ASSERT_EQ(::unlink(path.c_str()), 0);
  ASSERT_EQ(::symlink(target.c_str(), path.c_str()), 0);
  const Status s = w.Write(SomeReport(4));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("metrics: opening " + path), std::string::npos) << s.message();
  EXPECT_EQ(Slurp(target), "untouched\n");

  // In a directory others may write, nopfsd makes no file of its own (others could stand in for
  // it there); one made for it (by root, under Slurm) it rewrites.
  const std::string shared = dir_ + "/shared";
  ASSERT_EQ(::mkdir(shared.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  MetricsWriter in_shared(shared, {"80", "alice", "n1"}, &io_);
  const Status absent = in_shared.Write(SomeReport(5));
  EXPECT_EQ(absent.code(), StatusCode::kNotFound) << absent.ToString();
  EXPECT_NE(absent.message().find(shared + "/nopfs_80.prom does not exist"), std::string::npos)
      << absent.message();
  EXPECT_TRUE(Names(shared).empty());
  { std::ofstream(shared + "/nopfs_80.prom") << ""; }
  ASSERT_TRUE(in_shared.Write(SomeReport(5)).ok());
  EXPECT_EQ(Slurp(shared + "/nopfs_80.prom"), RenderMetrics(SomeReport(5), {"80", "alice", "n1"}));
}

// No reader ever opens half a text: while nopfsd writes (slowly here), an open(2) waits for the
// whole new text; a reader that keeps the file open is waited for, then costs one period.
TEST_F(RunDirFaultTest, AReaderOpensTheOldTextOrTheNewOneNeverAMix) {
  MetricsWriter w(dir_, {"79", "alice", "n1"}, &io_);
  const std::string path = dir_ + "/nopfs_79.prom";
  ASSERT_TRUE(w.Write(SomeReport(5)).ok());
  const std::string old_text = Slurp(path);
  const std::string new_text = RenderMetrics(LargerReport(123'456'789), {"79", "alice", "n1"});
  io_.ShortWrites(true);                        // many writes...
  io_.SetDelay(std::chrono::milliseconds(20));  // ...each slow: the rewrite takes a while
  Status written;
  std::thread writer([&] { written = w.Write(LargerReport(123'456'789)); });
  std::vector<std::string> seen;
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    seen.push_back(Slurp(path));
  }
  writer.join();
  io_.ClearFaults();
  ASSERT_TRUE(written.ok()) << written.ToString();
  int news = 0;
  for (const std::string& text : seen) {
    EXPECT_TRUE(text == old_text || text == new_text) << text.size() << " bytes:\n" << text;
    news += text == new_text ? 1 : 0;
  }
  EXPECT_GT(news, 0);  // the later opens waited for the rewrite, then read it whole

  // A reader that holds the file open: the rewrite waits for it, then gives up this period.
  const int held = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  const Status busy = w.Write(SomeReport(6));
  EXPECT_EQ(busy.code(), StatusCode::kUnavailable) << busy.ToString();
  EXPECT_NE(busy.message().find(path + " stays open in another process"), std::string::npos)
      << busy.message();
  EXPECT_EQ(Slurp(path), new_text);
  ::close(held);
  ASSERT_TRUE(w.Write(SomeReport(6)).ok());
  EXPECT_EQ(Slurp(path), RenderMetrics(SomeReport(6), {"79", "alice", "n1"}));
}

// Two writers of one file (two nodes' nopfsd under one metrics directory, as on a test cluster
// that runs its nodes on one host) take turns: neither locks the other out of its lease, so each
// rewrite lands and the file always holds one whole text.
TEST_F(RunDirFaultTest, TwoWritersOfOneFileTakeTurns) {
  const std::string path = dir_ + "/nopfs_81.prom";
  { std::ofstream(path) << ""; }
  MetricsWriter n1(dir_, {"81", "alice", "n1"});
  MetricsWriter n3(dir_, {"81", "alice", "n3"});
  constexpr int kWrites = 200;
  std::atomic<int> failed{0};
  std::string failure;
  std::mutex failure_mu;
  auto write_all = [&](MetricsWriter* w) {
    for (int i = 0; i < kWrites; ++i) {
      const Status s = w->Write(SomeReport(static_cast<uint64_t>(i)));
      if (!s.ok()) {
        failed.fetch_add(1);
        std::lock_guard<std::mutex> lock(failure_mu);
        failure = s.ToString();
      }
    }
  };
  std::thread a(write_all, &n1);
  std::thread b(write_all, &n3);
  a.join();
  b.join();
  EXPECT_EQ(failed.load(), 0) << failure;
  const std::string last = Slurp(path);
  EXPECT_TRUE(last == RenderMetrics(SomeReport(kWrites - 1), {"81", "alice", "n1"}) ||
              last == RenderMetrics(SomeReport(kWrites - 1), {"81", "alice", "n3"}))
      << last;
}

// --- the daemon ---

constexpr uint32_t kSamples = 60;

std::string Bytes(uint32_t i) {
  return std::string(100 + (i * 53) % 900, static_cast<char>('a' + i % 26));
}

class DaemonFaultTest : public RunDirFaultTest {
 protected:
  void SetUp() override {
    RunDirFaultTest::SetUp();
    std::filesystem::create_directories(dir_ + "/data/c0");
    for (uint32_t i = 0; i < kSamples; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "/data/c0/s%04u.bin", i);
      std::ofstream(dir_ + name) << Bytes(i);
    }
    ASSERT_EQ(::mkdir((dir_ + "/run").c_str(), 0700), 0);
    ASSERT_EQ(::mkdir((dir_ + "/metrics").c_str(), 0755), 0);
    std::ofstream(dir_ + "/node.lua") << "staging = { capacity = \"4M\", threads = 1 }\n"
                                         "classes = { ram { capacity = \"1M\", threads = 1 } }\n"
                                         "metrics_dir = \""
                                      << dir_ << "/metrics\"\n";
  }
  DaemonOptions Options() {
    DaemonOptions o;
    o.run_dir = dir_ + "/run";
    o.dataset = dir_ + "/data";
    o.config_path = dir_ + "/node.lua";
    o.job_id = "88";
    o.job.seed = 7;
    o.job.epochs = 1;
    o.job.ranks = 1;
    o.job.ranks_per_node = 1;
    o.job.batch = 2;
    o.plan_threads = 1;
    o.uid = static_cast<uint32_t>(::getuid());
    o.local_io = &io_;
    return o;
  }
};

TEST_F(DaemonFaultTest, APlanFileThatCannotBeWrittenIsAStartFailureThatNamesIt) {
  for (const Fault& f : kFaults) {
    SCOPED_TRACE(f.what);
    io_.OnlyPaths(dir_ + "/run/.plan");
    f.set(&io_);
    Result<std::unique_ptr<Daemon>> d = Daemon::Start(Options());
    io_.ClearFaults();
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find(dir_ + "/run/plan "), std::string::npos)
        << d.status().message();
    EXPECT_NE(d.status().message().find(f.error), std::string::npos) << d.status().message();
    EXPECT_FALSE(Exists(dir_ + "/run/plan"));
    EXPECT_FALSE(Exists(dir_ + "/run/.plan.tmp"));
  }
  // The same directory on a sound disk: the daemon starts and writes the plan.
  io_.OnlyPaths("");
  Result<std::unique_ptr<Daemon>> d = Daemon::Start(Options());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_NE(Slurp(dir_ + "/run/plan").find("nopfs"), std::string::npos);
  (*d)->Stop();
  EXPECT_FALSE(Exists(dir_ + "/run/plan"));
}

TEST_F(DaemonFaultTest, AMetricsDirectoryThatFailsCostsTheJobOneWarningAndNoByte) {
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", ring));
  io_.OnlyPaths(dir_ + "/metrics/");
  io_.FailWrites(ENOSPC, 100);  // part of the first file, then a full disk
  Result<std::unique_ptr<Daemon>> d = Daemon::Start(Options());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  {
    auto c = client::Client::Connect(dir_ + "/run/nopfsd.sock");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto s = (*c)->Open(0);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    uint64_t got = 0;
    for (;;) {
      auto r = (*s)->Next(10s);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (!r->has_value()) break;
      const client::Sample& x = **r;
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(x.data), x.size), Bytes(x.sample_id));
      ASSERT_TRUE((*s)->Release(x).ok());
      ++got;
    }
    EXPECT_EQ(got, kSamples);
  }
  // What the full disk left: an empty file (no series), never half a text.
  EXPECT_EQ(Names(dir_ + "/metrics"), std::vector<std::string>{"nopfs_88.prom"});
  EXPECT_EQ(Slurp(dir_ + "/metrics/nopfs_88.prom"), "");
  (*d)->Stop();  // writes the metrics once more: the same fault, no second warning
  spdlog::set_default_logger(previous);
  int warnings = 0;
  for (const std::string& line : ring->last_formatted()) {
    if (line.find("metrics: writing " + dir_ + "/metrics/nopfs_88.prom: No space left") !=
        std::string::npos) {
      ++warnings;
      EXPECT_NE(line.find("the job goes on without metrics"), std::string::npos) << line;
    }
  }
  EXPECT_EQ(warnings, 1);
  // nopfsd made that file (a directory of its user's own, as `nopfs run`'s): it goes with it.
  EXPECT_EQ(Names(dir_ + "/metrics"), std::vector<std::string>{});
  EXPECT_GT(io_.failed_calls(), 0u);
}

}  // namespace
}  // namespace nopfs::service
