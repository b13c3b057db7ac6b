// nopfs-job's record of a job, at the epilog: the summary nopfsd left in its run directory, as
// one line for slurmd's log and the job's output, and the warning for a job that staged data but
// read nothing through nopfs. The summary is the user's file (nopfsd runs as the user): it is
// read as hostile input and only its numbers, and names made printable, reach root's lines.
#include <sys/xattr.h>

#include <cinttypes>

#include "common/dir_names.h"
#include "common/printable.h"
#include "protocol/wire.h"
#include "spank/launcher.h"

namespace nopfs::spank::launcher {

std::optional<report::StatusReport> ReadSummary(const std::string& node_dir, uint64_t job_id,
                                                uid_t uid, std::string* why) {
  Result<UniqueFd> node = OpenTrustedDir(node_dir);
  if (!node.ok()) {
    *why = node.status().message();
    return std::nullopt;
  }
  const std::string job = std::to_string(job_id);
  const UniqueFd run(
      ::openat(node->get(), job.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!run.valid()) {
    *why = Status::FromErrno(errno, node_dir + "/" + job).message();
    return std::nullopt;
  }
  Result<std::string> bytes =
      ReadUserFile(run.get(), launch::kSummaryName, uid, launch::kMaxSummaryBytes);
  if (!bytes.ok()) {
    *why = bytes.status().message();
    return std::nullopt;
  }
  Result<wire::Message> m = wire::Decode(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes->data()), bytes->size()));
  const wire::StatusOk* ok = m.ok() ? std::get_if<wire::StatusOk>(&m->body) : nullptr;
  if (ok == nullptr || !ok->report) {
    *why = "not a status report" + (m.ok() ? std::string() : ": " + m.status().message());
    return std::nullopt;
  }
  return *ok->report;
}

std::string DescribeSummary(const report::StatusReport& r) {
  uint64_t served = 0;
  std::string sources;
  for (const report::Source& s : r.sources) {
    served += s.samples;
    sources +=
        (sources.empty() ? "" : ", ") + Printable(s.name, 16) + " " + std::to_string(s.samples);
  }
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "served %" PRIu64 " samples (%s); read %s from the PFS; stall median %s, p99 %s",
                served, sources.c_str(), FormatBytes(static_cast<double>(r.pfs_bytes)).c_str(),
                report::FormatSeconds(static_cast<double>(r.stall.median_ns) * 1e-9).c_str(),
                report::FormatSeconds(static_cast<double>(r.stall.p99_ns) * 1e-9).c_str());
  std::string out = buf;
  if (r.kept) {
    std::snprintf(buf, sizeof buf, "; adopted %" PRIu64 " samples, kept %s",
                  r.kept->adopted_samples,
                  FormatBytes(static_cast<double>(r.kept->kept_bytes)).c_str());
    out += buf;
  }
  if (r.siblings && r.siblings->read_samples > 0) {
    out += "; " + std::to_string(r.siblings->read_samples) + " samples through a sibling job";
  }
  if (r.peers) {
    std::snprintf(buf, sizeof buf, "; peers: node %u of %u, fetched %" PRIu64 ", served %" PRIu64,
                  r.peers->node, r.peers->nodes, r.peers->fetched_samples, r.peers->served_samples);
    out += buf;
  }
  uint64_t failed = 0;
  for (const report::Tier& t : r.tiers)
    failed += t.failed;
  std::snprintf(buf, sizeof buf,
                "; errors: %" PRIu64 " staging, %" PRIu64 " corrupt, %" PRIu64 " changed", failed,
                r.corrupt, r.changed);
  return out + buf;
}

std::string UnusedWarning(const report::StatusReport& r) {
  uint64_t served = 0, staged = 0;
  for (const report::Source& s : r.sources)
    served += s.samples;
  for (const report::Tier& t : r.tiers)
    staged += t.ready_bytes;
  if (served > 0 || (staged == 0 && r.pfs_bytes == 0)) return "";
  return "warning: this job staged " +
         FormatBytes(static_cast<double>(std::max(staged, r.pfs_bytes))) +
         " of its dataset but read nothing through nopfs (the script read the files itself): "
         "import DataLoader, DistributedSampler and ImageFolder from nopfs.torch instead of "
         "torch and torchvision (docs/python.md, \"The three-line change\"), or submit without "
         "--nopfs";
}

namespace {

// A POSIX ACL (the system.posix_acl_access extended attribute, little-endian): the owner reads and
// writes, `uid` reads, nobody else.
std::string ReadableBy(uid_t uid) {
  std::string acl;
  auto u16 = [&](uint16_t v) {
    acl += static_cast<char>(v & 0xff);
    acl += static_cast<char>(v >> 8);
  };
  auto u32 = [&](uint32_t v) {
    u16(static_cast<uint16_t>(v & 0xffff));
    u16(static_cast<uint16_t>(v >> 16));
  };
  constexpr uint32_t kUndefined = 0xffffffff;
  u32(2);                                                        // the format's version
  for (auto [tag, perm, id] : {std::tuple{0x01, 6, kUndefined},  // the owner: rw
                               std::tuple{0x02, 4, static_cast<uint32_t>(uid)},  // the user: r
                               std::tuple{0x04, 0, kUndefined},     // the owning group: nothing
                               std::tuple{0x10, 4, kUndefined},     // the mask
                               std::tuple{0x20, 0, kUndefined}}) {  // others: nothing
    u16(static_cast<uint16_t>(tag));
    u16(static_cast<uint16_t>(perm));
    u32(id);
  }
  return acl;
}

// Removes nopfsd-*.log files of `dir_fd` last changed more than `days` ago.
void RemoveOldLogs(int dir_fd, uint32_t days) {
  Result<std::vector<std::string>> names = DirNames(dir_fd, "job_logs.dir");
  if (!names.ok()) return;
  const time_t oldest = ::time(nullptr) - static_cast<time_t>(days) * 86400;
  for (const std::string& name : *names) {
    if (name.rfind("nopfsd-", 0) != 0 || name.size() < 5 || name.substr(name.size() - 4) != ".log")
      continue;
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_mtime < oldest)
      ::unlinkat(dir_fd, name.c_str(), 0);
  }
}

}  // namespace

std::string KeepJobLog(const Job& job, const std::string& log_dir, uint32_t days) {
  Result<UniqueFd> dir = MakeTrustedDir(log_dir, 0755);
  if (!dir.ok()) return "nopfsd's log not kept: " + dir.status().message();
  RemoveOldLogs(dir->get(), days);
  Result<UniqueFd> node = OpenTrustedDir(job.node_dir);
  if (!node.ok()) return "nopfsd's log not kept: " + node.status().message();
  const std::string id = std::to_string(job.job_id);
  const UniqueFd run(
      ::openat(node->get(), id.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!run.valid())
    return "nopfsd's log not kept: " + Status::FromErrno(errno, job.run_dir).message();
  Result<std::string> text = ReadUserFile(run.get(), launch::kLogName, job.uid, kMaxKeptLogBytes);
  if (!text.ok()) return "nopfsd's log not kept: " + text.status().message();
  const std::string name = "nopfsd-" + id + "-" + job.node + ".log";
  const UniqueFd out(::openat(dir->get(), name.c_str(),
                              O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
  const std::string shown = log_dir + "/" + name;
  if (!out.valid()) return "nopfsd's log not kept: " + Status::FromErrno(errno, shown).message();
  if (::write(out.get(), text->data(), text->size()) != static_cast<ssize_t>(text->size())) {
    const int err = errno;
    ::unlinkat(dir->get(), name.c_str(), 0);
    return "nopfsd's log not kept: " + Status::FromErrno(err, shown).message();
  }
  const std::string acl = ReadableBy(job.uid);
  if (::fsetxattr(out.get(), "system.posix_acl_access", acl.data(), acl.size(), 0) != 0) {
    return "nopfsd's log kept as " + shown + " (root's alone: " + std::strerror(errno) + ")";
  }
  return "nopfsd's log kept as " + shown;
}

Status AppendAsUser(const std::string& path, uid_t uid, gid_t gid, const std::string& text) {
  if (path.empty() || path[0] != '/') return Status::InvalidArgument("no absolute output path");
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe");
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return Status::FromErrno(errno, "fork");
  }
  if (pid == 0) {
    ::close(pipe_fds[0]);
    int err = 0;
    if (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0 ||
        ::setresuid(uid, uid, uid) != 0) {
      err = errno;
    } else {
      const int fd = ::open(path.c_str(),
                            O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
      struct stat st {};
      if (fd < 0) {
        err = errno;
      } else if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        err = EINVAL;
      } else if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
        err = errno != 0 ? errno : EIO;
      }
    }
    (void)!::write(pipe_fds[1], &err, sizeof err);
    _exit(0);
  }
  ::close(pipe_fds[1]);
  int err = EIO;
  ssize_t n;
  do {
    n = ::read(pipe_fds[0], &err, sizeof err);
  } while (n < 0 && errno == EINTR);
  ::close(pipe_fds[0]);
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(sizeof err)) err = EIO;
  if (err != 0)
    return Status::FromErrno(err, "appending to " + path + " as uid " + std::to_string(uid));
  return Status::Ok();
}

}  // namespace nopfs::spank::launcher
