// fabric::ServePool: the threads that serve a peer link's authenticated read requests and pushes,
// so that a slow tier read (an SSD) delays neither the link's progress thread nor the other
// requests. Jobs wait in one queue; each thread takes the oldest and runs the pool's handler on
// it. With no threads the link runs the handler itself (inline()).
//
// Thread safety: Submit and Stop may be called from any thread; the handler runs on the pool's
// threads, several at once, and must be thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace nopfs::fabric {

// A read request from node `node`, or a sample it pushed (`push`).
struct ServeJob {
  uint32_t node = 0;
  uint64_t request_id = 0;
  uint64_t sample = 0;
  bool remote_ok = false;  // the reader asked with kAcceptsRemoteRead
  bool push = false;       // a Push to hand to on_push, not a read request
  uint64_t push_xxh3 = 0;
  std::vector<std::byte> push_data;
};

class ServePool {
 public:
  using Handler = std::function<void(ServeJob& job)>;

  ServePool() = default;
  ~ServePool();  // Stop()
  ServePool(const ServePool&) = delete;
  ServePool& operator=(const ServePool&) = delete;

  // Starts `threads` threads running `handler` on each job (once, before any Submit).
  void Start(uint32_t threads, Handler handler);
  // Whether the pool has no threads: the caller serves jobs itself.
  bool inline_only() const { return threads_.empty(); }
  // Queues a job for the next free thread (dropped once stopped).
  void Submit(ServeJob job);
  // Wakes and joins the threads; jobs still queued are dropped. Idempotent.
  void Stop();

 private:
  void Loop();

  Handler handler_;
  Mutex mu_;
  CondVar cv_;
  std::deque<ServeJob> queue_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace nopfs::fabric
