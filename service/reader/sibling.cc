#include "service/reader/sibling.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>

#include <dirent.h>
#include <spdlog/spdlog.h>

#include "protocol/wire.h"

namespace nopfs::service {
namespace {

constexpr char kMagicLine[] = "nopfs-live 1";

// Opens `name` in `dfd` as a directory, never following a link, and checks that only this uid
// owns and can use it.
Result<UniqueFd> OpenPrivateDir(int dfd, const std::string& name, const std::string& path) {
  UniqueFd fd(::openat(dfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(errno, "sibling registry: opening " + path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "sibling registry: " + path);
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return Status::PermissionDenied("sibling registry: " + path + " is owned by uid " +
                                    std::to_string(st.st_uid) + " with mode " +
                                    std::to_string(st.st_mode & 0777) +
                                    ", not by this user with mode 0700; not used");
  }
  return fd;
}

bool ParseU64(std::string_view s, uint64_t* v, int base = 10) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, base);
  return ec == std::errc() && p == s.data() + s.size();
}

bool ProcessGone(uint32_t pid) {
  return pid == 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
}

Status WriteAll(int fd, const std::byte* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::FromErrno(errno, "write");
    data += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

}  // namespace

std::string LiveDir(const std::string& user_dir) {
  return user_dir + "/" + kLiveName;
}

std::string EncodeLiveEntry(const LiveEntry& e) {
  char fp[17];
  std::snprintf(fp, sizeof(fp), "%016llx", static_cast<unsigned long long>(e.fingerprint));
  return std::string(kMagicLine) + "\njob " + e.job + "\npid " + std::to_string(e.pid) +
         "\nstarted " + std::to_string(e.started_ns) + "\nfingerprint " + fp + "\nsocket " +
         e.socket + "\n";
}

bool LiveBefore(const LiveEntry& a, const LiveEntry& b) {
  return a.started_ns != b.started_ns ? a.started_ns < b.started_ns : a.name < b.name;
}

Result<LiveEntry> ParseLiveEntry(std::string_view text) {
  if (text.size() > kMaxLiveEntryBytes) {
    return Status::InvalidArgument("sibling registry entry: longer than " +
                                   std::to_string(kMaxLiveEntryBytes) + " bytes");
  }
  std::map<std::string, std::string, std::less<>> fields;
  bool first = true;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) {
      return Status::InvalidArgument("sibling registry entry: its last line is cut");
    }
    const std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl + 1);
    if (first) {
      if (line != kMagicLine) {
        return Status::InvalidArgument("sibling registry entry: does not start with \"" +
                                       std::string(kMagicLine) + "\"");
      }
      first = false;
      continue;
    }
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) {
      return Status::InvalidArgument("sibling registry entry: a line without a value");
    }
    if (!fields.emplace(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1))).second) {
      return Status::InvalidArgument("sibling registry entry: a field appears twice");
    }
  }
  LiveEntry e;
  uint64_t pid = 0, started = 0;
  if (first || fields.size() != 5 || !fields.count("job") || !fields.count("socket") ||
      !fields.count("pid") || !ParseU64(fields["pid"], &pid) || pid > UINT32_MAX ||
      !fields.count("started") || !ParseU64(fields["started"], &started) ||
      !fields.count("fingerprint") || fields["fingerprint"].size() != 16 ||
      !ParseU64(fields["fingerprint"], &e.fingerprint, 16) || fields["socket"].empty() ||
      fields["socket"][0] != '/') {
    return Status::InvalidArgument(
        "sibling registry entry: needs exactly job, pid, started, fingerprint (16 hex digits) "
        "and socket (an absolute path)");
  }
  e.job = fields["job"];
  e.socket = fields["socket"];
  e.pid = static_cast<uint32_t>(pid);
  e.started_ns = static_cast<int64_t>(started);
  return e;
}

Result<std::string> RegisterLive(const std::string& user_dir, const std::string& key,
                                 const LiveEntry& entry) {
  if (entry.job.empty() || entry.job.find('/') != std::string::npos || entry.job[0] == '.') {
    return Status::InvalidArgument("sibling registry: job \"" + entry.job + "\" is not a name");
  }
  UniqueFd udir(::open(user_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!udir.valid()) return Status::FromErrno(errno, "sibling registry: opening " + user_dir);
  const std::string live = LiveDir(user_dir);
  // Another job's UnregisterLive may remove the empty directory between its creation and its
  // opening here: then it is created again.
  Result<UniqueFd> dfd = Status::NotFound(live);
  for (int attempt = 0; attempt < 3 && !dfd.ok() && dfd.status().code() == StatusCode::kNotFound;
       ++attempt) {
    if (::mkdirat(udir.get(), kLiveName, 0700) != 0 && errno != EEXIST) {
      return Status::FromErrno(errno, "sibling registry: creating " + live);
    }
    dfd = OpenPrivateDir(udir.get(), kLiveName, live);
  }
  if (!dfd.ok()) return dfd.status();
  const std::string name = key + "." + entry.job;
  const std::string tmp = ".tmp." + name;
  (void)::unlinkat(dfd->get(), tmp.c_str(), 0);
  UniqueFd fd(::openat(dfd->get(), tmp.c_str(),
                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid())
    return Status::FromErrno(errno, "sibling registry: creating " + live + "/" + tmp);
  const std::string text = EncodeLiveEntry(entry);
  Status w = WriteAll(fd.get(), reinterpret_cast<const std::byte*>(text.data()), text.size());
  fd.Reset();
  if (w.ok() && ::renameat(dfd->get(), tmp.c_str(), dfd->get(), name.c_str()) != 0) {
    w = Status::FromErrno(errno, "rename");
  }
  if (!w.ok()) {
    (void)::unlinkat(dfd->get(), tmp.c_str(), 0);
    return w.WithContext("sibling registry: writing " + live + "/" + name);
  }
  return live + "/" + name;
}

void UnregisterLive(const std::string& path) {
  if (path.empty()) return;
  (void)::unlink(path.c_str());
  // The directory goes with its last entry (ENOTEMPTY while other jobs run), as the per-user
  // directory does with its last job.
  (void)::rmdir(path.substr(0, path.rfind('/')).c_str());
}

void RemoveLive(const std::string& user_dir, const std::string& name) {
  UniqueFd udir(::open(user_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!udir.valid()) return;
  Result<UniqueFd> dfd = OpenPrivateDir(udir.get(), kLiveName, LiveDir(user_dir));
  if (dfd.ok() && name.find('/') == std::string::npos)
    (void)::unlinkat(dfd->get(), name.c_str(), 0);
}

Result<std::vector<LiveEntry>> FindLive(const std::string& user_dir, const std::string& key,
                                        uint64_t fingerprint) {
  std::vector<LiveEntry> out;
  UniqueFd udir(::open(user_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!udir.valid()) {
    if (errno == ENOENT) return out;
    return Status::FromErrno(errno, "sibling registry: opening " + user_dir);
  }
  const std::string live = LiveDir(user_dir);
  Result<UniqueFd> dfd = OpenPrivateDir(udir.get(), kLiveName, live);
  if (!dfd.ok()) {
    if (dfd.status().code() == StatusCode::kNotFound) return out;
    return dfd.status();
  }
  // fdopendir takes the descriptor; list through a duplicate so that dfd stays usable.
  DIR* d = ::fdopendir(::dup(dfd->get()));
  if (d == nullptr) return Status::FromErrno(errno, "sibling registry: listing " + live);
  std::vector<std::string> names;
  const std::string prefix = key + ".";
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > prefix.size() && n.compare(0, prefix.size(), prefix) == 0) names.push_back(n);
  }
  ::closedir(d);
  for (const std::string& n : names) {
    UniqueFd fd(::openat(dfd->get(), n.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!fd.valid()) continue;
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
        static_cast<uint64_t>(st.st_size) > kMaxLiveEntryBytes) {
      continue;
    }
    std::string text(static_cast<size_t>(st.st_size), '\0');
    const ssize_t r = ::pread(fd.get(), text.data(), text.size(), 0);
    if (r != static_cast<ssize_t>(text.size())) continue;
    Result<LiveEntry> e = ParseLiveEntry(text);
    if (!e.ok()) continue;
    if (ProcessGone(e->pid)) {
      (void)::unlinkat(dfd->get(), n.c_str(), 0);  // its nopfsd died without removing it
      continue;
    }
    if (e->fingerprint != fingerprint) continue;
    e->name = n;
    out.push_back(std::move(*e));
  }
  std::sort(out.begin(), out.end(), LiveBefore);
  return out;
}

Result<std::shared_ptr<SiblingSource>> SiblingSource::Connect(const LiveEntry& entry,
                                                              uint64_t fingerprint,
                                                              std::chrono::milliseconds timeout) {
  std::shared_ptr<SiblingSource> s = Make(entry, fingerprint, timeout);
  NOPFS_RETURN_IF_ERROR(s->Open());
  return s;
}

std::shared_ptr<SiblingSource> SiblingSource::Make(const LiveEntry& entry, uint64_t fingerprint,
                                                   std::chrono::milliseconds timeout) {
  return std::shared_ptr<SiblingSource>(new SiblingSource(entry, fingerprint, timeout));
}

Status SiblingSource::Open() {
  {
    MutexLock lock(&mu_);
    ++open_;
  }
  Result<UniqueFd> fd = Dial();
  MutexLock lock(&mu_);
  if (!fd.ok()) {
    --open_;
    return fd.status();
  }
  Release(std::move(*fd), /*usable=*/true);
  return Status::Ok();
}

void SiblingSource::Abandon() {
  MutexLock lock(&mu_);
  abandoned_ = true;
  gone_.store(true);
  // A shut-down socket wakes the thread blocked on it (its recv ends at once); the descriptor
  // itself stays open until that thread releases it.
  for (int fd : busy_)
    (void)::shutdown(fd, SHUT_RDWR);
  open_ -= idle_.size();
  idle_.clear();
  cv_.SignalAll();
}

void SiblingSource::Release(UniqueFd fd, bool usable) {
  busy_.erase(fd.get());
  if (usable && !abandoned_) {
    idle_.push_back(std::move(fd));
  } else {
    --open_;
  }
  cv_.SignalAll();
}

Result<UniqueFd> SiblingSource::Dial() {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (entry_.socket.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("sibling: socket path too long: " + entry_.socket);
  }
  std::memcpy(addr.sun_path, entry_.socket.data(), entry_.socket.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno(errno, "sibling: socket");
  {
    MutexLock lock(&mu_);
    if (abandoned_) return Status::Unavailable("sibling: stopped");
    busy_.insert(fd.get());
  }
  // Every return below leaves busy_ without this descriptor before it is closed.
  const auto fail = [this, &fd](Status s) -> Result<UniqueFd> {
    MutexLock lock(&mu_);
    busy_.erase(fd.get());
    return s;
  };
  // A connect to a listener whose queue is full waits; not longer than an answer may.
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout_.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout_.count() % 1000) * 1000);
  (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    const std::string what = "sibling: connecting to " + entry_.socket + ": " + std::strerror(err);
    // Nobody listens there (any more), or it does not take connections: a stale entry. Anything
    // else (a socket this user may not use): refused.
    if (err == ECONNREFUSED || err == ENOENT || err == EAGAIN || err == EINPROGRESS) {
      return fail(Status::Unavailable(what));
    }
    return fail(Status::PermissionDenied(what));
  }
  Result<uint32_t> uid = wire::PeerUid(fd.get());
  if (!uid.ok()) return fail(uid.status());
  if (*uid != ::geteuid()) {
    return fail(Status::PermissionDenied("sibling: the service at " + entry_.socket +
                                         " runs as uid " + std::to_string(*uid) + ", not as uid " +
                                         std::to_string(::geteuid()) + "; refusing to use it"));
  }
  if (Status s = wire::SendMessage(
          fd.get(),
          wire::Message{1, wire::Hello{wire::kVersion, static_cast<uint32_t>(::getpid())}});
      !s.ok()) {
    return fail(Status::Unavailable("sibling: HELLO to " + entry_.socket + ": " + s.message()));
  }
  Result<wire::Received> r = wire::RecvMessage(fd.get(), timeout_);
  if (!r.ok()) return fail(r.status().WithContext("sibling: HELLO to " + entry_.socket));
  if (!std::holds_alternative<wire::HelloOk>(r->message.body)) {
    if (auto* e = std::get_if<wire::Error>(&r->message.body)) return fail(wire::ToStatus(*e));
    return fail(Status::Unavailable("sibling: " + entry_.socket + " did not answer HELLO"));
  }
  return fd;
}

Result<uint64_t> SiblingSource::FetchOn(int fd, uint32_t sample, std::span<std::byte> dst) {
  uint32_t rid = 0;
  {
    MutexLock lock(&mu_);
    rid = next_request_++;
  }
  NOPFS_RETURN_IF_ERROR(
      wire::SendMessage(fd, wire::Message{rid, wire::ReadSample{fingerprint_, sample}}));
  Result<wire::Received> r = wire::RecvMessage(fd, timeout_);
  if (!r.ok()) return r.status();
  if (r->message.request_id != rid) {
    return Status::Unavailable("sibling: an answer to another request");
  }
  if (auto* e = std::get_if<wire::Error>(&r->message.body)) return wire::ToStatus(*e);
  auto* ok = std::get_if<wire::SampleOk>(&r->message.body);
  if (ok == nullptr || ok->sample_id != sample) {
    return Status::Unavailable("sibling: not an answer to READ_SAMPLE");
  }
  if (ok->size != dst.size()) {
    return Status::Corruption("sibling: sample " + std::to_string(sample) + " has " +
                              std::to_string(ok->size) + " bytes there, " +
                              std::to_string(dst.size()) + " here");
  }
  if (ok->size <= wire::kMaxInlineSample) {
    if (!dst.empty()) std::memcpy(dst.data(), ok->data.data(), dst.size());
  } else {
    if (!r->fd.valid()) return Status::Unavailable("sibling: SAMPLE_OK without its memfd");
    size_t done = 0;
    while (done < dst.size()) {
      const ssize_t n =
          ::pread(r->fd.get(), dst.data() + done, dst.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        return Status::Corruption("sibling: sample " + std::to_string(sample) +
                                  ": its memfd is short");
      done += static_cast<size_t>(n);
    }
  }
  if (XXH3_64bits(dst.data(), dst.size()) != ok->xxh3) {
    return Status::Corruption("sibling: sample " + std::to_string(sample) +
                              ": the bytes differ from the checksum sent with them");
  }
  return ok->xxh3;
}

Result<uint64_t> SiblingSource::Fetch(uint32_t sample, std::span<std::byte> dst) {
  if (gone()) return Status::Unavailable("sibling: gone");
  UniqueFd fd;
  bool dial = false;
  {
    MutexLock lock(&mu_);
    while (idle_.empty() && open_ >= kMaxConnections && !gone())
      cv_.Wait(&mu_);
    if (gone()) return Status::Unavailable("sibling: gone");
    if (!idle_.empty()) {
      fd = std::move(idle_.back());
      idle_.pop_back();
      busy_.insert(fd.get());
    } else {
      ++open_;
      dial = true;
    }
  }
  if (dial) {
    Result<UniqueFd> d = Dial();
    if (!d.ok()) {
      gone_.store(true);
      MutexLock lock(&mu_);
      --open_;
      cv_.SignalAll();
      return abandoned_ ? Status::Unavailable("sibling: stopped") : d.status();
    }
    fd = std::move(*d);
  }
  Result<uint64_t> h = FetchOn(fd.get(), sample, dst);
  MutexLock lock(&mu_);
  if (abandoned_ && !h.ok()) h = Status::Unavailable("sibling: stopped");
  // A refusal about this sample leaves the connection usable; a broken or confused one is closed,
  // and a sibling whose connection broke has ended (or is ending): it is not asked again.
  const bool usable = h.ok() || h.status().code() == StatusCode::kFailedPrecondition ||
                      h.status().code() == StatusCode::kNotFound ||
                      h.status().code() == StatusCode::kInvalidArgument ||
                      h.status().code() == StatusCode::kIoError;
  if (!usable && h.status().code() == StatusCode::kUnavailable) gone_.store(true);
  Release(std::move(fd), usable);
  return h;
}

SiblingReader::SiblingReader(Options options) : o_(std::move(options)) {
  MutexLock lock(&mu_);
  self_ = o_.self;
  self_.name = o_.key + "." + o_.self.job;
  self_.started_ns = INT64_MAX;
}

void SiblingReader::Registering(int64_t started_ns) {
  MutexLock lock(&mu_);
  self_.started_ns = started_ns;
  next_look_ = {};
}

std::optional<Result<uint64_t>> SiblingReader::Fetch(uint32_t sample, std::span<std::byte> dst) {
  std::shared_ptr<SiblingSource> s = Current();
  if (!s) return std::nullopt;
  return s->Fetch(sample, dst);
}

std::shared_ptr<SiblingSource> SiblingReader::Current() {
  const auto now = std::chrono::steady_clock::now();
  {
    MutexLock lock(&mu_);
    if (stopped_) return nullptr;
    if (current_ && !current_->gone()) return current_;
    if (current_) {
      spdlog::info(
          "sibling: job {} ended (or stopped answering); samples go to the PFS until "
          "another sibling is found",
          current_->entry().job);
      current_.reset();
    }
    // One thread looks; the others wait for what it finds (a sibling answers its HELLO in
    // milliseconds), so that the first samples of a job are not read from the PFS only because
    // they were asked for while the connection was being made. A look that takes longer (a
    // sibling that does not answer) leaves them to the PFS after kLookWait.
    if (looking_) {
      constexpr std::chrono::milliseconds kLookWait(1000);
      const auto deadline = now + std::min(kLookWait, o_.timeout);
      while (looking_ && !stopped_ && looked_cv_.WaitUntil(&mu_, deadline)) {
      }
      return stopped_ || looking_ ? nullptr : current_;
    }
    if (now < next_look_) return nullptr;
    looking_ = true;
    next_look_ = now + o_.look_every;
  }
  std::shared_ptr<SiblingSource> found = Look();
  {
    MutexLock lock(&mu_);
    looking_ = false;
    if (found && !stopped_) {
      current_ = found;
      ever_ = true;
    }
  }
  looked_cv_.SignalAll();
  MutexLock lock(&mu_);
  return stopped_ ? nullptr : current_;
}

std::shared_ptr<SiblingSource> SiblingReader::Look() {
  Result<std::vector<LiveEntry>> found = FindLive(o_.user_dir, o_.key, o_.self.fingerprint);
  if (!found.ok()) {
    MutexLock lock(&mu_);
    if (refused_.insert("").second) {
      spdlog::warn("sibling: not looking for this user's other jobs: {}", found.status().message());
    }
    return nullptr;
  }
  for (const LiveEntry& e : *found) {
    // Only a job before this one in the order (none after it: two jobs never read through each
    // other). Another node of this very job (nodes that share a scratch directory, as on one
    // machine) is a peer, not a sibling.
    std::shared_ptr<SiblingSource> s;
    {
      MutexLock lock(&mu_);
      if (stopped_ || !LiveBefore(e, self_)) return nullptr;
      if (e.job.rfind(o_.same_job, 0) == 0 || refused_.count(e.name) > 0) continue;
      s = connecting_ = SiblingSource::Make(e, o_.self.fingerprint, o_.timeout);
    }
    const Status st = s->Open();  // Stop() abandons it meanwhile
    {
      MutexLock lock(&mu_);
      connecting_.reset();
      if (stopped_) return nullptr;
      // This job may have registered meanwhile: what decides is its entry's time when the
      // sibling is taken (Registering takes the lock), so both jobs see the same order.
      if (!LiveBefore(e, self_)) {
        s->Abandon();
        return nullptr;
      }
      if (!st.ok()) refused_.insert(e.name);
    }
    if (st.ok()) {
      spdlog::info(
          "sibling: job {} (pid {}) runs on this dataset and registered before this one; samples "
          "this node does not hold are read through its nopfsd, not from the PFS",
          e.job, e.pid);
      return s;
    }
    const bool stale = st.code() == StatusCode::kUnavailable;
    spdlog::info("sibling: not reading from job {}{}: {}", e.job,
                 stale ? " (its entry is stale, removed)" : "", st.message());
    if (stale) RemoveLive(o_.user_dir, e.name);
  }
  return nullptr;
}

void SiblingReader::Stop() {
  {
    MutexLock lock(&mu_);
    stopped_ = true;
    if (current_) current_->Abandon();
    if (connecting_) connecting_->Abandon();
  }
  looked_cv_.SignalAll();
}

std::string SiblingReader::through() const {
  MutexLock lock(&mu_);
  return current_ && !current_->gone() ? current_->entry().job : std::string();
}

bool SiblingReader::ever() const {
  MutexLock lock(&mu_);
  return ever_;
}

}  // namespace nopfs::service
