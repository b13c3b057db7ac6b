#include "service/daemon/daemon.h"

#include <pwd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "common/mutex.h"
#include "common/units.h"
#include "launch/kept_area.h"
#include "policy/predict.h"
#include "service/daemon/run_dir.h"
#include "service/env/env.h"

namespace nopfs::service {
namespace {

constexpr uint64_t kMinRingBytes = uint64_t{4} << 20;
constexpr uint64_t kMaxRingBytes = uint64_t{64} << 20;
constexpr uint32_t kMinRingSlots = 64;
constexpr uint32_t kMaxRingSlots = 1u << 16;
// Connections beyond one per stream: status queries, a client between two streams.
constexpr size_t kSpareConnections = 16;
// Connections kept for sibling jobs' nopfsd (a packed array of a few jobs, each opening at most
// SiblingSource::kMaxConnections).
constexpr size_t kSiblingConnections = 8 * SiblingSource::kMaxConnections;
// How long a sibling read may take (the sibling may read the PFS for it) before the PFS is read.
constexpr std::chrono::milliseconds kSiblingTimeout(10000);
// How long an open waits for another process's streams of its rank to close before it is
// refused: a process that died or exited a moment ago has its connection closed by the kernel,
// and the server closes its streams within milliseconds.
constexpr auto kOwnerGrace = std::chrono::seconds(2);
// The staging rate in the status is measured over about this long.
constexpr auto kRateWindow = std::chrono::seconds(5);
// The status lists at most this many open streams (so that the report fits one message).
constexpr size_t kMaxReportedStreams = 512;
// What the kept key covers beside the dataset's path: the catalog's scan (no options today).
constexpr char kKeptScanOptions[] = "catalog/1";
// At exit, the dataset files of the kept samples are stat-ed for at most this long (the epilog
// gives nopfsd `grace` seconds, 10 by default, to stop): files not reached are not kept.
constexpr auto kKeepStatBudget = std::chrono::seconds(4);
// Stats wait on the PFS's metadata servers, not on a core: many in flight.
constexpr unsigned kKeepStatThreads = 32;
// At start, the kept samples' files are stat-ed ahead of the reads by this many threads.
constexpr unsigned kKeptCheckThreads = 16;
// How often the metrics file is rewritten.
constexpr std::chrono::seconds kMetricsPeriod(5);

// Adds b's counters and histogram to a (median and p99 are recomputed from the sum).
void Merge(ring::RingStats* a, const ring::RingStats& b) {
  a->samples += b.samples;
  a->bytes += b.bytes;
  a->next_calls += b.next_calls;
  a->stall_ns_total += b.stall_ns_total;
  for (size_t i = 0; i < a->histogram.size(); ++i)
    a->histogram[i] += b.histogram[i];
  ring::SummarizeStalls(a);
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

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

Status Daemon::Init() {
  started_ = std::chrono::steady_clock::now();
  {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    start_wall_ns_ = int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }
  if (options_.config_path.empty()) {
    config_ = lua::DefaultNodeConfig(lua::HostMemoryBytes());
  } else {
    Result<lua::NodeConfig> c = lua::LoadNodeConfig(options_.config_path);
    if (!c.ok()) return c.status();
    config_ = std::move(*c);
  }
  spdlog::info("nopfsd: job {}, node {}, config {}", options_.job_id, options_.node,
               config_.source());
  startup_.Mark("config");

  // Peers first, so that the other nodes can reach this one while it scans and plans. The
  // start-up phase lasts until startup_deadline: the nodes wait for each other until then.
  const auto startup_deadline = std::chrono::steady_clock::now() +
                                std::chrono::milliseconds(options_.peer_startup_timeout_ms);
  if (!options_.peers.empty()) {
    Result<std::vector<fabric::PeerAddress>> peers = fabric::ParsePeerList(options_.peers);
    if (!peers.ok()) return peers.status().WithContext("--peers");
    if (peers->size() != options_.job.nodes() || options_.node >= peers->size()) {
      return Status::InvalidArgument("--peers lists " + std::to_string(peers->size()) +
                                     " nodes, the job has " + std::to_string(options_.job.nodes()) +
                                     "; write one HOST:PORT per node, in node order");
    }
    const fabric::PeerAddress& me = (*peers)[options_.node];
    if (!options_.peer_listen.empty() &&
        options_.peer_listen != me.host + ":" + std::to_string(me.port)) {
      return Status::InvalidArgument("--peer-listen " + options_.peer_listen + " is not entry " +
                                     std::to_string(options_.node) + " of --peers (" + me.host +
                                     ":" + std::to_string(me.port) + ")");
    }
    Result<fabric::Secret> secret = fabric::ReadSecretFile(options_.peer_secret_file);
    if (!secret.ok()) return secret.status().WithContext("--peer-secret-file");
    PeerServiceOptions po;
    po.provider = options_.peer_provider;
    po.node = options_.node;
    po.peers = std::move(*peers);
    po.secret = *secret;
    po.timeout = std::chrono::milliseconds(options_.peer_timeout_ms);
    Result<std::unique_ptr<PeerService>> ps = PeerService::Start(po);
    if (ps.ok()) {
      peers_ = std::move(*ps);
    } else {
      // A taken port or a provider missing here: the node still serves its own ranks.
      spdlog::warn("peers: {}; this node runs without peers", ps.status().message());
    }
  }

  if (peers_) {
    const auto tw = std::chrono::steady_clock::now();
    if (Status joined = peers_->WaitForPeers(startup_deadline); joined.ok()) {
      spdlog::info("peers: every other node answered in {:.2f} s",
                   Seconds(std::chrono::steady_clock::now() - tw));
    } else {
      spdlog::warn(
          "peers: {} (deadline {} ms after this node started); the job goes on without them, "
          "and one that starts later joins for peer reads when it comes",
          joined.message(), options_.peer_startup_timeout_ms);
    }
  }

  startup_.Mark("peers");

  // The dataset.
  CatalogOptions co;
  co.dataset = options_.dataset;
  co.cache_dir = config_.catalog_cache();
  co.work_dir = options_.run_dir + "/catalog";
  co.uid = options_.uid;
  // A scanned catalog's DB is written once the node serves (Init's end): it saves the next job
  // the scan, and this one does not wait for it.
  co.defer_store = true;
  // One scan per job: the nodes divide it among themselves over the peer link (without peers, the
  // node scans alone).
  if (peers_) {
    co.node = options_.node;
    co.nodes = options_.job.nodes();
    PeerService* ps = peers_.get();
    // A round waits for the others until the start-up deadline, at least five peer timeouts, and
    // at least as long as this node's own share of the work took (RoundDeadlines). Rounds
    // run one after the other on this thread.
    auto deadlines = std::make_shared<RoundDeadlines>(
        startup_deadline, 5 * std::chrono::milliseconds(options_.peer_timeout_ms),
        std::chrono::steady_clock::now());
    co.exchange = [ps, deadlines](uint64_t round, std::vector<std::vector<std::byte>> out) {
      auto got = ps->CatalogExchange(round, std::move(out),
                                     deadlines->Enter(std::chrono::steady_clock::now()));
      deadlines->Leave(std::chrono::steady_clock::now());
      return got;
    };
  }
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::unique_ptr<Catalog>> catalog = Catalog::Open(co, Env::Default());
  if (!catalog.ok()) return catalog.status().WithContext("dataset " + options_.dataset);
  catalog_ = std::move(*catalog);
  startup_.Mark("catalog", catalog_->open_phases());
  if (!catalog_->reused()) {
    spdlog::info("catalog: scanning the dataset: {}", catalog_->rescan_reason());
  }
  if (catalog_->share_note().rfind("alone: ", 0) == 0) {
    spdlog::warn("catalog: the job's shared scan failed, this node scanned {}",
                 catalog_->share_note());
  }
  spdlog::info("catalog: {} samples, {} ({}, {}) in {:.2f} s, fingerprint {:016x}",
               catalog_->size(),
               FormatBytes(static_cast<double>(std::accumulate(
                   catalog_->sizes().begin(), catalog_->sizes().end(), uint64_t{0}))),
               catalog_->reused() ? "reused from the cache" : "scanned", catalog_->share_note(),
               Seconds(std::chrono::steady_clock::now() - t0), catalog_->fingerprint());

  // The job, now that F is known.
  job_ = options_.job;
  if (job_.samples != 0 && job_.samples != catalog_->size()) {
    return Status::InvalidArgument("--samples " + std::to_string(job_.samples) +
                                   " disagrees with the dataset's " +
                                   std::to_string(catalog_->size()) + " samples");
  }
  job_.samples = catalog_->size();
  NOPFS_RETURN_IF_ERROR(job_.Validate());
  if (options_.node >= job_.nodes()) {
    return Status::InvalidArgument("node " + std::to_string(options_.node) +
                                   " is out of range: the job has " + std::to_string(job_.nodes()) +
                                   " nodes");
  }

  // Capacities: the config's classes, capped by what the job was granted on this node.
  model_ = config_.model();
  policy::Bytes ram_left = options_.ram_grant;
  policy::Bytes ssd_left = options_.ssd_grant;
  std::vector<policy::Bytes> capacities;
  for (policy::StorageClass& c : model_.classes) {
    policy::Bytes& left = c.kind == policy::ClassKind::kRam ? ram_left : ssd_left;
    c.capacity = std::min(c.capacity, left);
    left -= c.capacity;
    capacities.push_back(c.capacity);
  }
  const auto t1 = std::chrono::steady_clock::now();
  // The counts outlive the plan's making: the peer directory needs what this node reads.
  policy::NodeAccessCounts counts =
      policy::CountNodeAccesses(job_, options_.node, options_.plan_threads);
  plan_ = policy::MakeNodePlan(counts, catalog_->sizes(), capacities, config_.planner());
  spdlog::info("plan ({}): {} accesses of {} distinct samples in {:.2f} s",
               policy::PlannerName(config_.planner()), plan_.accesses, plan_.distinct,
               Seconds(std::chrono::steady_clock::now() - t1));
  // The plan line's prediction (docs/service.md, "Status"): the stall of a consumer that takes no
  // time, that is the node's reading time, with every rank's staging threads reading the PFS.
  try {
    const uint32_t pfs_readers = job_.ranks * std::max<uint32_t>(1, model_.staging.threads);
    policy::SystemModel m = model_;
    m.compute_rate = 0;
    const policy::NodePrediction pred =
        policy::PredictNode(job_, plan_, catalog_->sizes(), m, pfs_readers, options_.plan_threads);
    predicted_stall_ns_ = static_cast<uint64_t>(pred.stall_seconds * 1e9);
  } catch (const std::exception& e) {
    spdlog::warn("no stall prediction for the status: {}", e.what());
  }
  startup_.Mark("plan");

  AdoptKept();
  FindSibling();

  // Tiers.
  for (size_t j = 0; j < model_.classes.size(); ++j) {
    const policy::StorageClass& c = model_.classes[j];
    TierRef ref{c.name, nullptr, nullptr};
    const policy::TierPlan& tp = plan_.tiers[j];
    if (!tp.prefetch_order.empty()) {
      if (c.kind == policy::ClassKind::kRam) {
        Result<TierLayout> layout = TierLayout::Ram(tp, catalog_->sizes());
        if (!layout.ok()) return layout.status();
        Result<std::unique_ptr<RamTier>> t = RamTier::Create(options_.job_id, std::move(*layout));
        if (!t.ok()) return t.status().WithContext("class " + c.name);
        ref.ram = t->get();
        ram_tiers_.push_back(std::move(*t));
      } else {
        Result<TierLayout> layout = TierLayout::Ssd(tp, catalog_->sizes());
        if (!layout.ok()) return layout.status();
        SsdTierOptions so;
        so.scratch_root = c.path;
        so.job = options_.job_id;
        so.node = std::to_string(options_.node);
        // The class's kept copy: its data files become the tier's where the layouts agree (the
        // same plan as the job that kept them), so its samples are neither read nor copied.
        KeptCopy* copy = nullptr;
        for (KeptClass& k : kept_)
          if (k.class_index == j && k.copy) copy = k.copy.get();
        if (copy != nullptr) so.adopt_data = copy->InPlaceFiles(*layout);
        Result<std::unique_ptr<SsdTier>> t = SsdTier::Create(so, std::move(*layout));
        if (!t.ok()) return t.status().WithContext("class " + c.name);
        if (copy != nullptr) copy->SetInPlaceTier(t->get());
        ref.ssd = t->get();
        ssd_tiers_.push_back(std::move(*t));
      }
      spdlog::info("tier {}: {} samples, {}", c.name, tp.prefetch_order.size(),
                   FormatBytes(static_cast<double>(tp.bytes)));
    }
    tier_refs_.push_back(ref);
  }
  uint32_t prefetch_threads = 0;
  for (const policy::StorageClass& c : model_.classes)
    prefetch_threads += c.threads;
  reader_ = std::make_unique<SampleReader>(*catalog_, plan_, tier_refs_, model_,
                                           job_.nodes() * std::max<uint32_t>(1, prefetch_threads));
  reader_->set_verify_ram_hits(config_.ram_verify() == lua::RamVerify::kAlways);
  std::vector<KeptCopy*> copies;
  for (KeptClass& k : kept_) {
    if (k.copy) copies.push_back(k.copy.get());
  }
  if (!copies.empty()) {
    // The kept samples' files are checked ahead of the reads, in the order of the job's first
    // accesses (the tiers' prefetch orders, interleaved as their prefetchers run side by side).
    std::vector<policy::SampleId> order;
    for (size_t i = 0, more = 1; more != 0; ++i) {
      more = 0;
      for (const policy::TierPlan& tp : plan_.tiers) {
        if (i < tp.prefetch_order.size()) {
          order.push_back(tp.prefetch_order[i]);
          ++more;
        }
      }
    }
    for (KeptCopy* k : copies)
      k->CheckAhead(order, kKeptCheckThreads);
    // A sample is kept by one class at most: the first copy that knows it answers.
    reader_->SetKeptSource(
        [copies](policy::SampleId id, std::span<std::byte> dst) -> Result<uint64_t> {
          for (KeptCopy* k : copies) {
            Result<uint64_t> r = k->Fetch(id, dst);
            if (r.ok() || r.status().code() != StatusCode::kNotFound) return r;
          }
          return Status::NotFound("sample " + std::to_string(id) + " is not kept");
        });
  }
  if (siblings_) {
    SiblingReader* sib = siblings_.get();
    reader_->SetSiblingSource([sib](policy::SampleId id, std::span<std::byte> dst) {
      return sib->Fetch(static_cast<uint32_t>(id), dst);
    });
  }

  // Prefetchers, one per non-empty class, each with the class's threads.
  prefetch_done_.assign(model_.classes.size(), {});
  for (size_t j = 0; j < tier_refs_.size(); ++j) {
    Tier* tier = tier_refs_[j].ram != nullptr ? static_cast<Tier*>(tier_refs_[j].ram)
                                              : static_cast<Tier*>(tier_refs_[j].ssd);
    if (tier == nullptr) {
      prefetchers_.push_back(nullptr);
      continue;
    }
    SampleReader* r = reader_.get();
    auto p = std::make_unique<Prefetcher>(
        *tier,
        [r](policy::SampleId s, std::span<std::byte> dst) {
          return r->FetchForFill(s, dst, /*may_defer=*/true);
        },
        model_.classes[j].threads,
        [r](policy::SampleId s, std::span<std::byte> dst) {
          return r->FetchForFill(s, dst, /*may_defer=*/false);
        });
    prefetchers_.push_back(std::move(p));
  }

  // The peer directory before the first prefetch: a sample this node holds along with others is
  // copied from its filler, which only the directory names (on failure the node keeps serving
  // from its own tiers and the PFS; the reason is logged and in the status).
  if (peers_) {
    std::vector<const Prefetcher*> pf;
    for (const auto& p : prefetchers_)
      pf.push_back(p.get());
    (void)peers_->Attach(plan_, counts, tier_refs_, pf, *catalog_, *reader_);
  }
  counts = {};
  // A filled class is announced, so that the other nodes stop guessing (docs/algorithm.md §7),
  // and the kept copies free the disk of the samples it now holds (docs/tiers.md).
  PeerService* ps = peers_.get();
  for (size_t j = 0; j < prefetchers_.size(); ++j) {
    if (!prefetchers_[j] || (ps == nullptr && copies.empty())) continue;
    prefetchers_[j]->SetOnDone([this, ps, copies, j] {
      if (ps != nullptr) ps->AnnounceClassDone(static_cast<uint32_t>(j));
      if (copies.empty()) return;
      std::vector<policy::SampleId> ready;
      for (policy::SampleId id : plan_.tiers[j].prefetch_order)
        if (tier_refs_[j].ram != nullptr ? tier_refs_[j].ram->IsReady(id)
                                         : tier_refs_[j].ssd->IsReady(id)) {
          ready.push_back(id);
        }
      for (KeptCopy* k : copies)
        (void)k->Release(ready);
    });
  }
  {
    MutexLock lock(&rate_mu_);
    rate_samples_.push_back({std::chrono::steady_clock::now(), StagedBytes()});
  }
  for (auto& p : prefetchers_)
    if (p) NOPFS_RETURN_IF_ERROR(p->Start());
  startup_.Mark("tiers");

  // Rings: the staging capacity shared by the node's ranks, never less than a few samples.
  const uint32_t local_ranks = job_.ranks_on_node(options_.node);
  const policy::Bytes max_sample =
      catalog_->size() == 0 ? 0
                            : *std::max_element(catalog_->sizes().begin(), catalog_->sizes().end());
  // A ring deeper than kMaxRingBytes buys no throughput (the staging threads run ahead of the
  // client by that much already) and costs its memory up front.
  ring_bytes_ = std::max<uint64_t>(
      {std::min(model_.staging.capacity / std::max<uint32_t>(1, local_ranks), kMaxRingBytes),
       4 * (max_sample + 64), kMinRingBytes});

  LocalServer::Options so;
  so.socket_path = options_.run_dir + "/nopfsd.sock";
  so.allowed_uid = options_.uid;
  // One connection per stream a rank may open, and a few for `nopfs status` and the like.
  so.max_connections = size_t{local_ranks} * config_.limits().streams_per_rank + kSpareConnections;
  // Sibling jobs' nopfsd (each opens at most SiblingSource::kMaxConnections).
  if (options_.share_running) so.max_connections += kSiblingConnections;
  server_ = std::make_unique<LocalServer>(so, this);
  NOPFS_RETURN_IF_ERROR(server_->Start());
  RegisterSibling();
  spdlog::info(
      "serving on {} (rings of {} each; at most {} streams per rank, {} of rings in all, "
      "{} connections)",
      so.socket_path, FormatBytes(static_cast<double>(ring_bytes_)),
      config_.limits().streams_per_rank,
      FormatBytes(static_cast<double>(ring_bytes_) * local_ranks *
                  config_.limits().streams_per_rank),
      so.max_connections);

  if (!config_.metrics_dir().empty()) {
    MetricsLabels labels{options_.job_id, std::to_string(options_.uid), "localhost"};
    std::vector<char> buf(16384);
    passwd pw{};
    passwd* found = nullptr;
    if (getpwuid_r(options_.uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr) {
      labels.user = pw.pw_name;
    }
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) labels.node = host;
    metrics_ = std::make_unique<MetricsWriter>(config_.metrics_dir(), std::move(labels),
                                               options_.local_io);
    WriteMetrics();
    spdlog::info("metrics: writing {} every {} s", metrics_->path(), kMetricsPeriod.count());
  }
  reporter_ = std::thread([this] { Reporter(); });
  // The plan line for the job's output (the SPANK plugin prints it in the batch script's task).
  // A run directory that cannot take it cannot take the ready file either: a start failure.
  if (!options_.run_dir.empty()) {
    if (Status s = WriteFileAtomically(options_.run_dir, kPlanName,
                                       report::RenderPlanLine(Report()), options_.local_io);
        !s.ok()) {
      return s;
    }
  }
  startup_.Mark("serve");
  store_thread_ = std::thread([this] {
    catalog_->StorePending();
    if (catalog_->pending_store_seconds() > 0 && catalog_->store_error().empty()) {
      spdlog::info("catalog: stored for the next job in {:.2f} s ({})",
                   catalog_->pending_store_seconds(), catalog_->db_path());
    }
  });
  return Status::Ok();
}

void Daemon::WriteMetrics() {
  const Status st = metrics_->Write(Report());
  if (st.ok()) {
    if (!metrics_error_.empty()) spdlog::info("metrics: {} written again", metrics_->path());
    metrics_error_.clear();
  } else if (st.message() != metrics_error_) {
    metrics_error_ = st.message();
    spdlog::warn("{} (the job goes on without metrics)", metrics_error_);
  }
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
    if (metrics_ && std::chrono::steady_clock::now() >= next_write) {
      WriteMetrics();  // (its report samples the rate too)
      next_write = std::chrono::steady_clock::now() + kMetricsPeriod;
    } else {
      (void)ObserveRates();
    }
  }
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
  // No new sibling finds this daemon; the ones reading from it fall back to the PFS when the
  // server closes their connections.
  UnregisterLive(live_entry_);
  live_entry_.clear();
  serving_.store(false);
  if (server_) server_->Stop();
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
  if (metrics_) WriteMetrics();
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
  for (KeptClass& k : kept_)
    if (k.copy) k.copy->StopChecks();  // they may mark slots of a tier ready
  KeepAtExit();
  if (metrics_ && reader_) WriteMetrics();  // with what was kept
  reader_.reset();
  siblings_.reset();
  kept_.clear();  // the adopted copies: what is worth keeping again is in the new kept entries
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

void Daemon::AdoptKept() {
  std::error_code ec;
  const std::filesystem::path dataset = std::filesystem::canonical(options_.dataset, ec);
  std::vector<size_t> ssd;
  for (size_t j = 0; j < model_.classes.size(); ++j) {
    if (model_.classes[j].kind == policy::ClassKind::kSsd) ssd.push_back(j);
  }
  if (ssd.empty() || ec) {
    if (options_.keep) {
      spdlog::warn("kept area: nothing will be kept: {}",
                   ssd.empty() ? "the node config has no SSD class" : ec.message());
    }
    return;
  }
  for (size_t j : ssd) {
    KeptClass k;
    k.class_index = j;
    k.place.kept_dir = launch::KeptAreaDir(SsdTier::UserDir(model_.classes[j].path, geteuid()));
    k.place.dataset = dataset.string();
    k.place.tag = options_.job_id + "." + std::to_string(options_.node);
    std::string scan = kKeptScanOptions;
    // Two SSD classes on one path keep under two keys (and private names) in its kept area.
    for (const KeptClass& other : kept_) {
      if (other.place.kept_dir == k.place.kept_dir) {
        scan += "/" + model_.classes[j].name;
        k.place.tag += "." + std::to_string(j);
        break;
      }
    }
    k.place.key = launch::KeptKey(k.place.dataset, scan);
    if (Result<uint64_t> n = CleanKeptArea(k.place.kept_dir); !n.ok()) {
      spdlog::warn("kept area: cleaning {}: {}", k.place.kept_dir, n.status().message());
    }
    Result<std::unique_ptr<KeptCopy>> copy = KeptCopy::Adopt(k.place, *catalog_, Env::Default());
    if (copy.ok()) {
      k.copy = std::move(*copy);
    } else if (copy.status().code() != StatusCode::kNotFound) {
      spdlog::warn("kept area: the kept copy of {} in {} is unusable and was removed: {}",
                   k.place.dataset, k.place.kept_dir, copy.status().message());
    }
    kept_.push_back(std::move(k));
  }
}

void Daemon::FindSibling() {
  // The registry is in the user's area of the first SSD class's scratch path, beside its kept
  // area, under the same key. The sibling is looked for when a sample is first about to be read
  // from the PFS, and again while there is none (SiblingReader).
  if (!options_.share_running || kept_.empty()) return;
  const KeptPlace& place = kept_.front().place;
  SiblingReader::Options o;
  o.user_dir = place.kept_dir.substr(0, place.kept_dir.rfind('/'));
  o.key = place.key;
  o.self.job = place.tag;
  o.self.pid = static_cast<uint32_t>(::getpid());
  o.self.fingerprint = catalog_->fingerprint();
  o.same_job = options_.job_id + ".";
  o.timeout = kSiblingTimeout;
  siblings_ = std::make_unique<SiblingReader>(std::move(o));
}

void Daemon::RegisterSibling() {
  // The registry is in the user's area of the first SSD class's scratch path, beside its kept
  // area, under the same key.
  if (!options_.share_running || kept_.empty()) return;
  const KeptPlace& place = kept_.front().place;
  const std::string user_dir = place.kept_dir.substr(0, place.kept_dir.rfind('/'));
  LiveEntry e;
  e.job = place.tag;
  e.pid = static_cast<uint32_t>(::getpid());
  e.fingerprint = catalog_->fingerprint();
  std::error_code ec;
  e.socket = std::filesystem::absolute(options_.run_dir + "/nopfsd.sock", ec).string();
  serving_.store(true);
  // The entry's time orders the siblings (sibling.h): this job reads through entries before it
  // only, from before the entry exists, so that no other job can see it in another order.
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  e.started_ns = int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  if (siblings_) siblings_->Registering(e.started_ns);
  Result<std::string> path = RegisterLive(user_dir, place.key, e);
  if (path.ok()) {
    live_entry_ = *path;
  } else {
    spdlog::warn("sibling: other jobs of this user will not find this one: {}",
                 path.status().message());
  }
}

Result<uint64_t> Daemon::ReadSample(uint64_t fingerprint, uint32_t sample_id,
                                    std::vector<std::byte>* bytes) {
  if (!options_.share_running || !serving_.load()) {
    return Status::FailedPrecondition("nopfsd: this job does not serve sibling reads");
  }
  if (fingerprint != catalog_->fingerprint()) {
    return Status::FailedPrecondition("nopfsd: the dataset's catalog differs here (fingerprint " +
                                      std::to_string(catalog_->fingerprint()) + ")");
  }
  if (sample_id >= catalog_->size()) {
    return Status::InvalidArgument("nopfsd: sample " + std::to_string(sample_id) +
                                   " is not in the dataset (" + std::to_string(catalog_->size()) +
                                   " samples)");
  }
  bytes->resize(catalog_->length(sample_id));
  // Never through a sibling of this job's: a read goes through one sibling at most.
  Result<SourceId> src = reader_->Read(sample_id, *bytes, /*ask_sibling=*/false);
  if (!src.ok()) return src.status();
  sibling_served_.fetch_add(1, std::memory_order_relaxed);
  sibling_served_bytes_.fetch_add(bytes->size(), std::memory_order_relaxed);
  return XXH3_64bits(bytes->data(), bytes->size());
}

void Daemon::KeepAtExit() {
  if (!options_.keep) return;
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t used = 0;  // --keep-max-bytes bounds every class's kept bytes together
  for (KeptClass& k : kept_) {
    const std::string& name = model_.classes[k.class_index].name;
    SsdTier* tier = k.class_index < tier_refs_.size() ? tier_refs_[k.class_index].ssd : nullptr;
    if (tier == nullptr) continue;  // the class holds nothing in this job
    const std::string user_dir = k.place.kept_dir.substr(0, k.place.kept_dir.rfind('/'));
    if (tier->dir().rfind(user_dir + "/", 0) != 0) {
      spdlog::warn("kept area: class {}: nothing kept: its tier is not under {}", name, user_dir);
      continue;
    }
    if (options_.keep_max_bytes != 0 && used >= options_.keep_max_bytes) {
      spdlog::info("kept area: class {}: nothing kept: --keep-max-bytes reached", name);
      continue;
    }
    KeepOptions ko;
    ko.place = k.place;
    ko.max_bytes = options_.keep_max_bytes == 0 ? 0 : options_.keep_max_bytes - used;
    ko.created = k.copy ? k.copy->created() : 0;
    // Half a second of margin for ctime's coarse clock (a write during the job is never trusted).
    ko.unchanged_before_ns = start_wall_ns_ - 500'000'000;
    ko.stat_threads = kKeepStatThreads;
    ko.deadline = t0 + kKeepStatBudget;
    Result<KeepResult> r = KeepSsdTier(ko, *tier, *catalog_, Env::Default());
    if (!r.ok()) {
      spdlog::error("kept area: class {}: keeping its SSD tier failed (nothing kept): {}", name,
                    r.status().message());
      continue;
    }
    used += r->bytes;
    kept_bytes_.fetch_add(r->bytes);
    spdlog::info(
        "kept area: kept {} samples ({} on disk) in {} in {:.2f} s; {} ready samples not kept "
        "(class {})",
        r->samples, FormatBytes(static_cast<double>(r->bytes)), r->dir,
        Seconds(std::chrono::steady_clock::now() - t0), r->skipped, name);
  }
}

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
  const double mean = static_cast<double>(std::accumulate(catalog_->sizes().begin(),
                                                          catalog_->sizes().end(), uint64_t{0})) /
                      static_cast<double>(std::max<uint64_t>(1, catalog_->size()));
  const uint32_t slots = static_cast<uint32_t>(std::clamp<double>(
      2.0 * static_cast<double>(ring_bytes_) / std::max(1.0, mean), kMinRingSlots, kMaxRingSlots));
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
  Result<std::unique_ptr<ring::RingWriter>> ring = ring::RingWriter::Create(
      ring_bytes_, slots, "nopfs-" + options_.job_id + "-rank" + std::to_string(req.rank));
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

void Daemon::CloseStream(uint64_t stream_id) {
  std::unique_ptr<StagingStream> s;
  {
    MutexLock lock(&mu_);
    auto it = streams_.find(stream_id);
    if (it == streams_.end()) return;
    s = std::move(it->second);
    streams_.erase(it);
    --open_per_rank_[s->rank()];
    claims_.erase(stream_id);
  }
  closed_cv_.SignalAll();
  s->Cancel();
  const ring::RingStats st = s->ring().stats();
  spdlog::info("stream {} (rank {}) closed: {} staged, {} errors", stream_id, s->rank(),
               s->staged(), s->errors());
  MutexLock lock(&mu_);
  Merge(&closed_stats_, st);
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
    Tier* tier = tier_refs_[j].ram != nullptr ? static_cast<Tier*>(tier_refs_[j].ram)
                                              : static_cast<Tier*>(tier_refs_[j].ssd);
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
