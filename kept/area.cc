#include "kept/area.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <span>

#include "common/checksum.h"
#include "common/coding.h"
#include "common/dir_names.h"
#include "common/lock_file.h"
#include "common/small_file.h"
#include "common/unique_fd.h"
#include "kept/tree.h"

namespace nopfs::kept {
namespace {

constexpr std::string_view kManifestMagic = "NOPFSKPT";
constexpr std::string_view kIndexMagic = "NOPFSKIX";
constexpr std::string_view kRecordMagic = "NOPFSKRC";

uint64_t Hash(std::string_view bytes) {
  return ColdXxh3(std::as_bytes(std::span(bytes.data(), bytes.size())));
}

// Appends the xxh3 of everything written so far.
std::string Seal(coding::StringWriter w) {
  const uint64_t h = Hash(w.bytes());
  w.U64(h);
  return w.Take();
}

// Checks magic, version and the trailing xxh3; returns the body after the version.
Result<std::string_view> Unseal(std::string_view bytes, std::string_view magic, const char* what) {
  if (bytes.size() < magic.size() + 4 + 8) {
    return Status::Corruption(std::string(what) + ": truncated (" + std::to_string(bytes.size()) +
                              " bytes)");
  }
  if (bytes.substr(0, magic.size()) != magic) {
    return Status::Corruption(std::string(what) + ": not a nopfs " + what + " (bad magic)");
  }
  const std::string_view sealed = bytes.substr(0, bytes.size() - 8);
  const uint64_t stored =
      coding::LoadLe(reinterpret_cast<const std::byte*>(bytes.data() + sealed.size()), 8);
  if (Hash(sealed) != stored) return Status::Corruption(std::string(what) + ": checksum mismatch");
  const uint32_t version = static_cast<uint32_t>(
      coding::LoadLe(reinterpret_cast<const std::byte*>(bytes.data() + magic.size()), 4));
  if (version != kKeptVersion) {
    return Status::Corruption(std::string(what) + ": version " + std::to_string(version) +
                              ", this nopfs reads version " + std::to_string(kKeptVersion));
  }
  return sealed.substr(magic.size() + 4);
}

void HexTo(uint64_t v, char* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 15; i >= 0; --i) {
    out[i] = kHex[v & 0xf];
    v >>= 4;
  }
}

}  // namespace

std::string KeptAreaDir(const std::string& user_dir) {
  return user_dir + "/kept";
}

Result<int> LockKeptEntry(const std::string& dir) {
  Result<int> fd = LockFileIn(dir, "lock");
  if (fd.ok() && *fd < 0) return Status::Unavailable(dir + "/lock is held by another nopfsd");
  return fd;
}

namespace {

bool InUse(const std::string& kept_dir, const std::string& name, bool grace) {
  UniqueFd kfd(::open(kept_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (kfd.get() < 0) return false;
  UniqueFd dfd(::openat(kfd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dfd.get() < 0) return false;
  UniqueFd lock(::openat(dfd.get(), "lock", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (lock.get() < 0) {
    struct stat st {};
    return grace && errno == ENOENT && ::fstat(dfd.get(), &st) == 0 &&
           int64_t(::time(nullptr)) - int64_t(st.st_ctime) < kKeptLockGraceSeconds;
  }
  struct stat st {};
  if (::fstat(lock.get(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (::flock(lock.get(), LOCK_SH | LOCK_NB) != 0) return errno == EWOULDBLOCK;
  return false;
}

}  // namespace

bool KeptEntryInUse(const std::string& kept_dir, const std::string& name) {
  return InUse(kept_dir, name, true);
}

bool KeptLockHeld(const std::string& dir, const std::string& name) {
  return InUse(dir, name, false);
}

std::string KeptKey(std::string_view canonical_dataset, std::string_view scan_options) {
  coding::StringWriter w;
  w.Str("nopfs kept dataset");
  w.Str(canonical_dataset);
  w.Str(scan_options);
  std::string key(16, '0');
  HexTo(Hash(w.bytes()), key.data());
  return key;
}

bool IsKeptKey(std::string_view name) {
  return name.size() == 16 && std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string EncodeKeptManifest(const KeptManifest& m) {
  coding::StringWriter w;
  w.Bytes(kManifestMagic);
  w.U32(kKeptVersion);
  w.Str(m.key);
  w.Str(m.dataset);
  w.U64(static_cast<uint64_t>(m.created));
  w.U64(static_cast<uint64_t>(m.last_used));
  w.U64(m.samples);
  w.U64(m.index_bytes);
  w.U64(m.index_xxh3);
  w.U32(m.data_files);
  return Seal(std::move(w));
}

Result<KeptManifest> ParseKeptManifest(std::string_view bytes) {
  if (bytes.size() > kMaxManifestBytes) return Status::Corruption("MANIFEST: too large");
  Result<std::string_view> body = Unseal(bytes, kManifestMagic, "MANIFEST");
  if (!body.ok()) return body.status();
  coding::Reader r(*body);
  KeptManifest m;
  uint64_t created = 0, last_used = 0;
  r.Str(&m.key);
  r.Str(&m.dataset);
  r.U64(&created);
  r.U64(&last_used);
  r.U64(&m.samples);
  r.U64(&m.index_bytes);
  r.U64(&m.index_xxh3);
  r.U32(&m.data_files);
  if (!r.ok()) return Status::Corruption(std::string("MANIFEST: ") + r.error());
  if (!r.done()) return Status::Corruption("MANIFEST: trailing bytes");
  if (!IsKeptKey(m.key)) return Status::Corruption("MANIFEST: the key is not 16 hex digits");
  if (m.data_files > kMaxKeptDataFiles) return Status::Corruption("MANIFEST: too many data files");
  if (m.index_bytes > kMaxIndexBytes) return Status::Corruption("MANIFEST: index too large");
  m.created = static_cast<int64_t>(created);
  m.last_used = static_cast<int64_t>(last_used);
  return m;
}

std::string EncodeKeptIndex(const std::vector<KeptSample>& samples) {
  coding::StringWriter w;
  w.Bytes(kIndexMagic);
  w.U32(kKeptVersion);
  w.U64(samples.size());
  for (const KeptSample& s : samples) {
    w.Str(s.relative_path);
    w.U64(s.offset);
    w.U64(s.length);
    w.U64(s.xxh3);
    w.U64(s.file_size);
    w.U64(static_cast<uint64_t>(s.mtime_ns));
    w.U64(static_cast<uint64_t>(s.ctime_ns));
    w.U64(s.inode);
    w.U32(s.data_file);
    w.U64(s.data_offset);
  }
  return Seal(std::move(w));
}

Result<std::vector<KeptSample>> ParseKeptIndex(std::string_view bytes) {
  if (bytes.size() > kMaxIndexBytes) return Status::Corruption("index: too large");
  Result<std::string_view> body = Unseal(bytes, kIndexMagic, "index");
  if (!body.ok()) return body.status();
  coding::Reader r(*body);
  uint64_t count = 0;
  if (!r.U64(&count)) return Status::Corruption(std::string("index: ") + r.error());
  // Each record takes at least 72 bytes: a count past that is a lie, not an allocation.
  if (count > r.remaining() / 72) return Status::Corruption("index: count runs past the end");
  std::vector<KeptSample> out(count);
  for (KeptSample& s : out) {
    uint64_t mtime = 0, ctime = 0;
    r.Str(&s.relative_path);
    r.U64(&s.offset);
    r.U64(&s.length);
    r.U64(&s.xxh3);
    r.U64(&s.file_size);
    r.U64(&mtime);
    r.U64(&ctime);
    r.U64(&s.inode);
    r.U32(&s.data_file);
    r.U64(&s.data_offset);
    if (!r.ok()) return Status::Corruption(std::string("index: ") + r.error());
    s.mtime_ns = static_cast<int64_t>(mtime);
    s.ctime_ns = static_cast<int64_t>(ctime);
  }
  if (!r.done()) return Status::Corruption("index: trailing bytes");
  return out;
}

std::string EncodeKeepRecord(const KeptManifest& manifest, std::string_view index) {
  coding::StringWriter w;
  w.Bytes(kRecordMagic);
  w.U32(kKeptVersion);
  w.Str(EncodeKeptManifest(manifest));
  w.Str(index);
  return Seal(std::move(w));
}

Result<KeepRecord> ParseKeepRecord(std::string_view bytes) {
  if (bytes.size() > kMaxKeepRecordBytes) return Status::Corruption("keep record: too large");
  Result<std::string_view> body = Unseal(bytes, kRecordMagic, "keep record");
  if (!body.ok()) return body.status();
  coding::Reader r(*body);
  // Two le32-length-prefixed byte strings, read in place.
  const auto view = [&r](std::string_view* out) {
    uint32_t n = 0;
    std::span<const std::byte> b;
    if (!r.U32(&n) || !r.Bytes(n, &b)) return false;
    *out = std::string_view(reinterpret_cast<const char*>(b.data()), b.size());
    return true;
  };
  std::string_view manifest, index;
  if (view(&manifest)) view(&index);
  if (!r.ok()) return Status::Corruption(std::string("keep record: ") + r.error());
  if (!r.done()) return Status::Corruption("keep record: trailing bytes");
  KeepRecord out;
  Result<KeptManifest> m = ParseKeptManifest(manifest);
  if (!m.ok()) return m.status().WithContext("keep record");
  if (m->index_bytes != index.size() || Hash(index) != m->index_xxh3) {
    return Status::Corruption("keep record: the index differs from what its MANIFEST records");
  }
  Result<std::vector<KeptSample>> samples = ParseKeptIndex(index);
  if (!samples.ok()) return samples.status().WithContext("keep record");
  if (samples->size() != m->samples) {
    return Status::Corruption("keep record: the MANIFEST counts " + std::to_string(m->samples) +
                              " samples, the index holds " + std::to_string(samples->size()));
  }
  out.manifest = std::move(*m);
  out.samples = std::move(*samples);
  return out;
}

Status WriteFileDurably(const std::string& dir, const std::string& name, std::string_view bytes) {
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dfd.get() < 0) return Status::FromErrno(errno, dir);
  const std::string tmp = ".tmp." + name;
  const std::string path = dir + "/" + name;
  UniqueFd fd(::openat(dfd.get(), tmp.c_str(),
                       O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (fd.get() < 0) return Status::FromErrno(errno, dir + "/" + tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, dir + "/" + tmp);
    done += size_t(n);
  }
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, dir + "/" + tmp);
  if (::renameat(dfd.get(), tmp.c_str(), dfd.get(), name.c_str()) != 0) {
    return Status::FromErrno(errno, path);
  }
  if (::fsync(dfd.get()) != 0) return Status::FromErrno(errno, dir);
  return Status::Ok();
}

Result<std::vector<KeptDataset>> ListKept(const std::string& kept_dir) {
  std::vector<KeptDataset> out;
  UniqueFd kfd(::open(kept_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (kfd.get() < 0) {
    if (errno == ENOENT) return out;
    return Status::FromErrno(errno, kept_dir);
  }
  Result<std::vector<std::string>> all = DirNames(kfd.get(), kept_dir);
  if (!all.ok()) return all.status();
  const std::vector<std::string>& names = *all;
  for (const std::string& name : names) {
    KeptDataset k;
    k.key = name;
    k.dir = kept_dir + "/" + name;
    struct stat st {};
    if (::fstatat(kfd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone
    // Everything in the entry, whatever its shape (kept/tree.h).
    k.bytes = UsageAt(kfd.get(), name, k.dir).bytes;
    if (!S_ISDIR(st.st_mode)) {
      out.push_back(std::move(k));
      continue;
    }
    UniqueFd dfd(
        ::openat(kfd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (dfd.get() < 0) {
      out.push_back(std::move(k));
      continue;
    }
    if (IsKeptKey(name)) {
      Result<std::string> bytes =
          ReadSmallFileAt(dfd.get(), "MANIFEST", SmallFileRules{kMaxManifestBytes, {}});
      if (bytes.ok()) {
        Result<KeptManifest> m = ParseKeptManifest(*bytes);
        if (m.ok() && m->key == name) {
          k.dataset = m->dataset;
          k.samples = m->samples;
          k.created = m->created;
          k.last_used = m->last_used;
          k.complete = true;
        }
      }
    }
    out.push_back(std::move(k));
  }
  return out;
}

Status RemoveKept(const std::string& kept_dir, const std::string& name) {
  UniqueFd kfd(::open(kept_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (kfd.get() < 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::FromErrno(errno, kept_dir);
  }
  return RemoveKeptAt(kfd.get(), kept_dir, name);
}

Status RemoveKeptAt(int kept_fd, const std::string& shown, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return Status::InvalidArgument("kept entry \"" + name +
                                   "\": not an entry name; give a key (16 hex digits) or a .tmp.* "
                                   "name as `nopfs cache ls` shows it");
  }
  return RemoveTreeAt(kept_fd, name, shown + "/" + name);
}

}  // namespace nopfs::kept
