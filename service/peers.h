// PeerService: what makes a node's cache part of the whole job's cache (docs/algorithm.md §7). It
// serves this node's ready tier copies to the job's other nodes over fabric::PeerLink, builds the
// peer directory (service/directory.h) with the other nodes at start, and gives the SampleReader
// its peer source: for a sample this node does not hold, the directory's holder if that holder is
// presumed to have it ready by now.
//
// Life: Start() opens the link first thing in nopfsd's start-up, so that the node's peers can
// reach it while it is still scanning and planning (until Attach it answers every read with "not
// available"). Attach() is called once the tiers and their prefetchers exist, before the
// prefetchers start (they need the directory to know which samples to copy from a peer): it
// builds the directory (a collective exchange among all nodes; if it fails, e.g. a node never
// came up, the node runs without peers and says why) and installs the peer source into the
// reader.
//
// Fills: a sample several nodes hold is read from the PFS by one of them, its filler (the
// directory names it); the others' prefetchers copy it from the filler once it is presumed ready
// (FetchCopy, the reader's peer fill source; without the margin: a wrong guess costs a round trip,
// not asking costs the duplicate PFS read for certain). When the filler does not have it yet, the
// prefetcher defers the slot to the end of its pass and asks again then; only a filler that still
// does not have it (or is dead) makes it read the PFS. So the job reads such a sample from the PFS
// about once.
//
// Pushes: a staging read that had to read the PFS for a sample another node holds (or fills for
// the job) but was not presumed to have yet offers that node the bytes, which it keeps if its slot
// is still empty; so the sample is read from the PFS once even when staging outruns a holder's
// prefetcher (the fill order and the stream order differ).
//
// Readiness (§6): a holder is presumed to have filled the q-th entry of its class-j list once
// this node's own prefetcher of class j has settled past q + margin, or has finished, or the
// holder has reported class j done (AnnounceClassDone, sent when its prefetcher finishes); a wrong
// guess costs one "not available" reply, after which the reader reads the PFS. A peer that does
// not answer within the timeout is dead for the rest of the job (PeerLink), and never asked again.
//
// Thread safety: Attach from one thread, before the reader is used by staging threads; the
// peer source, the serving callback and StatusText are safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "fabric/peer_link.h"
#include "policy/frequency.h"
#include "policy/plan.h"
#include "service/catalog.h"
#include "service/directory.h"
#include "service/prefetcher.h"
#include "service/sample_reader.h"

namespace nopfs::service {

struct PeerServiceOptions {
  std::string provider = "tcp;ofi_rxm";
  uint32_t node = 0;
  std::vector<fabric::PeerAddress> peers;  // every node of the job, in node order
  fabric::Secret secret{};
  std::chrono::milliseconds timeout{5000};  // per request and handshake (a dead peer costs one)
  uint64_t margin = 20;                     // §6's readiness margin, in prefetch-list entries
};

class PeerService {
 public:
  static Result<std::unique_ptr<PeerService>> Start(const PeerServiceOptions& options);
  ~PeerService();
  PeerService(const PeerService&) = delete;
  PeerService& operator=(const PeerService&) = delete;

  // Serves `tiers` (class j of `plan`), builds the directory from what this node holds and what
  // it will read (`counts`), and installs the peer source into `reader`. `prefetchers` (not
  // started yet, or running) give the pace for readiness. Everything given must outlive the
  // service. An error means the node runs without peers (it still serves its own).
  Status Attach(const policy::NodePlan& plan, const policy::NodeAccessCounts& counts,
                const std::vector<TierRef>& tiers,
                const std::vector<const Prefetcher*>& prefetchers, const Catalog& catalog,
                SampleReader& reader);

  // "peers: ..." lines for `nopfs status`.
  std::string StatusText() const;

  // Tells the other nodes that this node's class `cls` is filled (its prefetcher finished): they
  // then presume every entry of it ready (docs/algorithm.md §7).
  void AnnounceClassDone(uint32_t cls);

  // Stops the link: nothing more is served, and peer reads (by prefetchers still running) fail at
  // once, so that they can be joined before the service goes. Idempotent; the destructor calls it.
  void Stop();

 private:
  explicit PeerService(PeerServiceOptions options);
  fabric::ServeResult Serve(uint64_t sample);
  // Whether a request for `sample` is answered from memory (a RAM tier, or "not available"):
  // then the link's progress thread answers it; an SSD read goes to the serving threads.
  bool ServesFromMemory(uint64_t sample) const;
  // The peer to read `sample` from: its holder if this node does not hold it, else its filler if
  // that is another node.
  std::optional<dir::Location> Where(policy::SampleId sample) const;
  // §6: whether loc's holder is presumed to have it by now (and is not dead).
  bool PresumedReady(const dir::Location& loc, uint64_t margin) const;
  int Lookup(policy::SampleId sample) const;
  Result<uint64_t> Fetch(policy::SampleId sample, std::span<std::byte> dst);
  Result<uint64_t> FetchCopy(policy::SampleId sample, std::span<std::byte> dst);
  Result<uint64_t> ReadFrom(const dir::Location& loc, std::span<std::byte> dst);
  // The reader's push: offers a sample a staging read took from the PFS to the node the directory
  // names for it (its holder, or its filler) unless that node reported its class filled.
  void Push(policy::SampleId sample, std::span<const std::byte> bytes, uint64_t xxh3);
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
  mutable std::mutex mu_;
  std::string state_ = "starting";    // GUARDED_BY(mu_): for the status
  dir::DirectoryStats stats_;         // GUARDED_BY(mu_)
  std::string rma_ = "not attached";  // GUARDED_BY(mu_): how RAM tiers are served, for the status
  uint64_t round_ = 0;
};

}  // namespace nopfs::service
