#include "fabric/serve_pool.h"

#include <utility>

namespace nopfs::fabric {

ServePool::~ServePool() {
  Stop();
}

void ServePool::Start(uint32_t threads, Handler handler) {
  handler_ = std::move(handler);
  for (uint32_t i = 0; i < threads; ++i)
    threads_.emplace_back([this] { Loop(); });
}

void ServePool::Submit(ServeJob job) {
  {
    MutexLock lock(&mu_);
    if (stop_) return;
    queue_.push_back(std::move(job));
  }
  // After the mutex: a thread woken while it is held wakes only to wait for it.
  cv_.Signal();
}

void ServePool::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    queue_.clear();
    cv_.SignalAll();
  }
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
}

void ServePool::Loop() {
  for (;;) {
    ServeJob job;
    {
      MutexLock lock(&mu_);
      while (!stop_ && queue_.empty())
        cv_.Wait(&mu_);
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    handler_(job);
  }
}

}  // namespace nopfs::fabric
