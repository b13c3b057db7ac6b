// The daemon's start-up: Daemon::Init and its phases, in the order Init runs them (daemon.h lists
// them; docs/architecture.md, "nopfsd's start-up", gives the reason for the order).
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include <spdlog/spdlog.h>

#include "common/mutex.h"
#include "common/printable.h"
#include "common/units.h"
#include "policy/predict.h"
#include "service/daemon/daemon.h"
#include "service/daemon/daemon_internal.h"
#include "service/daemon/run_dir.h"
#include "service/env/env.h"

namespace nopfs::service {
namespace {

using daemon_internal::kMetricsPeriod;
using daemon_internal::Seconds;

constexpr uint64_t kMinRingBytes = uint64_t{4} << 20;
constexpr uint64_t kMaxRingBytes = uint64_t{64} << 20;
// Connections beyond one per stream: status queries, a client between two streams.
constexpr size_t kSpareConnections = 16;
// Connections kept for sibling jobs' nopfsd (a packed array of a few jobs, each opening at most
// SiblingSource::kMaxConnections).
constexpr size_t kSiblingConnections = 8 * SiblingSource::kMaxConnections;
// At start, the kept samples' files are stat-ed ahead of the reads by this many threads.
constexpr unsigned kKeptCheckThreads = 16;

}  // namespace

// What one phase of the start-up hands on to a later one and the daemon does not keep.
struct Daemon::Startup {
  // The nodes wait for each other until then (the peers' handshake, the shared scan's rounds).
  std::chrono::steady_clock::time_point deadline;
  // What this node reads, per sample: made by PlanNode, used by AttachPeerDirectory, then freed.
  policy::NodeAccessCounts counts;
  // The classes' adopted kept copies (AdoptKept), as sources of the reader and of the prefetch.
  std::vector<KeptCopy*> copies;
};

Status Daemon::Init() {
  // The phases, in order; each uses what the phases before it established:
  //   peer endpoint  first: bound with the one capability nopfsd starts with, which it gives up
  //                  right after (after_peer_bind), before it reads anything else
  //   config         the node config: classes, limits, planner, metrics; everything reads it
  //   peers          the other nodes reach this one while it scans and plans (the nodes wait
  //                  for each other until the start-up deadline)
  //   catalog        the dataset, scanned once for the job over the peer link (or reused)
  //   job            F from the catalog, checked against the job's flags
  //   plan           the classes capped by the grants; the node's accesses counted and planned
  //   kept, sibling  the kept copy and a running sibling job: before the tiers, whose SSD files
  //                  may be the kept copy's own, and before the reader that asks them
  //   tiers          the RAM and SSD tiers, laid out by the plan
  //   reader         the sample reader over the tiers, the kept copy and the sibling
  //   prefetchers    one per non-empty class, made but not started
  //   peer directory before the first prefetch: a sample this node holds with others is copied
  //                  from its filler, which only the directory names
  //   announcements  a filled class is announced to the peers and frees the kept copies' disk
  //   prefetch       the prefetchers start (the staging rate is measured from here)
  //   server         the rings' size, the local socket; sibling jobs may find this one from here
  //   reporter       the rate sampling and the metrics file
  //   plan line      for the job's output: written last, when the node serves
  //   catalog store  the scanned catalog kept for the next job, while this one serves
  started_ = std::chrono::steady_clock::now();
  {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    start_wall_ns_ = int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }
  Startup s;
  s.deadline = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(options_.peer_startup_timeout_ms);
  NOPFS_RETURN_IF_ERROR(StartPeers());
  startup_.Mark("peers");
  NOPFS_RETURN_IF_ERROR(LoadConfig());
  startup_.Mark("config");
  JoinPeers(s);
  startup_.Mark("peers");
  NOPFS_RETURN_IF_ERROR(OpenCatalog(s));
  NOPFS_RETURN_IF_ERROR(SettleJob());
  PlanNode(&s);
  startup_.Mark("plan");
  AdoptKept();
  FindSibling();
  NOPFS_RETURN_IF_ERROR(CreateTiers());
  CreateReader(&s);
  CreatePrefetchers();
  StartKeepCommits();
  AttachPeerDirectory(&s);
  AnnounceFilledClasses(s);
  NOPFS_RETURN_IF_ERROR(StartPrefetchers());
  startup_.Mark("tiers");
  NOPFS_RETURN_IF_ERROR(StartServer());
  StartReporter();
  NOPFS_RETURN_IF_ERROR(WritePlanLine());
  startup_.Mark("serve");
  StoreCatalogLater();
  return Status::Ok();
}

Status Daemon::LoadConfig() {
  if (options_.config_path.empty()) {
    config_ = lua::DefaultNodeConfig(lua::HostMemoryBytes());
  } else {
    Result<lua::NodeConfig> c = lua::LoadNodeConfig(options_.config_path);
    if (!c.ok()) return c.status();
    config_ = std::move(*c);
  }
  spdlog::info("nopfsd: job {}, node {}, config {}", options_.job_id, options_.node,
               config_.source());
  return Status::Ok();
}

Status Daemon::StartPeers() {
  const auto after_bind = [this] {
    return options_.after_peer_bind ? options_.after_peer_bind() : Status::Ok();
  };
  if (options_.peers.empty()) return after_bind();
  Result<std::vector<fabric::PeerAddress>> peers = fabric::ParsePeerList(options_.peers);
  if (!peers.ok()) return peers.status().WithContext("--peers");
  if (peers->size() != options_.job.nodes() || options_.node >= peers->size()) {
    return Status::InvalidArgument("--peers lists " + std::to_string(peers->size()) +
                                   " nodes, the job has " + std::to_string(options_.job.nodes()) +
                                   "; write one HOST:PORT per node, in node order");
  }
  const fabric::PeerAddress& me = (*peers)[options_.node];
  const std::string listen = me.host + ":" + std::to_string(me.port);
  if (!options_.peer_listen.empty() && options_.peer_listen != listen) {
    return Status::InvalidArgument("--peer-listen " + options_.peer_listen + " is not entry " +
                                   std::to_string(options_.node) + " of --peers (" + listen + ")");
  }
  Result<fabric::Secret> secret = fabric::ReadSecretFile(options_.peer_secret_file);
  if (!secret.ok()) {
    NOPFS_RETURN_IF_ERROR(after_bind());
    return secret.status().WithContext("--peer-secret-file");
  }
  // NOPFS_PEER_RMA=always: RMA reads of RAM tiers even where the provider does them in software
  // (tcp, where replies sent from the tier are faster): what the tests of that path set.
  bool rma_in_software = false;
  if (const char* e = std::getenv("NOPFS_PEER_RMA"); e != nullptr && *e != '\0') {
    const std::string v = e;
    if (v != "always" && v != "auto") {
      NOPFS_RETURN_IF_ERROR(after_bind());
      return Status::InvalidArgument("NOPFS_PEER_RMA=" + Printable(v) +
                                     ": write NOPFS_PEER_RMA=auto (RMA reads where the provider "
                                     "does them in hardware) or always");
    }
    rma_in_software = v == "always";
  }
  PeerServiceOptions po;
  po.rma_in_software = rma_in_software;
  po.provider = options_.peer_provider;
  po.node = options_.node;
  po.peers = std::move(*peers);
  po.secret = *secret;
  po.timeout = std::chrono::milliseconds(options_.peer_timeout_ms);
  po.after_bind = after_bind;
  Result<std::unique_ptr<PeerService>> ps = PeerService::Start(po);
  // Whether or not the endpoint was bound, nothing is read before the capability is gone (a
  // second call finds none and only checks).
  NOPFS_RETURN_IF_ERROR(after_bind());
  if (ps.ok()) {
    peers_ = std::move(*ps);
    peer_port_ = me.port;
    peer_note_ = "listening on " + listen;
  } else {
    // A taken port or a provider missing here: the node still serves its own ranks.
    peer_note_ = "no peers: " + ps.status().message();
    spdlog::warn("peers: {}; this node runs without peers", ps.status().message());
  }
  return Status::Ok();
}

void Daemon::JoinPeers(const Startup& s) {
  if (!peers_) return;
  const auto tw = std::chrono::steady_clock::now();
  if (Status joined = peers_->WaitForPeers(s.deadline); joined.ok()) {
    const double took = Seconds(std::chrono::steady_clock::now() - tw);
    spdlog::info("peers: every other node answered in {:.2f} s", took);
    peers_joined_ = true;
    peer_note_ += fmt::format("; every other node answered in {:.2f} s", took);
  } else {
    spdlog::warn(
        "peers: {} (deadline {} ms after this node started); the job goes on without them, "
        "and one that starts later joins for peer reads when it comes",
        joined.message(), options_.peer_startup_timeout_ms);
    peer_note_ += "; " + joined.message() + " (" +
                  std::to_string(options_.peer_startup_timeout_ms) +
                  " ms); the job goes on without them until they answer";
  }
}

Status Daemon::OpenCatalog(const Startup& s) {
  CatalogOptions co;
  co.dataset = options_.dataset;
  co.cache_dir = config_.catalog_cache();
  co.work_dir = options_.run_dir + "/catalog";
  co.uid = options_.uid;
  // A scanned catalog's DB is written once the node serves (StoreCatalogLater): it saves the next
  // job the scan, and this one does not wait for it.
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
        s.deadline, 5 * std::chrono::milliseconds(options_.peer_timeout_ms),
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
  return Status::Ok();
}

Status Daemon::SettleJob() {
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
  return Status::Ok();
}

void Daemon::PlanNode(Startup* s) {
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
  s->counts = policy::CountNodeAccesses(job_, options_.node, options_.plan_threads);
  plan_ = policy::MakeNodePlan(s->counts, catalog_->sizes(), capacities, config_.planner());
  spdlog::info("plan ({}): {} accesses of {} distinct samples in {:.2f} s",
               policy::PlannerName(config_.planner()), plan_.accesses, plan_.distinct,
               Seconds(std::chrono::steady_clock::now() - t1));
  NoteTooSmallTiers();
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
}

void Daemon::NoteTooSmallTiers() {
  const std::span<const policy::Bytes> sizes = catalog_->sizes();
  if (sizes.empty()) return;
  const auto largest = std::max_element(sizes.begin(), sizes.end());
  const auto id = static_cast<policy::SampleId>(largest - sizes.begin());
  for (size_t j = 0; j < model_.classes.size(); ++j) {
    const policy::StorageClass& c = model_.classes[j];
    if (c.capacity == 0 || c.capacity >= *largest) continue;
    // What to ask for: room for the largest sample, in whole MiB, at least --nopfs-ram's 1M.
    const policy::Bytes want = std::max<policy::Bytes>((*largest + kMiB - 1) / kMiB * kMiB, kMiB);
    const size_t held = plan_.tiers[j].prefetch_order.size();
    const std::string option = c.kind == policy::ClassKind::kRam ? "--nopfs-ram" : "--nopfs-ssd";
    std::string note =
        "nopfs: plan: tier " + c.name + ": " + FormatBytes(static_cast<double>(c.capacity)) +
        " cannot hold the dataset's largest sample, " + std::string(catalog_->relative_path(id)) +
        " (" + FormatBytes(static_cast<double>(*largest)) + "); " +
        (held == 0 ? "the job runs without this tier on node " + std::to_string(options_.node)
                   : "it holds " + std::to_string(held) + " smaller samples on node " +
                         std::to_string(options_.node)) +
        "; write " + option + "=" + SizeArg(want) + " or more";
    spdlog::warn("{}", note);
    plan_notes_ += note + "\n";
  }
}

Status Daemon::CreateTiers() {
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
  return Status::Ok();
}

void Daemon::CreateReader(Startup* s) {
  uint32_t prefetch_threads = 0;
  for (const policy::StorageClass& c : model_.classes)
    prefetch_threads += c.threads;
  ReaderSources sources;
  sources.peers = peers_.get();
  for (KeptClass& k : kept_) {
    if (k.copy) s->copies.push_back(k.copy.get());
  }
  if (!s->copies.empty()) {
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
    for (KeptCopy* k : s->copies)
      k->CheckAhead(order, kKeptCheckThreads);
    // A sample is kept by one class at most: the first copy that knows it answers.
    sources.kept = [copies = s->copies](policy::SampleId id,
                                        std::span<std::byte> dst) -> Result<uint64_t> {
      for (KeptCopy* k : copies) {
        Result<uint64_t> r = k->Fetch(id, dst);
        if (r.ok() || r.status().code() != StatusCode::kNotFound) return r;
      }
      return Status::NotFound("sample " + std::to_string(id) + " is not kept");
    };
  }
  sources.shared = MakeSharedFetch(s->counts);
  if (siblings_) {
    SiblingReader* sib = siblings_.get();
    sources.sibling = [sib](policy::SampleId id, std::span<std::byte> dst) {
      return sib->Fetch(static_cast<uint32_t>(id), dst);
    };
  }
  reader_ = std::make_unique<SampleReader>(*catalog_, plan_, tier_refs_, model_,
                                           job_.nodes() * std::max<uint32_t>(1, prefetch_threads),
                                           std::move(sources));
  reader_->set_verify_ram_hits(config_.ram_verify() == lua::RamVerify::kAlways);
}

void Daemon::CreatePrefetchers() {
  // One per non-empty class, each with the class's threads.
  prefetch_done_.assign(model_.classes.size(), {});
  for (size_t j = 0; j < tier_refs_.size(); ++j) {
    Tier* tier = tier_refs_[j].tier();
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
}

void Daemon::AttachPeerDirectory(Startup* s) {
  // On failure the node keeps serving from its own tiers and the PFS; the reason is logged and in
  // the status.
  if (peers_) {
    std::vector<const Prefetcher*> pf;
    for (const auto& p : prefetchers_)
      pf.push_back(p.get());
    (void)peers_->Attach(plan_, s->counts, tier_refs_, pf, *catalog_, *reader_);
  }
  s->counts = {};
}

void Daemon::AnnounceFilledClasses(const Startup& s) {
  // A filled class is announced, so that the other nodes stop guessing (docs/algorithm.md §7),
  // and the kept copies free the disk of the samples it now holds (docs/tiers.md); its keep
  // record is committed at once, with every sample the tier now holds.
  PeerService* ps = peers_.get();
  const std::vector<KeptCopy*>& copies = s.copies;
  for (size_t j = 0; j < prefetchers_.size(); ++j) {
    KeepCommitter* committer = nullptr;
    for (KeptClass& k : kept_)
      if (k.class_index == j && k.committer) committer = k.committer.get();
    if (!prefetchers_[j] || (ps == nullptr && copies.empty() && committer == nullptr)) continue;
    prefetchers_[j]->SetOnDone([this, ps, copies, committer, j] {
      if (ps != nullptr) ps->AnnounceClassDone(static_cast<uint32_t>(j));
      if (committer != nullptr) committer->Wake();
      if (copies.empty()) return;
      std::vector<policy::SampleId> ready;
      for (policy::SampleId id : plan_.tiers[j].prefetch_order)
        if (tier_refs_[j].tier()->IsReady(id)) {
          ready.push_back(id);
        }
      for (KeptCopy* k : copies)
        (void)k->Release(ready);
    });
  }
}

Status Daemon::StartPrefetchers() {
  {
    MutexLock lock(&rate_mu_);
    rate_samples_.push_back({std::chrono::steady_clock::now(), StagedBytes()});
  }
  for (auto& p : prefetchers_)
    if (p) NOPFS_RETURN_IF_ERROR(p->Start());
  return Status::Ok();
}

Status Daemon::StartServer() {
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
  ring_thread_ = std::thread([this] { RingThread(); });  // makes the first ring at once
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
  return Status::Ok();
}

void Daemon::StartReporter() {
  if (!config_.metrics_dir().empty()) {
    MetricsLabels labels{options_.job_id, std::to_string(options_.uid), "localhost"};
    using Seconds = std::chrono::duration<double>;
    labels.start_time = Seconds(std::chrono::system_clock::now().time_since_epoch()).count() -
                        Seconds(std::chrono::steady_clock::now() - started_).count();
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
    (void)WriteReports(true, false);
    spdlog::info("metrics: writing {} every {} s", metrics_->path(), kMetricsPeriod.count());
  }
  reporter_ = std::thread([this] { Reporter(); });
}

Status Daemon::WritePlanLine() {
  // The plan line for the job's output (the SPANK plugin prints it in the batch script's task).
  // A run directory that cannot take it cannot take the ready file either: a start failure.
  if (options_.run_dir.empty()) return Status::Ok();
  return WriteFileAtomically(options_.run_dir, kPlanName,
                             report::RenderPlanLine(Report()) + plan_notes_, options_.local_io);
}

void Daemon::StoreCatalogLater() {
  store_thread_ = std::thread([this] {
    catalog_->StorePending();
    if (catalog_->pending_store_seconds() > 0 && catalog_->store_error().empty()) {
      spdlog::info("catalog: stored for the next job in {:.2f} s ({})",
                   catalog_->pending_store_seconds(), catalog_->db_path());
    }
  });
}

}  // namespace nopfs::service
