#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include "share/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/coding.h"
#include "common/dir_names.h"

namespace nopfs::share {

using coding::Reader;
using coding::Writer;
namespace {

constexpr uint32_t kManifestMagic = 0x4d53504e;  // "NPSM"
constexpr uint16_t kManifestVersion = 1;
constexpr char kManifest[] = "MANIFEST";
constexpr char kManifestTmp[] = "MANIFEST.tmp";
constexpr char kTmpPrefix[] = ".tmp-";
constexpr size_t kChunk = 1 << 20;

std::string CopyName(uint64_t name) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(name));
  return buf;
}

bool ParseCopyName(const std::string& s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

int64_t Ns(const timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

Status WriteAll(int fd, const std::byte* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::FromErrno(w < 0 ? errno : EIO, "share: write");
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// The xxh3 of the whole of `fd`, and its length.
Result<std::pair<uint64_t, uint64_t>> HashFd(int fd) {
  std::vector<std::byte> buf(kChunk);
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  uint64_t off = 0;
  for (;;) {
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "share: read");
    if (n == 0) break;
    XXH3_64bits_update(&st, buf.data(), static_cast<size_t>(n));
    off += static_cast<uint64_t>(n);
  }
  return std::make_pair(XXH3_64bits_digest(&st), off);
}

}  // namespace

FileId IdOf(const struct stat& st) {
  return FileId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                static_cast<uint64_t>(st.st_size), Ns(st.st_mtim), Ns(st.st_ctim)};
}

Result<std::unique_ptr<Store>> Store::Open(StoreOptions options) {
  if (options.root.empty() || options.root.front() != '/') {
    return Status::InvalidArgument("share: the dataset root must be an absolute path");
  }
  if (::mkdir(options.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "share: creating " + options.dir);
  }
  UniqueFd dir(::open(options.dir.c_str(), O_DIRECTORY | O_NOFOLLOW | O_RDONLY | O_CLOEXEC));
  if (!dir.valid()) return Status::FromErrno(errno, "share: opening " + options.dir);
  struct stat st {};
  if (::fstat(dir.get(), &st) != 0) return Status::FromErrno(errno, "share: " + options.dir);
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return Status::FailedPrecondition(
        "share: " + options.dir +
        " is not this service's own private directory (owner and mode 0700); remove it and "
        "the service makes it again");
  }
  std::unique_ptr<Store> s(new Store(std::move(options), std::move(dir)));
  NOPFS_RETURN_IF_ERROR(s->Load());
  return s;
}

Store::~Store() {
  (void)Save();
}

Status Store::Load() {
  {
    UniqueFd root(::open(o_.root.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (!root.valid() || ::fstat(root.get(), &st) != 0) {
      return Status::FromErrno(errno, "share: the dataset " + o_.root);
    }
    root_dev_ = static_cast<uint64_t>(st.st_dev);
    root_ino_ = static_cast<uint64_t>(st.st_ino);
  }
  MutexLock l(&mu_);
  std::string text;
  {
    UniqueFd m(::openat(dir_.get(), kManifest, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (m.valid()) {
      std::vector<std::byte> buf(kChunk);
      for (;;) {
        const ssize_t n = ::read(m.get(), buf.data(), buf.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        text.append(reinterpret_cast<const char*>(buf.data()), static_cast<size_t>(n));
      }
    }
  }
  bool drop_all = false;
  if (!text.empty()) {
    Reader rd(std::string_view(text).substr(0, text.size() >= 8 ? text.size() - 8 : 0));
    uint64_t sum = 0;
    if (text.size() >= 8)
      sum = coding::LoadLe64(std::as_bytes(std::span(text.data(), text.size())), text.size() - 8);
    uint32_t magic = 0;
    uint16_t version = 0;
    uint64_t dev = 0, ino = 0, next = 0, count = 0;
    const bool head = text.size() >= 8 && XXH3_64bits(text.data(), text.size() - 8) == sum &&
                      rd.U32(&magic) && rd.U16(&version) && magic == kManifestMagic &&
                      version == kManifestVersion && rd.U64(&dev) && rd.U64(&ino) &&
                      rd.U64(&next) && rd.U64(&count);
    if (!head || dev != root_dev_ || ino != root_ino_) {
      drop_all = true;  // unreadable, or the manifest of a dataset directory since replaced
    } else {
      next_name_ = next;
      for (uint64_t i = 0; i < count; ++i) {
        std::string rel;
        Entry e;
        uint64_t mt = 0, ct = 0;
        if (!rd.Str(&rel) || !rd.U64(&e.id.dev) || !rd.U64(&e.id.ino) || !rd.U64(&e.id.size) ||
            !rd.U64(&mt) || !rd.U64(&ct) || !rd.U64(&e.xxh3) || !rd.U64(&e.name) ||
            !rd.U64(&e.last_used) || !CheckRelativePath(rel).ok() || e.name >= next_name_) {
          entries_.clear();
          drop_all = true;
          break;
        }
        e.id.mtime_ns = static_cast<int64_t>(mt);
        e.id.ctime_ns = static_cast<int64_t>(ct);
        entries_[rel] = e;
      }
    }
  }
  if (drop_all) entries_.clear();
  // Entries whose copy is missing or of another size go; so does every file no entry names.
  std::set<uint64_t> named;
  for (auto it = entries_.begin(); it != entries_.end();) {
    struct stat st {};
    if (::fstatat(dir_.get(), CopyName(it->second.name).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != it->second.id.size ||
        named.count(it->second.name) != 0) {
      it = entries_.erase(it);
      continue;
    }
    named.insert(it->second.name);
    ++it;
  }
  Result<std::vector<std::string>> names = DirNames(dir_.get(), o_.dir);
  if (names.ok()) {
    for (const std::string& n : *names) {
      uint64_t v = 0;
      if (n == kManifest) continue;
      if (ParseCopyName(n, &v) && named.count(v) != 0) continue;
      (void)::unlinkat(dir_.get(), n.c_str(), 0);
    }
  }
  for (auto& [rel, e] : entries_) {
    used_ += e.id.size;
    lru_.insert({e.last_used, rel});
    clock_ = std::max(clock_, e.last_used);
  }
  stats_.files = entries_.size();
  EvictLocked(0);
  dirty_ = true;
  return Status::Ok();
}

void Store::DropLocked(std::map<std::string, Entry>::iterator it) {
  (void)::unlinkat(dir_.get(), CopyName(it->second.name).c_str(), 0);
  lru_.erase({it->second.last_used, it->first});
  used_ -= it->second.id.size;
  entries_.erase(it);
  stats_.files = entries_.size();
  dirty_ = true;
}

void Store::EvictLocked(uint64_t need) {
  while (!lru_.empty() && used_ + need > o_.quota) {
    auto it = entries_.find(lru_.begin()->second);
    if (it == entries_.end()) {
      lru_.erase(lru_.begin());
      continue;
    }
    DropLocked(it);
    ++stats_.evicted;
  }
}

UniqueFd Store::OpenCopy(uint64_t name) const {
  return UniqueFd(::openat(dir_.get(), CopyName(name).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
}

Result<Store::Entry> Store::Fill(const std::string& rel, const FileId& proof, Outcome* why) {
  *why = Outcome::kDenied;
  // From the root, one component at a time, never through a link: only a file inside the
  // declared tree is ever read, and it must be the proof's very file.
  UniqueFd cur(::open(o_.root.c_str(), O_DIRECTORY | O_PATH | O_CLOEXEC));
  if (!cur.valid()) return Status::FromErrno(errno, "share: the dataset root");
  size_t start = 0;
  for (;;) {
    const size_t slash = rel.find('/', start);
    if (slash == std::string::npos) break;
    const std::string c = rel.substr(start, slash - start);
    UniqueFd next(::openat(cur.get(), c.c_str(), O_DIRECTORY | O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid()) return Status::PermissionDenied("share: not the proof's file");
    cur = std::move(next);
    start = slash + 1;
  }
  const std::string leaf = rel.substr(start);
  struct stat st {};
  if (::fstatat(cur.get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_dev) != proof.dev ||
      static_cast<uint64_t>(st.st_ino) != proof.ino) {
    return Status::PermissionDenied("share: not the proof's file");
  }
  UniqueFd src(
      ::openat(cur.get(), leaf.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!src.valid() || ::fstat(src.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_dev) != proof.dev ||
      static_cast<uint64_t>(st.st_ino) != proof.ino) {
    return Status::PermissionDenied("share: not the proof's file");
  }
  *why = Outcome::kNotStored;
  if (IdOf(st) != proof) return Status::Unavailable("share: the file changed");
  // The copy: an unnamed file of this directory, linked under its name once complete.
  uint64_t name;
  {
    MutexLock l(&mu_);
    name = next_name_++;
  }
  const std::string final_name = CopyName(name);
  const std::string tmp_name = kTmpPrefix + final_name;
  UniqueFd out(::openat(dir_.get(), tmp_name.c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0400));
  if (!out.valid()) return Status::FromErrno(errno, "share: creating a copy");
  auto discard = [&] { (void)::unlinkat(dir_.get(), tmp_name.c_str(), 0); };
  std::vector<std::byte> buf(kChunk);
  XXH3_state_t hs;
  XXH3_64bits_reset(&hs);
  uint64_t off = 0;
  for (;;) {
    const ssize_t n = ::pread(src.get(), buf.data(), buf.size(), static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      discard();
      return Status::FromErrno(errno, "share: reading the PFS");
    }
    if (n == 0) break;
    XXH3_64bits_update(&hs, buf.data(), static_cast<size_t>(n));
    if (Status w = WriteAll(out.get(), buf.data(), static_cast<size_t>(n)); !w.ok()) {
      discard();
      return w;
    }
    off += static_cast<uint64_t>(n);
  }
  if (::fstat(src.get(), &st) != 0 || IdOf(st) != proof || off != proof.size) {
    discard();
    return Status::Unavailable("share: the file changed while it was read");
  }
  if (::renameat(dir_.get(), tmp_name.c_str(), dir_.get(), final_name.c_str()) != 0) {
    discard();
    return Status::FromErrno(errno, "share: naming a copy");
  }
  Entry e;
  e.id = proof;
  e.xxh3 = XXH3_64bits_digest(&hs);
  e.name = name;
  e.verified = true;
  return e;
}

Store::Answer Store::Serve(const std::string& rel, const FileId& proof, bool want_fd) {
  Answer a;
  for (int attempt = 0; attempt < 2; ++attempt) {
    Entry e;
    {
      MutexLock l(&mu_);
      auto it = entries_.find(rel);
      if (it != entries_.end() && it->second.id == proof) {
        Entry& found = it->second;
        lru_.erase({found.last_used, rel});
        found.last_used = ++clock_;
        lru_.insert({found.last_used, rel});
        dirty_ = true;
        e = found;
      } else {
        if (filling_.count(rel) != 0) {
          a.outcome = Outcome::kBusy;
          return a;
        }
        // An entry of another identity stays until the fill shows that the proof is the file
        // at that path now (the file changed on the PFS): a forged proof removes nothing.
        if (proof.size > o_.quota) {
          a.outcome = Outcome::kNotStored;
          return a;
        }
        filling_.insert(rel);
        e.name = 0;
      }
    }
    if (e.name == 0) {
      Outcome why = Outcome::kDenied;
      Result<Entry> filled = Fill(rel, proof, &why);
      MutexLock l(&mu_);
      filling_.erase(rel);
      if (!filled.ok()) {
        a.outcome = why;
        return a;
      }
      e = *filled;
      if (auto old = entries_.find(rel); old != entries_.end()) {
        DropLocked(old);  // the file changed on the PFS: its old copy goes
        ++stats_.replaced;
      }
      EvictLocked(e.id.size);
      e.last_used = ++clock_;
      entries_[rel] = e;
      lru_.insert({e.last_used, rel});
      used_ += e.id.size;
      dirty_ = true;
      ++stats_.filled;
      stats_.filled_bytes += e.id.size;
      stats_.files = entries_.size();
    }
    UniqueFd fd;
    if (want_fd || !e.verified) fd = OpenCopy(e.name);
    bool good = !(want_fd || !e.verified) || fd.valid();
    if (good && !e.verified) {
      Result<std::pair<uint64_t, uint64_t>> h = HashFd(fd.get());
      good = h.ok() && h->first == e.xxh3 && h->second == e.id.size;
      MutexLock l(&mu_);
      auto it = entries_.find(rel);
      if (it != entries_.end() && it->second.name == e.name) {
        if (good) {
          it->second.verified = true;
        } else {
          ++stats_.corrupt;
          DropLocked(it);
        }
      }
    }
    if (!good) continue;  // the copy is gone or damaged: fill it again, once
    a.outcome = Outcome::kReady;
    a.size = e.id.size;
    a.xxh3 = e.xxh3;
    if (want_fd) a.fd = std::move(fd);
    MutexLock l(&mu_);
    ++stats_.served;
    stats_.served_bytes += e.id.size;
    return a;
  }
  a.outcome = Outcome::kNotStored;
  return a;
}

Status Store::Save() {
  MutexLock save(&save_mu_);
  Writer w;
  {
    MutexLock l(&mu_);
    if (!dirty_) return Status::Ok();
    dirty_ = false;
    w.U32(kManifestMagic);
    w.U16(kManifestVersion);
    w.U64(root_dev_);
    w.U64(root_ino_);
    w.U64(next_name_);
    w.U64(entries_.size());
    for (const auto& [rel, e] : entries_) {
      w.Str(rel);
      w.U64(e.id.dev);
      w.U64(e.id.ino);
      w.U64(e.id.size);
      w.U64(static_cast<uint64_t>(e.id.mtime_ns));
      w.U64(static_cast<uint64_t>(e.id.ctime_ns));
      w.U64(e.xxh3);
      w.U64(e.name);
      w.U64(e.last_used);
    }
  }
  std::vector<std::byte> bytes = w.Take();
  const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size());
  Writer tail(std::move(bytes));
  tail.U64(sum);
  bytes = tail.Take();
  auto failed = [&](const Status& s) {
    MutexLock l(&mu_);
    dirty_ = true;
    return s;
  };
  UniqueFd f(::openat(dir_.get(), kManifestTmp,
                      O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!f.valid()) return failed(Status::FromErrno(errno, "share: writing the manifest"));
  if (Status s = WriteAll(f.get(), bytes.data(), bytes.size()); !s.ok()) return failed(s);
  if (::fsync(f.get()) != 0) return failed(Status::FromErrno(errno, "share: fsync"));
  if (::renameat(dir_.get(), kManifestTmp, dir_.get(), kManifest) != 0) {
    return failed(Status::FromErrno(errno, "share: renaming the manifest"));
  }
  return Status::Ok();
}

Result<StoredCopy> ReadStoredCopy(const std::string& dir) {
  UniqueFd d(::open(dir.c_str(), O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!d.valid()) return Status::FromErrno(errno, "share: the store " + dir);
  struct stat st {};
  if (::fstat(d.get(), &st) != 0 || st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    return Status::InvalidArgument("share: the store " + dir +
                                   " must be this user's and writable by no one else");
  }
  UniqueFd m(::openat(d.get(), kManifest, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!m.valid() && errno == ENOENT) return StoredCopy{};
  if (!m.valid() || ::fstat(m.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_uid != ::geteuid()) {
    return Status::InvalidArgument("share: " + dir + "/" + kManifest +
                                   " is not a regular file of this user");
  }
  std::string text;
  text.reserve(static_cast<size_t>(st.st_size));
  std::vector<std::byte> buf(kChunk);
  for (;;) {
    const ssize_t n = ::read(m.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "share: reading " + dir + "/" + kManifest);
    if (n == 0) break;
    text.append(reinterpret_cast<const char*>(buf.data()), static_cast<size_t>(n));
  }
  const Status bad = Status::InvalidArgument("share: " + dir + "/" + kManifest + " does not check");
  if (text.size() < 8) return bad;
  const uint64_t sum =
      coding::LoadLe64(std::as_bytes(std::span(text.data(), text.size())), text.size() - 8);
  if (XXH3_64bits(text.data(), text.size() - 8) != sum) return bad;
  Reader rd(std::string_view(text).substr(0, text.size() - 8));
  uint32_t magic = 0;
  uint16_t version = 0;
  uint64_t dev = 0, ino = 0, next = 0, count = 0;
  if (!rd.U32(&magic) || !rd.U16(&version) || magic != kManifestMagic ||
      version != kManifestVersion || !rd.U64(&dev) || !rd.U64(&ino) || !rd.U64(&next) ||
      !rd.U64(&count)) {
    return bad;
  }
  StoredCopy out;
  for (uint64_t i = 0; i < count; ++i) {
    // rel (a le32 length and its bytes), then dev, ino, size, mtime, ctime, xxh3, name, last_used
    uint32_t rel_len = 0;
    uint64_t dev_ino[2], size = 0;
    if (!rd.U32(&rel_len) || !rd.Skip(rel_len) || !rd.U64(&dev_ino[0]) || !rd.U64(&dev_ino[1]) ||
        !rd.U64(&size) || !rd.Skip(5 * 8)) {
      return bad;
    }
    ++out.files;
    out.bytes += size;
  }
  if (rd.remaining() != 0) return bad;
  return out;
}

Store::Stats Store::stats() const {
  MutexLock l(&mu_);
  Stats s = stats_;
  s.files = entries_.size();
  s.bytes = used_;
  return s;
}

}  // namespace nopfs::share
