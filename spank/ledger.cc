#include "spank/ledger.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <sstream>
#include <thread>

#include "common/small_file.h"

namespace nopfs::spank {
namespace {

bool ParseU64(std::string_view s, uint64_t* v) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *v);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// The keys this version writes.
constexpr std::string_view kKnownKeys[] = {"job",          "uid",
                                           "node_index",   "ram",
                                           "ssd",          "boot",
                                           "pid",          "start",
                                           "ssd_path",     "metrics_dir",
                                           "keep",         "keep_max_bytes",
                                           "keep_dataset", "sibling_dataset"};

bool IsKnownKey(std::string_view key) {
  return std::find(std::begin(kKnownKeys), std::end(kKnownKeys), key) != std::end(kKnownKeys);
}

// "key=value" with a key of what FormatEntry writes (lower-case letters, digits, '_') that is
// none of this version's, and no newline: a line of a newer version's entry.
bool IsUnknownLine(std::string_view line) {
  const size_t eq = line.find('=');
  if (eq == 0 || eq == std::string_view::npos || line.find('\n') != std::string_view::npos) {
    return false;
  }
  const std::string_view key = line.substr(0, eq);
  return !IsKnownKey(key) && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

std::string FormatEntry(const LedgerEntry& e) {
  std::string out = "job=" + std::to_string(e.job_id) + "\nuid=" + std::to_string(e.uid) +
                    "\nnode_index=" + std::to_string(e.node_index) +
                    "\nram=" + std::to_string(e.ram) + "\nssd=" + std::to_string(e.ssd) +
                    "\nboot=" + e.boot_id + "\npid=" + std::to_string(e.pid) +
                    "\nstart=" + std::to_string(e.start_time) + "\n";
  for (const std::string& p : e.ssd_paths) {
    if (!p.empty() && p.find('\n') == std::string::npos) out += "ssd_path=" + p + "\n";
  }
  if (!e.metrics_dir.empty() && e.metrics_dir.find('\n') == std::string::npos) {
    out += "metrics_dir=" + e.metrics_dir + "\n";
  }
  if (e.keep) {
    out += "keep=1\nkeep_max_bytes=" + std::to_string(e.keep_max_bytes) + "\n";
    if (!e.keep_dataset.empty() && e.keep_dataset.find('\n') == std::string::npos) {
      out += "keep_dataset=" + e.keep_dataset + "\n";
    }
  }
  if (!e.sibling_dataset.empty() && e.sibling_dataset.find('\n') == std::string::npos) {
    out += "sibling_dataset=" + e.sibling_dataset + "\n";
  }
  for (const std::string& line : e.unknown) {
    if (IsUnknownLine(line)) out += line + "\n";
  }
  return out;
}

Result<LedgerEntry> ParseEntry(const std::string& text) {
  LedgerEntry e;
  uint32_t seen = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) return Status::Corruption("ledger entry line '" + line + "'");
    const std::string key = line.substr(0, eq);
    const std::string_view value = std::string_view(line).substr(eq + 1);
    uint64_t v = 0;
    if (key == "boot") {
      e.boot_id = std::string(value);
      seen |= 1u << 0;
      continue;
    }
    if (key == "metrics_dir") {
      if (value.empty()) return Status::Corruption("ledger entry line '" + line + "'");
      e.metrics_dir = std::string(value);
      continue;
    }
    if (key == "keep_dataset") {
      if (value.empty()) return Status::Corruption("ledger entry line '" + line + "'");
      e.keep_dataset = std::string(value);
      continue;
    }
    if (key == "sibling_dataset") {
      if (value.empty()) return Status::Corruption("ledger entry line '" + line + "'");
      e.sibling_dataset = std::string(value);
      continue;
    }
    if (key == "ssd_path") {
      if (value.empty()) return Status::Corruption("ledger entry line '" + line + "'");
      e.ssd_paths.emplace_back(value);
      continue;
    }
    if (!IsKnownKey(key)) {
      if (!IsUnknownLine(line)) return Status::Corruption("ledger entry key '" + key + "'");
      e.unknown.push_back(line);  // a newer version's: kept as it is
      continue;
    }
    if (!ParseU64(value, &v)) return Status::Corruption("ledger entry value '" + line + "'");
    if (key == "job") {
      e.job_id = v;
      seen |= 1u << 1;
    } else if (key == "uid") {
      e.uid = static_cast<uint32_t>(v);
      seen |= 1u << 2;
    } else if (key == "node_index") {
      e.node_index = static_cast<uint32_t>(v);
      seen |= 1u << 3;
    } else if (key == "ram") {
      e.ram = v;
      seen |= 1u << 4;
    } else if (key == "ssd") {
      e.ssd = v;
      seen |= 1u << 5;
    } else if (key == "pid") {
      e.pid = static_cast<int64_t>(v);
      seen |= 1u << 6;
    } else if (key == "start") {
      e.start_time = v;
      seen |= 1u << 7;
    } else if (key == "keep") {
      if (v > 1) return Status::Corruption("ledger entry value '" + line + "'");
      e.keep = v == 1;
    } else {
      e.keep_max_bytes = v;
    }
  }
  if (seen != 0xffu) return Status::Corruption("ledger entry misses fields");
  return e;
}

Result<Ledger> Ledger::Lock(const std::string& dir, std::chrono::milliseconds timeout) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "ledger: mkdir " + dir);
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, "ledger: " + dir);
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return Status::FailedPrecondition("ledger: " + dir +
                                      " must be a directory of this user with mode 0700");
  }
  const std::string lock = dir + "/lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Status::FromErrno(errno, "ledger: open " + lock);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const int err = errno;
      ::close(fd);
      return Status::FromErrno(err, "ledger: flock " + lock);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::close(fd);
      return Status::TimedOut("ledger: " + lock + " stayed locked for " +
                              std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Ledger(dir, fd);
}

Ledger::Ledger(Ledger&& other) noexcept : dir_(std::move(other.dir_)), fd_(other.fd_) {
  other.fd_ = -1;
}

Ledger::~Ledger() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

Result<std::vector<LedgerEntry>> Ledger::Entries() const {
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return Status::FromErrno(errno, "ledger: opendir " + dir_);
  std::vector<LedgerEntry> out;
  std::vector<std::string> bad;
  while (dirent* ent = ::readdir(d)) {
    const std::string name = ent->d_name;
    uint64_t job = 0;
    if (!ParseU64(name, &job)) continue;  // ".", "..", "lock", temporary files
    const std::string path = dir_ + "/" + name;
    Result<std::string> text = ReadSmallFile(path, SmallFileRules{});
    if (!text.ok() && text.status().code() == StatusCode::kNotFound) continue;  // removed meanwhile
    if (!text.ok() && text.status().code() != StatusCode::kPermissionDenied) {
      // Unreadable, not malformed: it may be a live job's entry, so it is neither dropped nor
      // removed.
      ::closedir(d);
      return text.status().WithContext("ledger: entry " + path + " cannot be read");
    }
    // A link, not a regular file or too large: malformed, like one that does not parse.
    Result<LedgerEntry> e = text.ok() ? ParseEntry(*text) : Result<LedgerEntry>(text.status());
    if (!e.ok() || e->job_id != job) {
      bad.push_back(name);
      continue;
    }
    out.push_back(*e);
  }
  ::closedir(d);
  for (const std::string& name : bad)
    ::unlink((dir_ + "/" + name).c_str());
  return out;
}

Status Ledger::Put(const LedgerEntry& e) const {
  const std::string path = dir_ + "/" + std::to_string(e.job_id);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Status::FromErrno(errno, "ledger: create " + tmp);
  const std::string text = FormatEntry(e);
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    return Status::FromErrno(err, "ledger: write " + tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rerr = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno(rerr, "ledger: rename " + tmp);
  }
  const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

Status Ledger::Remove(uint64_t job_id) const {
  const std::string path = dir_ + "/" + std::to_string(job_id);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno(errno, "ledger: unlink " + path);
  }
  return Status::Ok();
}

std::string BootId() {
  Result<std::string> read = ReadSmallFile("/proc/sys/kernel/random/boot_id", SmallFileRules{});
  if (!read.ok()) return "";  // the kernel does not say
  std::string id = std::move(*read);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' '))
    id.pop_back();
  return id;
}

std::optional<uint64_t> ProcessStartTime(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  Result<std::string> read = ReadSmallFile("/proc/" + std::to_string(pid) + "/stat", {});
  if (!read.ok()) return std::nullopt;  // no such process (or it cannot be read: not known alive)
  const std::string& stat = *read;
  // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return std::nullopt;
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  char state = 0;
  in >> state;
  if (state == 'Z' || state == 'X' || state == 0) return std::nullopt;
  // Fields 4..21 precede the start time (field 22); `state` was field 3.
  for (int i = 4; i <= 21; ++i)
    in >> field;
  uint64_t start = 0;
  if (!(in >> start)) return std::nullopt;
  return start;
}

bool IsProcessAlive(pid_t pid, uint64_t start_time) {
  const std::optional<uint64_t> s = ProcessStartTime(pid);
  return s.has_value() && *s == start_time;
}

}  // namespace nopfs::spank
