// Daemon with a real dataset on disk, a real config file and the real client library: the bounds
// on what one job's clients can make nopfsd allocate (docs/security.md).
#include "service/daemon/daemon.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "share/silent_service.h"

namespace nopfs::service {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kSamples = 400;

std::string Bytes(uint32_t i) {
  return std::string(100 + (i * 53) % 900, static_cast<char>('a' + i % 26));
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-daemon-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/data/c0");
    for (uint32_t i = 0; i < kSamples; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "/data/c0/s%04u.bin", i);
      std::ofstream(dir_ + name) << Bytes(i);
    }
    ASSERT_EQ(::mkdir((dir_ + "/run").c_str(), 0700), 0);
    std::ofstream(dir_ + "/node.lua") << "staging = { capacity = \"4M\", threads = 1 }\n"
                                         "classes = { ram { capacity = \"1M\", threads = 1 } }\n"
                                         "limits = { streams_per_rank = 3 }\n";
  }
  void TearDown() override {
    if (daemon_) daemon_->Stop();
    std::filesystem::remove_all(dir_);
  }
  void StartDaemon(uint32_t epochs = 1) {
    DaemonOptions o;
    o.run_dir = dir_ + "/run";
    o.dataset = dir_ + "/data";
    o.config_path = dir_ + "/node.lua";
    o.job.seed = 7;
    o.job.epochs = epochs;
    o.job.ranks = 2;
    o.job.ranks_per_node = 2;
    o.job.batch = 2;
    o.plan_threads = 1;
    o.uid = static_cast<uint32_t>(::getuid());
    if (!shared_socket_.empty()) {
      o.shared_socket = shared_socket_;
      o.shared_dataset = o.dataset;
    }
    Result<std::unique_ptr<Daemon>> d = Daemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
  }
  // Reads `n` samples (all that are left when n = UINT64_MAX) and checks each against its file.
  uint64_t ReadChecked(client::Stream* s, uint64_t n) {
    uint64_t got = 0;
    for (; got < n; ++got) {
      auto r = s->Next(10s);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok() || !r->has_value()) break;
      const client::Sample& x = **r;
      const std::string want = Bytes(x.sample_id);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(x.data), x.size), want)
          << "sample " << x.sample_id;
      EXPECT_TRUE(s->Release(x).ok());
    }
    return got;
  }

  std::string dir_;
  std::string shared_socket_;  // the node's share service: the dataset is its shared directory
  std::unique_ptr<Daemon> daemon_;
};

// A share service that does not answer (its PFS hangs while it fills a batch) would hold the
// reads asked of it for a minute each; the job's end does not wait for them: Stop returns well
// within the epilog's grace (10 s by default), and the job's teardown is whole.
TEST_F(DaemonTest, StopDoesNotWaitForAShareServiceThatDoesNotAnswer) {
  share::SilentService svc(dir_ + "/share.sock");
  ASSERT_TRUE(svc.ok());
  shared_socket_ = dir_ + "/share.sock";
  StartDaemon();
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (svc.unanswered() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  ASSERT_GT(svc.unanswered(), 0u) << "nopfsd asked the share service nothing";
  const auto t0 = std::chrono::steady_clock::now();
  daemon_->Stop();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 5s) << "Stop took "
                      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                      << " ms";
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/run/catalog"));
}

TEST_F(DaemonTest, StreamsPastTheLimitAreRefusedWhileTheRanksStreamGoesOn) {
  StartDaemon();
  const std::string sock = dir_ + "/run/nopfsd.sock";
  auto c = client::Client::Connect(sock);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto first = (*c)->Open(0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(ReadChecked(first->get(), 50), 50u);

  // The flood: one connection asks for rank 0's stream again and again.
  std::vector<std::unique_ptr<client::Stream>> more;
  uint64_t refused = 0;
  for (int i = 0; i < 500; ++i) {
    auto s = (*c)->Open(0);
    if (s.ok()) {
      more.push_back(std::move(*s));
      continue;
    }
    ++refused;
    EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(
        s.status().message().find("rank 0 already has 3 streams open, the most one rank may have"),
        std::string::npos)
        << s.status().ToString();
  }
  EXPECT_EQ(more.size(), 2u);
  EXPECT_EQ(refused, 498u);
  // Another rank's limit is its own.
  auto other = (*c)->Open(1);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  // The rank's first stream delivers every remaining sample, byte for byte.
  const uint64_t rest = ReadChecked(first->get(), UINT64_MAX);
  EXPECT_GT(rest, 0u);
  auto status = (*c)->StatusText();
  ASSERT_TRUE(status.ok());
  EXPECT_NE(status->find("limits: 3 streams per rank; refused 498 streams"), std::string::npos)
      << *status;
  // A stream closed frees its place.
  ASSERT_TRUE(more.back()->Close().ok());
  more.pop_back();
  auto again = (*c)->Open(0);
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

TEST_F(DaemonTest, AnotherOwnersOpenOfARankIsRefusedAndTheFirstReadsOn) {
  StartDaemon(/*epochs=*/2);
  auto c = client::Client::Connect(dir_ + "/run/nopfsd.sock");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  client::OpenOptions epoch0;
  epoch0.epochs = 1;
  auto first = (*c)->Open(0, epoch0);  // owned by this process (HELLO's pid)
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(ReadChecked(first->get(), 5), 5u);

  // Another process's stream of rank 0 in epoch 0 (a whole stream, or a worker share naming
  // another owner) waits for the first to close, then is refused.
  const uint32_t me = static_cast<uint32_t>(::getpid());
  client::OpenOptions other;
  other.owner_pid = me + 1;
  const auto t0 = std::chrono::steady_clock::now();
  auto refused = (*c)->Open(0, other);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1900));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("rank 0's stream is already open by pid " +
                                            std::to_string(me) +
                                            " (epoch 0); each process needs its own rank"),
            std::string::npos)
      << refused.status().ToString();
  // This process's worker shares, another epoch, another rank: accepted.
  client::OpenOptions share = epoch0;
  share.owner_pid = me;
  share.workers = 2;
  share.worker = 1;
  auto worker = (*c)->Open(0, share);
  EXPECT_TRUE(worker.ok()) << worker.status().ToString();
  client::OpenOptions epoch1 = other;
  epoch1.epoch = 1;
  auto next_epoch = (*c)->Open(0, epoch1);
  EXPECT_TRUE(next_epoch.ok()) << next_epoch.status().ToString();
  auto rank1 = (*c)->Open(1, other);
  EXPECT_TRUE(rank1.ok()) << rank1.status().ToString();
  auto status = (*c)->StatusText();
  ASSERT_TRUE(status.ok());
  EXPECT_NE(status->find("owners: refused 1 opens of a rank another process had open"),
            std::string::npos)
      << *status;
  // The first stream reads on, byte for byte; once this process's streams of epoch 0 are
  // closed, another process may read the rank's epoch 0 (a restart).
  EXPECT_GT(ReadChecked(first->get(), UINT64_MAX), 0u);
  ASSERT_TRUE((*first)->Close().ok());
  ASSERT_TRUE((*worker)->Close().ok());
  auto restarted = (*c)->Open(0, other);
  EXPECT_TRUE(restarted.ok()) << restarted.status().ToString();
}

// A stream per epoch on one connection, closed mid-epoch or at its end, the next opened at once
// (its ring is the one made ahead, the last one's is freed on nopfsd's ring thread): every epoch
// delivers the rank's samples, each once, byte for byte, in copy mode (the ring's arena written
// and freed) and zero copy alike; the daemon stops with closes still queued.
TEST_F(DaemonTest, AStreamPerEpochOnOneConnectionDeliversEveryEpoch) {
  constexpr uint32_t kEpochs = 6;
  StartDaemon(kEpochs);
  auto c = client::Client::Connect(dir_ + "/run/nopfsd.sock");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (uint32_t epoch = 0; epoch < kEpochs; ++epoch) {
    client::OpenOptions o;
    o.epoch = epoch;
    o.epochs = 1;
    o.zero_copy = epoch % 2 == 1;
    auto s = (*c)->Open(0, o);
    ASSERT_TRUE(s.ok()) << "epoch " << epoch << ": " << s.status().ToString();
    if (epoch == 2) {  // left early: closed with samples staged and unread
      EXPECT_EQ(ReadChecked(s->get(), 10), 10u);
      ASSERT_TRUE((*s)->Close().ok());
      continue;
    }
    std::vector<int> seen(kSamples, 0);
    uint64_t got = 0;
    for (;;) {
      auto r = (*s)->Next(10s);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (!r->has_value()) break;
      const client::Sample& x = **r;
      ASSERT_LT(x.sample_id, kSamples);
      ++seen[x.sample_id];
      EXPECT_EQ(x.epoch, epoch);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(x.data), x.size), Bytes(x.sample_id))
          << "epoch " << epoch << " sample " << x.sample_id;
      ASSERT_TRUE((*s)->Release(x).ok());
      ++got;
    }
    EXPECT_EQ(got, kSamples / 2) << "epoch " << epoch;  // rank 0 of 2
    for (uint32_t i = 0; i < kSamples; ++i)
      EXPECT_LE(seen[i], 1) << "epoch " << epoch << " sample " << i;
    ASSERT_TRUE((*s)->Close().ok());
  }
  // Closed and not yet freed, perhaps: Stop frees them before the tiers go.
  auto last = (*c)->Open(1);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(ReadChecked(last->get(), 20), 20u);
  ASSERT_TRUE((*last)->Close().ok());
  daemon_->Stop();
}

}  // namespace
}  // namespace nopfs::service
