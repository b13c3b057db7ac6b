// SampleReader: reads one sample from the fastest source that has it, checks its bytes, and
// counts what each source served. Staging threads call it for every access of every local rank;
// prefetchers use its PFS fetch to fill the tiers.
//
// Sources, per docs/algorithm.md §4: this node's tier holding the sample once it is ready (RAM:
// copy out of the memfd; SSD: a read of its data file), a peer's tier, the kept copy, a sibling
// job, or the PFS (the sources beside the tiers and the PFS are given at construction:
// sources.h). policy::ChooseSource picks between the tier, a peer and the PFS. Every tier read is
// checked against the xxh3 recorded when the tier was filled; a mismatch (a corrupted SSD file, a
// stray write into shared memory) is logged, the slot is marked failed, and the sample is read from
// the PFS instead. A PFS read records the sample's checksum in the catalog the first time, and
// warns if a later read of the same file differs (the file changed during the job). Fetch-and-cache
// (docs/algorithm.md §7): when a staging read has to go to the PFS for a sample that the plan
// places in a tier not filled yet, the reader stores the bytes it already has in that tier
// (claiming the slot, so that the prefetcher skips it), and the PFS is read once for it.
//
// Thread safety: Read and the fetch are safe from any number of threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "policy/model.h"
#include "policy/plan.h"
#include "service/catalog/catalog.h"
#include "service/reader/sources.h"
#include "service/tiers/ram_tier.h"
#include "service/tiers/ssd_tier.h"
#include "service/tiers/tier_layout.h"
#include "service/tiers/tier_ref.h"

namespace nopfs::service {

// Where a read was served from: a class index (0..classes-1), a peer, or the PFS.
struct SourceId {
  static constexpr int kShared = -5;   // the node's shared copy (share/client.h)
  static constexpr int kSibling = -4;  // another job's nopfsd on this node (sibling.h)
  static constexpr int kKept = -3;     // the kept copy an earlier job left (service/reader/kept.h)
  static constexpr int kPeer = -2;
  static constexpr int kPfs = -1;
  int index = kPfs;
};

// Counters per source, monotone.
struct SourceCounters {
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> nanos{0};  // time spent reading (staging reads only)
};

class SampleReader {
 public:
  // catalog, plan, tiers, model and sources.peers must outlive the reader. tiers[j] is class j
  // of the plan.
  SampleReader(Catalog& catalog, const policy::NodePlan& plan, std::vector<TierRef> tiers,
               const policy::SystemModel& model, uint32_t pfs_readers, ReaderSources sources = {});
  SampleReader(const SampleReader&) = delete;
  SampleReader& operator=(const SampleReader&) = delete;

  // Reads `sample` into dst, which must be exactly catalog.length(sample) bytes. Errors name the
  // sample and its path. Without `ask_sibling` (a read for a sibling job) the sibling is not
  // asked: a read goes through one sibling at most.
  Result<SourceId> Read(policy::SampleId sample, std::span<std::byte> dst, bool ask_sibling = true);

  // Zero copy: when `sample` is ready in the region class (the first RAM class; see
  // region_class()), verifies its bytes in place against the checksum recorded at fill, counts
  // the read, and returns where they are in that tier's memory. nullopt when the sample is not
  // there (or failed its check: the slot is then failed and Read refetches it).
  struct InPlace {
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  std::optional<InPlace> ReadInPlace(policy::SampleId sample);
  // Whether a RAM tier hit (in place or copied out) is checked against the xxh3 recorded at fill
  // (the node config's `verify`; default true). Fills, SSD and peer reads are always checked.
  void set_verify_ram_hits(bool verify) { verify_ram_hits_ = verify; }
  bool verifies_ram_hits() const { return verify_ram_hits_; }
  // The class whose tier clients may map (the first RAM class), or -1.
  int region_class() const { return region_class_; }
  // Reads of the region class served in place (included in its class_counters).
  uint64_t in_place_reads() const { return in_place_.load(std::memory_order_relaxed); }

  // A PFS read that records/compares the checksum and returns it.
  Result<uint64_t> FetchFromPfs(policy::SampleId sample, std::span<std::byte> dst, bool staging);
  // The fetch the prefetchers use: the kept copy, else the sample's filler's copy when another
  // node reads it from the PFS for the job (PeerSource::FetchCopy), else the sibling, else
  // FetchFromPfs. When the filler does not have it
  // yet: with `may_defer`, kUnavailable (the prefetcher retries the slot after its pass, see
  // prefetcher.h); without, the PFS.
  Result<uint64_t> FetchForFill(policy::SampleId sample, std::span<std::byte> dst, bool may_defer);

  // Samples and bytes taken from the kept copy (prefetches and staging reads).
  const SourceCounters& kept_counters() const { return kept_; }

  // Samples and bytes taken from the node's shared copy (prefetches and staging reads); its
  // bytes must match the catalog's checksum when one is known, else the PFS is read.
  const SourceCounters& shared_counters() const { return shared_; }

  // A sibling's bytes must match the catalog's checksum when one is known; any failure (the
  // sibling gone, a timeout, a mismatch) reads the PFS for that sample, and is logged once.
  // Samples and bytes taken from the sibling (prefetches and staging reads), and its failures.
  const SourceCounters& sibling_counters() const { return sibling_; }
  uint64_t sibling_failures() const { return sibling_failed_.load(std::memory_order_relaxed); }

  // A peer pushed `sample` (read from the PFS there before this node had it): when the plan
  // places it in a tier whose slot is still empty, stores it there (as fetch-and-cache does) and
  // returns true; otherwise (not planned here, filled or being filled, wrong size or checksum)
  // false. The bytes are checked against `xxh3` and the catalog's checksum when one is known.
  bool KeepPushed(policy::SampleId sample, std::span<const std::byte> bytes, uint64_t xxh3);
  // Pushed samples stored in class j's tier.
  const SourceCounters& pushed_kept(size_t j) const { return *pushed_kept_[j]; }

  // Per class (index j), then the peer, then the PFS (staging reads).
  const SourceCounters& class_counters(size_t j) const { return *per_class_[j]; }
  const SourceCounters& peer_counters() const { return peer_; }
  // Prefetches copied from a peer (the sample's filler) instead of read from the PFS. Staging
  // reads from a peer that were kept in a tier count in peer_counters and cached_on_read.
  const SourceCounters& peer_fill_counters() const { return peer_fill_; }
  // Prefetches whose filler never had the sample ready (after deferral): read from the PFS.
  uint64_t peer_fill_gave_up() const { return peer_fill_gave_up_.load(std::memory_order_relaxed); }
  const SourceCounters& pfs_counters() const { return pfs_; }
  // Every byte read from the PFS, prefetch included.
  uint64_t pfs_bytes_total() const { return pfs_total_.load(std::memory_order_relaxed); }
  uint64_t corruptions() const { return corruptions_.load(std::memory_order_relaxed); }
  // PFS reads whose bytes differed from the checksum first recorded for the sample: its file
  // was rewritten during the job (each is logged).
  uint64_t changed_on_pfs() const { return changed_on_pfs_.load(std::memory_order_relaxed); }
  // Samples (reads) and bytes of class j stored by fetch-and-cache (not by its prefetcher).
  const SourceCounters& cached_on_read(size_t j) const { return *cached_on_read_[j]; }
  size_t class_count() const { return tiers_.size(); }
  const std::string& class_name(size_t j) const { return tiers_[j].name; }

 private:
  // A planned slot this read has claimed for fetch-and-cache (docs/algorithm.md §7): its class,
  // its tier and its slot.
  struct Claim {
    size_t klass = 0;
    Tier* tier = nullptr;
    uint32_t slot = kNoSlot;
  };
  Status ReadTier(const TierRef& t, policy::SampleId sample, std::span<std::byte> dst);
  // The class whose tier holds `sample` ready (waiting a moment for a fill already under way), or
  // -1.
  int LocalClass(int klass, policy::SampleId sample) const;
  // The peer's bytes for a staging read (counted), or an error (logged unless expected).
  Result<uint64_t> FetchPeer(policy::SampleId sample, std::span<std::byte> dst);
  // The kept copy's bytes (counted), or an error: NotFound without a kept copy.
  Result<uint64_t> FetchKept(policy::SampleId sample, std::span<std::byte> dst);
  // The shared copy's bytes (counted), or an error: NotFound when it does not serve the sample.
  Result<uint64_t> FetchShared(policy::SampleId sample, std::span<std::byte> dst);
  // The sibling's bytes (counted), or an error: NotFound without a sibling to ask.
  Result<uint64_t> FetchSibling(policy::SampleId sample, std::span<std::byte> dst);
  // Fetch-and-cache: claims `sample`'s slot in class j's tier (TryBeginFill) if it is empty;
  // nullopt when there is nothing to claim.
  std::optional<Claim> ClaimForCache(size_t j, policy::SampleId sample);
  // Stores `bytes` (the sample just read, xxh3 `hash`) in the claimed slot and marks it ready.
  // Failures are logged and the slot given back; the read itself has succeeded.
  void CacheAfterRead(const Claim& claim, policy::SampleId sample, std::span<const std::byte> bytes,
                      uint64_t hash, SourceCounters& counter);

  Catalog& catalog_;
  const policy::NodePlan& plan_;
  std::vector<TierRef> tiers_;
  const policy::SystemModel& model_;
  uint32_t pfs_readers_;
  int region_class_ = -1;
  const ReaderSources sources_;
  SourceCounters kept_;
  SourceCounters shared_;
  SourceCounters sibling_;
  std::atomic<uint64_t> sibling_failed_{0};
  std::vector<std::unique_ptr<SourceCounters>> pushed_kept_;
  SourceCounters peer_fill_;
  std::atomic<uint64_t> peer_fill_gave_up_{0};
  std::vector<std::unique_ptr<SourceCounters>> per_class_;
  std::vector<std::unique_ptr<SourceCounters>> cached_on_read_;
  SourceCounters peer_;
  SourceCounters pfs_;
  std::atomic<uint64_t> pfs_total_{0};
  std::atomic<uint64_t> corruptions_{0};
  std::atomic<uint64_t> changed_on_pfs_{0};
  std::atomic<uint64_t> in_place_{0};
  bool verify_ram_hits_ = true;  // set before any read
  std::atomic<uint32_t> pfs_active_{0};
};

}  // namespace nopfs::service
