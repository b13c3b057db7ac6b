#include "common/mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace nopfs {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

class Counter {
 public:
  void Add() {
    MutexLock lock(&mu_);
    ++n_;
    changed_.SignalAll();
  }
  // Waits until the count reaches `want` or `timeout` passes; returns the count it saw.
  int WaitFor(int want, milliseconds timeout) {
    const auto deadline = steady_clock::now() + timeout;
    MutexLock lock(&mu_);
    while (n_ < want && changed_.WaitUntil(&mu_, deadline)) {
    }
    return n_;
  }
  // Lets go of the lock in the middle, as a scope that does slow work unlocked.
  int AddTwiceUnlockedBetween() {
    MutexLock lock(&mu_);
    ++n_;
    lock.Unlock();
    std::this_thread::yield();
    lock.Lock();
    ++n_;
    return n_;
  }

 private:
  Mutex mu_;
  CondVar changed_;
  int n_ GUARDED_BY(mu_) = 0;
};

TEST(Mutex, ManyThreadsCountExactly) {
  Counter c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c] {
      for (int i = 0; i < 10000; ++i)
        c.Add();
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(c.WaitFor(40000, milliseconds(0)), 40000);
}

TEST(Mutex, CondVarWakesAWaiter) {
  Counter c;
  std::thread adder([&c] {
    std::this_thread::sleep_for(milliseconds(20));
    c.Add();
  });
  const auto t0 = steady_clock::now();
  EXPECT_EQ(c.WaitFor(1, std::chrono::seconds(30)), 1);
  EXPECT_LT(steady_clock::now() - t0, std::chrono::seconds(30));
  adder.join();
}

TEST(Mutex, WaitUntilReturnsFalseAtTheDeadline) {
  Counter c;
  const auto t0 = steady_clock::now();
  EXPECT_EQ(c.WaitFor(1, milliseconds(50)), 0);
  EXPECT_GE(steady_clock::now() - t0, milliseconds(50));
}

TEST(Mutex, MutexLockUnlocksAndRelocks) {
  Counter c;
  EXPECT_EQ(c.AddTwiceUnlockedBetween(), 2);
  c.Add();  // the lock was released at the end of the scope: this does not deadlock
  EXPECT_EQ(c.WaitFor(3, milliseconds(0)), 3);
}

// A value that readers read together and a writer changes alone.
class Shared {
 public:
  int Read() {
    ReaderLock lock(&mu_);
    return value_;
  }
  // Holds a reader's lock until `release` is set, after saying it holds it in `holding`.
  int ReadHolding(std::atomic<int>* holding, const std::atomic<bool>* release) {
    ReaderLock lock(&mu_);
    ++*holding;
    while (!release->load())
      std::this_thread::yield();
    return value_;
  }
  void Write(int v) {
    WriterLock lock(&mu_);
    value_ = v;
  }

 private:
  SharedMutex mu_;
  int value_ GUARDED_BY(mu_) = 0;
};

TEST(SharedMutex, ReadersHoldItTogetherAndTheWriterAlone) {
  Shared s;
  std::atomic<int> holding{0};
  std::atomic<bool> release{false};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r)
    readers.emplace_back([&] { EXPECT_EQ(s.ReadHolding(&holding, &release), 0); });
  // Both readers are inside at once (a plain mutex would keep the second out for good).
  while (holding.load() < 2)
    std::this_thread::yield();
  std::atomic<bool> written{false};
  std::thread writer([&] {
    s.Write(7);
    written = true;
  });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(written.load()) << "the writer waits for the readers";
  release = true;
  writer.join();
  for (auto& t : readers)
    t.join();
  EXPECT_TRUE(written.load());
  EXPECT_EQ(s.Read(), 7);
}

}  // namespace
}  // namespace nopfs
