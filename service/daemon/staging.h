// StagingStream: one open stream of one local rank. A sequencer thread walks the rank's access
// stream (policy::RankStream) from the requested (epoch, step), keeps the accesses of the
// requested share (wire::StreamShare: every workers-th batch of each epoch, up to an epoch
// limit; by default all of them), reserves space for each access in
// the rank's ring in that exact order (blocking while the ring is full: back-pressure from a slow
// client), and hands the reservation to p0 staging threads that read the sample from the fastest
// source (SampleReader) straight into the ring and publish it. A sample ready in the RAM tier the
// client maps (EnableInPlace) costs only a lookup: the sequencer publishes it in place itself,
// unless RAM hits are verified (hashing is the threads' work). The client sees samples in stream
// order however the threads finish.
//
// A read that fails is published as an error slot whose text names the sample and its path; the
// stream goes on with the next sample. Cancel() (the client closed the stream or died, or nopfsd
// is stopping) wakes everything and joins the threads.
//
// Thread safety: Start/Cancel from the owning thread; counters from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "policy/job.h"
#include "policy/partition.h"
#include "protocol/ring.h"
#include "protocol/wire.h"
#include "service/catalog/catalog.h"
#include "service/reader/sample_reader.h"

namespace nopfs::service {

// InvalidArgument unless workers >= 1, worker < workers and batch >= 1.
Status ValidateShare(const wire::StreamShare& share);

// How many of the first `n` entries of an epoch belong to the share: entries k with
// (k / batch) % workers == worker.
uint64_t ShareCount(uint64_t n, const wire::StreamShare& share);

class StagingStream {
 public:
  // `share` must be valid (ValidateShare).
  StagingStream(uint64_t id, const policy::JobSpec& job, uint32_t rank, policy::StreamPoint start,
                const wire::StreamShare& share, const Catalog& catalog, SampleReader& reader,
                std::unique_ptr<ring::RingWriter> ring, uint32_t threads);
  ~StagingStream();
  StagingStream(const StagingStream&) = delete;
  StagingStream& operator=(const StagingStream&) = delete;

  void Start();
  // Idempotent: cancels the ring, joins the threads.
  void Cancel();

  // Before Start(): samples ready in the reader's region class are published in place
  // (RingWriter::PublishInRegion; the client mapped that tier) instead of copied into the ring.
  void EnableInPlace() {
    in_place_ = true;
    verify_in_place_ = reader_.verifies_ram_hits();
  }
  uint64_t id() const { return id_; }
  uint32_t rank() const { return rank_; }
  ring::RingWriter& ring() { return *ring_; }
  uint64_t total() const { return total_; }  // accesses of the share from the start to the end
  uint64_t staged() const { return staged_.load(std::memory_order_relaxed); }
  uint64_t errors() const { return errors_.load(std::memory_order_relaxed); }
  bool finished() const { return finished_.load(std::memory_order_relaxed); }

 private:
  struct Work {
    uint64_t seq;
    policy::SampleId sample;
    std::span<std::byte> dst;
  };
  void Sequence();
  void Stage();
  void PublishInPlace(uint64_t seq, policy::SampleId sample, const SampleReader::InPlace& at);

  const uint64_t id_;
  const policy::JobSpec job_;
  const uint32_t rank_;
  const policy::StreamPoint start_;
  const wire::StreamShare share_;
  bool in_place_ = false;
  bool verify_in_place_ = true;  // RAM hits are verified: in-place publishing is the threads' work
  uint32_t end_epoch_ = 0;       // the first epoch not served
  const Catalog& catalog_;
  SampleReader& reader_;
  std::unique_ptr<ring::RingWriter> ring_;
  const uint32_t threads_;
  uint64_t total_ = 0;

  Mutex mu_;
  CondVar cv_;
  std::deque<Work> queue_ GUARDED_BY(mu_);
  bool no_more_ GUARDED_BY(mu_) = false;  // the sequencer is done
  std::atomic<bool> cancelled_{false};
  std::atomic<uint64_t> staged_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<bool> finished_{false};
  std::thread sequencer_;
  std::vector<std::thread> workers_;
};

}  // namespace nopfs::service
