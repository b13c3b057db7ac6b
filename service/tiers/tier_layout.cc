#include "service/tiers/tier_layout.h"

#include <algorithm>
#include <bit>
#include <string>

#include <spdlog/spdlog.h>

#include "common/mutex.h"

namespace nopfs::service {

namespace {
constexpr uint64_t kBlockBits = 512;  // bits per rank block
}  // namespace

std::shared_ptr<spdlog::logger> TierLog() {
  static const std::shared_ptr<spdlog::logger> log = [] {
    if (auto l = spdlog::get("tier")) return l;
    auto l = spdlog::default_logger()->clone("tier");
    try {
      spdlog::register_logger(l);
    } catch (const spdlog::spdlog_ex&) {
      return spdlog::get("tier");  // registered by someone else meanwhile
    }
    return l;
  }();
  return log;
}

Result<TierLayout> TierLayout::Make(const policy::TierPlan& plan, std::span<const uint64_t> sizes,
                                    uint64_t alignment, uint64_t max_file_bytes) {
  if (alignment == 0 || !std::has_single_bit(alignment)) {
    return Status::InvalidArgument("tier layout: alignment " + std::to_string(alignment) +
                                   " is not a power of two");
  }
  const auto& order = plan.prefetch_order;
  if (order.size() >= kNoSlot) {
    return Status::InvalidArgument("tier layout: " + std::to_string(order.size()) +
                                   " samples exceed the limit of 2^32-2 per tier");
  }
  TierLayout l;
  l.alignment_ = alignment;
  const uint64_t f = sizes.size();
  l.bits_.assign((f + 63) / 64, 0);
  l.samples_.reserve(order.size());
  l.offsets_.reserve(order.size());
  l.sizes_.reserve(order.size());

  uint64_t file_used = 0;  // bytes used in the current (last) file
  for (policy::SampleId s : order) {
    if (s >= f) {
      return Status::InvalidArgument("tier layout: sample " + std::to_string(s) +
                                     " is outside the dataset of " + std::to_string(f) +
                                     " samples");
    }
    uint64_t& word = l.bits_[s / 64];
    const uint64_t bit = uint64_t{1} << (s % 64);
    if (word & bit) {
      return Status::InvalidArgument("tier layout: sample " + std::to_string(s) +
                                     " appears twice in the prefetch list");
    }
    word |= bit;
    const uint64_t size = sizes[s];
    const uint64_t padded = l.RoundUp(size);
    if (l.file_start_.empty() ||
        (max_file_bytes != 0 && file_used > 0 && file_used + padded > max_file_bytes)) {
      if (!l.file_start_.empty()) l.file_bytes_.back() = file_used;
      l.file_start_.push_back(l.total_bytes_);
      l.file_bytes_.push_back(0);
      file_used = 0;
    }
    l.samples_.push_back(s);
    l.offsets_.push_back(l.total_bytes_);
    l.sizes_.push_back(size);
    file_used += padded;
    l.total_bytes_ += padded;
    l.payload_bytes_ += size;
    l.max_padded_ = std::max(l.max_padded_, padded);
  }
  if (!l.file_bytes_.empty()) l.file_bytes_.back() = file_used;

  // Rank index over the bitmap, then slots in sample-id order.
  const uint64_t words_per_block = kBlockBits / 64;
  l.rank_.assign((l.bits_.size() + words_per_block - 1) / words_per_block + 1, 0);
  uint32_t count = 0;
  for (uint64_t w = 0; w < l.bits_.size(); ++w) {
    if (w % words_per_block == 0) l.rank_[w / words_per_block] = count;
    count += static_cast<uint32_t>(std::popcount(l.bits_[w]));
  }
  l.by_rank_.assign(order.size(), 0);
  // Rank of sample s = number of held samples with a smaller id.
  for (uint32_t slot = 0; slot < order.size(); ++slot) {
    const policy::SampleId s = order[slot];
    const uint64_t w = s / 64;
    uint32_t r = l.rank_[w / words_per_block];
    for (uint64_t i = (w / words_per_block) * words_per_block; i < w; ++i) {
      r += static_cast<uint32_t>(std::popcount(l.bits_[i]));
    }
    r += static_cast<uint32_t>(std::popcount(l.bits_[w] & ((uint64_t{1} << (s % 64)) - 1)));
    l.by_rank_[r] = slot;
  }
  return l;
}

uint32_t TierLayout::SlotOf(policy::SampleId sample) const {
  const uint64_t w = sample / 64;
  if (w >= bits_.size()) return kNoSlot;
  const uint64_t bit = uint64_t{1} << (sample % 64);
  if (!(bits_[w] & bit)) return kNoSlot;
  const uint64_t words_per_block = kBlockBits / 64;
  uint32_t r = rank_[w / words_per_block];
  for (uint64_t i = (w / words_per_block) * words_per_block; i < w; ++i) {
    r += static_cast<uint32_t>(std::popcount(bits_[i]));
  }
  r += static_cast<uint32_t>(std::popcount(bits_[w] & (bit - 1)));
  return by_rank_[r];
}

SlotExtent TierLayout::Extent(uint32_t slot) const {
  const uint64_t off = offsets_[slot];
  // Few files: a binary search over their starts.
  const auto it = std::upper_bound(file_start_.begin(), file_start_.end(), off);
  const auto file = static_cast<uint32_t>((it - file_start_.begin()) - 1);
  return SlotExtent{file, off - file_start_[file], sizes_[slot]};
}

const char* SlotStateName(SlotState s) {
  switch (s) {
    case SlotState::kEmpty:
      return "empty";
    case SlotState::kFilling:
      return "filling";
    case SlotState::kReady:
      return "ready";
    case SlotState::kFailed:
      return "failed";
  }
  return "unknown";
}

SlotTable::SlotTable(uint32_t slots)
    : n_(slots),
      state_(std::make_unique<std::atomic<uint8_t>[]>(slots)),
      hash_(std::make_unique<std::atomic<uint64_t>[]>(slots)) {}

bool SlotTable::TryBeginFill(uint32_t slot) {
  uint8_t cur = state_[slot].load(std::memory_order_acquire);
  while (cur == static_cast<uint8_t>(SlotState::kEmpty) ||
         cur == static_cast<uint8_t>(SlotState::kFailed)) {
    if (state_[slot].compare_exchange_weak(cur, static_cast<uint8_t>(SlotState::kFilling),
                                           std::memory_order_acq_rel)) {
      return true;
    }
  }
  return false;
}

void SlotTable::Set(uint32_t slot, SlotState s) {
  state_[slot].store(static_cast<uint8_t>(s), std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) > 0) {
    // Taking the mutex orders this notify after any waiter's predicate check.
    { MutexLock lock(&mu_); }
    cv_.SignalAll();
  }
}

void SlotTable::MarkReady(uint32_t slot, uint64_t xxh3) {
  hash_[slot].store(xxh3, std::memory_order_relaxed);
  Set(slot, SlotState::kReady);
}

void SlotTable::MarkFailed(uint32_t slot) {
  Set(slot, SlotState::kFailed);
}

void SlotTable::Abandon(uint32_t slot) {
  Set(slot, SlotState::kEmpty);
}

Status SlotTable::WaitReady(uint32_t slot, std::chrono::nanoseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  SlotState s;
  {
    MutexLock lock(&mu_);
    for (;;) {
      s = state(slot);
      if (s == SlotState::kReady || s == SlotState::kFailed) break;
      if (!cv_.WaitUntil(&mu_, deadline)) break;
    }
    s = state(slot);
  }
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
  if (s == SlotState::kReady) return Status::Ok();
  if (s == SlotState::kFailed) {
    return Status::Unavailable("slot " + std::to_string(slot) +
                               " failed to fill; read the sample from the PFS");
  }
  return Status::TimedOut("slot " + std::to_string(slot) + " still " + SlotStateName(s) +
                          " after the wait");
}

}  // namespace nopfs::service
