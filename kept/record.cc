#include "kept/record.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <sstream>
#include <thread>

#include "common/small_file.h"
#include "kept/area.h"
#include "kept/tree.h"

namespace nopfs::kept {
namespace {

constexpr char kFile[] = "kept";
constexpr char kTemp[] = "kept.tmp";

bool Trusted(const struct stat& st) {
  return S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0;
}

template <typename T>
bool Number(std::string_view s, T* out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && !s.empty();
}

}  // namespace

std::string FormatRootRecord(const std::map<RootRecord::Key, RootTimes>& times) {
  std::string out;
  for (const auto& [k, t] : times) {
    out += std::to_string(k.first) + " " + k.second + " " + std::to_string(t.first_seen) + " " +
           std::to_string(t.last_used) + "\n";
  }
  return out;
}

std::map<RootRecord::Key, RootTimes> ParseRootRecord(const std::string& text) {
  std::map<RootRecord::Key, RootTimes> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string uid, key, seen, used, extra;
    if (!(f >> uid >> key >> seen >> used) || (f >> extra)) continue;
    uint32_t u = 0;
    RootTimes t;
    if (!Number(uid, &u) || !IsKeptKey(key) || !Number(seen, &t.first_seen) ||
        !Number(used, &t.last_used)) {
      continue;
    }
    out[{u, key}] = t;
  }
  return out;
}

Result<RootRecord> RootRecord::Open(const std::string& ssd_path, std::chrono::milliseconds timeout,
                                    std::string* note) {
  note->clear();
  const std::string shown = ssd_path + "/" + kRootRecordDir;
  UniqueFd parent(::open(ssd_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent.valid()) return Status::FromErrno(errno, ssd_path);
  UniqueFd dir;
  for (int attempt = 0; attempt < 3 && !dir.valid(); ++attempt) {
    if (::mkdirat(parent.get(), kRootRecordDir, 0700) != 0 && errno != EEXIST) {
      return Status::FromErrno(errno, "creating " + shown);
    }
    UniqueFd fd(
        ::openat(parent.get(), kRootRecordDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    if (fd.valid() && ::fstat(fd.get(), &st) == 0 && Trusted(st)) {
      dir = std::move(fd);
      break;
    }
    // Not root's own directory (made first by a user in a sticky scratch directory, a link, a
    // file): taken apart without following anything, and made anew.
    if (struct stat lst{};
        ::fstatat(parent.get(), kRootRecordDir, &lst, AT_SYMLINK_NOFOLLOW) == 0) {
      *note = shown + " (uid " + std::to_string(lst.st_uid) + ", not root's directory) removed";
    }
    NOPFS_RETURN_IF_ERROR(RemoveTreeAt(parent.get(), kRootRecordDir, shown));
  }
  if (!dir.valid()) return Status::Unavailable(shown + " keeps being replaced by another user");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (::flock(dir.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return Status::FromErrno(errno, "flock " + shown);
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Unavailable(shown + ": held by another nopfs-job or nopfs gc for " +
                                 std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  RootRecord r(std::move(dir), shown);
  Result<std::string> text =
      ReadSmallFileAt(r.dir_.get(), kFile, SmallFileRules{kMaxRootRecordBytes, ::geteuid()});
  if (text.ok()) {
    r.times_ = ParseRootRecord(*text);
  } else if (text.status().code() != StatusCode::kNotFound) {
    *note += (note->empty() ? "" : "; ") + shown + "/" + kFile + ": " + text.status().message() +
             " (made anew)";
  }
  return r;
}

Status RootRecord::Save() {
  if (!dirty_) return Status::Ok();
  const std::string text = FormatRootRecord(times_);
  const std::string tmp = shown_ + "/" + kTemp;
  (void)::unlinkat(dir_.get(), kTemp, 0);
  UniqueFd fd(
      ::openat(dir_.get(), kTemp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return Status::FromErrno(errno, tmp);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, tmp);
    done += size_t(n);
  }
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, tmp);
  if (::renameat(dir_.get(), kTemp, dir_.get(), kFile) != 0) {
    return Status::FromErrno(errno, shown_ + "/" + kFile);
  }
  if (::fsync(dir_.get()) != 0) return Status::FromErrno(errno, shown_);
  dirty_ = false;
  return Status::Ok();
}

}  // namespace nopfs::kept
