// KeepCommitter (kept.h): the keep record committed beside the SSD tier as it fills.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <utility>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "service/reader/kept.h"

namespace nopfs::service {

KeepCommitter::KeepCommitter(KeepCommitOptions options, SsdTier& tier, const Catalog& catalog,
                             Env* env)
    : o_(std::move(options)),
      tier_(tier),
      catalog_(catalog),
      env_(env),
      mark_(tier.layout().slot_count(), kUnseen),
      stat_of_(tier.layout().slot_count()) {}

KeepCommitter::~KeepCommitter() {
  Stop();
}

Result<bool> KeepCommitter::Commit(bool force) {
  const auto t0 = std::chrono::steady_clock::now();
  const TierLayout& layout = tier_.layout();
  std::vector<uint32_t> fresh;
  for (uint32_t s = 0; s < layout.slot_count(); ++s) {
    if (mark_[s] == kUnseen && tier_.slots().state(s) == SlotState::kReady) fresh.push_back(s);
  }
  // One stat per file not seen before, in parallel (the PFS's metadata servers answer them).
  std::vector<std::string> paths;
  for (uint32_t s : fresh) {
    std::string p = catalog_.path(layout.SampleAt(s));
    if (!stats_.contains(p)) paths.push_back(std::move(p));
  }
  std::sort(paths.begin(), paths.end());
  paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
  std::vector<std::optional<FileStat>> got(paths.size());
  {
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    const unsigned n = std::min<unsigned>(std::max(1u, o_.stat_threads), unsigned(paths.size()));
    for (unsigned t = 0; t < n; ++t) {
      threads.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < paths.size();) {
          Result<FileStat> st = env_->Stat(paths[i]);
          if (st.ok()) got[i] = *st;
        }
      });
    }
    for (std::thread& t : threads)
      t.join();
  }
  for (size_t i = 0; i < paths.size(); ++i)
    stats_.emplace(std::move(paths[i]), got[i]);
  for (uint32_t s : fresh) {
    const policy::SampleId id = layout.SampleAt(s);
    const std::optional<FileStat>& st = stats_.at(catalog_.path(id));
    const uint64_t padded = layout.PaddedSizeOf(s);
    // The same rule as a keep at exit: the file unchanged since before the job's start (so the
    // tier's bytes are the file's at the stat), long enough, and within the budget, first come
    // first recorded.
    if (!st || !st->is_regular || st->ctime_ns >= o_.unchanged_before_ns ||
        catalog_.offset(id) + catalog_.length(id) > st->size ||
        (o_.max_bytes != 0 && budget_used_ + padded > o_.max_bytes)) {
      mark_[s] = kRefused;
      continue;
    }
    // The record stays within what root reads (kept::kMaxKeepRecordBytes).
    const uint64_t entry = kept::KeptIndexEntryBytes(catalog_.relative_path(id).size());
    if (kept::kKeepRecordOverheadBytes + index_used_ + entry > o_.max_record_bytes) {
      mark_[s] = kRefused;
      if (!record_full_) {
        record_full_ = true;
        spdlog::warn(
            "kept area: the keep record is full ({} samples, at most {} bytes); the samples "
            "that become ready later are not recorded",
            recorded_, o_.max_record_bytes);
      }
      continue;
    }
    index_used_ += entry;
    budget_used_ += padded;
    mark_[s] = kRecorded;
    stat_of_[s] = *st;
    ++recorded_;
  }
  const uint64_t fresh_recorded = recorded_ - written_recorded_;
  const bool write =
      fresh_recorded > 0 &&
      (force || (fresh.empty() && t0 - last_write_ >= o_.quiet) ||
       fresh_recorded >= std::max<uint64_t>(o_.min_new_samples, written_recorded_ / 4));
  if (!write) return false;
  NOPFS_RETURN_IF_ERROR(Write());
  commit_ns_.fetch_add(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now() - t0)
                                    .count()),
                       std::memory_order_relaxed);
  return true;
}

Status KeepCommitter::Write() {
  const TierLayout& layout = tier_.layout();
  std::vector<kept::KeptSample> records;
  records.reserve(recorded_);
  for (uint32_t s = 0; s < layout.slot_count(); ++s) {
    // A slot failed since (a read found it corrupt) is left out.
    if (mark_[s] != kRecorded || tier_.slots().state(s) != SlotState::kReady) continue;
    const policy::SampleId id = layout.SampleAt(s);
    const FileStat& st = stat_of_[s];
    const SlotExtent e = layout.Extent(s);
    kept::KeptSample k;
    k.relative_path = std::string(catalog_.relative_path(id));
    k.offset = catalog_.offset(id);
    k.length = catalog_.length(id);
    k.xxh3 = tier_.slots().expected(s);
    k.file_size = st.size;
    k.mtime_ns = st.mtime_ns;
    k.ctime_ns = st.ctime_ns;
    k.inode = st.inode;
    k.data_file = e.file;
    k.data_offset = e.offset;
    records.push_back(std::move(k));
  }
  const std::string index = kept::EncodeKeptIndex(records);
  kept::KeptManifest m;
  m.key = o_.place.key;
  m.dataset = o_.place.dataset;
  m.created = static_cast<int64_t>(::time(nullptr));
  m.last_used = m.created;
  m.samples = records.size();
  m.index_bytes = index.size();
  m.index_xxh3 = XXH3_64bits(index.data(), index.size());
  m.data_files = layout.file_count();
  const std::string record = kept::EncodeKeepRecord(m, index);
  // The samples' bytes are not synced: whoever adopts them checks each against its xxh3.
  NOPFS_RETURN_IF_ERROR(kept::WriteFileDurably(tier_.dir(), kept::kKeepRecordName, record));
  written_recorded_ = recorded_;
  last_write_ = std::chrono::steady_clock::now();
  commits_.fetch_add(1, std::memory_order_relaxed);
  committed_.store(records.size(), std::memory_order_relaxed);
  written_bytes_.fetch_add(record.size(), std::memory_order_relaxed);
  return Status::Ok();
}

void KeepCommitter::Start() {
  thread_ = std::thread([this] { Run(); });
}

void KeepCommitter::Wake() {
  {
    MutexLock lock(&mu_);
    wake_ = true;
  }
  cv_.SignalAll();
}

void KeepCommitter::Run() {
  bool logged = false;
  for (;;) {
    bool woken = false;
    {
      MutexLock lock(&mu_);
      const auto deadline = std::chrono::steady_clock::now() + o_.interval;
      while (!stop_ && !wake_ && cv_.WaitUntil(&mu_, deadline)) {
      }
      if (stop_) return;
      woken = std::exchange(wake_, false);
    }
    Result<bool> r = Commit(woken);
    if (!r.ok() && !logged) {
      logged = true;
      spdlog::warn("kept area: committing the keep record of {}: {} (retrying)", tier_.dir(),
                   r.status().message());
    }
  }
}

void KeepCommitter::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void KeepCommitter::Discard() {
  for (const std::string& name :
       {std::string(kept::kKeepRecordName), ".tmp." + std::string(kept::kKeepRecordName)}) {
    const std::string path = tier_.dir() + "/" + name;
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      spdlog::warn("kept area: removing {}: {}", path, std::strerror(errno));
    }
  }
}

}  // namespace nopfs::service
