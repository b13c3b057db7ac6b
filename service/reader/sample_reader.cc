#include "service/reader/sample_reader.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

namespace nopfs::service {
namespace {

// How long a staging read waits for a fill of its sample already under way.
constexpr std::chrono::seconds kFillWait{5};

uint64_t NowNanos() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void Count(SourceCounters& c, uint64_t bytes, uint64_t nanos) {
  c.reads.fetch_add(1, std::memory_order_relaxed);
  c.bytes.fetch_add(bytes, std::memory_order_relaxed);
  c.nanos.fetch_add(nanos, std::memory_order_relaxed);
}

}  // namespace

SampleReader::SampleReader(Catalog& catalog, const policy::NodePlan& plan,
                           std::vector<TierRef> tiers, const policy::SystemModel& model,
                           uint32_t pfs_readers, ReaderSources sources)
    : catalog_(catalog),
      plan_(plan),
      tiers_(std::move(tiers)),
      model_(model),
      pfs_readers_(std::max<uint32_t>(1, pfs_readers)),
      sources_(std::move(sources)) {
  for (size_t j = 0; j < tiers_.size(); ++j) {
    if (region_class_ < 0 && tiers_[j].ram != nullptr) region_class_ = static_cast<int>(j);
    per_class_.push_back(std::make_unique<SourceCounters>());
    cached_on_read_.push_back(std::make_unique<SourceCounters>());
    pushed_kept_.push_back(std::make_unique<SourceCounters>());
  }
}

std::optional<SampleReader::Claim> SampleReader::ClaimForCache(size_t j, policy::SampleId sample) {
  Tier* tier = tiers_[j].tier();
  if (tier == nullptr) return std::nullopt;
  const uint32_t slot = tier->layout().SlotOf(sample);
  if (slot >= tier->layout().slot_count() || !tier->slots().TryBeginFill(slot)) {
    return std::nullopt;
  }
  return Claim{j, tier, slot};
}

void SampleReader::CacheAfterRead(const Claim& claim, policy::SampleId sample,
                                  std::span<const std::byte> bytes, uint64_t hash,
                                  SourceCounters& counter) {
  Tier* tier = claim.tier;
  // The bytes are at hand: the tier's fill copies them instead of reading the PFS again.
  const FetchFn from_memory = [&](policy::SampleId, std::span<std::byte> dst) -> Result<uint64_t> {
    if (dst.size() != bytes.size()) {
      return Status::Internal("fetch-and-cache: sample " + std::to_string(sample) + " has " +
                              std::to_string(bytes.size()) + " bytes, its slot " +
                              std::to_string(dst.size()));
    }
    std::memcpy(dst.data(), bytes.data(), bytes.size());
    return hash;
  };
  // An SSD fill writes through an aligned bounce buffer; each staging thread keeps its own.
  thread_local std::unique_ptr<std::byte, decltype(&std::free)> bounce{nullptr, &std::free};
  thread_local uint64_t bounce_size = 0;
  const uint64_t need = tier->bounce_bytes();
  if (need > bounce_size) {
    const uint64_t rounded = (need + kSsdAlignment - 1) / kSsdAlignment * kSsdAlignment;
    bounce.reset(static_cast<std::byte*>(std::aligned_alloc(kSsdAlignment, rounded)));
    bounce_size = bounce ? rounded : 0;
  }
  if (need > bounce_size) {
    tier->slots().Abandon(claim.slot);  // no memory for the bounce buffer: the prefetcher fills it
    return;
  }
  Result<uint64_t> h = tier->Fill(claim.slot, from_memory, {bounce.get(), need});
  if (h.ok()) {
    tier->slots().MarkReady(claim.slot, *h);
    Count(counter, bytes.size(), 0);
  } else {
    tier->slots().Abandon(claim.slot);  // the prefetcher tries again from the PFS
    spdlog::warn("sample {} ({}): could not keep it in the {} tier after reading it: {}", sample,
                 catalog_.path(sample), tiers_[claim.klass].name, h.status().message());
  }
}

bool SampleReader::KeepPushed(policy::SampleId sample, std::span<const std::byte> bytes,
                              uint64_t xxh3) {
  if (sample >= plan_.location.size()) return false;
  const int8_t klass = plan_.location[sample];
  if (klass == policy::kNotCached || static_cast<size_t>(klass) >= tiers_.size()) return false;
  if (bytes.size() != catalog_.length(sample) || XXH3_64bits(bytes.data(), bytes.size()) != xxh3) {
    spdlog::warn("sample {}: a peer pushed {} bytes that do not match it; ignored", sample,
                 bytes.size());
    return false;
  }
  const std::optional<uint64_t> known = catalog_.checksum(sample);
  if (known && *known != xxh3) {
    spdlog::warn(
        "sample {} ({}): a peer pushed bytes whose checksum differs from the one "
        "recorded here; ignored",
        sample, catalog_.path(sample));
    return false;
  }
  const std::optional<Claim> claim = ClaimForCache(static_cast<size_t>(klass), sample);
  if (!claim) return false;  // filled, or being filled: nothing to spare
  CacheAfterRead(*claim, sample, bytes, xxh3, *pushed_kept_[claim->klass]);
  return claim->tier->slots().state(claim->slot) == SlotState::kReady;
}

Result<uint64_t> SampleReader::FetchKept(policy::SampleId sample, std::span<std::byte> dst) {
  if (!sources_.kept) return Status::NotFound("no kept copy");
  const uint64_t t0 = NowNanos();
  Result<uint64_t> h = sources_.kept(sample, dst);
  if (h.ok()) Count(kept_, dst.size(), NowNanos() - t0);
  return h;
}

Result<uint64_t> SampleReader::FetchShared(policy::SampleId sample, std::span<std::byte> dst) {
  if (!sources_.shared) return Status::NotFound("no shared copy");
  const uint64_t t0 = NowNanos();
  Result<uint64_t> h = sources_.shared(sample, dst);
  if (!h.ok()) return h;
  const std::optional<uint64_t> known = catalog_.checksum(sample);
  if (known && *known != *h) {
    spdlog::warn(
        "sample {} ({}): the shared copy's bytes differ from the checksum recorded here; "
        "reading the PFS",
        sample, catalog_.path(sample));
    return Status::Corruption("sample " + std::to_string(sample) +
                              ": the shared copy differs from the checksum recorded here");
  }
  if (!known) (void)catalog_.RecordChecksum(sample, *h);
  Count(shared_, dst.size(), NowNanos() - t0);
  return h;
}

Result<uint64_t> SampleReader::FetchSibling(policy::SampleId sample, std::span<std::byte> dst) {
  if (!sources_.sibling) return Status::NotFound("no sibling");
  const uint64_t t0 = NowNanos();
  std::optional<Result<uint64_t>> asked = sources_.sibling(sample, dst);
  if (!asked) return Status::NotFound("no sibling now");
  Result<uint64_t>& h = *asked;
  const std::optional<uint64_t> known = h.ok() ? catalog_.checksum(sample) : std::nullopt;
  if (h.ok() && (!known || *known == *h)) {
    Count(sibling_, dst.size(), NowNanos() - t0);
    return h;
  }
  const Status why = h.ok() ? Status::Corruption("sample " + std::to_string(sample) + " (" +
                                                 catalog_.path(sample) +
                                                 "): the sibling's bytes differ from the "
                                                 "checksum recorded here")
                            : h.status();
  if (sibling_failed_.fetch_add(1, std::memory_order_relaxed) == 0) {
    spdlog::warn(
        "sibling: a read failed, reading the PFS for it instead (later failures are "
        "counted, not logged): {}",
        why.message());
  }
  return why;
}

Result<uint64_t> SampleReader::FetchForFill(policy::SampleId sample, std::span<std::byte> dst,
                                            bool may_defer) {
  if (Result<uint64_t> h = FetchKept(sample, dst); h.ok()) return h;
  if (Result<uint64_t> h = FetchShared(sample, dst); h.ok()) return h;
  if (sources_.peers != nullptr) {
    const uint64_t t0 = NowNanos();
    Result<uint64_t> h = sources_.peers->FetchCopy(sample, dst);
    const std::optional<uint64_t> known = h.ok() ? catalog_.checksum(sample) : std::nullopt;
    if (h.ok() && (!known || *known == *h)) {
      Count(peer_fill_, dst.size(), NowNanos() - t0);
      return h;
    }
    if (!h.ok() && h.status().code() == StatusCode::kUnavailable) {
      if (may_defer) return h.status();  // the filler has not got it yet: later
      peer_fill_gave_up_.fetch_add(1, std::memory_order_relaxed);
    } else if (h.ok() || h.status().code() != StatusCode::kNotFound) {
      spdlog::warn("sample {} ({}): copying it from its peer failed, reading the PFS instead: {}",
                   sample, catalog_.path(sample),
                   h.ok() ? std::string("checksum differs") : h.status().message());
    }
  }
  if (Result<uint64_t> sb = FetchSibling(sample, dst); sb.ok()) return sb;
  Result<uint64_t> h = FetchFromPfs(sample, dst, /*staging=*/false);
  // When another node fills this sample for the job and did not have it (a copy given up on), it
  // will read the PFS too unless it is offered these bytes (for a sample this node fills itself,
  // the peer service finds nobody to offer them to).
  if (h.ok() && sources_.peers != nullptr) sources_.peers->Push(sample, dst, *h);
  return h;
}

Status SampleReader::ReadTier(const TierRef& t, policy::SampleId sample, std::span<std::byte> dst) {
  if (t.ssd != nullptr) return t.ssd->Read(sample, dst);
  Result<std::span<const std::byte>> view = t.ram->View(sample);
  if (!view.ok()) return view.status();
  if (view->size() != dst.size()) {
    return Status::Internal("sample " + std::to_string(sample) + ": RAM tier holds " +
                            std::to_string(view->size()) + " bytes, the catalog says " +
                            std::to_string(dst.size()));
  }
  if (!verify_ram_hits_) {
    if (!dst.empty()) std::memcpy(dst.data(), view->data(), dst.size());
    return Status::Ok();
  }
  // Copy and check the copy, not the tier (what the client gets is what must be right), a chunk
  // at a time so that each chunk is hashed while it is still in cache: one pass over memory.
  constexpr size_t kChunk = 32 << 10;
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t off = 0; off < dst.size(); off += kChunk) {
    const size_t n = std::min(kChunk, dst.size() - off);
    std::memcpy(dst.data() + off, view->data() + off, n);
    XXH3_64bits_update(&state, dst.data() + off, n);
  }
  const uint32_t slot = t.ram->layout().SlotOf(sample);
  if (XXH3_64bits_digest(&state) != t.ram->slots().expected(slot)) {
    t.ram->slots().MarkFailed(slot);
    return Status::Corruption("sample " + std::to_string(sample) +
                              ": RAM tier copy differs from the checksum recorded at fill time");
  }
  return Status::Ok();
}

std::optional<SampleReader::InPlace> SampleReader::ReadInPlace(policy::SampleId sample) {
  if (region_class_ < 0 || sample >= plan_.location.size() ||
      plan_.location[sample] != region_class_) {
    return std::nullopt;
  }
  const TierRef& t = tiers_[static_cast<size_t>(region_class_)];
  if (!t.ram->IsReady(sample)) return std::nullopt;
  const uint64_t t0 = NowNanos();
  if (Status v = verify_ram_hits_ ? t.ram->Verify(sample) : Status::Ok(); !v.ok()) {
    if (v.code() == StatusCode::kCorruption) corruptions_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("sample {} ({}): {} tier copy unusable, reading it again: {}", sample,
                 catalog_.path(sample), t.name, v.message());
    return std::nullopt;
  }
  const SlotExtent e = t.ram->layout().Extent(t.ram->layout().SlotOf(sample));
  Count(*per_class_[static_cast<size_t>(region_class_)], e.size, NowNanos() - t0);
  in_place_.fetch_add(1, std::memory_order_relaxed);
  return InPlace{e.offset, e.size};
}

Result<uint64_t> SampleReader::FetchFromPfs(policy::SampleId sample, std::span<std::byte> dst,
                                            bool staging) {
  pfs_active_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t t0 = NowNanos();
  Status s = catalog_.Read(sample, dst);
  const uint64_t t1 = NowNanos();
  pfs_active_.fetch_sub(1, std::memory_order_relaxed);
  if (!s.ok()) return s;
  pfs_total_.fetch_add(dst.size(), std::memory_order_relaxed);
  if (staging) Count(pfs_, dst.size(), t1 - t0);
  const uint64_t h = XXH3_64bits(dst.data(), dst.size());
  const std::optional<uint64_t> known = catalog_.checksum(sample);
  if (!known) {
    if (Status r = catalog_.RecordChecksum(sample, h); !r.ok()) {
      spdlog::warn("sample {} ({}): could not record its checksum: {}", sample,
                   catalog_.path(sample), r.message());
    }
  } else if (*known != h) {
    // Counted (nopfs status) and logged: a tier may still hold, and serve, the first bytes.
    changed_on_pfs_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn(
        "sample {} ({}): the file changed on the PFS during the job (checksum {:016x}, "
        "first seen {:016x}); serving the new bytes from here, a cache tier that holds the "
        "sample keeps the first ones",
        sample, catalog_.path(sample), h, *known);
    (void)catalog_.RecordChecksum(sample, h);
  }
  return h;
}

int SampleReader::LocalClass(int klass, policy::SampleId sample) const {
  Tier* tier = tiers_[static_cast<size_t>(klass)].tier();
  if (tier == nullptr) return -1;
  if (tier->IsReady(sample)) return klass;
  // A prefetcher is fetching this very sample (staging often catches up with the prefetchers,
  // which work in the same first-access order): its copy arrives sooner than a second PFS read
  // would, and the PFS is spared the duplicate.
  const uint32_t slot = tier->layout().SlotOf(sample);
  if (slot != kNoSlot && tier->slots().state(slot) == SlotState::kFilling &&
      tier->slots().WaitReady(slot, kFillWait).ok()) {
    return klass;
  }
  return -1;
}

Result<uint64_t> SampleReader::FetchPeer(policy::SampleId sample, std::span<std::byte> dst) {
  const uint64_t t0 = NowNanos();
  Result<uint64_t> h = sources_.peers->Fetch(sample, dst);
  const std::optional<uint64_t> known = catalog_.checksum(sample);
  if (h.ok() && (!known || *known == *h)) {
    Count(peer_, dst.size(), NowNanos() - t0);
    return h;
  }
  // "Not available" is a readiness guess that missed (docs/algorithm.md §7): expected, quiet.
  if (!h.ok() && h.status().code() == StatusCode::kNotFound) {
    spdlog::debug("sample {}: not ready at its peer yet, reading the PFS", sample);
    return h.status();
  }
  spdlog::warn("sample {} ({}): peer read failed, reading the PFS instead: {}", sample,
               catalog_.path(sample),
               h.ok() ? std::string("checksum differs") : h.status().message());
  return h.ok() ? Status::Corruption("sample " + std::to_string(sample) +
                                     ": the peer's bytes differ from the checksum recorded here")
                : h.status();
}

Result<SourceId> SampleReader::Read(policy::SampleId sample, std::span<std::byte> dst,
                                    bool ask_sibling) {
  const int8_t klass = sample < plan_.location.size() ? plan_.location[sample] : policy::kNotCached;
  const bool planned = klass != policy::kNotCached && static_cast<size_t>(klass) < tiers_.size();
  // This node's tier first, when the model prefers it to the peer that has the sample.
  const int local = planned ? LocalClass(klass, sample) : -1;
  const int peer = local < 0 && sources_.peers != nullptr ? sources_.peers->Lookup(sample) : -1;
  policy::SourceKind kind = policy::SourceKind::kPfs;
  if (local >= 0 || peer >= 0) {
    const uint32_t gamma = pfs_readers_ + pfs_active_.load(std::memory_order_relaxed);
    kind = policy::ChooseSource(model_, dst.size(), local, peer, gamma).kind;
  }
  if (kind == policy::SourceKind::kLocal) {
    const TierRef& t = tiers_[static_cast<size_t>(local)];
    const uint64_t t0 = NowNanos();
    Status s = ReadTier(t, sample, dst);
    if (s.ok()) {
      Count(*per_class_[static_cast<size_t>(local)], dst.size(), NowNanos() - t0);
      return SourceId{local};
    }
    if (s.code() == StatusCode::kCorruption) corruptions_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("sample {} ({}): {} tier read failed, reading the PFS instead: {}", sample,
                 catalog_.path(sample), t.name, s.message());
  }
  // Every other source: fetch-and-cache claims the planned slot before reading, so that a
  // prefetcher reaching the same sample meanwhile skips it instead of reading the PFS a second
  // time, and what is read is kept there. The peer (when the model chose it), the kept copy, the
  // shared copy, a sibling, then the PFS.
  const std::optional<Claim> claim =
      planned ? ClaimForCache(static_cast<size_t>(klass), sample) : std::nullopt;
  SourceId from{SourceId::kPeer};
  Result<uint64_t> h = Status::NotFound("no source");
  if (kind == policy::SourceKind::kPeer) h = FetchPeer(sample, dst);
  if (!h.ok()) {
    from = SourceId{SourceId::kKept};
    h = FetchKept(sample, dst);
  }
  if (!h.ok()) {
    from = SourceId{SourceId::kShared};
    h = FetchShared(sample, dst);
  }
  if (!h.ok() && ask_sibling) {
    from = SourceId{SourceId::kSibling};
    h = FetchSibling(sample, dst);
  }
  if (!h.ok()) {
    from = SourceId{SourceId::kPfs};
    h = FetchFromPfs(sample, dst, /*staging=*/true);
  }
  if (!h.ok()) {
    if (claim) claim->tier->slots().Abandon(claim->slot);
    return h.status();
  }
  if (claim) CacheAfterRead(*claim, sample, dst, *h, *cached_on_read_[claim->klass]);
  // The node that holds it (or fills it for the job) will read it from the PFS too unless it is
  // offered these bytes.
  if (from.index == SourceId::kPfs && sources_.peers != nullptr) {
    sources_.peers->Push(sample, dst, *h);
  }
  return from;
}

}  // namespace nopfs::service
