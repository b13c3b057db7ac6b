// Daemon: nopfsd's parts put together for one job on one node.
//
// Start(): loads the node config, opens the dataset's catalog, replays the job's shuffle to plan
// this node (policy::MakeNodePlan over the configured classes, capped by what the job was
// granted), creates the RAM and SSD tiers and starts their prefetchers, and opens the local
// server. From then on each client that opens a rank's stream gets a ring that a StagingStream
// fills in that rank's order, at most limits().streams_per_rank streams per rank at once (one more
// is refused with ResourceExhausted; the rank's open streams go on), and at most that many
// connections per local rank plus a few (LocalServer::Options::max_connections). Stop(): closes the
// server (cancelling every stream), stops the prefetchers, with `keep` moves the SSD tier's ready
// samples to the kept area (service/reader/kept.h), and destroys the tiers, so that nothing else
// the job staged remains. Start() adopts the dataset's kept copy, if any, as a source of samples.
//
// Thread safety: Start/Stop from the main thread; the Handler methods are called by the server's
// threads and are safe concurrently; StatusText from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/phases.h"
#include "common/status.h"
#include "lua/config.h"
#include "policy/frequency.h"
#include "policy/job.h"
#include "policy/plan.h"
#include "protocol/ring.h"
#include "service/catalog/catalog.h"
#include "service/daemon/metrics.h"
#include "service/daemon/staging.h"
#include "service/env/local_io.h"
#include "service/peers/peers.h"
#include "service/reader/kept.h"
#include "service/reader/sample_reader.h"
#include "service/reader/sibling.h"
#include "service/server/local_server.h"
#include "service/tiers/prefetcher.h"
#include "service/tiers/ram_tier.h"
#include "service/tiers/ssd_tier.h"
#include "share/ahead.h"
#include "share/client.h"

namespace nopfs::service {

struct DaemonOptions {
  std::string run_dir;           // the job's run directory (socket, log), already prepared
  std::string dataset;           // ImageFolder directory or manifest file
  std::string config_path;       // node config (Lua); "" = DefaultNodeConfig
  std::string job_id = "local";  // Slurm job id, or "local" for `nopfs run`
  policy::JobSpec job;           // job.samples = 0: take F from the dataset
  uint32_t node = 0;             // this node's index in the job
  // Bytes the admission policy granted this job on this node; UINT64_MAX = the config's capacity.
  policy::Bytes ram_grant = UINT64_MAX;
  policy::Bytes ssd_grant = UINT64_MAX;
  unsigned plan_threads = 0;  // 0: all cores
  uint32_t uid = 0;           // the only uid allowed to connect (the job's user)
  // Peers (docs/fabric.md): every node's HOST:PORT in node order ("" = no peers), this node's
  // entry again (checked against the list), the per-job secret file, the libfabric provider.
  std::string peers;
  std::string peer_listen;
  std::string peer_secret_file;
  std::string peer_provider = "tcp;ofi_rxm";
  uint32_t peer_timeout_ms = 5000;
  // The start-up phase: how long after Start the node waits for every other node to answer its
  // handshake before the first catalog round (docs/fabric.md, "Start-up").
  uint32_t peer_startup_timeout_ms = 60000;
  // The kept area (service/reader/kept.h): keep the SSD tier's ready samples at Stop(), at most
  // keep_max_bytes of disk (0: no limit). A kept copy of the dataset is adopted whatever these say.
  bool keep = false;
  uint64_t keep_max_bytes = 0;
  // Sibling jobs (service/reader/sibling.h): register in the user's registry, serve READ_SAMPLE,
  // and read from the oldest running sibling on the same dataset before the PFS.
  bool share_running = true;
  // The node's shared copy (share/client.h): the share service's socket and the dataset as the
  // node config declares it; empty: not used. Used only when the job's dataset is that directory.
  std::string shared_socket;
  std::string shared_dataset;
  // Leave the job's summary in the run directory (launch::kSummaryName; the epilog reads it).
  bool summary = false;
  // Called once the peer endpoint is bound, or could not be, or at once without peers: before the
  // daemon reads the node config or the dataset and before it starts a thread (nopfsd gives up
  // its capabilities there: launch::DropAllCapabilities). An error fails Start. Unset: nothing.
  std::function<Status()> after_peer_bind;
  // The I/O of the run directory's plan file and of the metrics file (tests inject faults);
  // nullptr: LocalIo::Default(). Must outlive the daemon.
  LocalIo* local_io = nullptr;
};

class Daemon final : public Handler {
 public:
  static Result<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon() override;
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Idempotent.
  void Stop();

  uint64_t samples() const { return catalog_->size(); }
  const policy::NodePlan& plan() const { return plan_; }
  const Catalog& catalog() const { return *catalog_; }
  const std::string& log_level() const { return config_.log_level(); }
  // Where Start's time went (nopfsd's `start-up in` line, docs/service.md "Start-up").
  const Phases& startup_phases() const { return startup_; }
  // How the peer link started, for the launcher (launch::ReadyInfo): the port this node listens
  // on (0: none), whether every other node answered in the start-up phase, and one line on it
  // ("listening on H:P; every other node answered", or why there are no peers). Empty for a job
  // without peers.
  uint16_t peer_port() const { return peer_port_; }
  bool peers_joined() const { return peers_joined_; }
  const std::string& peer_note() const { return peer_note_; }
  const SampleReader& reader() const { return *reader_; }
  // Waits until every prefetcher has visited all of its slots (tests and benchmarks).
  void WaitPrefetched();

  // LocalServer::Handler
  HelloInfo Hello() override;
  Result<StreamGrant> OpenStream(const OpenStreamRequest& request, ConnectionId conn) override;
  std::function<void()> CloseStream(uint64_t stream_id) override;
  std::string StatusText() override;  // report::RenderText(Report())
  report::StatusReport Report() override;
  Result<wire::DescribeOk> Describe(uint32_t sample_id) override;
  Result<uint64_t> ReadSample(uint64_t fingerprint, uint32_t sample_id,
                              std::vector<std::byte>* bytes) override;

 private:
  explicit Daemon(DaemonOptions options);

  // The start-up (daemon_start.cc). Init runs these phases in this order, each using what the
  // ones before it established; the reason for the order is at Init. A phase that fails ends the
  // start (Start then stops what was started).
  struct Startup;  // what a phase hands on to a later one and the daemon does not keep
  Status Init();
  Status LoadConfig();                   // config_
  Status StartPeers();                   // peers_ (null without peers or when they fail to start)
  void JoinPeers(const Startup& s);      // the start-up phase: waits for the other nodes
  Status OpenCatalog(const Startup& s);  // catalog_, scanned over the peer link or reused
  Status SettleJob();                    // job_: F from the catalog, checked
  void PlanNode(Startup* s);             // model_ (capped by the grants), plan_, the counts
  Status CreateTiers();                  // ram_tiers_, ssd_tiers_, tier_refs_
  void CreateReader(Startup* s);         // reader_ with its sources: peers, kept copies, sibling
  void CreatePrefetchers();              // prefetchers_ (not started)
  void AttachPeerDirectory(Startup* s);  // the peer directory; frees the counts
  void AnnounceFilledClasses(const Startup& s);  // what a class's filling triggers
  Status StartPrefetchers();  // the prefetch runs; the rate is measured from here
  Status StartServer();       // ring_bytes_, server_, the sibling registry entry
  void StartReporter();       // metrics_, reporter_
  Status WritePlanLine();     // the run directory's plan line for the job's output
  // Notes, for the log and the job's output, each class whose capacity on this node is smaller
  // than the dataset's largest sample: which sample, its size, and what to ask for instead. The
  // class holds what fits (nothing: the job runs without it); the job goes on either way.
  void NoteTooSmallTiers();
  void StoreCatalogLater();  // store_thread_

  DaemonOptions options_;
  lua::NodeConfig config_;
  policy::SystemModel model_;  // the config's, capacities capped by the grants
  policy::JobSpec job_;        // options_.job with F from the catalog
  std::unique_ptr<Catalog> catalog_;
  policy::NodePlan plan_;
  uint64_t predicted_stall_ns_ = report::kUnknown;  // set by Init (a consumer taking no time)
  // Lines for the job's output after the plan line (NoteTooSmallTiers), each ending in '\n'.
  std::string plan_notes_;
  std::vector<std::unique_ptr<RamTier>> ram_tiers_;
  std::vector<std::unique_ptr<SsdTier>> ssd_tiers_;
  std::vector<TierRef> tier_refs_;  // [class]
  std::unique_ptr<SampleReader> reader_;
  std::vector<std::unique_ptr<Prefetcher>> prefetchers_;  // [class] (null for an empty class)
  std::vector<std::chrono::steady_clock::time_point> prefetch_done_;
  std::unique_ptr<LocalServer> server_;
  std::chrono::steady_clock::time_point started_;
  Phases startup_;  // Init's phases
  // Writes the scanned catalog's DB after Init (Catalog::StorePending); joined by Stop.
  std::thread store_thread_;
  uint64_t ring_bytes_ = 0;

  Mutex mu_;
  std::map<uint64_t, std::unique_ptr<StagingStream>> streams_ GUARDED_BY(mu_);
  uint64_t next_stream_ GUARDED_BY(mu_) = 1;
  // Streams open or being opened, per local rank (at most limits().streams_per_rank each).
  std::map<uint32_t, uint32_t> open_per_rank_ GUARDED_BY(mu_);
  uint64_t refused_streams_ GUARDED_BY(mu_) = 0;
  // One process per rank: which process each stream open or being opened is read for, and its
  // epochs [first_epoch, end_epoch). Streams of a rank whose epochs overlap share one owner.
  struct Claim {
    uint32_t rank = 0;
    uint32_t owner_pid = 0;
    uint32_t first_epoch = 0;
    uint32_t end_epoch = 0;
  };
  std::map<uint64_t, Claim> claims_ GUARDED_BY(mu_);  // by stream id
  uint64_t refused_owners_ GUARDED_BY(mu_) = 0;       // opens refused for another owner
  CondVar closed_cv_;                                 // notified when a stream closes (with mu_)
  // Finished streams' client statistics, kept for the status after their clients left.
  ring::RingStats closed_stats_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;

  // The ring thread, off the connections' way: it stops a closed stream's writer and frees its
  // ring (milliseconds for a ring whose arena was written), so that the connection that closed
  // it is served at once, its next OPEN_STREAM (the next epoch's) included; and it keeps one
  // fresh ring ready for the next OPEN_STREAM, since creating one maps memory and so waits for
  // every unmapping and population of memory in nopfsd (a ring being freed, a tier's chunk being
  // committed: 5-20 ms on 2 cores). Started by StartServer, drained and joined by Stop once the
  // server is stopped (no close can come after), before the reader goes.
  void RingThread();
  void Retire(std::shared_ptr<StagingStream> s);
  uint32_t RingSlots() const;  // the slots of every ring (from the catalog's mean sample size)
  // The ready ring if there is one (another is made at once), else a ring made now.
  Result<std::unique_ptr<ring::RingWriter>> TakeRing(uint32_t rank);
  std::thread ring_thread_;
  Mutex ring_mu_;
  CondVar ring_cv_;
  std::deque<std::shared_ptr<StagingStream>> closing_ GUARDED_BY(ring_mu_);
  std::unique_ptr<ring::RingWriter> spare_ring_ GUARDED_BY(ring_mu_);
  bool ring_stop_ GUARDED_BY(ring_mu_) = false;
  std::unique_ptr<PeerService> peers_;  // null without peers
  uint16_t peer_port_ = 0;
  bool peers_joined_ = false;
  std::string peer_note_;

  // The kept area of each SSD class, in the config's order: the class, where its samples are
  // kept (its own scratch path's kept area; none when the dataset has no canonical path), and its
  // adopted copy (null when none). Set in Init and Stop (main thread).
  struct KeptClass {
    size_t class_index = 0;
    KeptPlace place;
    std::unique_ptr<KeptCopy> copy;
    // With --keep: the keep record committed beside the class's SSD tier as it fills (null
    // without a tier), from which the epilog keeps when this daemon is killed.
    std::unique_ptr<KeepCommitter> committer;
  };
  std::vector<KeptClass> kept_;
  // What Stop() kept (disk bytes, every class).
  std::atomic<uint64_t> kept_bytes_{0};
  int64_t start_wall_ns_ = 0;  // the real time at the start of Init
  void AdoptKept();
  void StartKeepCommits();
  void KeepAtExit();

  // Sibling jobs: the sibling this daemon reads through (null: not sharing), its registry
  // entry's path (empty: not registered), and what it served to siblings.
  std::unique_ptr<SiblingReader> siblings_;
  std::string live_entry_;
  std::atomic<uint64_t> sibling_served_{0};
  std::atomic<uint64_t> sibling_served_bytes_{0};
  std::atomic<bool> serving_{false};  // READ_SAMPLE is served from Init's end to Stop's start
  void FindSibling();
  // The node's shared copy (null: the dataset is not shared here, or is not the declared
  // directory): the source the reader asks after the kept copy.
  std::shared_ptr<share::ShareClient> shared_;
  // Its files asked for ahead of the reads, in the order of this node's first reads.
  std::shared_ptr<share::AheadReader> shared_ahead_;
  std::atomic<bool> shared_warned_{false};
  SharedFetchFn MakeSharedFetch(const policy::NodeAccessCounts& counts);
  void RegisterSibling();

  // Bytes staged into each class so far (prefetched, kept from staging reads, pushed by peers).
  std::vector<uint64_t> StagedBytes() const;
  // Records StagedBytes() now and returns each class's rate in bytes/s over the last
  // kRateWindow (since start at first).
  std::vector<uint64_t> ObserveRates();
  struct RateSample {
    std::chrono::steady_clock::time_point t;
    std::vector<uint64_t> bytes;  // [class]
  };
  Mutex rate_mu_;
  std::deque<RateSample> rate_samples_ GUARDED_BY(rate_mu_);  // the oldest is kept

  // The reporter thread: samples the staging rate every second and, with the config's
  // metrics_dir, rewrites the metrics file (and with options_.summary the job's summary for the
  // epilog, launch::kSummaryName in the run directory) every kMetricsPeriod, and in Stop().
  void Reporter();
  // Writes the metrics file (`metrics`, when there is one) and the summary (`summary`, when asked
  // for) from one report. False when there was nothing to write.
  bool WriteReports(bool metrics, bool summary);
  void WriteMetrics(const report::StatusReport& r);
  void WriteSummary(const report::StatusReport& r);
  std::unique_ptr<MetricsWriter> metrics_;  // null without metrics_dir
  std::string metrics_error_;               // the last error logged (each new one is logged once)
  std::thread reporter_;
  Mutex reporter_mu_;
  CondVar reporter_cv_;
  bool reporter_stop_ GUARDED_BY(reporter_mu_) = false;
};

}  // namespace nopfs::service
