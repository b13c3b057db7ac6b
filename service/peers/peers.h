// PeerService: what makes a node's cache part of the whole job's cache. It serves this node's
// ready tier copies to the job's other nodes over fabric::PeerLink, builds the peer directory
// (service/peers/directory.h) with them, and is the SampleReader's PeerSource
// (service/reader/sources.h): the holder of a sample this node reads and does not hold, and the
// filler a prefetcher copies from. The rules
// (directory, readiness, fills, pushes, dead peers, when each step happens) are
// docs/algorithm.md §7.
//
// Life: Start() opens the link at the beginning of nopfsd's start-up (reads get "not available"
// until Attach); Attach() builds the directory once the tiers and prefetchers exist, before the
// prefetchers start, and on failure leaves the node without peers, saying why.
//
// Thread safety: Attach from one thread, before the reader is used by staging threads; the
// peer source, the serving callback and Report are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "fabric/peer_link.h"
#include "policy/frequency.h"
#include "policy/plan.h"
#include "protocol/status_report.h"
#include "service/catalog/catalog.h"
#include "service/peers/directory.h"
#include "service/reader/sample_reader.h"
#include "service/tiers/prefetcher.h"

namespace nopfs::service {

struct PeerServiceOptions {
  std::string provider = "tcp;ofi_rxm";
  uint32_t node = 0;
  std::vector<fabric::PeerAddress> peers;  // every node of the job, in node order
  fabric::Secret secret{};
  std::chrono::milliseconds timeout{5000};  // per request and handshake (a dead peer costs one)
  uint64_t margin = 20;  // docs/algorithm.md §7: readiness margin, in prefetch-list entries
  std::function<Status()> after_bind;  // fabric::PeerLinkOptions::after_bind
  bool rma_in_software = false;        // fabric::PeerLinkOptions::rma_in_software
};

class PeerService final : public PeerSource {
 public:
  static Result<std::unique_ptr<PeerService>> Start(const PeerServiceOptions& options);
  ~PeerService() override;
  PeerService(const PeerService&) = delete;
  PeerService& operator=(const PeerService&) = delete;

  // Serves `tiers` (class j of `plan`), builds the directory from what this node holds and what
  // it will read (`counts`), and from then on answers as the reader's PeerSource; the samples
  // other nodes push are kept through `reader` (SampleReader::KeepPushed). `prefetchers` (not
  // started yet, or running) give the pace for readiness. Everything given must outlive the
  // service. An error means the node runs without peers (it still serves its own, and as a
  // PeerSource knows no peer).
  Status Attach(const policy::NodePlan& plan, const policy::NodeAccessCounts& counts,
                const std::vector<TierRef>& tiers,
                const std::vector<const Prefetcher*>& prefetchers, const Catalog& catalog,
                SampleReader& reader);

  // One collective round of the catalog's shared scan (CatalogOptions::exchange): catalog round r
  // is the link's round kCatalogRoundBase + r, apart from the directory's rounds. Usable from
  // Start on; every node must call it with the same rounds.
  // It waits for the others until `deadline`.
  static constexpr uint64_t kCatalogRoundBase = uint64_t{1} << 48;
  Result<std::vector<std::vector<std::byte>>> CatalogExchange(
      uint64_t round, std::vector<std::vector<std::byte>> out,
      std::chrono::steady_clock::time_point deadline);

  // The start-up phase (fabric::PeerLink::WaitForPeers): Ok once every other node has answered
  // this node's handshake, Unavailable naming those that had not by `deadline`.
  Status WaitForPeers(std::chrono::steady_clock::time_point deadline);

  // The link's counters and the directory's state, for the status (the daemon adds the copies
  // its prefetchers made).
  report::Peers Report() const;

  // Tells the other nodes that this node's class `cls` is filled (its prefetcher finished): they
  // then presume every entry of it ready (docs/algorithm.md §7).
  void AnnounceClassDone(uint32_t cls);

  // PeerSource (sources.h): no peer until Attach has built the directory.
  int Lookup(policy::SampleId sample) const override;
  Result<uint64_t> Fetch(policy::SampleId sample, std::span<std::byte> dst) override;
  Result<uint64_t> FetchCopy(policy::SampleId sample, std::span<std::byte> dst) override;
  // Offers a sample a staging read took from the PFS to the node the directory names for it (its
  // holder, or its filler) unless that node reported its class filled.
  void Push(policy::SampleId sample, std::span<const std::byte> bytes, uint64_t xxh3) override;

  // Stops the link: nothing more is served, and peer reads (by prefetchers still running) fail at
  // once, so that they can be joined before the service goes. Idempotent; the destructor calls it.
  void Stop();

 private:
  explicit PeerService(PeerServiceOptions options);
  // A peer's request for `sample`; `nowait`: only if the read needs no disk I/O (an SSD-tier
  // sample in the page cache), WouldBlock otherwise.
  fabric::ServeResult Serve(uint64_t sample, bool nowait);
  // Whether a request for `sample` is answered from memory (a RAM tier, or "not available"):
  // then the link's progress thread answers it; an SSD read is tried there without waiting
  // (Serve with nowait) and goes to the serving threads where it would wait for the disk.
  bool ServesFromMemory(uint64_t sample) const;
  // The peer to read `sample` from: its holder if this node does not hold it, else its filler if
  // that is another node.
  std::optional<dir::Location> Where(policy::SampleId sample) const;
  // docs/algorithm.md §7: whether loc's holder is presumed to have it by now (and is not dead).
  bool PresumedReady(const dir::Location& loc, uint64_t margin) const;
  Result<uint64_t> ReadFrom(const dir::Location& loc, std::span<std::byte> dst);
  // A push from node `node`: kept in this node's tier if planned here and not filled yet.
  void OnPush(uint32_t node, uint64_t sample, uint64_t xxh3, std::span<const std::byte> bytes);

  PeerServiceOptions options_;
  std::unique_ptr<fabric::PeerLink> link_;
  // Set once by Attach (then read-only).
  const policy::NodePlan* plan_ = nullptr;
  std::vector<TierRef> tiers_;
  std::vector<const Prefetcher*> prefetchers_;
  dir::PeerDirectory directory_;
  std::atomic<bool> serving_{false};            // tiers known: reads are served
  std::atomic<bool> have_directory_{false};     // directory built: peers are read
  std::atomic<SampleReader*> reader_{nullptr};  // set by Attach: pushes are kept through it
  std::atomic<uint64_t> pushes_kept_{0};
  mutable Mutex mu_;
  std::string state_ GUARDED_BY(mu_) = "starting";  // for the status
  dir::DirectoryStats stats_ GUARDED_BY(mu_);
  uint64_t held_elsewhere_ GUARDED_BY(mu_) = 0;  // the directory's samples held by other nodes
  uint64_t needed_ GUARDED_BY(mu_) = 0;          // the samples this node reads and does not hold
  std::string rma_ GUARDED_BY(mu_) = "not attached";  // how RAM tiers are served, for the status
  uint64_t round_ = 0;
};

}  // namespace nopfs::service
