#include "protocol/ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

namespace nopfs::ring {
namespace {

using namespace std::chrono_literals;

auto Deadline(std::chrono::milliseconds d = 10s) {
  return std::chrono::steady_clock::now() + d;
}

// The content of sample `seq`: a deterministic pattern so the consumer can check every byte.
std::byte Pattern(uint64_t seq, uint64_t i) {
  return static_cast<std::byte>((seq * 131 + i * 7 + (i >> 8)) & 0xff);
}
void Fill(std::span<std::byte> dst, uint64_t seq) {
  for (uint64_t i = 0; i < dst.size(); ++i)
    dst[i] = Pattern(seq, i);
}
bool Check(const View& v) {
  for (uint64_t i = 0; i < v.size; ++i) {
    if (v.data[i] != Pattern(v.seq, i)) return false;
  }
  return true;
}
uint64_t SizeOf(uint64_t seq) {
  return (seq * 2654435761u) % 3000;
}

std::unique_ptr<RingReader> ReaderFor(const RingWriter& w) {
  wire::UniqueFd fd(::fcntl(w.fd(), F_DUPFD_CLOEXEC, 0));
  auto r = RingReader::Open(std::move(fd), w.capacity(), w.slot_count());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(*r) : nullptr;
}

TEST(Ring, CreateValidatesAndSeals) {
  EXPECT_FALSE(RingWriter::Create(0, 4).ok());
  EXPECT_FALSE(RingWriter::Create(4096, 0).ok());
  auto w = RingWriter::Create(1000, 4);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->capacity(), 1024u);  // rounded to 64
  int seals = ::fcntl((*w)->fd(), F_GET_SEALS);
  EXPECT_NE(seals & F_SEAL_SHRINK, 0);
  EXPECT_NE(seals & F_SEAL_GROW, 0);
  EXPECT_NE(::ftruncate((*w)->fd(), 10), 0);
  auto big = (*w)->Reserve(2000, {}, Deadline());
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
}

// Bytes of shared memory the memfd holds (allocated pages, not its size).
uint64_t Committed(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

TEST(Ring, TheArenaIsCommittedAsItIsFirstWritten) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  auto w = RingWriter::Create(64 * kMiB, 64);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const int fd = (*w)->fd();
  EXPECT_LT(Committed(fd), kMiB);  // the header and the slot table only
  auto r = ReaderFor(**w);
  ASSERT_NE(r, nullptr);
  EXPECT_LT(Committed(fd), kMiB);  // mapping it for the reader allocates nothing either
  // Reserved on commit and never written (a sample published in the region): nothing.
  auto a = (*w)->Reserve(8 * kMiB, SampleMeta{}, Deadline(), RingWriter::Space::kOnCommit);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_LT(Committed(fd), kMiB);
  // Committed for writing: the arena up to the sample's end, in chunks.
  ASSERT_TRUE((*w)->Commit(a->seq).ok());
  EXPECT_GE(Committed(fd), 8 * kMiB);
  EXPECT_LT(Committed(fd), 16 * kMiB);
  Fill(a->dst, a->seq);
  ASSERT_TRUE((*w)->Publish(a->seq).ok());
  // The default reservation is committed when Reserve returns.
  auto b = (*w)->Reserve(12 * kMiB, SampleMeta{}, Deadline());
  ASSERT_TRUE(b.ok());
  EXPECT_GE(Committed(fd), 20 * kMiB);
  EXPECT_LT(Committed(fd), 28 * kMiB);
  Fill(b->dst, b->seq);
  ASSERT_TRUE((*w)->Publish(b->seq).ok());
  // An error slot in bytes never committed still carries its message.
  auto c = (*w)->Reserve(30 * kMiB, SampleMeta{}, Deadline(), RingWriter::Space::kOnCommit);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*w)->PublishError(c->seq, Status::NotFound("sample 7 (/d/x): gone")).ok());
  EXPECT_LT(Committed(fd), 28 * kMiB);
  EXPECT_FALSE((*w)->Commit(c->seq).ok());  // published already
  for (uint64_t seq : {a->seq, b->seq}) {
    auto v = r->Next(1s);
    ASSERT_TRUE(v.ok() && v->has_value()) << v.status().ToString();
    EXPECT_TRUE(Check(**v));
    ASSERT_TRUE(r->Release(seq).ok());
  }
  auto e = r->Next(1s);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(e.status().message(), "sample 7 (/d/x): gone");
}

TEST(Ring, ReaderRejectsWrongGeometry) {
  auto w = RingWriter::Create(4096, 8);
  ASSERT_TRUE(w.ok());
  auto dup = [&] { return wire::UniqueFd(::fcntl((*w)->fd(), F_DUPFD_CLOEXEC, 0)); };
  EXPECT_FALSE(RingReader::Open(dup(), 8192, 8).ok());
  EXPECT_FALSE(RingReader::Open(dup(), 4096, 16).ok());
  EXPECT_FALSE(RingReader::Open(dup(), 4000, 8).ok());
  EXPECT_FALSE(RingReader::Open(wire::UniqueFd(), 4096, 8).ok());
  EXPECT_TRUE(RingReader::Open(dup(), 4096, 8).ok());
}

// Four threads publish out of order; the consumer still sees exact sequence order, intact data,
// and the metadata the producer gave.
TEST(Ring, OrderKeptWithOutOfOrderPublish) {
  auto w = RingWriter::Create(64 * 1024, 32);
  ASSERT_TRUE(w.ok());
  RingWriter& writer = **w;
  auto reader = ReaderFor(writer);
  ASSERT_NE(reader, nullptr);
  constexpr uint64_t kCount = 3000;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RingWriter::Reservation> work;
  bool done = false;
  std::vector<std::thread> pubs;
  for (int t = 0; t < 4; ++t) {
    pubs.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (;;) {
        RingWriter::Reservation r;
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return done || !work.empty(); });
          if (work.empty()) return;
          r = work.front();
          work.pop_front();
        }
        if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
        Fill(r.dst, r.seq);
        ASSERT_TRUE(writer.Publish(r.seq).ok());
      }
    });
  }
  std::thread seq_thread([&] {
    for (uint64_t i = 0; i < kCount; ++i) {
      SampleMeta m{static_cast<uint32_t>(i * 3), -static_cast<int64_t>(i), 2, i / 10, i};
      auto r = writer.Reserve(SizeOf(i), m, Deadline());
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_EQ(r->seq, i);
      std::lock_guard lock(mu);
      work.push_back(*r);
      cv.notify_one();
    }
    {
      std::lock_guard lock(mu);
      done = true;
    }
    cv.notify_all();
  });
  for (uint64_t i = 0; i < kCount; ++i) {
    auto v = reader->Next(10s);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ASSERT_TRUE(v->has_value());
    const View& x = **v;
    ASSERT_EQ(x.seq, i);
    ASSERT_EQ(x.sample_id, i * 3);
    ASSERT_EQ(x.label, -static_cast<int64_t>(i));
    ASSERT_EQ(x.epoch, 2u);
    ASSERT_EQ(x.step, i / 10);
    ASSERT_EQ(x.position, i);
    ASSERT_EQ(x.size, SizeOf(i));
    ASSERT_EQ(reinterpret_cast<uintptr_t>(x.data) % kAlign, 0u);
    ASSERT_TRUE(Check(x)) << "seq " << i;
    ASSERT_TRUE(reader->Release(i).ok());
  }
  seq_thread.join();
  for (auto& t : pubs)
    t.join();
  writer.Finish();
  auto end = reader->Next(1s);
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
  RingStats s = writer.stats();
  EXPECT_EQ(s.samples, kCount);
  EXPECT_EQ(s.next_calls, kCount + 1);
  uint64_t bytes = 0;
  for (uint64_t i = 0; i < kCount; ++i)
    bytes += SizeOf(i);
  EXPECT_EQ(s.bytes, bytes);
  EXPECT_GE(s.stall_ns_p99, s.stall_ns_median);
}

// A slow consumer holding several samples: the producer blocks (back-pressure) and never
// overwrites a sample before it is released; releases come out of order; sizes vary so the arena
// wraps many times.
TEST(Ring, BackPressureOutOfOrderReleaseAndWraparound) {
  // 16 KiB: three held samples of up to 2.5 KiB, the next one and a wrap gap always fit.
  auto w = RingWriter::Create(16 * 1024, 16);
  ASSERT_TRUE(w.ok());
  RingWriter& writer = **w;
  auto reader = ReaderFor(writer);
  constexpr uint64_t kCount = 2000;
  std::atomic<uint64_t> max_ahead{0};
  std::thread producer([&] {
    for (uint64_t i = 0; i < kCount; ++i) {
      auto r = writer.Reserve(SizeOf(i) % 2500, {}, Deadline());
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      Fill(r->dst, r->seq);
      ASSERT_TRUE(writer.Publish(r->seq).ok());
      max_ahead = std::max<uint64_t>(max_ahead, i + 1 - writer.released());
    }
    writer.Finish();
  });
  std::mt19937 rng(7);
  std::vector<View> held;
  uint64_t got = 0;
  for (;;) {
    auto v = reader->Next(10s);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    if (!v->has_value()) break;
    ASSERT_EQ((*v)->seq, got++);
    held.push_back(**v);
    // A DataLoader-like window: sometimes the newest sample is released at once (out of order),
    // the rest are held until three are out, then released in random order. Before each release
    // every held sample is re-checked: a producer that overwrote unreleased space breaks a
    // checksum here.
    if (rng() % 4 == 0) {
      for (const View& h : held)
        ASSERT_TRUE(Check(h)) << "overwritten seq " << h.seq;
      ASSERT_TRUE(reader->Release(held.back().seq).ok());
      held.pop_back();
    } else if (got % 3 == 0) {
      std::shuffle(held.begin(), held.end(), rng);
      for (const View& h : held) {
        ASSERT_TRUE(Check(h)) << "overwritten seq " << h.seq;
        ASSERT_TRUE(reader->Release(h.seq).ok());
      }
      held.clear();
    }
    if (rng() % 50 == 0) std::this_thread::sleep_for(1ms);  // slow consumer
  }
  for (const View& h : held) {
    ASSERT_TRUE(Check(h));
    ASSERT_TRUE(reader->Release(h.seq).ok());
  }
  producer.join();
  EXPECT_EQ(got, kCount);
  EXPECT_LE(max_ahead.load(), 16u);
  EXPECT_EQ(writer.released(), kCount);
  // Double release and release of a seq never returned are refused.
  EXPECT_FALSE(reader->Release(0).ok());
  EXPECT_FALSE(reader->Release(kCount + 5).ok());
}

TEST(Ring, ProducerBlocksUntilRelease) {
  auto w = RingWriter::Create(1024, 8);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  auto a = (*w)->Reserve(1024, {}, Deadline());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*w)->Publish(a->seq).ok());
  // Full: a second reservation times out while the first is unreleased.
  auto b = (*w)->Reserve(64, {}, Deadline(50ms));
  EXPECT_EQ(b.status().code(), StatusCode::kTimedOut);
  auto v = reader->Next(1s);
  ASSERT_TRUE(v.ok() && v->has_value());
  std::atomic<bool> reserved{false};
  std::thread t([&] {
    auto c = (*w)->Reserve(64, {}, Deadline());
    EXPECT_TRUE(c.ok());
    reserved = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(reserved.load());  // still blocked: Next() alone does not free space
  ASSERT_TRUE(reader->Release(0).ok());
  t.join();
  EXPECT_TRUE(reserved.load());
}

// The wake-up protocol: a producer out of space sleeps until a batch of samples (a quarter of the
// slots, at most 16) is released, so releases do not each cost a FUTEX_WAKE; a consumer that runs
// dry wakes it at once whatever the batch, so nothing waits on a batch that cannot come.
TEST(Ring, ProducerSleepsForABatchAndAConsumerRunningDryWakesIt) {
  auto w = RingWriter::Create(1 << 20, 8);  // batch: 2 samples
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  for (int k = 0; k < 8; ++k) {
    auto r = (*w)->Reserve(64, {}, Deadline(1s));
    ASSERT_TRUE(r.ok());
    Fill(r->dst, r->seq);
    ASSERT_TRUE((*w)->Publish(r->seq).ok());
  }
  auto produce = [&](int n) {
    return std::thread([&, n] {
      for (int k = 0; k < n; ++k) {
        auto r = (*w)->Reserve(64, {}, Deadline(10s));
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        Fill(r->dst, r->seq);
        ASSERT_TRUE((*w)->Publish(r->seq).ok());
      }
    });
  };
  auto wait_asleep = [&] {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!reader->producer_asleep() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    return reader->producer_asleep();
  };
  std::thread t = produce(1);  // the 9th sample: the ring is full, it sleeps
  ASSERT_TRUE(wait_asleep());
  auto v0 = reader->Next(1s);
  ASSERT_TRUE(v0.ok() && v0->has_value());
  ASSERT_TRUE(reader->Release(0).ok());
  EXPECT_EQ(reader->producer_wakes(), 0u);  // one sample released: not a batch yet
  auto v1 = reader->Next(1s);
  ASSERT_TRUE(v1.ok() && v1->has_value());
  ASSERT_TRUE(reader->Release(1).ok());
  EXPECT_EQ(reader->producer_wakes(), 1u);  // the batch of 2: woken
  t.join();

  // Now the consumer takes everything published (7 samples) and holds the last, while the
  // producer sleeps for the 10th; after one release the consumer asks for more and, finding
  // nothing, wakes the producer itself.
  for (uint64_t seq = 2; seq < 9; ++seq) {
    auto v = reader->Next(1s);
    ASSERT_TRUE(v.ok() && v->has_value());
    ASSERT_EQ((*v)->seq, seq);
    EXPECT_TRUE(Check(**v));
    if (seq < 8) {
      ASSERT_TRUE(reader->Release(seq).ok());
    }
  }
  // Seqs 0..7 released, 8 held: the producer fills the other 7 slots (9..15), then sleeps on 16.
  std::thread t2 = produce(8);
  ASSERT_TRUE(wait_asleep());
  const uint64_t before = reader->producer_wakes();
  for (uint64_t seq = 9; seq < 16; ++seq) {  // take the 7 it published, keep holding them
    auto v = reader->Next(1s);
    ASSERT_TRUE(v.ok() && v->has_value());
    ASSERT_EQ((*v)->seq, seq);
  }
  ASSERT_TRUE(reader->Release(8).ok());  // one released: below the batch, no wake
  EXPECT_EQ(reader->producer_wakes(), before);
  auto last = reader->Next(10s);  // runs dry: wakes the producer, which publishes seq 16
  ASSERT_TRUE(last.ok() && last->has_value()) << last.status().ToString();
  EXPECT_EQ((*last)->seq, 16u);
  // (Woken at least once; a second wake may come if the consumer spins out before the woken
  // producer has run.)
  EXPECT_GE(reader->producer_wakes(), before + 1);
  t2.join();
}

// A ring of one slot passes thousands of samples back and forth: every hand-over needs a wake-up
// on each side, so a lost one would cost the 50 ms wait slice each time (minutes in all).
TEST(Ring, PingPongThroughOneSlotLosesNoWakeUp) {
  auto w = RingWriter::Create(4096, 1);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  constexpr uint64_t kSamples = 20000;
  std::thread producer([&] {
    for (uint64_t k = 0; k < kSamples; ++k) {
      auto r = (*w)->Reserve(64 + k % 512, {}, Deadline(10s));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      Fill(r->dst, r->seq);
      ASSERT_TRUE((*w)->Publish(r->seq).ok());
    }
    (*w)->Finish();
  });
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t got = 0;
  for (;;) {
    auto v = reader->Next(10s);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    if (!v->has_value()) break;
    ASSERT_EQ((*v)->seq, got);
    EXPECT_TRUE(Check(**v));
    ASSERT_TRUE(reader->Release((*v)->seq).ok());
    ++got;
  }
  producer.join();
  EXPECT_EQ(got, kSamples);
  // Not a speed test: 20,000 lost wake-ups would take 1,000 s; any handful would still pass.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 300s);
}

// A sample of the full capacity fits whenever the ring is empty, wherever the head stands.
TEST(Ring, FullCapacitySampleAfterWrap) {
  auto w = RingWriter::Create(1024, 4);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  for (uint64_t size : {64u, 1024u, 100u, 1024u, 1000u, 1024u}) {
    auto r = (*w)->Reserve(size, {}, Deadline(1s));
    ASSERT_TRUE(r.ok()) << size << ": " << r.status().ToString();
    Fill(r->dst, r->seq);
    ASSERT_TRUE((*w)->Publish(r->seq).ok());
    auto v = reader->Next(1s);
    ASSERT_TRUE(v.ok() && v->has_value());
    EXPECT_EQ((*v)->size, size);
    EXPECT_TRUE(Check(**v));
    ASSERT_TRUE(reader->Release((*v)->seq).ok());
  }
}

TEST(Ring, ErrorSlotCarriesMessageAndStreamGoesOn) {
  auto w = RingWriter::Create(4096, 8);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  auto a = (*w)->Reserve(256, SampleMeta{17, 0, 0, 0, 0}, Deadline());
  auto b = (*w)->Reserve(5, SampleMeta{18, 0, 0, 0, 1}, Deadline());
  ASSERT_TRUE(a.ok() && b.ok());
  Fill(b->dst, b->seq);
  ASSERT_TRUE((*w)->Publish(b->seq).ok());
  ASSERT_TRUE(
      (*w)->PublishError(a->seq, Status::NotFound("sample 17 (/pfs/x/a.jpg): No such file or "
                                                  "directory"))
          .ok());
  EXPECT_FALSE((*w)->Publish(a->seq).ok());  // already published
  auto e = reader->Next(1s);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(e.status().message(), "sample 17 (/pfs/x/a.jpg): No such file or directory");
  auto v = reader->Next(1s);
  ASSERT_TRUE(v.ok() && v->has_value());
  EXPECT_EQ((*v)->sample_id, 18u);
  EXPECT_TRUE(Check(**v));
  EXPECT_FALSE(reader->Release(0).ok());  // the error slot was released by Next
  EXPECT_TRUE(reader->Release(1).ok());
  EXPECT_EQ((*w)->released(), 2u);
}

TEST(Ring, CancelUnblocksBothSides) {
  auto w = RingWriter::Create(1024, 2);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  for (int i = 0; i < 2; ++i) {
    auto r = (*w)->Reserve(10, {}, Deadline());
    ASSERT_TRUE(r.ok());
  }
  Status producer_status;
  std::thread t([&] { producer_status = (*w)->Reserve(10, {}, Deadline(30s)).status(); });
  auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(30ms);
  (*w)->Cancel();
  t.join();
  EXPECT_EQ(producer_status.code(), StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  auto v = reader->Next(30s);
  EXPECT_EQ(v.status().code(), StatusCode::kUnavailable);
}

TEST(Ring, NextTimesOutAndEndOfStream) {
  auto w = RingWriter::Create(1024, 4);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  auto v = reader->Next(20ms);
  EXPECT_EQ(v.status().code(), StatusCode::kTimedOut);
  (*w)->Finish();
  v = reader->Next(1s);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->has_value());
  EXPECT_EQ((*w)->Reserve(1, {}, Deadline()).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(reader->stats().next_calls, 2u);
}

// A consumer that forges the shared release counter cannot make the producer reuse space that
// was never published, nor crash it.
TEST(Ring, ProducerDoesNotTrustTheSharedHeader) {
  auto w = RingWriter::Create(1024, 4);
  ASSERT_TRUE(w.ok());
  void* p = ::mmap(nullptr, RingBytes(1024, 4), PROT_READ | PROT_WRITE, MAP_SHARED, (*w)->fd(), 0);
  ASSERT_NE(p, MAP_FAILED);
  auto a = (*w)->Reserve(1024, {}, Deadline());
  ASSERT_TRUE(a.ok());
  // Forge "everything released" (offset 136) while the sample is still unpublished.
  reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(p) + 136)->store(UINT64_MAX);
  EXPECT_EQ((*w)->Reserve(64, {}, Deadline(30ms)).status().code(), StatusCode::kTimedOut);
  ASSERT_TRUE((*w)->Publish(a->seq).ok());
  EXPECT_TRUE((*w)->Reserve(64, {}, Deadline()).ok());  // clamped to what was handed out
  EXPECT_EQ((*w)->released(), 1u);
  // Garbage in the statistics yields numbers, not a crash.
  std::memset(static_cast<char*>(p) + 144, 0xff, 4096 - 144);
  RingStats s = (*w)->stats();
  EXPECT_GT(s.stall_ns_p99, 0u);
  ::munmap(p, RingBytes(1024, 4));
}

// A consumer that writes 2^64-1 into every counter of the header (as a rank can) does not make
// the service report impossible figures: each is bounded by what the producer published and by
// the ring's age.
TEST(Ring, ForgedStatisticsAreBounded) {
  const auto t0 = std::chrono::steady_clock::now();
  auto w = RingWriter::Create(4096, 8);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  for (uint64_t i = 0; i < 3; ++i) {
    auto r = (*w)->Reserve(100, {}, Deadline());
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE((*w)->Publish(r->seq).ok());
  }
  for (uint64_t i = 0; i < 3; ++i) {
    auto v = reader->Next(1s);
    ASSERT_TRUE(v.ok() && v->has_value());
    ASSERT_TRUE(reader->Release(i).ok());
  }
  void* p = ::mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, (*w)->fd(), 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(static_cast<char*>(p) + 144, 0xff, 192 + 8 * kHistogramBuckets - 144);
  const RingStats s = (*w)->stats();
  const auto age = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  EXPECT_LE(s.samples, 3u);
  EXPECT_LE(s.bytes, 300u);
  EXPECT_LE(s.stall_ns_total, age);
  EXPECT_LE(s.stall_ns_p99, 2 * age);  // a bucket's upper bound; was 2^63 ns (292 years)
  EXPECT_LE(s.stall_ns_median, 2 * age);
  uint64_t calls = 0;
  for (uint64_t c : s.histogram)
    calls += c;
  EXPECT_LE(s.next_calls, calls);
  ::munmap(p, kHeaderBytes);
}

// A producer killed with SIGKILL never finishes nor cancels its ring. The consumer, watching its
// socket to the producer, gets what was published and then Unavailable within a second, not a
// wait until its timeout.
TEST(Ring, DeadProducerIsNoticedThroughItsSocket) {
  auto w = RingWriter::Create(16 * 1024, 16);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  reader->WatchProducer(sv[0]);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(sv[0]);
    for (int i = 0; i < 2; ++i) {
      auto r = (*w)->Reserve(SizeOf(i), {}, Deadline());
      if (!r.ok()) ::_exit(2);
      Fill(r->dst, r->seq);
      if (!(*w)->Publish(r->seq).ok()) ::_exit(3);
    }
    ::pause();  // killed below, holding its end of the socket
    ::_exit(4);
  }
  ::close(sv[1]);
  for (uint64_t i = 0; i < 2; ++i) {
    auto v = reader->Next(10s);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ASSERT_TRUE(v->has_value());
    EXPECT_TRUE(Check(**v));
    ASSERT_TRUE(reader->Release(i).ok());
  }
  // Still alive: a short wait times out as before.
  EXPECT_EQ(reader->Next(100ms).status().code(), StatusCode::kTimedOut);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const auto t0 = std::chrono::steady_clock::now();
  auto v = reader->Next(30s);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(v.status().code(), StatusCode::kUnavailable) << v.status().ToString();
  EXPECT_NE(v.status().message().find("nopfsd is gone"), std::string::npos) << v.status().message();
  EXPECT_LT(waited, 1s);
  ::close(sv[0]);
}

// A slot corrupted to point outside the arena is reported, not dereferenced.
TEST(Ring, ReaderValidatesSlots) {
  auto w = RingWriter::Create(1024, 4);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  auto a = (*w)->Reserve(100, {}, Deadline());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*w)->Publish(a->seq).ok());
  void* p = ::mmap(nullptr, RingBytes(1024, 4), PROT_READ | PROT_WRITE, MAP_SHARED, (*w)->fd(), 0);
  ASSERT_NE(p, MAP_FAILED);
  uint64_t bad = 1000;  // offset 1000 + size 100 > 1024
  std::memcpy(static_cast<char*>(p) + kHeaderBytes + 48, &bad, sizeof(bad));
  auto v = reader->Next(1s);
  EXPECT_EQ(v.status().code(), StatusCode::kCorruption);
  ::munmap(p, RingBytes(1024, 4));
}

// Slots may point into an attached region (a RAM tier): the view is the region's bytes, the
// reserved arena extent is reclaimed on release as usual, and a region slot without a region or
// past its end is refused.
TEST(Ring, RegionSlotsPointIntoTheAttachedRegion) {
  const uint64_t region_bytes = 8192;
  wire::UniqueFd region(::memfd_create("ring-test-region", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(region.valid());
  ASSERT_EQ(::ftruncate(region.get(), static_cast<off_t>(region_bytes)), 0);
  ASSERT_EQ(::fcntl(region.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  void* rm = ::mmap(nullptr, region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, region.get(), 0);
  ASSERT_NE(rm, MAP_FAILED);
  std::span<std::byte> rbytes(static_cast<std::byte*>(rm), region_bytes);
  for (uint64_t i = 0; i < region_bytes; ++i)
    rbytes[i] = static_cast<std::byte>(i * 13 + 5);

  auto w = RingWriter::Create(1024, 4);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  ASSERT_TRUE(
      reader->AttachRegion(wire::UniqueFd(::fcntl(region.get(), F_DUPFD_CLOEXEC, 0)), region_bytes)
          .ok());
  EXPECT_EQ(
      reader->AttachRegion(wire::UniqueFd(::fcntl(region.get(), F_DUPFD_CLOEXEC, 0)), region_bytes)
          .code(),
      StatusCode::kFailedPrecondition);
  // 200 rounds through a 4-slot ring: arena space and slots are reclaimed as usual.
  for (uint64_t k = 0; k < 200; ++k) {
    SampleMeta meta;
    meta.sample_id = static_cast<uint32_t>(k);
    auto r = (*w)->Reserve(300, meta, Deadline());
    ASSERT_TRUE(r.ok()) << k;
    const uint64_t off = (k * 97) % (region_bytes - 300);
    if (k % 3 == 0) {
      Fill(r->dst, r->seq);
      ASSERT_TRUE((*w)->Publish(r->seq).ok());
    } else {
      ASSERT_TRUE((*w)->PublishInRegion(r->seq, off, 300).ok());
    }
    auto v = reader->Next(1s);
    ASSERT_TRUE(v.ok() && v->has_value()) << k;
    EXPECT_EQ((*v)->sample_id, k);
    if (k % 3 == 0) {
      EXPECT_TRUE(Check(**v));
    } else {
      EXPECT_EQ(std::memcmp((*v)->data, rbytes.data() + off, 300), 0) << k;
    }
    ASSERT_TRUE(reader->Release((*v)->seq).ok());
  }
  // A reader without a region refuses a region slot.
  auto w2 = RingWriter::Create(1024, 4);
  ASSERT_TRUE(w2.ok());
  auto unattached = ReaderFor(**w2);
  auto u = (*w2)->Reserve(64, {}, Deadline());
  ASSERT_TRUE(u.ok());
  ASSERT_TRUE((*w2)->PublishInRegion(u->seq, 0, 64).ok());
  EXPECT_EQ(unattached->Next(1s).status().code(), StatusCode::kCorruption);
  // A region slot past the region's end is refused.
  auto r = (*w)->Reserve(64, {}, Deadline());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*w)->PublishInRegion(r->seq, region_bytes - 10, 64).ok());
  EXPECT_EQ(reader->Next(1s).status().code(), StatusCode::kCorruption);
  ::munmap(rm, region_bytes);
}

// Resident kilobytes of the mapping that starts at `at` (/proc/self/smaps): the pages this
// mapping has touched, whatever the file holds.
uint64_t MappingRssKb(const void* at) {
  char start[32];
  std::snprintf(start, sizeof start, "%lx-", reinterpret_cast<unsigned long>(at));
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return UINT64_MAX;
  char line[512];
  bool in = false;
  uint64_t kb = UINT64_MAX;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, start, std::strlen(start)) == 0) {
      in = true;
    } else if (in && std::strncmp(line, "Rss:", 4) == 0) {
      kb = std::strtoull(line + 4, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kb;
}

TEST(Region, ReadCopiesTheFileWithoutTouchingTheMapping) {
  const uint64_t bytes = 64 * 4096;
  wire::UniqueFd fd(::memfd_create("ring-test-region", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(bytes)), 0);
  ASSERT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  std::vector<std::byte> want(bytes);
  for (uint64_t i = 0; i < bytes; ++i)
    want[i] = static_cast<std::byte>((i * 7 + (i >> 12)) & 0xff);
  ASSERT_EQ(::pwrite(fd.get(), want.data(), bytes, 0), static_cast<ssize_t>(bytes));
  auto region = Region::Map(fd.get(), bytes);
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  const Region& r = **region;
  fd.Reset();  // the region keeps what it needs

  // Samples of 10,000 bytes, back to back (some share a page), then one at the very end.
  std::vector<std::byte> out(10000);
  for (uint64_t at = 0; at + out.size() <= bytes; at += out.size()) {
    std::fill(out.begin(), out.end(), std::byte{0});
    r.Read(r.data() + at, out.size(), out.data());
    ASSERT_EQ(std::memcmp(out.data(), want.data() + at, out.size()), 0) << at;
  }
  const uint64_t last = bytes - out.size();
  r.Read(r.data() + last, out.size(), out.data());
  EXPECT_EQ(std::memcmp(out.data(), want.data() + last, out.size()), 0);
  r.Read(r.data(), 0, out.data());
  // Every byte read, no page of the mapping touched.
  EXPECT_EQ(MappingRssKb(r.data()), 0u);
  // What memcpy() from the mapping costs instead: the pages it touched.
  std::memcpy(out.data(), r.data() + 3 * 4096, out.size());
  EXPECT_GE(MappingRssKb(r.data()), 8u);
}

TEST(Ring, StallSummary) {
  RingStats s;
  s.histogram[0] = 10;   // 0 ns
  s.histogram[10] = 89;  // [512, 1024)
  s.histogram[20] = 1;   // ~1 ms
  SummarizeStalls(&s);
  EXPECT_EQ(s.stall_ns_median, 1024u);
  EXPECT_EQ(s.stall_ns_p99, 1024u);
  s.histogram[20] = 5;
  SummarizeStalls(&s);
  EXPECT_EQ(s.stall_ns_p99, uint64_t{1} << 20);
  EXPECT_EQ(StallBucket(0), 0);
  EXPECT_EQ(StallBucket(1), 1);
  EXPECT_EQ(StallBucket(1023), 10);
  EXPECT_EQ(StallBucket(1024), 11);
}

// The consumer in another process, through the descriptor only (as a client gets it over the
// socket).
TEST(Ring, AcrossProcesses) {
  auto w = RingWriter::Create(16 * 1024, 16);
  ASSERT_TRUE(w.ok());
  constexpr uint64_t kCount = 500;
  int fd = (*w)->fd();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    wire::UniqueFd mine(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    auto r = RingReader::Open(std::move(mine), 16 * 1024, 16);
    if (!r.ok()) ::_exit(2);
    for (uint64_t i = 0;; ++i) {
      auto v = (*r)->Next(10s);
      if (!v.ok()) ::_exit(3);
      if (!v->has_value()) ::_exit(i == kCount ? 0 : 4);
      if ((*v)->seq != i || !Check(**v)) ::_exit(5);
      if (!(*r)->Release(i).ok()) ::_exit(6);
    }
  }
  for (uint64_t i = 0; i < kCount; ++i) {
    auto r = (*w)->Reserve(SizeOf(i), {}, Deadline());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Fill(r->dst, r->seq);
    ASSERT_TRUE((*w)->Publish(r->seq).ok());
  }
  (*w)->Finish();
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ((*w)->stats().samples, kCount);
}

// Publishes `n` samples of `size` bytes (or SizeOf(seq) when size is 0) with the checkable
// pattern, then finishes the stream.
void Produce(RingWriter* w, uint64_t n, uint64_t size = 0) {
  for (uint64_t i = 0; i < n; ++i) {
    auto r = w->Reserve(size != 0 ? size : SizeOf(i),
                        SampleMeta{static_cast<uint32_t>(i + 100), 0, 0, i / 8, i}, Deadline());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Fill(r->dst, r->seq);
    ASSERT_TRUE(w->Publish(r->seq).ok());
  }
  w->Finish();
}

std::vector<uint64_t> Seqs(const std::vector<View>& views) {
  std::vector<uint64_t> s;
  for (const View& v : views)
    s.push_back(v.seq);
  return s;
}

TEST(RingBatch, TakesInOrderAndReleasesAtOnceWhileTheProducerRuns) {
  auto w = RingWriter::Create(64 * 1024, 32);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  constexpr uint64_t kCount = 1003;
  std::thread producer([&] { Produce(w->get(), kCount); });
  uint64_t next = 0, calls = 0;
  std::vector<View> batch;
  for (;;) {
    batch.clear();
    auto n = reader->NextBatch(8, 10s, &batch);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    ++calls;
    ASSERT_EQ(*n, batch.size());
    if (*n == 0) break;
    ASSERT_LE(*n, 8u);
    for (const View& v : batch) {
      ASSERT_EQ(v.seq, next) << "out of order";
      EXPECT_EQ(v.sample_id, next + 100);
      EXPECT_EQ(v.size, SizeOf(next));
      EXPECT_TRUE(Check(v)) << "seq " << v.seq;
      ++next;
    }
    ASSERT_TRUE(reader->ReleaseBatch(Seqs(batch)).ok());
  }
  producer.join();
  EXPECT_EQ(next, kCount);
  EXPECT_EQ((*w)->released(), kCount);
  const RingStats st = reader->stats();
  EXPECT_EQ(st.samples, kCount);
  EXPECT_EQ(st.next_calls, calls);  // one per batch, not one per sample
  EXPECT_LT(calls, kCount / 4);
}

TEST(RingBatch, PartialLastBatchThenEndOfStream) {
  auto w = RingWriter::Create(64 * 1024, 16);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  Produce(w->get(), 13, 100);
  std::vector<View> batch;
  auto n = reader->NextBatch(8, 1s, &batch);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 8u);
  ASSERT_TRUE(reader->ReleaseBatch(Seqs(batch)).ok());
  batch.clear();
  n = reader->NextBatch(8, 1s, &batch);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 5u);  // the short last batch
  EXPECT_EQ(batch.front().seq, 8u);
  EXPECT_EQ(batch.back().seq, 12u);
  n = reader->NextBatch(8, 1s, &batch);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);  // end of stream
  EXPECT_EQ(batch.size(), 5u);
}

TEST(RingBatch, ABatchLargerThanTheSlotTableTakesTheFreeSlots) {
  auto w = RingWriter::Create(64 * 1024, 4);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  std::thread producer([&] { Produce(w->get(), 10, 64); });
  std::vector<View> batch;
  auto n = reader->NextBatch(100, 10s, &batch);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 4u);  // all the slots
  auto more = reader->NextBatch(1, 1s, &batch);
  EXPECT_EQ(more.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(more.status().message().find("release some before asking for more"), std::string::npos);
  uint64_t next = 0;
  for (;;) {
    for (const View& v : batch) {
      EXPECT_EQ(v.seq, next++);
      EXPECT_TRUE(Check(v));
    }
    ASSERT_TRUE(reader->ReleaseBatch(Seqs(batch)).ok());
    batch.clear();
    n = reader->NextBatch(100, 10s, &batch);
    ASSERT_TRUE(n.ok());
    if (*n == 0) break;
    EXPECT_LE(*n, 4u);
  }
  producer.join();
  EXPECT_EQ(next, 10u);
}

// The samples of one batch fill the arena: the producer sleeps for space only their release can
// free, so the batch returns what it holds instead of waiting for the timeout.
TEST(RingBatch, ABatchLargerThanTheArenaReturnsWhatFits) {
  auto w = RingWriter::Create(4096, 64);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  std::thread producer([&] { Produce(w->get(), 40, 1000); });  // 4 fit in the arena
  uint64_t next = 0;
  std::vector<View> batch;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    batch.clear();
    auto n = reader->NextBatch(32, 30s, &batch);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    if (*n == 0) break;
    EXPECT_LE(*n, 4u);
    for (const View& v : batch) {
      EXPECT_EQ(v.seq, next++);
      EXPECT_TRUE(Check(v));
    }
    ASSERT_TRUE(reader->ReleaseBatch(Seqs(batch)).ok());
  }
  producer.join();
  EXPECT_EQ(next, 40u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);  // never waited for the timeout
}

TEST(RingBatch, AnErrorSlotEndsTheBatchAndIsTheNextCallsResult) {
  auto w = RingWriter::Create(4096, 8);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  for (uint64_t i = 0; i < 4; ++i) {
    auto r = (*w)->Reserve(256, SampleMeta{static_cast<uint32_t>(i), 0, 0, 0, i}, Deadline());
    ASSERT_TRUE(r.ok());
    if (i == 2) {
      ASSERT_TRUE((*w)->PublishError(r->seq, Status::NotFound("sample 2 (/pfs/c.jpg): gone")).ok());
    } else {
      Fill(r->dst, r->seq);
      ASSERT_TRUE((*w)->Publish(r->seq).ok());
    }
  }
  (*w)->Finish();
  std::vector<View> batch;
  auto n = reader->NextBatch(8, 1s, &batch);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  auto e = reader->NextBatch(8, 1s, &batch);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(e.status().message(), "sample 2 (/pfs/c.jpg): gone");
  EXPECT_EQ(batch.size(), 2u);  // nothing appended by a failed call
  n = reader->NextBatch(8, 1s, &batch);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);
  EXPECT_EQ(batch.back().seq, 3u);
  EXPECT_TRUE(Check(batch.back()));
  ASSERT_TRUE(reader->ReleaseBatch(Seqs(batch)).ok());
  EXPECT_EQ((*w)->released(), 4u);
}

TEST(RingBatch, ReleaseBatchIsAllOrNothing) {
  auto w = RingWriter::Create(4096, 8);
  ASSERT_TRUE(w.ok());
  auto reader = ReaderFor(**w);
  Produce(w->get(), 3, 10);
  std::vector<View> batch;
  ASSERT_EQ(*reader->NextBatch(8, 1s, &batch), 3u);
  const std::vector<uint64_t> unknown = {0, 5};
  EXPECT_EQ(reader->ReleaseBatch(unknown).code(), StatusCode::kFailedPrecondition);
  const std::vector<uint64_t> twice = {1, 1};
  EXPECT_EQ(reader->ReleaseBatch(twice).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->released(), 0u);
  const std::vector<uint64_t> all = {2, 0, 1};
  EXPECT_TRUE(reader->ReleaseBatch(all).ok());
  EXPECT_EQ((*w)->released(), 3u);
}

}  // namespace
}  // namespace nopfs::ring
