// What the daemon says about itself: the structured status (Report, and StatusText from it), the
// staging rate it measures, and the reporter thread that samples the rate and rewrites the
// metrics file.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>

#include <spdlog/spdlog.h>

#include "protocol/wire.h"
#include "service/daemon/daemon.h"
#include "service/daemon/daemon_internal.h"
#include "service/daemon/run_dir.h"

namespace nopfs::service {
namespace {

using daemon_internal::kMetricsPeriod;
using daemon_internal::Merge;
using daemon_internal::Seconds;

// The staging rate in the status is measured over about this long.
constexpr auto kRateWindow = std::chrono::seconds(5);
// The status lists at most this many open streams (so that the report fits one message).
constexpr size_t kMaxReportedStreams = 512;

}  // namespace

bool Daemon::WriteReports(bool metrics, bool summary) {
  metrics = metrics && metrics_ != nullptr;
  summary = summary && options_.summary && !options_.run_dir.empty();
  if (!metrics && !summary) return false;
  const report::StatusReport r = Report();  // (it samples the staging rate too)
  if (metrics) WriteMetrics(r);
  if (summary) WriteSummary(r);
  return true;
}

void Daemon::WriteMetrics(const report::StatusReport& r) {
  const Status st = metrics_->Write(r);
  if (st.ok()) {
    if (!metrics_error_.empty()) spdlog::info("metrics: {} written again", metrics_->path());
    metrics_error_.clear();
  } else if (st.message() != metrics_error_) {
    metrics_error_ = st.message();
    spdlog::warn("{} (the job goes on without metrics)", metrics_error_);
  }
}

void Daemon::WriteSummary(const report::StatusReport& r) {
  wire::Message m;
  m.body = wire::StatusOk{"", r};
  Result<std::vector<std::byte>> bytes = wire::Encode(m);
  Status st = bytes.status();
  if (bytes.ok()) {
    st = WriteFileAtomically(
        options_.run_dir, launch::kSummaryName,
        std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()),
        options_.local_io);
  }
  if (!st.ok()) spdlog::warn("summary: {} (the job's epilog will not have it)", st.message());
}

void Daemon::Reporter() {
  auto next_write = std::chrono::steady_clock::now() + kMetricsPeriod;
  for (;;) {
    {
      MutexLock lock(&reporter_mu_);
      const auto wake = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (!reporter_stop_ && reporter_cv_.WaitUntil(&reporter_mu_, wake)) {
      }
      if (reporter_stop_) return;
    }
    const bool due = std::chrono::steady_clock::now() >= next_write;
    if (due) next_write = std::chrono::steady_clock::now() + kMetricsPeriod;
    if (!due || !WriteReports(true, true)) (void)ObserveRates();
  }
}

std::string Daemon::StatusText() {
  return report::RenderText(Report());
}

std::vector<uint64_t> Daemon::StagedBytes() const {
  std::vector<uint64_t> out(tier_refs_.size(), 0);
  for (size_t j = 0; j < tier_refs_.size(); ++j) {
    if (!prefetchers_[j]) continue;
    out[j] = prefetchers_[j]->counters().bytes + reader_->cached_on_read(j).bytes.load() +
             reader_->pushed_kept(j).bytes.load();
  }
  return out;
}

std::vector<uint64_t> Daemon::ObserveRates() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<uint64_t> bytes = StagedBytes();
  MutexLock lock(&rate_mu_);
  rate_samples_.push_back({now, bytes});
  // Keep the newest sample at least kRateWindow old, and nothing older.
  while (rate_samples_.size() > 2 && rate_samples_[1].t <= now - kRateWindow)
    rate_samples_.pop_front();
  const RateSample& first = rate_samples_.front();
  const double dt = Seconds(now - first.t);
  std::vector<uint64_t> rates(bytes.size(), 0);
  for (size_t j = 0; j < bytes.size() && dt > 0; ++j) {
    const uint64_t moved = bytes[j] >= first.bytes[j] ? bytes[j] - first.bytes[j] : 0;
    rates[j] = static_cast<uint64_t>(static_cast<double>(moved) / dt);
  }
  return rates;
}

report::StatusReport Daemon::Report() {
  report::StatusReport r;
  const auto now = std::chrono::steady_clock::now();
  r.job_id = options_.job_id;
  r.node = options_.node;
  r.nodes = job_.nodes();
  r.pid = static_cast<uint32_t>(getpid());
  r.uptime_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now - started_).count());
  r.dataset = options_.dataset;
  r.predicted_stall_ns = predicted_stall_ns_;
  r.dataset_samples = catalog_->size();
  r.dataset_bytes =
      std::accumulate(catalog_->sizes().begin(), catalog_->sizes().end(), uint64_t{0});
  const std::vector<uint64_t> rates = ObserveRates();
  for (size_t j = 0; j < tier_refs_.size(); ++j) {
    const policy::TierPlan& tp = plan_.tiers[j];
    report::Tier t;
    t.name = model_.classes[j].name;
    t.capacity = model_.classes[j].capacity;
    if (!prefetchers_[j]) {
      r.tiers.push_back(std::move(t));
      continue;
    }
    const PrefetchCounters pc = prefetchers_[j]->counters();
    t.state = pc.done ? report::TierState::kDone : report::TierState::kRunning;
    t.planned_samples = tp.prefetch_order.size();
    t.planned_bytes = tp.bytes;
    t.kept_on_read = reader_->cached_on_read(j).reads.load();
    t.pushed = reader_->pushed_kept(j).reads.load();
    t.failed = pc.failures;
    // Ready is what the slots say now: a slot filled, found corrupt and filled again is one
    // sample (adding up the fill counters would count it twice).
    Tier* tier = tier_refs_[j].tier();
    for (uint32_t slot = 0; tier != nullptr && slot < tier->slots().size(); ++slot) {
      if (tier->slots().state(slot) != SlotState::kReady) continue;
      ++t.ready_samples;
      t.ready_bytes += tier->layout().SizeOf(slot);
    }
    t.rate = rates[j];
    if (pc.done) {
      t.eta_ns = 0;
    } else if (t.rate > 0) {
      const uint64_t left = t.planned_bytes > t.ready_bytes ? t.planned_bytes - t.ready_bytes : 0;
      t.eta_ns =
          static_cast<uint64_t>(static_cast<double>(left) / static_cast<double>(t.rate) * 1e9);
    }
    r.tiers.push_back(std::move(t));
  }
  ring::RingStats stall;
  {
    MutexLock lock(&mu_);
    stall = closed_stats_;
    for (auto& [id, s] : streams_) {
      const ring::RingStats st = s->ring().stats();
      if (r.streams.size() < kMaxReportedStreams) {
        r.streams.push_back({id, s->rank(), s->staged(), s->total(), s->errors(), st.samples});
      }
      Merge(&stall, st);
    }
    r.refusals.streams = refused_streams_;
    r.refusals.owners = refused_owners_;
  }
  for (size_t j = 0; j < tier_refs_.size(); ++j) {
    const SourceCounters& c = reader_->class_counters(j);
    report::Source src{model_.classes[j].name, c.reads.load(), c.bytes.load(), false, 0};
    if (static_cast<int>(j) == reader_->region_class()) {
      src.zero_copy = true;
      src.in_place = reader_->in_place_reads();
    }
    r.sources.push_back(std::move(src));
  }
  r.sources.push_back({"peer", reader_->peer_counters().reads.load(),
                       reader_->peer_counters().bytes.load(), false, 0});
  if (shared_) {
    r.sources.push_back({"shared", reader_->shared_counters().reads.load(),
                         reader_->shared_counters().bytes.load(), false, 0});
  }
  if (siblings_ && siblings_->ever()) {
    r.sources.push_back({"sibling", reader_->sibling_counters().reads.load(),
                         reader_->sibling_counters().bytes.load(), false, 0});
  }
  r.sources.push_back({"pfs", reader_->pfs_counters().reads.load(),
                       reader_->pfs_counters().bytes.load(), false, 0});
  if (peers_) {
    report::Peers p = peers_->Report();
    for (const auto& pf : prefetchers_)
      if (pf) p.deferred += pf->counters().deferred;
    p.copied_samples = reader_->peer_fill_counters().reads.load();
    p.copied_bytes = reader_->peer_fill_counters().bytes.load();
    p.fill_gave_up = reader_->peer_fill_gave_up();
    r.peers = std::move(p);
  }
  r.pfs_bytes = reader_->pfs_bytes_total();
  r.corrupt = reader_->corruptions();
  r.changed = reader_->changed_on_pfs();
  report::Kept& kept = r.kept.emplace();
  kept.kept_bytes = kept_bytes_.load();
  for (const KeptClass& k : kept_) {
    if (!k.copy) continue;
    kept.adopted_bytes += k.copy->adopted_bytes();
    kept.adopted_samples += k.copy->adopted_samples();
    kept.adopt_rejected_samples += k.copy->rejected_samples();
  }
  report::Siblings& sib = r.siblings.emplace();
  sib.through = siblings_ ? siblings_->through() : std::string();
  sib.read_samples = reader_->sibling_counters().reads.load();
  sib.read_bytes = reader_->sibling_counters().bytes.load();
  sib.read_failed = reader_->sibling_failures();
  sib.served_samples = sibling_served_.load();
  sib.served_bytes = sibling_served_bytes_.load();
  r.stall.reads = stall.samples;
  r.stall.total_ns = stall.stall_ns_total;
  r.stall.median_ns = stall.stall_ns_median;
  r.stall.p99_ns = stall.stall_ns_p99;
  std::copy(stall.histogram.begin(), stall.histogram.end(), r.stall.histogram.begin());
  r.refusals.streams_per_rank = config_.limits().streams_per_rank;
  r.refusals.connections = server_ ? server_->refused_connections() : 0;
  r.refusals.timed_out = server_ ? server_->timed_out_connections() : 0;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const auto ns = [](const timeval& tv) {
    return static_cast<uint64_t>(tv.tv_sec) * 1'000'000'000 +
           static_cast<uint64_t>(tv.tv_usec) * 1000;
  };
  r.cpu_user_ns = ns(ru.ru_utime);
  r.cpu_system_ns = ns(ru.ru_stime);
  return r;
}

}  // namespace nopfs::service
