// The client's batch calls (Stream::NextBatch, ReleaseBatch, FillBatch and their C API) against a
// real nopfsd (service::Daemon) serving real files: the bytes equal the files and the order is the
// stream's, whatever the batch size, the ring's size or the buffer's.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/nopfs_client.h"
#include "service/daemon/daemon.h"

namespace nopfs::client {
namespace {

using namespace std::chrono_literals;

// 120 samples of 64-128 KiB (about 11 MiB): more than the smallest ring nopfsd makes (4 MiB),
// and more samples than its slots (twice the ring over the mean size).
constexpr uint32_t kSamples = 120;

std::string Bytes(uint32_t i) {
  std::string s((64u << 10) + (i * 4099u) % (64u << 10), '\0');
  for (size_t k = 0; k < s.size(); ++k)
    s[k] = static_cast<char>((i * 131u + k * 7u + (k >> 9)) & 0xff);
  return s;
}

class BatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-batch-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ + "/data/c0");
    for (uint32_t i = 0; i < kSamples; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "/data/c0/s%04u.bin", i);
      std::ofstream(dir_ + name, std::ios::binary) << Bytes(i);
    }
    ASSERT_EQ(::mkdir((dir_ + "/run").c_str(), 0700), 0);
    std::ofstream(dir_ + "/node.lua") << "staging = { capacity = \"4M\", threads = 2 }\n"
                                         "classes = { ram { capacity = \"4M\", threads = 1 } }\n";
    service::DaemonOptions o;
    o.run_dir = dir_ + "/run";
    o.dataset = dir_ + "/data";
    o.config_path = dir_ + "/node.lua";
    o.job.seed = 11;
    o.job.epochs = 1;
    o.job.ranks = 1;
    o.job.ranks_per_node = 1;
    o.job.batch = 8;
    o.plan_threads = 1;
    o.uid = static_cast<uint32_t>(::getuid());
    Result<std::unique_ptr<service::Daemon>> d = service::Daemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
    auto c = Client::Connect(socket());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
    // The stream's order, read one sample at a time.
    auto s = client_->Open(0);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (;;) {
      auto x = (*s)->Next(10s);
      ASSERT_TRUE(x.ok()) << x.status().ToString();
      if (!x->has_value()) break;
      order_.push_back((*x)->sample_id);
      ASSERT_TRUE((*s)->Release(**x).ok());
    }
    ASSERT_EQ(order_.size(), kSamples);
  }
  void TearDown() override {
    client_.reset();
    if (daemon_) daemon_->Stop();
    std::filesystem::remove_all(dir_);
  }
  std::string socket() const { return dir_ + "/run/nopfsd.sock"; }
  std::unique_ptr<Stream> Open() {
    auto s = client_->Open(0);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::string dir_;
  std::unique_ptr<service::Daemon> daemon_;
  std::unique_ptr<Client> client_;
  std::vector<uint32_t> order_;
};

TEST_F(BatchTest, NextBatchDeliversTheFilesInTheStreamsOrder) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{32}, size_t{1000}}) {
    SCOPED_TRACE("batch " + std::to_string(n));
    auto s = Open();
    ASSERT_NE(s, nullptr);
    std::vector<uint32_t> got;
    std::vector<Sample> batch;
    uint64_t calls = 0;
    for (;;) {
      batch.clear();
      auto r = s->NextBatch(n, &batch, 10s);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_EQ(*r, batch.size());
      if (*r == 0) break;
      ++calls;
      ASSERT_LE(*r, n);
      for (const Sample& x : batch) {
        EXPECT_EQ(std::string(reinterpret_cast<const char*>(x.data), x.size), Bytes(x.sample_id))
            << "sample " << x.sample_id;
        got.push_back(x.sample_id);
      }
      ASSERT_TRUE(s->ReleaseBatch(batch).ok());
    }
    EXPECT_EQ(got, order_);
    if (n == 1000) {
      // More than the ring holds: every call takes what fits, and nothing is lost.
      EXPECT_GT(calls, 1u);
    }
    EXPECT_EQ(s->stats().samples, kSamples);
  }
}

TEST_F(BatchTest, FillBatchCopiesWholeBatchesAndAShortLastOne) {
  for (size_t n : {size_t{32}, size_t{kSamples + 5}}) {  // the second: larger than the ring
    SCOPED_TRACE("batch " + std::to_string(n));
    auto s = Open();
    ASSERT_NE(s, nullptr);
    std::vector<std::byte> buf(n * (128u << 10));
    std::vector<uint32_t> got;
    std::vector<size_t> counts;
    for (;;) {
      std::vector<BatchEntry> entries;
      auto r = s->FillBatch(n, buf, &entries, 10s);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_EQ(*r, entries.size());
      if (*r == 0) break;
      counts.push_back(*r);
      uint64_t at = 0;
      for (const BatchEntry& e : entries) {
        EXPECT_EQ(e.offset, at);  // back to back
        at += e.size;
        EXPECT_EQ(std::string(reinterpret_cast<const char*>(buf.data() + e.offset), e.size),
                  Bytes(e.sample_id))
            << "sample " << e.sample_id;
        EXPECT_EQ(e.label, 0);
        got.push_back(e.sample_id);
      }
    }
    EXPECT_EQ(got, order_);
    // Whole batches, then the short last one.
    for (size_t i = 0; i + 1 < counts.size(); ++i)
      EXPECT_EQ(counts[i], n);
    EXPECT_EQ(counts.back(), kSamples % n == 0 ? n : kSamples % n);
  }
}

TEST_F(BatchTest, FillBatchStopsAtTheBufferAndRefusesASampleLargerThanIt) {
  auto s = Open();
  ASSERT_NE(s, nullptr);
  std::vector<BatchEntry> entries;
  std::vector<std::byte> small(1000);
  auto r = s->FillBatch(4, small, &entries, 10s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("sample " + std::to_string(order_[0]) + " is " +
                                      std::to_string(Bytes(order_[0]).size()) +
                                      " bytes, larger than the batch buffer (1000 bytes); give a "
                                      "buffer of at least"),
            std::string::npos)
      << r.status().message();
  // Room for two samples of at most 128 KiB and less than three of at least 64 KiB.
  std::vector<std::byte> two(2 * (128u << 10) + 1000);
  std::vector<uint32_t> got;
  while (got.size() < kSamples) {
    entries.clear();
    auto k = s->FillBatch(8, two, &entries, 10s);
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    ASSERT_GT(*k, 0u);
    EXPECT_LE(*k, 3u);  // stopped at the buffer, the rest stays in line
    for (const BatchEntry& e : entries) {
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(two.data() + e.offset), e.size),
                Bytes(e.sample_id));
      got.push_back(e.sample_id);
    }
  }
  EXPECT_EQ(got, order_);  // the refused sample came first, nothing skipped
  entries.clear();
  auto end = s->FillBatch(8, two, &entries, 10s);
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(*end, 0u);
  // Next() after batches: also at the end.
  auto x = s->Next(1s);
  ASSERT_TRUE(x.ok());
  EXPECT_FALSE(x->has_value());
}

// Mappings of the RAM tier's memfd in this process (/proc/self/maps names it memfd:nopfs-*-ram).
int TierMappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:nopfs-") != std::string::npos && line.find("-ram") != std::string::npos) {
      ++n;
    }
  }
  return n;
}

// Reads `s` to its end; returns the sample ids, checking every sample's bytes.
std::vector<uint32_t> ReadAll(Stream* s) {
  std::vector<uint32_t> got;
  std::vector<Sample> batch;
  for (;;) {
    batch.clear();
    auto r = s->NextBatch(16, &batch, 10s);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok() || *r == 0) break;
    for (const Sample& x : batch) {
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(x.data), x.size), Bytes(x.sample_id));
      got.push_back(x.sample_id);
    }
    EXPECT_TRUE(s->ReleaseBatch(batch).ok());
  }
  return got;
}

TEST_F(BatchTest, TheStreamsOfAConnectionMapTheTierOnce) {
  // nopfsd runs in this process: its own mapping, and the client's, which the fixture's stream
  // made and which outlives that stream.
  const int before = TierMappings();
  ASSERT_GE(before, 2);
  auto a = Open();
  auto b = Open();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(ReadAll(a.get()), order_);
  EXPECT_EQ(ReadAll(b.get()), order_);
  EXPECT_EQ(TierMappings(), before);
  // Another connection maps it for itself, and unmaps it when it and its streams are gone.
  auto other = Client::Connect(socket());
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  auto c = (*other)->Open(0);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(TierMappings(), before + 1);
  EXPECT_EQ(ReadAll(c->get()), order_);
  other->reset();
  EXPECT_EQ(TierMappings(), before + 1);  // the stream holds it
  c->reset();
  EXPECT_EQ(TierMappings(), before);
  a.reset();
  b.reset();
  client_.reset();
  EXPECT_EQ(TierMappings(), before - 1);
}

TEST_F(BatchTest, CApi) {
  nopfs_client* c = nullptr;
  ASSERT_EQ(nopfs_connect(socket().c_str(), &c), 0) << nopfs_last_error();
  nopfs_stream* s = nullptr;
  ASSERT_EQ(nopfs_open(c, 0, 0, 0, &s), 0) << nopfs_last_error();
  std::vector<uint32_t> got;
  nopfs_sample batch[5];
  int n = nopfs_next_batch(s, batch, 5, 10000);
  ASSERT_EQ(n, 5) << nopfs_last_error();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(std::string(static_cast<const char*>(batch[i].data), batch[i].size),
              Bytes(batch[i].sample_id));
    got.push_back(batch[i].sample_id);
  }
  ASSERT_EQ(nopfs_release_batch(s, batch, 5), 0) << nopfs_last_error();
  EXPECT_EQ(nopfs_release_batch(s, batch, 1), NOPFS_E_FAILED_PRECONDITION);  // released already
  std::vector<char> buf(16u << 20);
  std::vector<nopfs_batch_entry> entries(kSamples);
  EXPECT_EQ(nopfs_fill_batch(s, 4, buf.data(), 100, entries.data(), 10000),
            NOPFS_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(nopfs_last_error()).find("larger than the batch buffer"),
            std::string::npos);
  n = nopfs_fill_batch(s, kSamples, buf.data(), buf.size(), entries.data(), 10000);
  ASSERT_EQ(n, static_cast<int>(kSamples - 5)) << nopfs_last_error();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(std::string(buf.data() + entries[i].offset, entries[i].size),
              Bytes(entries[i].sample_id));
    got.push_back(entries[i].sample_id);
  }
  EXPECT_EQ(got, order_);
  EXPECT_EQ(nopfs_next_batch(s, batch, 5, 10000), 0);  // end of stream
  nopfs_stream_close(s);
  nopfs_close(c);
}

}  // namespace
}  // namespace nopfs::client
