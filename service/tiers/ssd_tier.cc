#include "service/tiers/ssd_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string>
#include <system_error>

#include "common/checksum.h"
#include "common/lock_file.h"

namespace nopfs::service {

namespace {

constexpr char kLockName[] = "lock";
constexpr char kKeptName[] = "kept";
constexpr char kTempPrefix[] = ".tmp.";
constexpr time_t kTempGraceSeconds = 60;

bool ValidName(const std::string& s) {
  if (s.empty() || s[0] == '.' || s.size() > 100) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

// Removes a directory tree without following symbolic links.
Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return Status::FromErrno(ec.value(), "removing " + path);
  return Status::Ok();
}

// Creates (or checks) the per-user directory: a real directory, owned by us, mode 0700. Under
// Slurm the prolog has made it as root in a root-owned SSD directory (spank/user_dirs.h), so that
// no other user can take its name first; `nopfs run` and a nopfsd started by hand make it here.
Status EnsureUserDir(const std::string& path) {
  if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    const Status s = Status::FromErrno(errno, "ssd tier: creating " + path);
    if (errno != EACCES) return s;
    return Status::PermissionDenied(s.message() +
                                    "; in a root-owned SSD directory the job prolog makes it "
                                    "(docs/admin.md); outside Slurm, use an SSD path this user "
                                    "may write");
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "ssd tier: " + path);
  if (!S_ISDIR(st.st_mode)) {
    return Status::PermissionDenied("ssd tier: " + path +
                                    " exists and is not a directory; remove it");
  }
  if (st.st_uid != geteuid()) {
    return Status::PermissionDenied("ssd tier: " + path + " is owned by uid " +
                                    std::to_string(st.st_uid) + ", not by this daemon's uid " +
                                    std::to_string(geteuid()) +
                                    "; the job prolog moves such a directory aside, or the "
                                    "admin removes it (docs/admin.md)");
  }
  if ((st.st_mode & 07777) != 0700 && chmod(path.c_str(), 0700) != 0) {
    return Status::FromErrno(errno, "ssd tier: chmod 0700 " + path);
  }
  return Status::Ok();
}

// Opens and locks <dir>/lock. Ok(fd) when locked by us; -1 when another process holds it;
// NotFound when there is no lock file.
// The lock of an existing directory: its descriptor, or -1 when a live daemon holds it.
Result<int> TryLock(const std::string& dir) {
  const std::string path = dir + "/" + kLockName;
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::FromErrno(errno, "ssd tier: opening lock " + path);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    close(fd);
    if (err == EWOULDBLOCK) return -1;
    return Status::FromErrno(err, "ssd tier: flock " + path);
  }
  return fd;
}

Status PreadFull(LocalIo* io, int fd, std::byte* dst, uint64_t n, uint64_t off,
                 const std::string& path) {
  while (n > 0) {
    const ssize_t r = io->Pread(fd, dst, n, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "ssd tier: reading " + path);
    }
    if (r == 0) {
      return Status::IoError("ssd tier: reading " + path + ": unexpected end of file at offset " +
                             std::to_string(off));
    }
    dst += r;
    n -= static_cast<uint64_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status PwriteFull(LocalIo* io, int fd, const std::byte* src, uint64_t n, uint64_t off,
                  const std::string& path) {
  while (n > 0) {
    const ssize_t r = io->Pwrite(fd, src, n, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "ssd tier: writing " + path);
    }
    src += r;
    n -= static_cast<uint64_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

bool Aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kSsdAlignment == 0;
}

}  // namespace

std::string SsdTier::UserDir(const std::string& scratch_root, uid_t uid) {
  return scratch_root + "/nopfs-" + std::to_string(uid);
}

std::string SsdTier::DataPath(uint32_t file) const {
  return dir_ + "/data." + std::to_string(file);
}

Result<uint64_t> SsdTier::CleanupStale(const std::string& scratch_root, uid_t uid) {
  const std::string udir = UserDir(scratch_root, uid);
  DIR* d = opendir(udir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return uint64_t{0};
    return Status::FromErrno(errno, "ssd tier: listing " + udir);
  }
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  uint64_t removed = 0;
  for (const std::string& n : names) {
    // The kept area (kept/area.h) and the sibling registry (service/reader/sibling.h)
    // are not a job's tier.
    if (n == kKeptName || n == "live") continue;
    const std::string path = udir + "/" + n;
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    auto lock = TryLock(path);
    bool stale = false;
    if (lock.ok()) {
      if (*lock < 0) continue;  // a live daemon holds it
      stale = true;
    } else if (lock.status().code() == StatusCode::kNotFound) {
      // A job directory without a lock file was half removed; a temporary one may be under
      // construction right now, so it gets a grace period.
      const bool temp = n.rfind(kTempPrefix, 0) == 0;
      stale = !temp || time(nullptr) - st.st_mtime > kTempGraceSeconds;
    } else {
      TierLog()->warn("ssd tier cleanup: {}", lock.status().ToString());
      continue;
    }
    if (!stale) continue;
    // Remove while holding the lock, so that no one takes it over meanwhile.
    const Status s = RemoveTree(path);
    if (lock.ok()) close(*lock);
    NOPFS_RETURN_IF_ERROR(s);
    TierLog()->info("ssd tier cleanup: removed stale {}", path);
    ++removed;
  }
  return removed;
}

SsdTier::SsdTier(std::string dir, TierLayout layout, int lock_fd, LocalIo* io)
    : dir_(std::move(dir)),
      layout_(std::move(layout)),
      slots_(layout_.slot_count()),
      lock_fd_(lock_fd),
      io_(io) {}

Result<std::unique_ptr<SsdTier>> SsdTier::Create(const SsdTierOptions& o, TierLayout layout) {
  if (!ValidName(o.job) || !ValidName(o.node)) {
    return Status::InvalidArgument("ssd tier: job \"" + o.job + "\" and node \"" + o.node +
                                   "\" must be non-empty, made of letters, digits, '_', '-', "
                                   "'.', and not start with '.'");
  }
  const uid_t uid = geteuid();
  const std::string udir = UserDir(o.scratch_root, uid);
  NOPFS_RETURN_IF_ERROR(EnsureUserDir(udir));
  // Leftovers of dead daemons must not stop a new job: a failure to remove them is logged only.
  if (auto cleaned = CleanupStale(o.scratch_root, uid); !cleaned.ok()) {
    TierLog()->warn("ssd tier: removing stale directories: {}", cleaned.status().ToString());
  }

  // Build under a temporary name with the lock held, then rename into place.
  const std::string final_dir = udir + "/" + o.job + "." + o.node;
  std::string tmpl = udir + "/" + kTempPrefix + o.job + "." + o.node + ".XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    return Status::FromErrno(errno, "ssd tier: creating a directory in " + udir);
  }
  // The lock file appears already locked (LockFileIn): a cleaner never finds it free.
  auto lock = LockFileIn(tmpl, kLockName);
  if (!lock.ok() || *lock < 0) {
    (void)RemoveTree(tmpl);
    return lock.ok() ? Status::Internal("ssd tier: fresh lock in " + tmpl + " is held")
                     : lock.status();
  }
  if (rename(tmpl.c_str(), final_dir.c_str()) != 0) {
    const int err = errno;
    bool retried = false;
    if (err == EEXIST || err == ENOTEMPTY) {
      auto other = TryLock(final_dir);
      if (other.ok() && *other < 0) {
        close(*lock);
        (void)RemoveTree(tmpl);
        return Status::FailedPrecondition("ssd tier: " + final_dir +
                                          " is in use by a running nopfsd (its lock is held)");
      }
      // Left by a dead daemon (lock free or missing): replace it.
      const Status s = RemoveTree(final_dir);
      if (other.ok()) close(*other);
      retried = s.ok() && rename(tmpl.c_str(), final_dir.c_str()) == 0;
    }
    if (!retried) {
      close(*lock);
      (void)RemoveTree(tmpl);
      return Status::FromErrno(err, "ssd tier: renaming " + tmpl + " to " + final_dir);
    }
  }
  std::unique_ptr<SsdTier> tier(new SsdTier(final_dir, std::move(layout), *lock,
                                            o.io != nullptr ? o.io : LocalIo::Default()));

  // Space check first, so the message can name the shortfall before anything is written.
  struct statvfs vfs {};
  if (statvfs(final_dir.c_str(), &vfs) != 0) {
    const Status s = Status::FromErrno(errno, "ssd tier: statvfs " + final_dir);
    (void)tier->Destroy();
    return s;
  }
  const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  const uint64_t need = tier->layout_.total_bytes();
  if (need > avail) {
    (void)tier->Destroy();
    return Status::ResourceExhausted(
        "ssd tier: " + final_dir + " needs " + std::to_string(need) +
        " bytes for its data files but the file system has only " + std::to_string(avail) +
        " bytes free (short by " + std::to_string(need - avail) +
        " bytes); lower the SSD capacity or free space in " + o.scratch_root);
  }
  const Status s = tier->OpenFiles(o.direct_io, o.adopt_data);
  if (!s.ok()) {
    (void)tier->Destroy();
    return s;
  }
  TierLog()->info("ssd tier {}: {} samples in {} files, {} bytes, {} I/O", final_dir,
                  tier->layout_.slot_count(), tier->layout_.file_count(), need,
                  tier->direct_ ? "direct" : "buffered");
  SsdTier* t = tier.get();
  tier->allocator_ = std::thread([t] { t->PreallocateAll(); });
  return tier;
}

Status SsdTier::Preallocate(uint32_t file, uint64_t offset, uint64_t size) {
  std::vector<std::atomic<ChunkState>>& chunks = chunks_[file];
  if (size == 0 || chunks.empty()) return Status::Ok();
  const uint64_t file_bytes = layout_.file_bytes(file);
  const uint64_t first = offset / kAllocChunk;
  const uint64_t last = std::min<uint64_t>((offset + size - 1) / kAllocChunk, chunks.size() - 1);
  for (uint64_t c = first; c <= last; ++c) {
    ChunkState s = chunks[c].load(std::memory_order_acquire);
    if (s == ChunkState::kAllocated) continue;
    MutexLock lock(&alloc_mu_);
    s = chunks[c].load(std::memory_order_relaxed);
    const uint64_t begin = c * kAllocChunk;
    const uint64_t len = std::min(kAllocChunk, file_bytes - begin);
    if (s == ChunkState::kNone) {
      const int err =
          io_->Fallocate(files_[file].fd, static_cast<off_t>(begin), static_cast<off_t>(len));
      if (err != 0) {
        s = ChunkState::kFailed;
        struct statvfs vfs {};
        const uint64_t avail = fstatvfs(files_[file].fd, &vfs) == 0
                                   ? static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize
                                   : 0;
        TierLog()->error(
            "ssd tier: preallocating bytes {}..{} of {}: {} ({} bytes free); the samples there "
            "are read from the next source",
            begin, begin + len, DataPath(file), std::strerror(err), avail);
      } else {
        s = ChunkState::kAllocated;
        allocated_bytes_.fetch_add(len, std::memory_order_relaxed);
      }
      chunks[c].store(s, std::memory_order_release);
    }
    if (s == ChunkState::kFailed) {
      return Status::ResourceExhausted("ssd tier: preallocating bytes " + std::to_string(begin) +
                                       ".." + std::to_string(begin + len) + " of " +
                                       DataPath(file) + " failed; no space for this sample");
    }
  }
  return Status::Ok();
}

void SsdTier::PreallocateAll() {
  for (uint32_t file = 0; file < chunks_.size(); ++file) {
    for (uint64_t c = 0; c < chunks_[file].size(); ++c) {
      if (stop_alloc_.load(std::memory_order_relaxed)) return;
      // A failure is logged and fails that chunk's fills; the other chunks are still allocated.
      (void)Preallocate(file, c * kAllocChunk, 1);
    }
  }
}

void SsdTier::WaitPreallocated() {
  if (allocator_.joinable()) allocator_.join();
}

void SsdTier::StopPreallocation() {
  stop_alloc_.store(true, std::memory_order_relaxed);
  if (allocator_.joinable()) allocator_.join();
}

Status SsdTier::OpenFiles(bool direct_io, const std::vector<std::string>& adopt) {
  direct_ = direct_io;
  for (uint32_t i = 0; i < layout_.file_count(); ++i) {
    const std::string path = DataPath(i);
    bool adopted = false;
    if (i < adopt.size() && !adopt[i].empty()) {
      struct stat st {};
      if (lstat(adopt[i].c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
          static_cast<uint64_t>(st.st_size) != layout_.file_bytes(i)) {
        TierLog()->warn("ssd tier: not taking over {}: not a regular file of {} bytes", adopt[i],
                        layout_.file_bytes(i));
      } else if (rename(adopt[i].c_str(), path.c_str()) != 0) {
        TierLog()->warn("ssd tier: not taking over {}: {}", adopt[i], std::strerror(errno));
      } else {
        adopted = true;
      }
    }
    adopted_.push_back(adopted);
    DataFile f;
    f.fd = open(path.c_str(), O_RDWR | (adopted ? 0 : O_CREAT | O_EXCL) | O_CLOEXEC | O_NOFOLLOW,
                0600);
    if (f.fd < 0) return Status::FromErrno(errno, "ssd tier: creating " + path);
    files_.push_back(f);
    chunks_.emplace_back((layout_.file_bytes(i) + kAllocChunk - 1) / kAllocChunk);
    if (direct_) {
      files_.back().direct_fd = open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC | O_NOFOLLOW);
      if (files_.back().direct_fd < 0) {
        if (errno != EINVAL) return Status::FromErrno(errno, "ssd tier: opening " + path);
        direct_ = false;  // the file system refuses O_DIRECT (tmpfs): buffered for all files
        TierLog()->warn("ssd tier {}: the file system refuses O_DIRECT; using buffered I/O", dir_);
      }
    }
  }
  if (!direct_) {
    for (DataFile& f : files_) {
      if (f.direct_fd >= 0) close(f.direct_fd);
      f.direct_fd = -1;
    }
  }
  return Status::Ok();
}

Status SsdTier::Destroy() {
  if (destroyed_) return Status::Ok();
  destroyed_ = true;
  stop_alloc_.store(true, std::memory_order_relaxed);
  if (allocator_.joinable()) allocator_.join();
  Status first;
  for (uint32_t i = 0; i < files_.size(); ++i) {
    if (files_[i].direct_fd >= 0) close(files_[i].direct_fd);
    if (files_[i].fd >= 0) close(files_[i].fd);
    if (unlink(DataPath(i).c_str()) != 0 && errno != ENOENT && first.ok()) {
      first = Status::FromErrno(errno, "ssd tier: removing " + DataPath(i));
    }
  }
  files_.clear();
  // The lock goes last, so the directory never looks abandoned while files remain.
  const std::string lock_path = dir_ + "/" + kLockName;
  if (unlink(lock_path.c_str()) != 0 && errno != ENOENT && first.ok()) {
    first = Status::FromErrno(errno, "ssd tier: removing " + lock_path);
  }
  if (lock_fd_ >= 0) close(lock_fd_);
  lock_fd_ = -1;
  if (rmdir(dir_.c_str()) != 0 && errno != ENOENT && first.ok()) {
    first = Status::FromErrno(errno, "ssd tier: removing " + dir_);
  }
  // The per-user directory goes when no other job of this user uses it (ENOTEMPTY otherwise).
  const std::string udir = dir_.substr(0, dir_.rfind('/'));
  (void)rmdir(udir.c_str());
  return first;
}

SsdTier::~SsdTier() {
  const Status s = Destroy();
  if (!s.ok()) TierLog()->error("{}", s.ToString());
}

bool SsdTier::IsReady(policy::SampleId sample) const {
  const uint32_t slot = layout_.SlotOf(sample);
  return slot != kNoSlot && slots_.state(slot) == SlotState::kReady;
}

Status SsdTier::WaitReady(policy::SampleId sample, std::chrono::nanoseconds timeout) const {
  const uint32_t slot = layout_.SlotOf(sample);
  if (slot == kNoSlot) {
    return Status::NotFound("ssd tier: sample " + std::to_string(sample) + " is not in this tier");
  }
  return slots_.WaitReady(slot, timeout).WithContext("ssd tier: sample " + std::to_string(sample));
}

Result<uint64_t> SsdTier::Fill(uint32_t slot, const FetchFn& fetch, std::span<std::byte> bounce) {
  if (destroyed_) return Status::FailedPrecondition("ssd tier: " + dir_ + " was destroyed");
  const SlotExtent e = layout_.Extent(slot);
  const uint64_t padded = layout_.PaddedSizeOf(slot);
  if (bounce.size() < padded || !Aligned(bounce.data())) {
    throw std::invalid_argument("SsdTier::Fill: bounce buffer too small or misaligned");
  }
  if (Status a = Preallocate(e.file, e.offset, padded); !a.ok()) return a;
  auto hash = fetch(layout_.SampleAt(slot), bounce.first(e.size));
  if (!hash.ok()) return hash.status();
  // Zero the padding so that no stale memory reaches the disk.
  std::memset(bounce.data() + e.size, 0, padded - e.size);
  const DataFile& f = files_[e.file];
  const Status s =
      f.direct_fd >= 0
          ? PwriteFull(io_, f.direct_fd, bounce.data(), padded, e.offset, DataPath(e.file))
          : PwriteFull(io_, f.fd, bounce.data(), e.size, e.offset, DataPath(e.file));
  if (!s.ok()) return s;
  return *hash;
}

Status SsdTier::Read(policy::SampleId sample, std::span<std::byte> dst) {
  return ReadSlot(sample, dst, false);
}

Status SsdTier::ReadIfCached(policy::SampleId sample, std::span<std::byte> dst) {
  return ReadSlot(sample, dst, true);
}

Status SsdTier::ReadSlot(policy::SampleId sample, std::span<std::byte> dst, bool nowait) {
  const uint32_t slot = layout_.SlotOf(sample);
  if (slot == kNoSlot) {
    return Status::NotFound("ssd tier: sample " + std::to_string(sample) + " is not in this tier");
  }
  const SlotState st = slots_.state(slot);
  if (st != SlotState::kReady) {
    return Status::FailedPrecondition("ssd tier: sample " + std::to_string(sample) + " is " +
                                      SlotStateName(st) + ", not ready");
  }
  const SlotExtent e = layout_.Extent(slot);
  if (dst.size() != e.size) {
    return Status::InvalidArgument("ssd tier: sample " + std::to_string(sample) + " has " +
                                   std::to_string(e.size) + " bytes, the buffer " +
                                   std::to_string(dst.size()));
  }
  if (destroyed_) return Status::FailedPrecondition("ssd tier: " + dir_ + " was destroyed");
  const DataFile& f = files_[e.file];
  const std::string path = DataPath(e.file);
  Status io = Status::Ok();
  if (nowait) {
    // All of it from the page cache, or nothing: a partial or refused read is left to Read.
    NoWait how = nowait_.load(std::memory_order_relaxed);
    if (how == NoWait::kRefused) {
      return Status::Unavailable("ssd tier: the file system cannot read without waiting");
    }
    const ssize_t r = io_->PreadNoWait(f.fd, dst.data(), e.size, static_cast<off_t>(e.offset));
    const int err = r < 0 ? errno : 0;
    if (err == EOPNOTSUPP && how == NoWait::kNoWait) {
      struct statfs fs {};
      how = ::fstatfs(f.fd, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC)
                ? NoWait::kMemory
                : NoWait::kRefused;
      nowait_.store(how, std::memory_order_relaxed);
    }
    if (err == EOPNOTSUPP && how == NoWait::kMemory) {
      io = PreadFull(io_, f.fd, dst.data(), e.size, e.offset, path);
    } else if (r != static_cast<ssize_t>(e.size)) {
      return Status::Unavailable("ssd tier: sample " + std::to_string(sample) +
                                 " is not in the page cache");
    }
  } else if (f.direct_fd >= 0 && Aligned(dst.data())) {
    // The whole blocks straight into dst, the partial last block through an aligned buffer.
    const uint64_t whole = e.size & ~(kSsdAlignment - 1);
    if (whole > 0) io = PreadFull(io_, f.direct_fd, dst.data(), whole, e.offset, path);
    if (io.ok() && whole < e.size) {
      alignas(kSsdAlignment) std::byte tail[kSsdAlignment];
      io = PreadFull(io_, f.direct_fd, tail, kSsdAlignment, e.offset + whole, path);
      if (io.ok()) std::memcpy(dst.data() + whole, tail, e.size - whole);
    }
  } else {
    io = PreadFull(io_, f.fd, dst.data(), e.size, e.offset, path);
  }
  if (!io.ok()) {
    // A disk that failed once for this slot is not asked again: its sample comes from elsewhere.
    slots_.MarkFailed(slot);
    TierLog()->error("ssd tier: sample {} in {} at offset {}: {}", sample, path, e.offset,
                     io.message());
    return Status(io.code(), "ssd tier: sample " + std::to_string(sample) + ": " + io.message() +
                                 "; slot marked failed, read it from the PFS");
  }
  const uint64_t got = Xxh3(dst);
  const uint64_t want = slots_.expected(slot);
  if (got == want) return Status::Ok();
  slots_.MarkFailed(slot);
  TierLog()->error("ssd tier: sample {} in {} at offset {}: xxh3 {:016x}, expected {:016x}", sample,
                   path, e.offset, got, want);
  return Status::Corruption("ssd tier: sample " + std::to_string(sample) + " in " + path +
                            " at offset " + std::to_string(e.offset) +
                            ": checksum mismatch; slot marked failed, read it from the PFS");
}

}  // namespace nopfs::service
