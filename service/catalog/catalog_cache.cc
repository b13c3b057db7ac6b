// The catalog cache's file protocol (see catalog_cache.h and docs/catalog.md).
#include "service/catalog/catalog_cache.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <filesystem>

namespace nopfs::service::cache {
namespace {

namespace fs = std::filesystem;

// Temporary and replaced cache entries older than this are left over by a crashed job.
constexpr auto kStaleAge = std::chrono::hours(6);

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Status EnsureDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) == 0) return Status::Ok();
  if (errno != EEXIST) return Status::FromErrno(errno, "creating directory " + path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, path);
  if (!S_ISDIR(st.st_mode))
    return Status::FailedPrecondition(path + " exists and is not a directory");
  return Status::Ok();
}

Result<std::string> UserCacheDir(const std::string& cache_dir, uint32_t uid) {
  struct stat st {};
  if (::stat(cache_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::FailedPrecondition("catalog cache directory " + cache_dir +
                                      " does not exist; the admin creates it (root-owned, mode "
                                      "0755: the prolog makes each user's subdirectory), or "
                                      "leave catalog_cache out");
  }
  const std::string dir = cache_dir + "/" + std::to_string(uid);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "creating catalog cache directory " + dir +
                                        " (in a root-owned cache directory the prolog makes it)");
  }
  if (::lstat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, dir);
  if (!S_ISDIR(st.st_mode) || st.st_uid != uid || (st.st_mode & 0022) != 0) {
    return Status::PermissionDenied(dir + " must be a directory owned by uid " +
                                    std::to_string(uid) +
                                    " and writable by no one else; remove it so nopfsd recreates "
                                    "it");
  }
  return dir;
}

std::string EntryPath(const std::string& user_dir, const std::string& real) {
  return user_dir + "/" + Hex16(XXH3_64bits(real.data(), real.size()));
}

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string UniqueSuffix() {
  static std::atomic<uint64_t> counter{0};
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof host - 1);
  return std::string(host) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1)) + "-" + Hex16(static_cast<uint64_t>(NowNs()));
}

void RemoveStale(const std::string& dir) {
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(".tmp-", 0) != 0 && name.rfind(".old-", 0) != 0) continue;
    std::error_code ec2;
    const auto t = fs::last_write_time(it->path(), ec2);
    if (!ec2 && now - t > kStaleAge) fs::remove_all(it->path(), ec2);
  }
}

Status Install(const std::string& tmp, const std::string& entry) {
  const auto failed = [&](const char* what) {
    return Status::FromErrno(errno, std::string(what) + " catalog " + tmp + " as " + entry);
  };
  // Racing jobs may install between our steps; each round either finishes or saw a racer.
  for (int round = 0; round < 8; ++round) {
    if (::rename(tmp.c_str(), entry.c_str()) == 0) return Status::Ok();
    if (errno != EEXIST && errno != ENOTEMPTY) return failed("installing");
    // An entry exists (stale, or just installed by a racing job): swap, then drop the old one.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, entry.c_str(), RENAME_EXCHANGE) == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);  // now holds the old DB
      return Status::Ok();
    }
    if (errno == ENOENT) continue;  // the entry vanished meanwhile: plain rename again
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return failed("installing");
    // No RENAME_EXCHANGE on this file system: move the old entry aside first.
    const std::string old = fs::path(entry).parent_path().string() + "/.old-" +
                            fs::path(entry).filename().string() + "-" + UniqueSuffix();
    if (::rename(entry.c_str(), old.c_str()) != 0 && errno != ENOENT) {
      return failed("moving aside the old entry for");
    }
    const bool ok = ::rename(tmp.c_str(), entry.c_str()) == 0;
    const int err = errno;
    std::error_code ec;
    fs::remove_all(old, ec);
    if (ok) return Status::Ok();
    if (err != EEXIST && err != ENOTEMPTY) {
      errno = err;
      return failed("installing");
    }
  }
  return Status::Unavailable("installing catalog " + tmp + " as " + entry +
                             ": other jobs kept replacing the entry; try again");
}

}  // namespace nopfs::service::cache
