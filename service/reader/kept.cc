#include "service/reader/kept.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <thread>
#include <unordered_map>

#include <spdlog/spdlog.h>
#include <xxhash.h>

namespace nopfs::service {
namespace {

constexpr uint32_t kNone = UINT32_MAX;
constexpr uint64_t kLoggedRejects = 10;  // the first rejections are logged at info, then debug

int64_t NowSeconds() {
  return static_cast<int64_t>(::time(nullptr));
}

Status PreadAll(LocalIo* io, int fd, std::span<std::byte> dst, uint64_t off,
                const std::string& what) {
  size_t got = 0;
  while (got < dst.size()) {
    const ssize_t n = io->Pread(fd, dst.data() + got, dst.size() - got, off_t(off + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, what);
    if (n == 0) return Status::Corruption(what + ": ends before the sample's bytes");
    got += size_t(n);
  }
  return Status::Ok();
}

uint64_t DiskBytesOf(LocalIo* io, const std::string& dir, const std::vector<std::string>& names) {
  uint64_t bytes = 0;
  for (const std::string& n : names) {
    struct stat st {};
    if (io->Lstat(dir + "/" + n, &st) == 0 && S_ISREG(st.st_mode))
      bytes += uint64_t(st.st_blocks) * 512;
  }
  return bytes;
}

// Creates <kept> (0700) if missing and checks that it is our own directory.
Status EnsureKeptDir(LocalIo* io, const std::string& kept) {
  if (io->Mkdir(kept, 0700) != 0 && errno != EEXIST)
    return Status::FromErrno(errno, "kept area: creating " + kept);
  struct stat st {};
  if (io->Lstat(kept, &st) != 0) return Status::FromErrno(errno, "kept area: " + kept);
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
    return Status::PermissionDenied("kept area: " + kept +
                                    " is not a directory of this user; remove it");
  }
  return Status::Ok();
}

}  // namespace

Result<uint64_t> CleanKeptArea(const std::string& kept_dir) {
  Result<std::vector<kept::KeptDataset>> list = kept::ListKept(kept_dir);
  if (!list.ok()) return list.status();
  uint64_t removed = 0;
  for (const kept::KeptDataset& k : *list) {
    if (k.complete) continue;
    if (k.key.rfind(".tmp.", 0) == 0 && kept::KeptEntryInUse(kept_dir, k.key)) continue;
    if (Status s = kept::RemoveKept(kept_dir, k.key); !s.ok()) {
      spdlog::warn("kept area: removing incomplete {}: {}", k.dir, s.message());
      continue;
    }
    spdlog::info("kept area: removed incomplete {}", k.dir);
    ++removed;
  }
  return removed;
}

Result<std::unique_ptr<KeptCopy>> KeptCopy::Adopt(const KeptPlace& place, Catalog& catalog,
                                                  Env* env, LocalIo* io, AdoptMode mode) {
  if (io == nullptr) io = LocalIo::Default();
  const std::string src = place.kept_dir + "/" + place.key;
  struct stat st {};
  if (io->Lstat(src, &st) != 0) return Status::FromErrno(errno, src);
  std::unique_ptr<KeptCopy> k(new KeptCopy(catalog, env, io));
  k->kept_dir_ = place.kept_dir;
  k->key_ = place.key;
  k->borrowed_ = mode == AdoptMode::kBorrow;
  // A borrowed copy is read where it is, under its own name.
  k->name_ =
      k->borrowed_ ? place.key : ".tmp.adopt." + place.tag + "." + std::to_string(::getpid());
  k->dir_ = place.kept_dir + "/" + k->name_;
  if (!S_ISDIR(st.st_mode)) {
    (void)kept::RemoveKept(place.kept_dir, place.key);
    return Status::Corruption(src + ": not a directory (removed)");
  }
  // Locked, then private: the entry's private name never shows a free lock to a cleaner
  // (CleanKeptArea), and two jobs never adopt the same directory (the loser finds it locked or
  // gone).
  Result<int> lock = kept::LockKeptEntry(src);
  if (!lock.ok()) {
    if (lock.status().code() == StatusCode::kUnavailable) {
      return Status::NotFound(src + ": another job adopts it");
    }
    return lock.status();
  }
  k->lock_fd_.Reset(*lock);
  if (k->borrowed_) {
    k->dir_fd_.Reset(io->Open(src, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, 0));
    if (!k->dir_fd_.valid()) return Status::FromErrno(errno, src);
  } else if (io->Rename(src, k->dir_) != 0) {
    return Status::FromErrno(errno, src);
  }
  const auto fail = [&k](Status s) {
    k->Discard();
    return s;
  };

  Result<std::string> mbytes = io->ReadSmallFile(k->dir_ + "/MANIFEST", kept::kMaxManifestBytes);
  if (!mbytes.ok()) return fail(mbytes.status());
  Result<kept::KeptManifest> m = kept::ParseKeptManifest(*mbytes);
  if (!m.ok()) return fail(m.status().WithContext(src));
  if (m->key != place.key) return fail(Status::Corruption(src + ": MANIFEST names another key"));
  Result<std::string> ibytes = io->ReadSmallFile(k->dir_ + "/index", m->index_bytes);
  if (!ibytes.ok()) return fail(ibytes.status());
  if (ibytes->size() != m->index_bytes ||
      XXH3_64bits(ibytes->data(), ibytes->size()) != m->index_xxh3) {
    return fail(Status::Corruption(src + ": index differs from what MANIFEST records"));
  }
  Result<std::vector<kept::KeptSample>> records = kept::ParseKeptIndex(*ibytes);
  if (!records.ok()) return fail(records.status().WithContext(src));
  k->records_ = std::move(*records);
  k->created_ = m->created;
  k->manifest_ = *m;
  for (uint32_t f = 0; f < m->data_files; ++f) {
    const std::string path = k->dir_ + "/data." + std::to_string(f);
    // Read-write when taken: Release punches the adopted samples out (only Release writes).
    UniqueFd fd(io->Open(path, (k->borrowed_ ? O_RDONLY : O_RDWR) | O_NOFOLLOW | O_NONBLOCK, 0));
    struct stat fst {};
    if (fd.valid() && (io->Fstat(fd.get(), &fst) != 0 || !S_ISREG(fst.st_mode))) fd.Reset();
    k->data_fds_.push_back(std::move(fd));  // none when absent: its samples are rejected
  }

  // Each kept record to the catalog's id for the same entry (path, offset, length).
  std::unordered_map<std::string_view, std::vector<uint32_t>> by_path;
  for (uint32_t r = 0; r < k->records_.size(); ++r)
    by_path[k->records_[r].relative_path].push_back(r);
  k->record_of_.assign(catalog.size(), kNone);
  k->state_ = std::make_unique<std::atomic<uint8_t>[]>(k->records_.size());
  k->checked_ = std::make_unique<std::atomic<bool>[]>(k->records_.size());
  for (policy::SampleId id = 0; id < catalog.size(); ++id) {
    auto it = by_path.find(catalog.relative_path(id));
    if (it == by_path.end()) continue;
    for (uint32_t r : it->second) {
      const kept::KeptSample& rec = k->records_[r];
      if (rec.offset == catalog.offset(id) && rec.length == catalog.length(id) &&
          k->state_[r].load(std::memory_order_relaxed) == kUntried) {
        k->record_of_[id] = r;
        k->state_[r].store(kMatched, std::memory_order_relaxed);  // matched (reset below)
        ++k->matched_;
        break;
      }
    }
  }
  for (uint32_t r = 0; r < k->records_.size(); ++r) {
    if (k->state_[r].load(std::memory_order_relaxed) == kMatched) {
      k->state_[r].store(kUntried, std::memory_order_relaxed);
    } else {
      k->state_[r].store(kRejected, std::memory_order_relaxed);  // the dataset no longer has it
      k->rejected_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  spdlog::info("kept area: {} {} ({} kept samples, {} of them in this dataset's catalog)",
               k->borrowed_ ? "reading, and leaving kept (this job keeps nothing)," : "adopted",
               src, k->records_.size(), k->matched_);
  return k;
}

void KeptCopy::PutBack() {
  StopChecks();
  if (borrowed_) return GiveBack(false);
  if (name_.empty()) return;
  // The data files a tier took over come back (the tier, never served, is destroyed next; the
  // next adoption checks every sample's bytes again).
  for (uint32_t f = 0; in_place_tier_ != nullptr && f < in_place_.size(); ++f) {
    if (in_place_[f]) {
      (void)io_->Rename(in_place_tier_->DataPath(f), dir_ + "/data." + std::to_string(f));
    }
  }
  in_place_tier_ = nullptr;
  // Adoption only reads the copy: it is as it was kept.
  for (UniqueFd& fd : data_fds_)
    fd.Reset();
  const std::string back = kept_dir_ + "/" + key_;
  (void)io_->Unlink(dir_ + "/lock");
  if (io_->Rename(dir_, back) == 0) {
    spdlog::info("kept area: {} given back as {}", dir_, back);
    name_.clear();
  }
  Remove();
}

KeptCopy::~KeptCopy() {
  Remove();
}

void KeptCopy::Remove() {
  if (borrowed_) return GiveBack(true);
  Discard();
}

void KeptCopy::GiveBack(bool used) {
  StopChecks();
  for (UniqueFd& fd : data_fds_)
    fd.Reset();
  if (!name_.empty() && used && dir_fd_.valid()) {
    // The MANIFEST is rewritten in the directory that was read (its descriptor): a key that now
    // holds another job's entry (kept meanwhile) is not touched, and a removed one takes nothing.
    kept::KeptManifest m = manifest_;
    m.last_used = std::max(m.last_used, NowSeconds());
    const std::string bytes = kept::EncodeKeptManifest(m);
    const char tmp[] = ".tmp.MANIFEST";
    bool done = false;
    const int fd =
        ::openat(dir_fd_.get(), tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      done = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()) &&
             ::fsync(fd) == 0;
      ::close(fd);
      done = done && ::renameat(dir_fd_.get(), tmp, dir_fd_.get(), "MANIFEST") == 0 &&
             ::fsync(dir_fd_.get()) == 0;
      if (!done) (void)::unlinkat(dir_fd_.get(), tmp, 0);
    }
    if (done) {
      spdlog::info("kept area: {} stays kept (last used now)", dir_);
    } else if (errno == ENOENT) {
      spdlog::info("kept area: {} was kept again or removed meanwhile; left as it is", dir_);
    } else {
      spdlog::warn("kept area: {} stays kept, its last use not updated: {}", dir_,
                   std::strerror(errno));
    }
  }
  name_.clear();
  dir_fd_.Reset();
  lock_fd_.Reset();
}

void KeptCopy::Discard() {
  StopChecks();
  for (UniqueFd& fd : data_fds_)
    fd.Reset();
  dir_fd_.Reset();
  if (!name_.empty()) {
    if (Status s = kept::RemoveKept(kept_dir_, name_); !s.ok())
      spdlog::warn("kept area: removing {}: {}", dir_, s.message());
    name_.clear();
  }
  lock_fd_.Reset();
}

void KeptCopy::Reject(uint32_t record, policy::SampleId sample, const std::string& why) {
  uint8_t was = state_[record].load(std::memory_order_acquire);
  while ((was == kUntried || was == kAdopted || was == kInPlace) &&
         !state_[record].compare_exchange_weak(was, kRejected)) {
  }
  if (was != kUntried && was != kAdopted && was != kInPlace) return;  // rejected or released before
  if (was == kInPlace) {
    // Marked ready in place but never served from here (the tier's check caught its bytes).
    adopted_samples_.fetch_sub(1, std::memory_order_relaxed);
    adopted_bytes_.fetch_sub(records_[record].length, std::memory_order_relaxed);
  }
  const uint64_t n = rejected_.fetch_add(1, std::memory_order_relaxed);
  if (n < kLoggedRejects) {
    spdlog::info("kept area: sample {} ({}) not adopted, read from its source: {}", sample,
                 catalog_.path(sample), why);
  } else {
    spdlog::debug("kept area: sample {} ({}) not adopted: {}", sample, catalog_.path(sample), why);
  }
}

bool KeptCopy::Unchanged(const kept::KeptSample& rec, const FileStat& st) {
  return st.size == rec.file_size && st.mtime_ns == rec.mtime_ns && st.ctime_ns == rec.ctime_ns &&
         st.inode == rec.inode;
}

void KeptCopy::CheckAhead(std::span<const policy::SampleId> order, unsigned threads) {
  if (name_.empty() || !checkers_.empty()) return;
  // The kept samples in order (then the rest), grouped by file: one stat per file.
  std::vector<std::vector<policy::SampleId>> files;
  std::unordered_map<std::string_view, size_t> file_of;
  std::vector<bool> queued(record_of_.size(), false);
  const auto add = [&](policy::SampleId id) {
    if (id >= record_of_.size() || record_of_[id] == kNone || queued[id]) return;
    queued[id] = true;
    auto [it, fresh] = file_of.try_emplace(catalog_.relative_path(id), files.size());
    if (fresh) files.emplace_back();
    files[it->second].push_back(id);
  };
  for (policy::SampleId id : order)
    add(id);
  for (policy::SampleId id = 0; id < record_of_.size(); ++id)
    add(id);
  if (files.empty()) return;
  auto shared = std::make_shared<std::vector<std::vector<policy::SampleId>>>(std::move(files));
  auto next = std::make_shared<std::atomic<size_t>>(0);
  const unsigned n = std::max(1u, std::min<unsigned>(threads, unsigned(shared->size())));
  for (unsigned t = 0; t < n; ++t) {
    checkers_.emplace_back([this, shared, next] {
      for (size_t i; !stop_checks_.load(std::memory_order_relaxed) &&
                     (i = next->fetch_add(1, std::memory_order_relaxed)) < shared->size();) {
        const std::vector<policy::SampleId>& samples = (*shared)[i];
        Result<FileStat> st = env_->Stat(catalog_.path(samples.front()));
        checked_files_.fetch_add(1, std::memory_order_relaxed);
        for (policy::SampleId id : samples) {
          const uint32_t r = record_of_[id];
          if (!st.ok()) {
            Reject(r, id, st.status().message());
          } else if (!Unchanged(records_[r], *st)) {
            Reject(r, id, "its file changed since it was kept");
          } else {
            checked_[r].store(true, std::memory_order_release);
            if (in_place_tier_ != nullptr && in_place_[records_[r].data_file]) MarkInPlace(r, id);
          }
        }
      }
    });
  }
}

std::vector<std::string> KeptCopy::InPlaceFiles(const TierLayout& layout) const {
  std::vector<std::string> out(layout.file_count());
  if (name_.empty() || borrowed_) return out;  // a borrowed copy is never written
  // [kept data file]: 1 while every kept sample in it sits at its extent in `layout`, 0 once one
  // does not; 2 (no sample seen yet) at first.
  std::vector<uint8_t> fits(data_fds_.size(), 2);
  for (policy::SampleId id = 0; id < record_of_.size(); ++id) {
    const uint32_t r = record_of_[id];
    if (r == kNone) continue;
    const kept::KeptSample& rec = records_[r];
    if (rec.data_file >= fits.size()) continue;
    const uint32_t slot = layout.SlotOf(id);
    bool at = false;
    if (slot != kNoSlot) {
      const SlotExtent e = layout.Extent(slot);
      at = e.file == rec.data_file && e.offset == rec.data_offset && e.size == rec.length;
    }
    if (!at) fits[rec.data_file] = 0;
    if (at && fits[rec.data_file] == 2) fits[rec.data_file] = 1;
  }
  for (uint32_t f = 0; f < fits.size() && f < out.size(); ++f) {
    struct stat st {};
    if (fits[f] == 1 && data_fds_[f].valid() && io_->Fstat(data_fds_[f].get(), &st) == 0 &&
        uint64_t(st.st_size) == layout.file_bytes(f)) {
      out[f] = dir_ + "/data." + std::to_string(f);
    }
  }
  return out;
}

void KeptCopy::SetInPlaceTier(SsdTier* tier) {
  in_place_.assign(data_fds_.size(), false);
  bool any = false;
  for (uint32_t f = 0; f < in_place_.size(); ++f) {
    in_place_[f] = tier != nullptr && tier->adopted(f);
    any = any || in_place_[f];
  }
  in_place_tier_ = any ? tier : nullptr;
  if (any) spdlog::info("kept area: the SSD tier {} took over data files of {}", tier->dir(), dir_);
}

void KeptCopy::WaitChecks() {
  for (std::thread& t : checkers_)
    if (t.joinable()) t.join();
}

void KeptCopy::StopChecks() {
  stop_checks_.store(true, std::memory_order_relaxed);
  WaitChecks();
}

void KeptCopy::MarkInPlace(uint32_t r, policy::SampleId id) {
  const kept::KeptSample& rec = records_[r];
  const std::optional<uint64_t> known = catalog_.checksum(id);
  if (known && *known != rec.xxh3) {
    Reject(r, id, "the kept bytes differ from their checksum");
    return;
  }
  uint8_t expected = kUntried;
  if (!state_[r].compare_exchange_strong(expected, kInPlace))
    return;  // fetched (or rejected) already
  adopted_samples_.fetch_add(1, std::memory_order_relaxed);
  adopted_bytes_.fetch_add(rec.length, std::memory_order_relaxed);
  // A fill that claimed the slot first writes the same bytes (read from here, checked).
  const uint32_t slot = in_place_tier_->layout().SlotOf(id);
  if (slot != kNoSlot && in_place_tier_->slots().TryBeginFill(slot)) {
    in_place_tier_->slots().MarkReady(slot, rec.xxh3);
    in_place_samples_.fetch_add(1, std::memory_order_relaxed);
  }
}

uint64_t KeptCopy::Release(std::span<const policy::SampleId> samples) {
  if (name_.empty() || borrowed_) return 0;
  uint64_t released = 0, bytes = 0;
  for (policy::SampleId id : samples) {
    if (id >= record_of_.size() || record_of_[id] == kNone) continue;
    const uint32_t r = record_of_[id];
    // A file the tier took over holds the tier's own copy.
    if (in_place_tier_ != nullptr && in_place_[records_[r].data_file]) continue;
    uint8_t expected = kAdopted;
    if (!state_[r].compare_exchange_strong(expected, kReleased))
      continue;  // not adopted (or released)
    const kept::KeptSample& rec = records_[r];
    const int fd = rec.data_file < data_fds_.size() ? data_fds_[rec.data_file].get() : -1;
    if (fd < 0) continue;
    // The sample's slot: its bytes and the padding up to the next slot (slots are aligned). A read
    // of the punched bytes gives zeros: a Fetch that raced with this one finds the sample
    // released, not corrupt (below).
    uint64_t len = rec.length;
    if (rec.data_offset % kSsdAlignment == 0)
      len = (len + kSsdAlignment - 1) / kSsdAlignment * kSsdAlignment;
    if (io_->PunchHole(fd, off_t(rec.data_offset), off_t(len)) == 0) {
      bytes += len;
    } else if (!punch_refused_.exchange(true)) {
      spdlog::warn(
          "kept area: {} cannot punch holes ({}); the adopted samples stay on disk until "
          "exit",
          dir_ + "/data." + std::to_string(rec.data_file), std::strerror(errno));
    }
    ++released;
  }
  released_samples_.fetch_add(released, std::memory_order_relaxed);
  released_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return released;
}

Result<uint64_t> KeptCopy::Fetch(policy::SampleId sample, std::span<std::byte> dst) {
  if (name_.empty() || sample >= record_of_.size() || record_of_[sample] == kNone) {
    return Status::NotFound("sample " + std::to_string(sample) + " is not kept");
  }
  const uint32_t r = record_of_[sample];
  if (const uint8_t state = state_[r].load(std::memory_order_acquire);
      state == kRejected || state == kReleased) {
    return Status::NotFound("sample " + std::to_string(sample) +
                            (state == kRejected ? " was rejected" : " is in a tier"));
  }
  const kept::KeptSample& rec = records_[r];
  const auto reject = [&](const std::string& why, StatusCode code) -> Status {
    Reject(r, sample, why);
    return Status(code, "kept sample " + std::to_string(sample) + ": " + why);
  };
  if (dst.size() != rec.length) return reject("size differs", StatusCode::kFailedPrecondition);
  // The file's check: CheckAhead's stat, or one here when it has not reached the file yet.
  if (!checked_[r].load(std::memory_order_acquire)) {
    Result<FileStat> st = env_->Stat(catalog_.path(sample));
    if (!st.ok()) return reject(st.status().message(), StatusCode::kFailedPrecondition);
    if (!Unchanged(rec, *st)) {
      return reject("its file changed since it was kept", StatusCode::kFailedPrecondition);
    }
  }
  // CheckAhead may have rejected it meanwhile (its stat came later than ours).
  if (state_[r].load(std::memory_order_acquire) == kRejected) {
    return Status::NotFound("sample " + std::to_string(sample) + " was rejected");
  }
  const int fd = rec.data_file < data_fds_.size() ? data_fds_[rec.data_file].get() : -1;
  if (fd < 0) return reject("its data file is missing", StatusCode::kCorruption);
  if (Status s =
          PreadAll(io_, fd, dst, rec.data_offset, dir_ + "/data." + std::to_string(rec.data_file));
      !s.ok()) {
    return reject(s.message(), StatusCode::kCorruption);
  }
  const uint64_t h = XXH3_64bits(dst.data(), dst.size());
  const std::optional<uint64_t> known = catalog_.checksum(sample);
  if (h != rec.xxh3 || (known && *known != h)) {
    if (state_[r].load(std::memory_order_acquire) == kReleased) {
      return Status::NotFound("sample " + std::to_string(sample) + " is in a tier");
    }
    return reject("the kept bytes differ from their checksum", StatusCode::kCorruption);
  }
  uint8_t expected = kUntried;
  if (state_[r].compare_exchange_strong(expected, kAdopted)) {
    adopted_samples_.fetch_add(1, std::memory_order_relaxed);
    adopted_bytes_.fetch_add(dst.size(), std::memory_order_relaxed);
    if (!known) (void)catalog_.RecordChecksum(sample, h);
  }
  return h;
}

namespace {

// A keep's private entry, <kept>/.tmp.keep.*, locked; removed (and unlocked) unless committed.
struct KeepEntry {
  std::string tmp, tmp_name;
  UniqueFd lock;
};

// Makes and locks the keep's private entry in <kept>.
Result<KeepEntry> MakeKeepEntry(LocalIo* io, const KeptPlace& place) {
  NOPFS_RETURN_IF_ERROR(EnsureKeptDir(io, place.kept_dir));
  KeepEntry e;
  e.tmp = place.kept_dir + "/.tmp.keep." + place.tag + ".XXXXXX";
  if (io->MakeTempDir(e.tmp) != 0) {
    return Status::FromErrno(errno, "kept area: creating a directory in " + place.kept_dir);
  }
  e.tmp_name = e.tmp.substr(place.kept_dir.size() + 1);
  Result<int> lock = kept::LockKeptEntry(e.tmp);
  if (!lock.ok()) {
    (void)kept::RemoveKept(place.kept_dir, e.tmp_name);
    return lock.status();
  }
  e.lock.Reset(*lock);
  return e;
}

// The ready slots in slot order (first access first), within the budget; the others counted in
// `skipped`.
std::vector<uint32_t> SlotsToKeep(const KeepOptions& o, SsdTier& tier, uint64_t& skipped) {
  const TierLayout& layout = tier.layout();
  std::vector<uint32_t> slots;
  uint64_t budget_used = 0;
  for (uint32_t s = 0; s < layout.slot_count(); ++s) {
    if (tier.slots().state(s) != SlotState::kReady) continue;
    const uint64_t padded = layout.PaddedSizeOf(s);
    if (o.max_bytes != 0 && budget_used + padded > o.max_bytes) {
      ++skipped;
      continue;
    }
    budget_used += padded;
    slots.push_back(s);
  }
  return slots;
}

// One stat per file of `paths` (sorted, distinct), in parallel, until the deadline: [path] its
// stat, or none (failed or not reached).
std::vector<std::optional<FileStat>> StatFiles(const KeepOptions& o,
                                               const std::vector<std::string>& paths, Env* env) {
  std::vector<std::optional<FileStat>> stats(paths.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  const unsigned n = std::max(1u, std::min<unsigned>(o.stat_threads, unsigned(paths.size())));
  for (unsigned t = 0; t < n; ++t) {
    threads.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < paths.size();) {
        if (std::chrono::steady_clock::now() >= o.deadline) return;
        Result<FileStat> st = env->Stat(paths[i]);
        if (st.ok()) stats[i] = *st;
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  return stats;
}

// What a keep records of its samples, and where they sit in the data files.
struct KeptRecords {
  std::vector<kept::KeptSample> records;
  // [data file]: (offset, padded size) of each kept slot in it.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> extents;
};

// The records of `slots` whose files were stat-ed, unchanged since before the job's start and long
// enough; the others counted in `skipped`.
KeptRecords RecordSlots(const KeepOptions& o, const SsdTier& tier, const Catalog& catalog,
                        const std::vector<uint32_t>& slots, Env* env, uint64_t& skipped) {
  const TierLayout& layout = tier.layout();
  std::vector<std::string> paths;
  paths.reserve(slots.size());
  for (uint32_t s : slots)
    paths.push_back(catalog.path(layout.SampleAt(s)));
  std::sort(paths.begin(), paths.end());
  paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
  const std::vector<std::optional<FileStat>> stats = StatFiles(o, paths, env);

  KeptRecords out;
  out.extents.resize(layout.file_count());
  for (uint32_t s : slots) {
    const policy::SampleId id = layout.SampleAt(s);
    const std::string path = catalog.path(id);
    const size_t i = size_t(std::lower_bound(paths.begin(), paths.end(), path) - paths.begin());
    const std::optional<FileStat>& st = stats[i];
    if (!st || !st->is_regular || st->ctime_ns >= o.unchanged_before_ns ||
        catalog.offset(id) + catalog.length(id) > st->size) {
      ++skipped;
      continue;
    }
    const SlotExtent e = layout.Extent(s);
    kept::KeptSample k;
    k.relative_path = std::string(catalog.relative_path(id));
    k.offset = catalog.offset(id);
    k.length = catalog.length(id);
    k.xxh3 = tier.slots().expected(s);
    k.file_size = st->size;
    k.mtime_ns = st->mtime_ns;
    k.ctime_ns = st->ctime_ns;
    k.inode = st->inode;
    k.data_file = e.file;
    k.data_offset = e.offset;
    out.records.push_back(std::move(k));
    out.extents[e.file].emplace_back(e.offset, layout.PaddedSizeOf(s));
  }
  return out;
}

// Moves the tier's data files that hold kept samples into the entry and punches out the rest of
// each; appends the names moved to `names`.
Status MoveDataFiles(LocalIo* io, SsdTier& tier, const std::string& tmp,
                     std::vector<std::vector<std::pair<uint64_t, uint64_t>>>& extents,
                     std::vector<std::string>& names) {
  const TierLayout& layout = tier.layout();
  // No chunk may be preallocated behind the punching.
  tier.StopPreallocation();
  bool punch_refused = false;
  for (uint32_t f = 0; f < layout.file_count(); ++f) {
    if (extents[f].empty()) continue;
    const std::string name = "data." + std::to_string(f);
    const std::string dst = tmp + "/" + name;
    if (io->Rename(tier.DataPath(f), dst) != 0) {
      return Status::FromErrno(errno, "kept area: moving " + tier.DataPath(f));
    }
    names.push_back(name);
    const UniqueFd fd(io->Open(dst, O_RDWR | O_NOFOLLOW, 0));
    if (!fd.valid()) return Status::FromErrno(errno, "kept area: " + dst);
    std::sort(extents[f].begin(), extents[f].end());
    uint64_t at = 0;
    const auto punch = [&](uint64_t from, uint64_t to) {
      if (to <= from || punch_refused) return;
      if (io->PunchHole(fd.get(), off_t(from), off_t(to - from)) != 0) {
        punch_refused = true;
        spdlog::warn("kept area: {} cannot punch holes ({}); the unkept slots stay allocated", dst,
                     std::strerror(errno));
      }
    };
    for (const auto& [off, len] : extents[f]) {
      punch(at, off);
      at = off + len;
    }
    punch(at, layout.file_bytes(f));
  }
  return Status::Ok();
}

// Writes the entry's index and then its MANIFEST (which makes it complete), durably; appends
// their names to `names`.
Status WriteIndexAndManifest(const KeepOptions& o, const std::string& tmp,
                             const std::vector<kept::KeptSample>& records, uint32_t data_files,
                             std::vector<std::string>& names) {
  const std::string index = kept::EncodeKeptIndex(records);
  kept::KeptManifest m;
  m.key = o.place.key;
  m.dataset = o.place.dataset;
  m.created = o.created != 0 ? o.created : NowSeconds();
  m.last_used = NowSeconds();
  m.samples = records.size();
  m.index_bytes = index.size();
  m.index_xxh3 = XXH3_64bits(index.data(), index.size());
  m.data_files = data_files;
  // The samples' bytes are not synced: adoption checks every one against its xxh3.
  NOPFS_RETURN_IF_ERROR(kept::WriteFileDurably(tmp, "index", index));
  NOPFS_RETURN_IF_ERROR(kept::WriteFileDurably(tmp, "MANIFEST", kept::EncodeKeptManifest(m)));
  names.push_back("index");
  names.push_back("MANIFEST");
  return Status::Ok();
}

// Renames the entry to <kept>/<key>, replacing what another job of the user kept meanwhile.
Status RenameIntoPlace(LocalIo* io, const KeptPlace& place, const std::string& tmp,
                       const std::string& dir) {
  if (io->Rename(tmp, dir) != 0) {
    if (errno != EEXIST && errno != ENOTEMPTY)
      return Status::FromErrno(errno, "kept area: renaming " + tmp);
    NOPFS_RETURN_IF_ERROR(kept::RemoveKept(place.kept_dir, place.key));
    if (io->Rename(tmp, dir) != 0) return Status::FromErrno(errno, "kept area: renaming " + tmp);
  }
  if (const UniqueFd kfd(io->Open(place.kept_dir, O_RDONLY | O_DIRECTORY, 0)); kfd.valid()) {
    (void)io->Fsync(kfd.get());
  }
  return Status::Ok();
}

}  // namespace

Result<KeepResult> KeepSsdTier(const KeepOptions& o, SsdTier& tier, const Catalog& catalog,
                               Env* env) {
  const KeptPlace& place = o.place;
  LocalIo* const io = o.io != nullptr ? o.io : LocalIo::Default();
  Result<KeepEntry> entry = MakeKeepEntry(io, place);
  if (!entry.ok()) return entry.status();
  const auto fail = [&](Status s) -> Status {
    (void)kept::RemoveKept(place.kept_dir, entry->tmp_name);
    entry->lock.Reset();
    return s;
  };

  KeepResult result;
  const std::vector<uint32_t> slots = SlotsToKeep(o, tier, result.skipped);
  KeptRecords recs = RecordSlots(o, tier, catalog, slots, env, result.skipped);
  // The data files that hold kept samples move into the entry; the rest of each is punched out.
  std::vector<std::string> names;
  if (Status s = MoveDataFiles(io, tier, entry->tmp, recs.extents, names); !s.ok()) return fail(s);
  if (Status s =
          WriteIndexAndManifest(o, entry->tmp, recs.records, tier.layout().file_count(), names);
      !s.ok()) {
    return fail(s);
  }
  result.dir = place.kept_dir + "/" + place.key;
  if (Status s = RenameIntoPlace(io, place, entry->tmp, result.dir); !s.ok()) return fail(s);
  (void)io->Unlink(result.dir + "/lock");
  entry->lock.Reset();
  result.samples = recs.records.size();
  result.bytes = DiskBytesOf(io, result.dir, names);
  return result;
}

}  // namespace nopfs::service
