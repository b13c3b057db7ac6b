// The ranks' streams: HELLO, OPEN_STREAM (one process per rank, at most limits().streams_per_rank
// streams per rank, a ring each), CLOSE_STREAM and DESCRIBE (docs/wire.md).
#include <algorithm>
#include <numeric>

#include <spdlog/spdlog.h>

#include "common/units.h"
#include "service/daemon/daemon.h"
#include "service/daemon/daemon_internal.h"

namespace nopfs::service {
namespace {

using daemon_internal::Merge;

constexpr uint32_t kMinRingSlots = 64;
constexpr uint32_t kMaxRingSlots = 1u << 16;
// How long an open waits for another process's streams of its rank to close before it is
// refused: a process that died or exited a moment ago has its connection closed by the kernel,
// and the server closes its streams within milliseconds.
constexpr auto kOwnerGrace = std::chrono::seconds(2);

}  // namespace

HelloInfo Daemon::Hello() {
  HelloInfo h;
  h.job_id = options_.job_id;
  h.ranks = job_.ranks;
  h.first_rank = job_.first_rank(options_.node);
  h.local_ranks = job_.ranks_on_node(options_.node);
  return h;
}

Result<StreamGrant> Daemon::OpenStream(const OpenStreamRequest& req, ConnectionId /*conn*/) {
  const uint32_t first = job_.first_rank(options_.node);
  const uint32_t local = job_.ranks_on_node(options_.node);
  if (req.rank < first || req.rank >= first + local) {
    return Status::InvalidArgument(
        "rank " + std::to_string(req.rank) + " does not run on this node (node " +
        std::to_string(options_.node) + " serves ranks " + std::to_string(first) + " to " +
        std::to_string(first + local - 1) + ")");
  }
  const policy::StreamPoint start{req.epoch, req.step};
  NOPFS_RETURN_IF_ERROR(policy::ValidateStreamPoint(job_, start));
  NOPFS_RETURN_IF_ERROR(ValidateShare(req.share));
  uint64_t id = 0;
  const uint32_t most = config_.limits().streams_per_rank;
  if (req.owner_pid == 0) {
    return Status::InvalidArgument(
        "nopfsd: OPEN_STREAM names owner pid 0; a DataLoader worker "
        "names the pid of the process whose rank it reads");
  }
  const Claim claim{req.rank, req.owner_pid, req.epoch,
                    req.share.epochs == 0
                        ? job_.epochs
                        : static_cast<uint32_t>(std::min<uint64_t>(
                              uint64_t{req.epoch} + req.share.epochs, job_.epochs))};
  {
    MutexLock lock(&mu_);
    // One process per rank (docs/wire.md): another owner's overlapping stream of this rank is
    // waited for a moment (it may be closing: its process just exited), then refused.
    const auto other_owner = [&]() REQUIRES(mu_) -> const Claim* {
      for (const auto& [sid, c] : claims_) {
        if (c.rank == claim.rank && c.owner_pid != claim.owner_pid &&
            c.first_epoch < claim.end_epoch && claim.first_epoch < c.end_epoch) {
          return &c;
        }
      }
      return nullptr;
    };
    const auto deadline = std::chrono::steady_clock::now() + kOwnerGrace;
    while (!stopped_ && other_owner() != nullptr && closed_cv_.WaitUntil(&mu_, deadline)) {
    }
    if (stopped_) return Status::Unavailable("nopfsd is stopping");
    if (const Claim* c = other_owner()) {
      const uint32_t epoch = std::max(c->first_epoch, claim.first_epoch);
      if (refused_owners_++ % 1000 == 0) {
        spdlog::warn(
            "refused a stream of rank {} for pid {}: pid {} reads that rank in epoch {} "
            "({} refused in all)",
            req.rank, req.owner_pid, c->owner_pid, epoch, refused_owners_);
      }
      return Status::FailedPrecondition(
          "nopfsd: rank " + std::to_string(req.rank) + "'s stream is already open by pid " +
          std::to_string(c->owner_pid) + " (epoch " + std::to_string(epoch) +
          "); each process needs its own rank: under a launcher that starts several processes "
          "per task (torchrun), submit with --nopfs-ranks-per-node = tasks per node x "
          "processes per task and let nopfs.torch take the rank from LOCAL_RANK (nopfs.Job."
          "from_env); DataLoader workers read shares of their process's rank through "
          "nopfs.torch (docs/user.md, \"Launchers\")");
    }
    uint32_t& open = open_per_rank_[req.rank];
    if (open >= most) {
      if (refused_streams_++ % 1000 == 0) {
        spdlog::warn(
            "refused a stream of rank {}: it has {} open, the most one rank may have "
            "({} refused in all)",
            req.rank, open, refused_streams_);
      }
      return Status::ResourceExhausted(
          "nopfsd: rank " + std::to_string(req.rank) + " already has " + std::to_string(open) +
          " streams open, the most one rank may have (limits.streams_per_rank in the node "
          "config; each holds a ring of " +
          FormatBytes(static_cast<double>(ring_bytes_)) +
          "); close a stream first, or use fewer DataLoader workers");
    }
    ++open;
    id = next_stream_++;
    claims_[id] = claim;
  }
  Result<std::unique_ptr<ring::RingWriter>> ring = TakeRing(req.rank);
  if (!ring.ok()) {
    MutexLock lock(&mu_);
    --open_per_rank_[req.rank];
    claims_.erase(id);
    closed_cv_.SignalAll();
    return ring.status();
  }
  StreamGrant grant;
  grant.stream_id = id;
  grant.ring_fd = (*ring)->fd();
  grant.capacity = (*ring)->capacity();
  grant.slot_count = (*ring)->slot_count();
  auto stream = std::make_unique<StagingStream>(id, job_, req.rank, start, req.share, *catalog_,
                                                *reader_, std::move(*ring), model_.staging.threads);
  if ((req.flags & wire::kOpenAcceptRegion) != 0 && reader_->region_class() >= 0) {
    // Zero copy: the client maps the RAM tier read-only and reads ready samples in place.
    const RamTier* ram = tier_refs_[static_cast<size_t>(reader_->region_class())].ram;
    Result<int> fd = ram->OpenReadOnlyFd();
    if (fd.ok()) {
      grant.region_fd.Reset(*fd);
      grant.region_bytes = ram->mapped_bytes();
      stream->EnableInPlace();
    } else {
      spdlog::warn("stream {}: serving by copy: {}", id, fd.status().message());
    }
  }
  stream->Start();
  spdlog::info(
      "stream {}: rank {} from epoch {} step {} (batches {} of every {} of {} entries, "
      "{} epochs; 0: all)",
      id, req.rank, req.epoch, req.step, req.share.worker, req.share.workers, req.share.batch,
      req.share.epochs);
  MutexLock lock(&mu_);
  streams_[id] = std::move(stream);
  return grant;
}

std::function<void()> Daemon::CloseStream(uint64_t stream_id) {
  std::shared_ptr<StagingStream> s;
  {
    MutexLock lock(&mu_);
    auto it = streams_.find(stream_id);
    if (it == streams_.end()) return nullptr;
    s = std::move(it->second);
    streams_.erase(it);
    --open_per_rank_[s->rank()];
    claims_.erase(stream_id);
    // The reader's figures are final: the client reads no more.
    Merge(&closed_stats_, s->ring().stats());
  }
  closed_cv_.SignalAll();
  // Stopping the writer and unmapping the ring (milliseconds for a large ring) wait until the
  // client has its answer, and run on the ring thread: the connection's next request does not
  // wait for them.
  return [this, s = std::move(s)]() mutable { Retire(std::move(s)); };
}

uint32_t Daemon::RingSlots() const {
  const double mean = static_cast<double>(std::accumulate(catalog_->sizes().begin(),
                                                          catalog_->sizes().end(), uint64_t{0})) /
                      static_cast<double>(std::max<uint64_t>(1, catalog_->size()));
  return static_cast<uint32_t>(std::clamp<double>(
      2.0 * static_cast<double>(ring_bytes_) / std::max(1.0, mean), kMinRingSlots, kMaxRingSlots));
}

Result<std::unique_ptr<ring::RingWriter>> Daemon::TakeRing(uint32_t rank) {
  {
    MutexLock lock(&ring_mu_);
    if (spare_ring_ != nullptr) {
      std::unique_ptr<ring::RingWriter> r = std::move(spare_ring_);
      ring_cv_.SignalAll();  // the next one
      return r;
    }
  }
  return ring::RingWriter::Create(ring_bytes_, RingSlots(),
                                  "nopfs-" + options_.job_id + "-rank" + std::to_string(rank));
}

void Daemon::Retire(std::shared_ptr<StagingStream> s) {
  {
    MutexLock lock(&ring_mu_);
    if (!ring_stop_ && ring_thread_.joinable()) {
      closing_.push_back(std::move(s));
      ring_cv_.SignalAll();
      return;
    }
  }
  s->Cancel();  // no ring thread (stopping): the caller waits
  spdlog::info("stream {} (rank {}) closed: {} staged, {} errors", s->id(), s->rank(), s->staged(),
               s->errors());
}

void Daemon::RingThread() {
  const uint32_t slots = RingSlots();
  MutexLock lock(&ring_mu_);
  for (;;) {
    while (closing_.empty() && spare_ring_ != nullptr && !ring_stop_)
      ring_cv_.Wait(&ring_mu_);
    if (!closing_.empty()) {
      std::shared_ptr<StagingStream> s = std::move(closing_.front());
      closing_.pop_front();
      lock.Unlock();
      s->Cancel();
      spdlog::info("stream {} (rank {}) closed: {} staged, {} errors", s->id(), s->rank(),
                   s->staged(), s->errors());
      s.reset();
      lock.Lock();
    } else if (ring_stop_) {
      return;  // every closed stream is freed
    } else {
      lock.Unlock();
      Result<std::unique_ptr<ring::RingWriter>> r =
          ring::RingWriter::Create(ring_bytes_, slots, "nopfs-" + options_.job_id + "-ring");
      lock.Lock();
      if (!r.ok()) {
        // An open meanwhile makes its own ring (and says why it cannot); try again in a while.
        spdlog::warn("could not make a ring ahead: {}", r.status().message());
        const auto retry = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        while (closing_.empty() && !ring_stop_ && ring_cv_.WaitUntil(&ring_mu_, retry)) {
        }
        continue;
      }
      spare_ring_ = std::move(*r);
    }
  }
}

Result<wire::DescribeOk> Daemon::Describe(uint32_t sample_id) {
  if (sample_id >= catalog_->size()) {
    return Status::NotFound("sample " + std::to_string(sample_id) +
                            " is not in the dataset (it has " + std::to_string(catalog_->size()) +
                            " samples)");
  }
  return wire::DescribeOk{sample_id, catalog_->path(sample_id), catalog_->offset(sample_id),
                          catalog_->length(sample_id), catalog_->label(sample_id)};
}

}  // namespace nopfs::service
