#include "service/peers/peers.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include <spdlog/spdlog.h>

#include "common/mutex.h"
#include "common/units.h"

namespace nopfs::service {

Result<std::unique_ptr<PeerService>> PeerService::Start(const PeerServiceOptions& options) {
  std::unique_ptr<PeerService> p(new PeerService(options));
  fabric::PeerLinkOptions lo;
  lo.provider = options.provider;
  lo.node = options.node;
  lo.peers = options.peers;
  lo.secret = options.secret;
  lo.timeout = options.timeout;
  lo.after_bind = options.after_bind;
  lo.rma_in_software = options.rma_in_software;
  PeerService* self = p.get();
  lo.serve_inline = [self](uint64_t sample) { return self->ServesFromMemory(sample); };
  lo.serve_nowait = [self](uint64_t sample) { return self->Serve(sample, true); };
  lo.on_push = [self](uint32_t node, uint64_t sample, uint64_t xxh3,
                      std::span<const std::byte> data) { self->OnPush(node, sample, xxh3, data); };
  Result<std::unique_ptr<fabric::PeerLink>> link =
      fabric::PeerLink::Start(lo, [self](uint64_t sample) { return self->Serve(sample, false); });
  if (!link.ok()) return link.status().WithContext("peers");
  p->link_ = std::move(*link);
  spdlog::info("peers: node {} of {}, listening on {}:{} ({})", options.node, options.peers.size(),
               options.peers[options.node].host, options.peers[options.node].port,
               options.provider);
  return p;
}

PeerService::PeerService(PeerServiceOptions options) : options_(std::move(options)) {}

PeerService::~PeerService() {
  Stop();  // stops the progress and serving threads (and so Serve) before the rest goes
}

void PeerService::Stop() {
  if (link_) link_->Stop();
}

void PeerService::AnnounceClassDone(uint32_t cls) {
  spdlog::info("peers: class {} filled; telling the other nodes", cls);
  link_->AnnounceClassDone(cls);
}

bool PeerService::ServesFromMemory(uint64_t sample) const {
  // Before Attach every answer is "not available", at once.
  if (!serving_.load(std::memory_order_acquire) || sample >= plan_->location.size()) return true;
  const int8_t cls = plan_->location[sample];
  return cls == policy::kNotCached || static_cast<size_t>(cls) >= tiers_.size() ||
         tiers_[static_cast<size_t>(cls)].ram != nullptr;
}

fabric::ServeResult PeerService::Serve(uint64_t sample, bool nowait) {
  fabric::ServeResult r;
  if (!serving_.load(std::memory_order_acquire) || sample >= plan_->location.size()) return r;
  const int8_t cls = plan_->location[sample];
  if (cls == policy::kNotCached || static_cast<size_t>(cls) >= tiers_.size()) return r;
  const TierRef& t = tiers_[static_cast<size_t>(cls)];
  const auto id = static_cast<policy::SampleId>(sample);
  if (t.ram != nullptr) {
    // In place: the link answers with an RMA descriptor (the reader checks the recorded xxh3),
    // or copies the bytes into its reply and checks them itself.
    Result<std::span<const std::byte>> v = t.ram->View(id);
    if (!v.ok()) return r;  // not ready
    return fabric::ServeResult::InPlace(*v, t.ram->RecordedXxh3(id));
  }
  if (t.ssd == nullptr || !t.ssd->IsReady(id)) return r;
  const uint64_t size = t.ssd->layout().SizeOf(t.ssd->layout().SlotOf(id));
  r.data.resize(size);
  // The read verifies the copy against the checksum recorded at fill.
  const Status s = nowait ? t.ssd->ReadIfCached(id, r.data) : t.ssd->Read(id, r.data);
  if (nowait && s.code() == StatusCode::kUnavailable) return fabric::ServeResult::WouldBlock();
  if (s.ok()) {
    // Read checked the bytes against the xxh3 recorded at fill: the link need not hash them again.
    r.status = fabric::ReadStatus::kOk;
    r.xxh3 = t.ssd->RecordedXxh3(id);
    r.verified = true;
  } else {
    r.data.clear();
    r.status = s.code() == StatusCode::kFailedPrecondition ? fabric::ReadStatus::kNotAvailable
                                                           : fabric::ReadStatus::kError;
    if (r.status == fabric::ReadStatus::kError) {
      spdlog::warn("peers: serving sample {} from {}: {}", sample, t.name, s.message());
    }
  }
  return r;
}

std::optional<dir::Location> PeerService::Where(policy::SampleId sample) const {
  if (!have_directory_.load(std::memory_order_acquire)) return std::nullopt;
  std::optional<dir::Location> loc = directory_.Find(sample);
  if (!loc) loc = directory_.FindCopy(sample);
  return loc;
}

bool PeerService::PresumedReady(const dir::Location& loc, uint64_t margin) const {
  if (link_->IsDead(loc.node)) return false;
  if (link_->PeerClassDone(loc.node, loc.cls)) return true;  // the holder said so
  if (loc.cls >= prefetchers_.size()) return false;
  // docs/algorithm.md §7: the holder's list is filled at about the pace of this node's own list of
  // that class.
  const Prefetcher* own = prefetchers_[loc.cls];
  if (own == nullptr) return false;
  // The pace is the number of entries settled, not the leading run: one slow fill (a first peer
  // handshake, a slow PFS read) must not make every later entry look unready.
  const PrefetchCounters c = own->counters();
  return policy::PeerPresumedReady(c.settled, loc.position, c.done, margin);
}

int PeerService::Lookup(policy::SampleId sample) const {
  const std::optional<dir::Location> loc = Where(sample);
  if (!loc || !PresumedReady(*loc, options_.margin)) return -1;
  return loc->cls;
}

Result<uint64_t> PeerService::ReadFrom(const dir::Location& loc, std::span<std::byte> dst) {
  // The xxh3 of the bytes in dst (a wrong size or an RMA read failing its checksum: Corruption).
  return link_->ReadInto(loc.node, loc.sample, dst);
}

Result<uint64_t> PeerService::Fetch(policy::SampleId sample, std::span<std::byte> dst) {
  const std::optional<dir::Location> loc = Where(sample);
  if (!loc) return Status::NotFound("peers: no peer holds sample " + std::to_string(sample));
  return ReadFrom(*loc, dst);
}

Result<uint64_t> PeerService::FetchCopy(policy::SampleId sample, std::span<std::byte> dst) {
  if (!have_directory_.load(std::memory_order_acquire)) {
    return Status::NotFound("peers: no directory");
  }
  const std::optional<dir::Location> loc = directory_.FindCopy(sample);
  if (!loc) return Status::NotFound("peers: this node fills sample " + std::to_string(sample));
  if (link_->IsDead(loc->node)) {
    return Status::NotFound("peers: the filler of sample " + std::to_string(sample) + " is dead");
  }
  // No margin here: a wrong guess costs a round trip, while not asking costs the very PFS read
  // that this copy is meant to spare.
  if (!PresumedReady(*loc, 0)) {
    return Status::Unavailable("peers: sample " + std::to_string(sample) +
                               " not presumed ready at its filler yet");
  }
  Result<uint64_t> h = ReadFrom(*loc, dst);
  if (!h.ok() && h.status().code() == StatusCode::kNotFound) {
    return Status::Unavailable("peers: sample " + std::to_string(sample) +
                               " not available at its filler yet");
  }
  if (!h.ok() && h.status().code() == StatusCode::kUnavailable) {
    // The link's Unavailable: the filler died or refused us. Not a "later".
    return Status::IoError(h.status().message());
  }
  return h;
}

void PeerService::Push(policy::SampleId sample, std::span<const std::byte> bytes, uint64_t xxh3) {
  const std::optional<dir::Location> loc = Where(sample);
  // Not when the node said it has the whole class; otherwise it may well lack it (a staging read
  // reaches the PFS only when the node was not presumed ready, answered "not available", or the
  // model preferred the PFS), and keeps the bytes only if its slot is still empty.
  if (!loc || link_->IsDead(loc->node) || link_->PeerClassDone(loc->node, loc->cls)) return;
  link_->Push(loc->node, sample, xxh3, bytes);
}

void PeerService::OnPush(uint32_t node, uint64_t sample, uint64_t xxh3,
                         std::span<const std::byte> bytes) {
  SampleReader* reader = reader_.load(std::memory_order_acquire);
  const bool kept = reader != nullptr && sample < plan_->location.size() &&
                    reader->KeepPushed(static_cast<policy::SampleId>(sample), bytes, xxh3);
  if (!kept) return;  // received minus kept, in the status line
  pushes_kept_.fetch_add(1, std::memory_order_relaxed);
  spdlog::debug("peers: kept sample {} pushed by node {}", sample, node);
}

Status PeerService::Attach(const policy::NodePlan& plan, const policy::NodeAccessCounts& counts,
                           const std::vector<TierRef>& tiers,
                           const std::vector<const Prefetcher*>& prefetchers,
                           const Catalog& catalog, SampleReader& reader) {
  (void)catalog;
  plan_ = &plan;
  tiers_ = tiers;
  prefetchers_ = prefetchers;
  serving_.store(true, std::memory_order_release);
  // RAM tiers are read by the other nodes with RMA where the provider does it in hardware (or
  // rma_in_software says so); elsewhere their samples go in replies sent straight from the tier,
  // and the tier is not exposed at all.
  std::string rma;
  for (const TierRef& t : tiers) {
    if (t.ram == nullptr) continue;
    if (!link_->asks_remote_read()) {
      if (link_->supports_remote_read()) {
        spdlog::info(
            "peers: {} served in replies sent straight from it, not by RMA: {} does RMA in "
            "software, where a reply is two messages and an RMA read four",
            t.name, options_.provider);
      }
      rma += (rma.empty() ? "" : ", ") + t.name + " in replies from memory";
      continue;
    }
    const Status s = link_->ExposeForRemoteRead(t.ram->mapping());
    if (s.ok()) {
      spdlog::info("peers: {} ({}) exposed to the job's peers for RMA reads", t.name,
                   FormatBytes(static_cast<double>(t.ram->mapping().size())));
    } else {
      spdlog::info("peers: {} served in replies, not by RMA: {}", t.name, s.message());
    }
    rma += (rma.empty() ? "" : ", ") + t.name + (s.ok() ? " by RMA reads" : " in replies");
  }
  {
    MutexLock lock(&mu_);
    rma_ = rma.empty() ? "no RAM tier" : rma;
  }

  // What this node holds (class, position in the class's fill order) and what it will read
  // without holding it.
  std::vector<dir::Holding> held;
  for (size_t j = 0; j < plan.tiers.size(); ++j) {
    const std::vector<policy::SampleId>& order = plan.tiers[j].prefetch_order;
    for (size_t q = 0; q < order.size(); ++q) {
      held.push_back({order[q], static_cast<uint16_t>(j), static_cast<uint32_t>(q)});
    }
  }
  std::vector<uint32_t> needs;
  for (policy::SampleId k = 0; k < counts.count.size(); ++k) {
    if (counts.count[k] > 0 && plan.location[k] == policy::kNotCached) needs.push_back(k);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const dir::Exchange exchange = [this](std::vector<std::vector<std::byte>> out) {
    return link_->Exchange(++round_, std::move(out));
  };
  dir::DirectoryStats stats;
  Result<dir::PeerDirectory> d = dir::BuildDirectory(
      options_.node, static_cast<uint32_t>(options_.peers.size()), held, needs, exchange, &stats);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MutexLock lock(&mu_);
  if (!d.ok()) {
    state_ = "directory failed (" + d.status().message() + "); reading the PFS instead";
    spdlog::warn("peers: {}", state_);
    return d.status();
  }
  directory_ = std::move(*d);
  stats_ = stats;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "directory of %zu samples held elsewhere (of %zu needed), %zu of the %zu held "
                "here to copy from the node that reads them from the PFS, built in %.2f s, %s "
                "sent, %s received",
                directory_.size(), needs.size(), directory_.copy_count(), held.size(), secs,
                FormatBytes(static_cast<double>(stats.bytes_sent)).c_str(),
                FormatBytes(static_cast<double>(stats.bytes_received)).c_str());
  state_ = buf;
  held_elsewhere_ = directory_.size();
  needed_ = needs.size();
  spdlog::info("peers: {}", state_);
  reader_.store(&reader, std::memory_order_release);
  have_directory_.store(true, std::memory_order_release);
  return Status::Ok();
}

Result<std::vector<std::vector<std::byte>>> PeerService::CatalogExchange(
    uint64_t round, std::vector<std::vector<std::byte>> out,
    std::chrono::steady_clock::time_point deadline) {
  return link_->Exchange(kCatalogRoundBase + round, std::move(out), deadline);
}

Status PeerService::WaitForPeers(std::chrono::steady_clock::time_point deadline) {
  return link_->WaitForPeers(deadline);
}

report::Peers PeerService::Report() const {
  const fabric::PeerLinkCounters c = link_->counters();
  report::Peers p;
  for (uint32_t n = 0; n < link_->nodes(); ++n) {
    if (n == options_.node) continue;
    if (link_->IsDead(n)) p.dead.push_back(n);
    for (uint32_t j = 0; j < 64; ++j)
      p.done_reports += link_->PeerClassDone(n, j) ? 1 : 0;
  }
  p.node = options_.node;
  p.nodes = static_cast<uint32_t>(options_.peers.size());
  p.served_samples = c.served_reads;
  p.served_bytes = c.served_bytes;
  p.served_not_available = c.served_not_available;
  p.fetched_samples = c.fetched_reads;
  p.fetched_bytes = c.fetched_bytes;
  p.fetch_not_available = c.fetch_not_available;
  p.timeouts = c.timeouts;
  p.refused = c.auth_refused;
  p.malformed = c.malformed;
  p.served_rma = c.served_remote;
  p.served_in_place = c.served_in_place;
  p.fetched_rma = c.fetched_remote;
  p.rma_failed = c.remote_failed;
  p.pushes_sent = c.pushes_sent;
  p.push_bytes_sent = c.push_bytes_sent;
  p.pushes_dropped = c.pushes_dropped;
  p.pushes_received = c.pushes_received;
  p.pushes_kept = pushes_kept_.load();
  MutexLock lock(&mu_);
  p.state = state_;
  p.held_elsewhere = held_elsewhere_;
  p.needed = needed_;
  p.rma = rma_;
  return p;
}

}  // namespace nopfs::service
