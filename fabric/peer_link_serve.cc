// PeerLink::State's serving side: a request answered by a serving thread (or pushed data handed
// on), and the RMA side driven by the progress thread (exposed regions registered, peers' remote
// replies read by RMA).
#include <spdlog/spdlog.h>

#include <cstring>

#include "common/checksum.h"
#include "fabric/peer_link_state.h"

namespace nopfs::fabric {

using namespace peer_link_detail;  // the link's constants

const PeerLink::State::Region* PeerLink::State::RegionOfLocked(const std::byte* p, uint64_t n) const
    REQUIRES(mu) {
  for (const Region& r : regions) {
    if (r.registered && p >= r.begin && n <= r.size &&
        static_cast<uint64_t>(p - r.begin) <= r.size - n) {
      return &r;
    }
  }
  return nullptr;
}

void PeerLink::State::Serve(ServeJob& job) {
  if (job.push) {
    opts.on_push(job.node, job.sample, job.push_xxh3, job.push_data);
  } else {
    Answer(job);
  }
}

void PeerLink::State::Answer(const ServeJob& job) {
  Answer(job, serve(job.sample), false);
}

void PeerLink::State::Answer(const ServeJob& job, ServeResult r, bool nowait) {
  ReadReply reply{job.request_id, job.sample, r.status, 0, {}};
  std::optional<RemoteReply> remote;
  std::span<const std::byte> borrowed;  // an in-place sample sent from where it is
  if (r.status == ReadStatus::kOk && !r.in_place.empty()) {
    if (r.in_place.size() > kMaxSampleBytes) {
      reply.status = ReadStatus::kError;
    } else {
      if (job.remote_ok && r.in_place.size() >= opts.remote_read_min) {
        MutexLock lock(&mu);
        if (const Region* g = RegionOfLocked(r.in_place.data(), r.in_place.size())) {
          remote = RemoteReply{
              job.request_id,
              job.sample,
              r.in_place.size(),
              g->exposed.wire_base + static_cast<uint64_t>(r.in_place.data() - g->begin),
              g->exposed.key,
              r.xxh3};
        }
      }
      if (!remote) {
        // Sent straight from the memory, with the xxh3 recorded at fill: the reader checks it
        // before it uses a byte, as after an RMA read.
        borrowed = r.in_place;
        reply.xxh3 = r.xxh3;
      }
    }
  } else if (r.status == ReadStatus::kOk && r.data.size() > kMaxSampleBytes) {
    reply.status = ReadStatus::kError;
  } else if (r.status == ReadStatus::kOk) {
    reply.data = std::move(r.data);
    if (r.verified) {
      reply.xxh3 = r.xxh3;
    } else if (!reply.data.empty()) {
      reply.xxh3 = Xxh3(reply.data);
    }
  }
  // The reply's data is sent as a second part of the message, not copied behind its head.
  std::vector<std::byte> tail;
  std::vector<std::byte> bytes;
  if (remote) {
    bytes = Encode(*remote);
  } else {
    tail = std::move(reply.data);
    reply.data.clear();
    bytes = EncodeReplyHead(reply, borrowed.empty() ? tail.size() : borrowed.size());
  }
  {
    MutexLock lock(&mu);
    if (remote) {
      ++counters.served_reads;
      ++counters.served_remote;
      counters.served_bytes += remote->length;
    } else if (!borrowed.empty()) {
      ++counters.served_reads;
      ++counters.served_in_place;
      counters.served_bytes += borrowed.size();
    } else if (reply.status == ReadStatus::kOk) {
      ++counters.served_reads;
      counters.served_bytes += tail.size();
      if (nowait) ++counters.served_nowait;
    } else {
      ++counters.served_not_available;
    }
    outbox.push_back({job.node, std::move(bytes), std::move(tail), borrowed});
  }
  wake.store(true);
  ep->Wake();
}

void PeerLink::State::DriveRemote() {
  std::vector<Region*> todo;
  std::deque<std::pair<uint32_t, RemoteReply>> posts;
  {
    MutexLock lock(&mu);
    if (regions_pending) {
      for (Region& g : regions)
        if (!g.registered) todo.push_back(&g);
      regions_pending = false;
    }
    posts.swap(reads_to_post);
  }
  for (Region* g : todo) {
    const Nonce n = RandomNonce();
    uint64_t key = 0;
    std::memcpy(&key, n.data(), sizeof key);
    Result<ExposedRegion> e = ep->ExposeForRemoteRead({g->begin, g->size}, key);
    MutexLock lock(&mu);
    g->tried = true;
    if (e.ok()) {
      g->exposed = *e;
      g->registered = true;
    } else {
      g->status = e.status();
    }
    cv.SignalAll();
  }
  for (auto& [node, v] : posts) {
    Status st = ep->PostRead(addr[node], v.addr, v.key, v.length, v.request_id, opts.timeout);
    if (!st.ok()) {
      MutexLock lock(&mu);
      ++counters.remote_failed;
      auto it = pending.find(v.request_id);
      if (it != pending.end()) {
        it->second->done = true;
        it->second->status =
            Status::IoError("RMA read of sample " + std::to_string(v.sample) + " from node " +
                            std::to_string(node) + " not posted: " + st.ToString());
        Release(*it->second);
        pending.erase(it);
      }
    }
  }
  // The reads that completed while the endpoint was polled (by Recv, mostly): TakeReads would
  // poll once more, which costs a system call, for nothing when none has.
  if (!ep->has_reads()) return;
  std::vector<ReadCompletion> done = ep->TakeReads();
  if (done.empty()) return;
  std::vector<std::shared_ptr<Pending>> finished;
  {
    MutexLock lock(&mu);
    for (ReadCompletion& c : done) {
      auto it = pending.find(c.cookie);
      if (it == pending.end()) continue;  // timed out or its peer died meanwhile
      std::shared_ptr<Pending> w = std::move(it->second);
      pending.erase(it);
      w->done = true;
      if (c.error != 0) {
        ++counters.remote_failed;
        w->status = Status::IoError("RMA read of sample " + std::to_string(w->sample) +
                                    " from node " + std::to_string(w->peer) + " failed");
        // The provider drops the connection on a failed RMA read: treat the peer as gone.
        KillLocked(w->peer, "an RMA read failed: " + c.error_text);
      } else {
        w->is_remote = true;
        w->remote = std::move(c.data);
        w->remote_len = c.length;
      }
      finished.push_back(std::move(w));
    }
  }
  for (const std::shared_ptr<Pending>& w : finished)
    Release(*w);  // after the mutex: the reader, woken, does not wait for it
}

}  // namespace nopfs::fabric
