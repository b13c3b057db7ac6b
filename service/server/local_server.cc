#include "service/server/local_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>

#include <spdlog/spdlog.h>

#include "common/mutex.h"

namespace nopfs::service {
namespace {

// A sample too large for SAMPLE_OK's payload, in a memfd the asker reads with pread.
Result<wire::UniqueFd> BytesInMemfd(const std::vector<std::byte>& bytes) {
  wire::UniqueFd fd(memfd_create("nopfs-sample", MFD_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(errno, "nopfsd: memfd for a sibling read");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        ::pwrite(fd.get(), bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::FromErrno(errno, "nopfsd: writing a sibling read's memfd");
    done += static_cast<size_t>(n);
  }
  return fd;
}

std::shared_ptr<spdlog::logger> RpcLog() {
  static const std::shared_ptr<spdlog::logger> log = [] {
    if (auto l = spdlog::get("rpc")) return l;
    auto l = spdlog::default_logger()->clone("rpc");
    try {
      spdlog::register_logger(l);
    } catch (const spdlog::spdlog_ex&) {
      if (auto existing = spdlog::get("rpc")) return existing;
    }
    return l;
  }();
  return log;
}

// Sends ERROR; failures are ignored because the connection is being dropped anyway.
void SendError(int fd, uint32_t request_id, const Status& st) {
  Status s = wire::SendMessage(fd, wire::Message{request_id, wire::FromStatus(st)});
  (void)s;
}

// STATUS_OK must fit one message: cut long texts on a line boundary and say so.
std::string FitStatusText(std::string text) {
  constexpr size_t kLimit = wire::kMaxPayload - 256;
  if (text.size() <= kLimit) return text;
  size_t cut = text.rfind('\n', kLimit);
  text.resize(cut == std::string::npos ? kLimit : cut + 1);
  text += "... (status truncated to fit one message)\n";
  return text;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t DeadlineNs(std::chrono::milliseconds after) {
  return NowNs() + std::chrono::duration_cast<std::chrono::nanoseconds>(after).count();
}

}  // namespace

LocalServer::LocalServer(Options options, Handler* handler)
    : options_(std::move(options)), handler_(handler) {}

LocalServer::~LocalServer() {
  Stop();
}

Status LocalServer::Start() {
  if (started_) return Status::FailedPrecondition("local server: already started");
  const std::string& path = options_.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("local server: socket path must be 1.." +
                                   std::to_string(sizeof(addr.sun_path) - 1) + " bytes, got '" +
                                   path + "'");
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return Status::FromErrno(errno, "local server: run directory " + dir);
  }
  if (!S_ISDIR(st.st_mode) || (st.st_mode & 07777) != 0700 || st.st_uid != ::geteuid()) {
    return Status::PermissionDenied("local server: run directory " + dir +
                                    " must be a directory of mode 0700 owned by uid " +
                                    std::to_string(::geteuid()));
  }
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::FailedPrecondition("local server: " + path +
                                        " exists and is not a socket; refusing to replace it");
    }
    if (::unlink(path.c_str()) != 0) {
      return Status::FromErrno(errno, "local server: removing the stale socket " + path);
    }
    RpcLog()->info("removed stale socket {}", path);
  } else if (errno != ENOENT) {
    return Status::FromErrno(errno, "local server: " + path);
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  listen_fd_.Reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listen_fd_.valid()) return Status::FromErrno(errno, "local server: socket");
  // The directory already keeps others out; the umask closes the window before chmod.
  mode_t old = ::umask(0177);
  int rc = ::bind(listen_fd_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  ::umask(old);
  if (rc != 0) return Status::FromErrno(err, "local server: bind " + path);
  socket_created_ = true;
  if (::chmod(path.c_str(), 0600) != 0) return Status::FromErrno(errno, "local server: chmod");
  if (::listen(listen_fd_.get(), options_.backlog) != 0) {
    return Status::FromErrno(errno, "local server: listen");
  }
  wake_fd_.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return Status::FromErrno(errno, "local server: eventfd");
  {
    MutexLock lock(&mu_);
    stopping_ = false;
  }
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  started_ = true;
  RpcLog()->info("listening on {} for uid {}", path, options_.allowed_uid);
  return Status::Ok();
}

void LocalServer::Stop() {
  if (started_) {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      for (auto& c : conns_)
        ::shutdown(c->fd.get(), SHUT_RDWR);
    }
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
    (void)n;
    if (accept_thread_.joinable()) accept_thread_.join();
    std::list<std::unique_ptr<Conn>> conns;
    {
      MutexLock lock(&mu_);
      conns.swap(conns_);
    }
    for (auto& c : conns) {
      if (c->thread.joinable()) c->thread.join();
    }
    started_ = false;
  }
  listen_fd_.Reset();
  wake_fd_.Reset();
  if (socket_created_) {
    ::unlink(options_.socket_path.c_str());
    socket_created_ = false;
  }
}

size_t LocalServer::connections() const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& c : conns_)
    n += c->done.load() ? 0 : 1;
  return n;
}

void LocalServer::ReapLocked() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    if ((*it)->done.load()) {
      (*it)->thread.join();
      it = conns_.erase(it);
    } else {
      ++it;
    }
  }
}

// Ends (SHUT_RD) every connection past its deadline; its thread then answers ERROR and closes.
void LocalServer::ExpireLocked() {
  const int64_t now = NowNs();
  for (auto& c : conns_) {
    const int64_t d = c->deadline_ns.load();
    if (d == 0 || now < d || c->done.load() || c->timed_out.exchange(true)) continue;
    ::shutdown(c->fd.get(), SHUT_RD);
  }
}

// Answers a connection past max_connections and closes it, without starting a thread.
void LocalServer::RefuseFull(int fd) {
  const uint64_t n = ++refused_full_;
  if (n == 1 || n % 1000 == 0) {
    RpcLog()->warn("refused connection(s) ({} in all): {} are open, the most this service takes", n,
                   options_.max_connections);
  }
  // A fresh socket's buffer takes one small message; never block the accept thread on it.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  SendError(fd, 0,
            Status::ResourceExhausted(
                "nopfsd: " + std::to_string(options_.max_connections) +
                " connections are open, the most this job's service takes; close clients "
                "that are done (each DataLoader worker holds one) and connect again"));
  ::close(fd);
}

void LocalServer::AcceptLoop() {
  pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
  for (;;) {
    int rc = ::poll(fds, 2, 100);
    {
      MutexLock lock(&mu_);
      ReapLocked();
      ExpireLocked();
      if (stopping_) return;
    }
    if (rc < 0 && errno != EINTR) {
      RpcLog()->error("poll on the listening socket: {}", std::strerror(errno));
      return;
    }
    if (rc <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        RpcLog()->warn("accept: {}", std::strerror(errno));
        // EMFILE and friends: back off instead of spinning on a readable listener.
        ::poll(nullptr, 0, 100);
      }
      continue;
    }
    MutexLock lock(&mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    ReapLocked();
    if (conns_.size() >= options_.max_connections) {
      RefuseFull(fd);
      continue;
    }
    auto conn = std::make_unique<Conn>();
    conn->id = ++next_id_;
    conn->fd.Reset(fd);
    conn->deadline_ns.store(DeadlineNs(options_.hello_timeout));
    Conn* raw = conn.get();
    conns_.push_back(std::move(conn));
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
}

void LocalServer::Serve(Conn* conn) {
  Session s;
  s.conn = conn;
  const int fd = conn->fd.get();
  auto finish = [&] {
    for (uint64_t id : s.streams) {
      if (std::function<void()> rest = handler_->CloseStream(id)) rest();
    }
    ::shutdown(fd, SHUT_RDWR);  // the fd itself is closed when the connection is reaped
    conn->done.store(true);
  };

  Result<uint32_t> uid = wire::PeerUid(fd);
  if (!uid.ok() || *uid != options_.allowed_uid) {
    ++refused_;
    std::string who = uid.ok() ? "uid " + std::to_string(*uid) : uid.status().message();
    RpcLog()->warn("refused a connection from {} (this job's uid is {})", who,
                   options_.allowed_uid);
    SendError(fd, 0,
              Status::PermissionDenied("nopfsd: this service belongs to uid " +
                                       std::to_string(options_.allowed_uid) + "; refused " + who));
    finish();
    return;
  }
  s.uid = *uid;

  for (;;) {
    std::optional<wire::Received> r = NextRequest(&s);
    if (!r) break;
    Reply reply = Answer(&s, r->message);
    Status sent = wire::SendMessage(fd, reply.message, reply.pass_fd, reply.region_fd.get());
    reply.region_fd.Reset(-1);
    if (reply.after_send) reply.after_send();
    if (!sent.ok() || reply.close_after) break;
  }
  finish();
}

std::optional<wire::Received> LocalServer::NextRequest(Session* s) {
  Conn* conn = s->conn;
  const int fd = conn->fd.get();
  if (s->hello) {
    // Idle between requests is fine; a request, once begun, must arrive within the timeout.
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    conn->deadline_ns.store(DeadlineNs(options_.request_timeout));
  }
  Result<wire::Received> r = wire::RecvMessage(fd, std::chrono::milliseconds(-1));
  if (!r.ok()) {
    if (conn->timed_out.load()) {
      const std::string what =
          s->hello
              ? "a request begun more than " + std::to_string(options_.request_timeout.count()) +
                    " ms ago is still incomplete"
              : "no HELLO within " + std::to_string(options_.hello_timeout.count()) + " ms";
      const uint64_t n = ++timed_out_;
      if (n == 1 || n % 1000 == 0) {
        RpcLog()->warn("connection {}: {}; closed ({} timed out in all)", conn->id, what, n);
      }
      SendError(fd, 0, Status::TimedOut("nopfsd: " + what + "; connection closed"));
    } else if (r.status().code() == StatusCode::kInvalidArgument) {
      ++malformed_;
      RpcLog()->warn("connection {}: malformed message: {}", conn->id, r.status().message());
      SendError(fd, 0, r.status());
    }
    return std::nullopt;
  }
  conn->deadline_ns.store(0);
  if (conn->timed_out.load()) return std::nullopt;  // expired just as the request completed
  if (!s->hello && wire::TypeOf(r->message.body) != wire::MsgType::kHello) {
    ++malformed_;
    SendError(fd, r->message.request_id,
              Status::FailedPrecondition("nopfsd: the first message must be HELLO"));
    return std::nullopt;
  }
  return std::move(*r);
}

LocalServer::Reply LocalServer::Answer(Session* s, const wire::Message& request) {
  Reply reply;
  reply.message = wire::Message{request.request_id, wire::Error{}};
  wire::Message& answer = reply.message;
  if (auto* h = std::get_if<wire::Hello>(&request.body)) {
    s->hello = true;
    s->client_pid = h->pid;
    HelloInfo info = handler_->Hello();
    answer.body =
        wire::HelloOk{wire::kVersion, info.job_id, info.ranks, info.first_rank, info.local_ranks};
  } else if (auto* o = std::get_if<wire::OpenStream>(&request.body)) {
    AnswerOpenStream(s, *o, &reply);
  } else if (auto* st = std::get_if<wire::StatusRequest>(&request.body)) {
    AnswerStatus(*st, &reply);
  } else if (auto* d = std::get_if<wire::Describe>(&request.body)) {
    Result<wire::DescribeOk> info = handler_->Describe(d->sample_id);
    if (info.ok()) {
      answer.body = std::move(*info);
    } else {
      answer.body = wire::FromStatus(info.status());
    }
  } else if (auto* rs = std::get_if<wire::ReadSample>(&request.body)) {
    AnswerReadSample(*rs, &reply);
  } else if (auto* c = std::get_if<wire::CloseStream>(&request.body)) {
    if (s->streams.erase(c->stream_id) == 1) {
      reply.after_send = handler_->CloseStream(c->stream_id);
      answer.body = wire::CloseOk{c->stream_id};
    } else {
      answer.body = wire::FromStatus(Status::NotFound(
          "nopfsd: stream " + std::to_string(c->stream_id) + " is not open on this connection"));
    }
  } else {
    ++malformed_;
    answer.body = wire::FromStatus(Status::InvalidArgument(
        "nopfsd: " + std::string(wire::TypeName(wire::TypeOf(request.body))) +
        " is not a request"));
    reply.close_after = true;
  }
  return reply;
}

void LocalServer::AnswerOpenStream(Session* s, const wire::OpenStream& o, Reply* reply) {
  OpenStreamRequest req{o.rank,
                        o.epoch,
                        o.step,
                        o.share.value_or(wire::StreamShare{}),
                        o.flags.value_or(0),
                        s->client_pid,
                        o.owner.value_or(s->client_pid),
                        s->uid};
  Result<StreamGrant> g = handler_->OpenStream(req, s->conn->id);
  if (!g.ok()) {
    reply->message.body = wire::FromStatus(g.status());
    return;
  }
  s->streams.insert(g->stream_id);
  wire::StreamOk ok{g->stream_id, g->capacity, g->slot_count, std::nullopt};
  if (g->region_fd.valid()) {
    ok.region_bytes = g->region_bytes;
    reply->region_fd = std::move(g->region_fd);
  }
  reply->message.body = ok;
  reply->pass_fd = g->ring_fd;
}

void LocalServer::AnswerStatus(const wire::StatusRequest& st, Reply* reply) {
  if (!st.report_version) {
    reply->message.body = wire::StatusOk{FitStatusText(handler_->StatusText()), std::nullopt};
  } else if (*st.report_version != report::kReportVersion) {
    reply->message.body = wire::FromStatus(Status::InvalidArgument(
        "nopfsd: status report version " + std::to_string(*st.report_version) +
        " is not supported (this nopfsd writes version " + std::to_string(report::kReportVersion) +
        "); use a nopfs command and nopfsd from the same release"));
  } else {
    reply->message.body = wire::StatusOk{"", handler_->Report()};
  }
}

void LocalServer::AnswerReadSample(const wire::ReadSample& rs, Reply* reply) {
  std::vector<std::byte> bytes;
  Result<uint64_t> sum = handler_->ReadSample(rs.fingerprint, rs.sample_id, &bytes);
  if (!sum.ok()) {
    reply->message.body = wire::FromStatus(sum.status());
  } else if (bytes.size() <= wire::kMaxInlineSample) {
    reply->message.body =
        wire::SampleOk{rs.sample_id, *sum, bytes.size(),
                       std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())};
  } else {
    Result<wire::UniqueFd> mfd = BytesInMemfd(bytes);
    if (mfd.ok()) {
      reply->message.body = wire::SampleOk{rs.sample_id, *sum, bytes.size(), ""};
      reply->sample_fd = std::move(*mfd);  // the message's only descriptor
      reply->pass_fd = reply->sample_fd.get();
    } else {
      reply->message.body = wire::FromStatus(mfd.status());
    }
  }
}

}  // namespace nopfs::service
