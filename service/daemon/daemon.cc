// The Daemon's life around its start-up: Start (daemon_start.cc runs the phases), Stop and the
// wait for the prefetchers. The rest of the class: the ranks' streams (daemon_streams.cc), the
// kept copy and sibling jobs (daemon_kept.cc), the status and the metrics (daemon_report.cc).
#include "service/daemon/daemon.h"

#include <filesystem>

#include <spdlog/spdlog.h>

#include "common/units.h"
#include "service/daemon/run_dir.h"

namespace nopfs::service {

Daemon::Daemon(DaemonOptions options) : options_(std::move(options)) {}

Daemon::~Daemon() {
  Stop();
}

Result<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  std::unique_ptr<Daemon> d(new Daemon(options));
  if (Status s = d->Init(); !s.ok()) {
    for (KeptClass& k : d->kept_) {
      if (k.copy) k.copy->PutBack();  // nothing served: the next start may adopt it
    }
    d->Stop();
    return s;
  }
  return d;
}

void Daemon::WaitPrefetched() {
  for (auto& p : prefetchers_)
    if (p) p->Wait();
}

void Daemon::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (reporter_.joinable()) {
    {
      MutexLock lock(&reporter_mu_);
      reporter_stop_ = true;
    }
    reporter_cv_.SignalAll();
    reporter_.join();
  }
  if (store_thread_.joinable()) store_thread_.join();  // the catalog DB is whole or not there
  closed_cv_.SignalAll();  // an open waiting for another owner's stream gives up
  // Reads through a sibling in flight end now, not when the sibling answers: the threads waiting
  // on them (prefetchers, staging) are stopped below. The few samples still wanted meanwhile come
  // from the PFS.
  if (siblings_) siblings_->Stop();
  // So do requests to the node's share service: one that does not answer (it may take up to
  // kSharedTimeout to fill a batch) never holds the job's end past the epilog's grace. What the
  // abandoned requests were for is not needed any more; reads still made before the prefetchers
  // stop, below, go to the PFS.
  if (shared_) {
    if (const size_t n = shared_->Cancel(); n > 0) {
      spdlog::info(
          "shared: stopping: {} requests to the share service that had not been answered were "
          "abandoned",
          n);
    }
  }
  // No new sibling finds this daemon; the ones reading from it fall back to the PFS when the
  // server closes their connections.
  UnregisterLive(live_entry_);
  live_entry_.clear();
  serving_.store(false);
  if (server_) server_->Stop();
  {
    MutexLock lock(&ring_mu_);
    ring_stop_ = true;
  }
  ring_cv_.SignalAll();
  if (ring_thread_.joinable()) ring_thread_.join();  // every closed stream's writer stopped
  {
    MutexLock lock(&ring_mu_);
    spare_ring_.reset();
  }
  if (sibling_served_.load() > 0) {
    spdlog::info("sibling: served {} samples ({}) to other jobs of this user",
                 sibling_served_.load(),
                 FormatBytes(static_cast<double>(sibling_served_bytes_.load())));
  }
  std::map<uint64_t, std::unique_ptr<StagingStream>> streams;
  {
    MutexLock lock(&mu_);
    streams.swap(streams_);
  }
  for (auto& [id, s] : streams)
    s->Cancel();
  streams.clear();
  // The last figures, with every stream closed (and merged into the stall).
  (void)WriteReports(true, false);
  if (!options_.run_dir.empty()) {
    LocalIo* io = options_.local_io != nullptr ? options_.local_io : LocalIo::Default();
    (void)io->Unlink(options_.run_dir + "/" + kPlanName);
  }
  // The prefetchers may be waiting on a peer (copying from a filler), and the peer service on
  // the tiers: tell the prefetchers to stop, stop the link (their peer reads then fail at once),
  // join the prefetchers, and only then let the peer service go, before the tiers.
  for (auto& p : prefetchers_)
    if (p) p->RequestStop();
  if (peers_) peers_->Stop();
  for (auto& p : prefetchers_)
    if (p) p->Stop();
  peers_.reset();
  prefetchers_.clear();
  if (shared_ahead_) {
    shared_ahead_->Stop();
    spdlog::info(
        "shared: {} files asked for ahead of the reads, {} reads found their descriptor ready, "
        "{} files asked for alone",
        shared_ahead_->asked_ahead(), shared_ahead_->read_ahead(), shared_ahead_->asked_alone());
  }
  for (KeptClass& k : kept_) {
    if (k.copy) k.copy->StopChecks();  // they may mark slots of a tier ready
    if (k.committer) k.committer->Stop();
  }
  KeepAtExit();
  // What was kept is in the kept area now (or nothing could be): the keep records go with the
  // tiers.
  for (KeptClass& k : kept_) {
    if (k.committer) k.committer->Discard();
    k.committer.reset();
  }
  if (reader_) (void)WriteReports(true, true);  // with what was kept
  // A file nopfsd made itself (`nopfs run`) would hold the job's last figures for ever.
  if (metrics_) {
    if (Status s = metrics_->RemoveIfMade(); !s.ok()) spdlog::warn("{}", s.message());
  }
  reader_.reset();
  siblings_.reset();
  // The adopted copies: what is worth keeping again is in the new kept entries; a borrowed copy
  // (a job that keeps nothing) stays kept.
  kept_.clear();
  for (auto& t : ssd_tiers_) {
    if (Status s = t->Destroy(); !s.ok()) spdlog::error("removing SSD tier: {}", s.message());
  }
  ssd_tiers_.clear();
  ram_tiers_.clear();
  tier_refs_.clear();
  catalog_.reset();
  std::error_code ec;
  std::filesystem::remove_all(options_.run_dir + "/catalog", ec);
  if (ec) spdlog::error("removing {}/catalog: {}", options_.run_dir, ec.message());
  spdlog::info("stopped; nothing staged remains{}",
               kept_bytes_.load() > 0 ? " but the kept samples" : "");
}

}  // namespace nopfs::service
