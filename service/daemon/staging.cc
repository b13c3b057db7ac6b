#include "service/daemon/staging.h"

#include <spdlog/spdlog.h>

#include "common/mutex.h"

namespace nopfs::service {
namespace {
// Bytes reserved at least per sample, so that an error message fits in place of a small sample.
constexpr uint64_t kErrorRoom = 512;
}  // namespace

Status ValidateShare(const wire::StreamShare& share) {
  if (share.workers == 0 || share.worker >= share.workers || share.batch == 0) {
    return Status::InvalidArgument(
        "a stream share needs worker < workers and a batch of at least 1 (got worker " +
        std::to_string(share.worker) + " of " + std::to_string(share.workers) + ", batch " +
        std::to_string(share.batch) + ")");
  }
  return Status::Ok();
}

uint64_t ShareCount(uint64_t n, const wire::StreamShare& share) {
  const uint64_t round = share.batch * share.workers;  // entries per round of batches
  if (round / share.workers != share.batch) return share.worker == 0 ? n : 0;  // overflow: one
  const uint64_t rest = n % round;
  const uint64_t before = share.batch * share.worker;  // entries of earlier workers in a round
  const uint64_t tail = rest > before ? std::min(rest - before, share.batch) : 0;
  return (n / round) * share.batch + tail;
}

StagingStream::StagingStream(uint64_t id, const policy::JobSpec& job, uint32_t rank,
                             policy::StreamPoint start, const wire::StreamShare& share,
                             const Catalog& catalog, SampleReader& reader,
                             std::unique_ptr<ring::RingWriter> ring, uint32_t threads)
    : id_(id),
      job_(job),
      rank_(rank),
      start_(start),
      share_(share),
      catalog_(catalog),
      reader_(reader),
      ring_(std::move(ring)),
      threads_(std::max<uint32_t>(1, threads)) {
  // Accesses of the share from (epoch, step) to the end epoch: the tail of the start epoch, then
  // whole epochs.
  const uint64_t limit =
      share_.epochs == 0 ? job_.epochs
                         : std::min<uint64_t>(job_.epochs, uint64_t{start_.epoch} + share_.epochs);
  end_epoch_ = static_cast<uint32_t>(limit);
  const uint64_t per_epoch = policy::RankEpochLength(job_, rank_);
  if (start_.epoch < end_epoch_) {
    const policy::EntryRange first = policy::RankStepEntries(job_, rank_, start_.step);
    total_ = ShareCount(per_epoch - std::min(per_epoch, first.begin), share_) +
             ShareCount(per_epoch, share_) * (end_epoch_ - start_.epoch - 1);
  }
}

StagingStream::~StagingStream() {
  Cancel();
}

void StagingStream::Start() {
  sequencer_ = std::thread([this] { Sequence(); });
  for (uint32_t i = 0; i < threads_; ++i)
    workers_.emplace_back([this] { Stage(); });
}

void StagingStream::Cancel() {
  cancelled_.store(true);
  ring_->Cancel();
  {
    MutexLock lock(&mu_);
    no_more_ = true;
  }
  cv_.SignalAll();
  if (sequencer_.joinable()) sequencer_.join();
  for (std::thread& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}

void StagingStream::Sequence() {
  policy::RankStream stream(job_, rank_, start_);
  policy::Access a;
  uint64_t count = 0;
  uint32_t epoch = UINT32_MAX;  // the epoch of the previous access
  uint64_t epoch_first = 0;     // the entry index at which the stream entered `epoch`
  while (!cancelled_.load(std::memory_order_relaxed) && stream.Next(&a)) {
    if (a.epoch >= end_epoch_) break;
    if (a.epoch != epoch) {
      epoch = a.epoch;
      epoch_first = a.index;
    }
    if (((a.index - epoch_first) / share_.batch) % share_.workers != share_.worker) continue;
    ring::SampleMeta meta;
    meta.sample_id = a.sample;
    meta.label = catalog_.label(a.sample);
    meta.epoch = a.epoch;
    meta.step = a.step;
    meta.position = a.index;
    // Room for the error text too, should the read fail.
    const uint64_t size = catalog_.length(a.sample);
    // The arena's memory is committed only for samples copied into it (Stage): one published
    // in the region (zero copy) never touches it.
    Result<ring::RingWriter::Reservation> r = ring_->Reserve(
        std::max<uint64_t>(size, kErrorRoom), meta, std::chrono::steady_clock::time_point::max(),
        ring::RingWriter::Space::kOnCommit);
    if (!r.ok()) {
      if (!cancelled_.load()) {
        spdlog::error("stream {} (rank {}): cannot stage sample {}: {}", id_, rank_, a.sample,
                      r.status().message());
      }
      break;
    }
    // A sample ready in the region costs a lookup to publish, less than handing it to a staging
    // thread (a wake-up per sample, which on 2 cores takes the CPU the training needs). Not when
    // RAM hits are verified: hashing is the staging threads' work, in parallel.
    if (in_place_ && !verify_in_place_) {
      if (const std::optional<SampleReader::InPlace> at = reader_.ReadInPlace(a.sample)) {
        PublishInPlace(r->seq, a.sample, *at);
        ++count;
        continue;
      }
    }
    {
      MutexLock lock(&mu_);
      queue_.push_back(Work{r->seq, a.sample, r->dst});
    }
    cv_.Signal();
    ++count;
  }
  if (!cancelled_.load()) ring_->Finish();
  (void)count;
  {
    MutexLock lock(&mu_);
    no_more_ = true;
  }
  cv_.SignalAll();
}

void StagingStream::PublishInPlace(uint64_t seq, policy::SampleId sample,
                                   const SampleReader::InPlace& at) {
  if (Status p = ring_->PublishInRegion(seq, at.offset, at.size); !p.ok()) {
    spdlog::error("stream {} (rank {}): publishing sample {}: {}", id_, rank_, sample, p.message());
  }
  staged_.fetch_add(1, std::memory_order_relaxed);
}

void StagingStream::Stage() {
  for (;;) {
    Work w;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !no_more_)
        cv_.Wait(&mu_);
      if (queue_.empty()) break;
      w = queue_.front();
      queue_.pop_front();
    }
    if (cancelled_.load(std::memory_order_relaxed)) continue;
    if (in_place_) {
      if (const std::optional<SampleReader::InPlace> at = reader_.ReadInPlace(w.sample)) {
        PublishInPlace(w.seq, w.sample, *at);
        continue;
      }
    }
    const Status room = ring_->Commit(w.seq);
    Result<SourceId> src =
        room.ok() ? reader_.Read(w.sample, w.dst.first(catalog_.length(w.sample)))
                  : Result<SourceId>(room.WithContext("sample " + std::to_string(w.sample)));
    if (src.ok()) {
      if (Status p = ring_->Publish(w.seq, catalog_.length(w.sample)); !p.ok()) {
        spdlog::error("stream {} (rank {}): publishing sample {}: {}", id_, rank_, w.sample,
                      p.message());
      }
      staged_.fetch_add(1, std::memory_order_relaxed);
    } else {
      errors_.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("stream {} (rank {}): {}", id_, rank_, src.status().message());
      (void)ring_->PublishError(w.seq, src.status());
    }
  }
  if (staged() + errors() == total_) finished_.store(true);
}

}  // namespace nopfs::service
