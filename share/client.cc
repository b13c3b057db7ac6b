#include "share/client.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace nopfs::share {

ShareClient::ShareClient(std::string socket_path, std::string dataset,
                         std::chrono::milliseconds timeout)
    : socket_path_(std::move(socket_path)), dataset_(std::move(dataset)), timeout_(timeout) {}

Result<UniqueFd> ShareClient::Take() {
  {
    MutexLock l(&mu_);
    while (!cancelled_ && idle_.empty() && open_ >= kMaxConnections)
      cv_.Wait(&mu_);
    if (cancelled_) return Status::Unavailable("share: stopped");
    if (!idle_.empty()) {
      UniqueFd fd = std::move(idle_.back());
      idle_.pop_back();
      busy_.push_back(fd.get());
      return fd;
    }
    ++open_;
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  Status s = Status::Ok();
  if (!fd.valid()) {
    s = Status::FromErrno(errno, "share: socket");
  } else if (socket_path_.size() >= sizeof(addr.sun_path)) {
    s = Status::InvalidArgument("share: socket path too long");
  } else {
    std::memcpy(addr.sun_path, socket_path_.data(), socket_path_.size());
    timeval tv{static_cast<time_t>(timeout_.count() / 1000),
               static_cast<suseconds_t>(timeout_.count() % 1000 * 1000)};
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      s = Status::Unavailable("share: connecting to " + socket_path_ + ": " + std::strerror(errno));
    } else if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
               (cred.uid != 0 && cred.uid != ::geteuid())) {
      // Only root's service (or one's own, in a test) is believed.
      s = Status::PermissionDenied("share: " + socket_path_ + " is served by uid " +
                                   std::to_string(cred.uid) + ", not root");
    }
  }
  MutexLock l(&mu_);
  if (s.ok() && cancelled_) s = Status::Unavailable("share: stopped");
  if (!s.ok()) {
    --open_;
    cv_.SignalAll();
    return s;
  }
  busy_.push_back(fd.get());
  return fd;
}

void ShareClient::Give(UniqueFd fd, bool usable) {
  MutexLock l(&mu_);
  // Out of busy_ before it can be closed (below, or by a later Take's caller), so that Cancel
  // never shuts down a descriptor number reused by something else.
  if (auto it = std::find(busy_.begin(), busy_.end(), fd.get()); it != busy_.end()) busy_.erase(it);
  if (cancelled_) usable = false;
  if (usable) {
    idle_.push_back(std::move(fd));
  } else {
    --open_;
  }
  cv_.SignalAll();
}

Status ShareClient::AskBatch(int sock, Op op, std::span<const std::string> rels,
                             std::span<Copy> out) {
  Request req;
  req.op = op;
  req.dataset = dataset_;
  std::vector<UniqueFd> proofs;
  std::vector<size_t> asked;  // index in rels of each file asked about
  for (size_t i = 0; i < rels.size(); ++i) {
    const std::string path = dataset_ + "/" + rels[i];
    UniqueFd p(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (!p.valid()) {
      out[i].outcome = Outcome::kDenied;
      out[i].open_errno = errno;
      continue;
    }
    req.files.push_back(rels[i]);
    proofs.push_back(std::move(p));
    asked.push_back(i);
  }
  if (asked.empty()) return Status::Ok();
  std::vector<int> raw;
  for (const UniqueFd& p : proofs)
    raw.push_back(p.get());
  NOPFS_RETURN_IF_ERROR(SendMessage(sock, EncodeRequest(req), raw));
  proofs.clear();
  Result<Message> m = ReceiveMessage(sock, 64 + 17 * kMaxBatch);
  if (!m.ok()) return m.status();
  Result<Reply> reply = DecodeReply(m->bytes, m->fds.size(), op);
  if (!reply.ok()) return reply.status();
  if (reply->status == ReplyStatus::kNotShared) {
    return Status::FailedPrecondition("share: " + dataset_ +
                                      " is not a shared dataset on this node");
  }
  if (reply->status == ReplyStatus::kUnavailable) {
    return Status::Unavailable("share: the copy of " + dataset_ + " cannot be used on this node");
  }
  if (reply->status != ReplyStatus::kOk || reply->files.size() != asked.size()) {
    return Status::Internal("share: the service refused the request");
  }
  size_t next_fd = 0;
  for (size_t k = 0; k < asked.size(); ++k) {
    Copy& c = out[asked[k]];
    const FileAnswer& a = reply->files[k];
    c.outcome = a.outcome;
    c.size = a.size;
    c.xxh3 = a.xxh3;
    if (op == Op::kOpen && a.outcome == Outcome::kReady) c.fd = std::move(m->fds[next_fd++]);
  }
  return Status::Ok();
}

Result<std::vector<ShareClient::Copy>> ShareClient::Ask(Op op, std::span<const std::string> rels) {
  std::vector<Copy> out(rels.size());
  size_t i = 0;
  while (i < rels.size()) {
    // A batch: at most kMaxBatch files and a request that fits in kMaxRequestBytes.
    size_t bytes = 64 + dataset_.size();
    size_t j = i;
    while (j < rels.size() && j - i < kMaxBatch && bytes + 4 + rels[j].size() <= kMaxRequestBytes) {
      bytes += 4 + rels[j].size();
      ++j;
    }
    if (j == i) return Status::InvalidArgument("share: a path too long to ask about");
    for (size_t k = i; k < j; ++k)
      NOPFS_RETURN_IF_ERROR(CheckRelativePath(rels[k]));
    Result<UniqueFd> fd = Take();
    if (!fd.ok()) return fd.status();
    Status s = AskBatch(fd->get(), op, rels.subspan(i, j - i), std::span(out).subspan(i, j - i));
    Give(std::move(*fd), s.ok());
    if (!s.ok()) return s;
    i = j;
  }
  return out;
}

size_t ShareClient::Cancel() {
  MutexLock l(&mu_);
  cancelled_ = true;
  for (int fd : busy_)
    (void)::shutdown(fd, SHUT_RDWR);  // its recvmsg returns at once: "share: closed"
  open_ -= idle_.size();
  idle_.clear();
  cv_.SignalAll();
  return busy_.size();
}

bool ShareClient::cancelled() const {
  MutexLock l(&mu_);
  return cancelled_;
}

Status ShareClient::Ping() {
  Result<UniqueFd> fd = Take();
  if (!fd.ok()) return fd.status();
  Request req;
  req.op = Op::kPing;
  req.dataset = dataset_;
  Status s = SendMessage(fd->get(), EncodeRequest(req), {});
  if (s.ok()) {
    Result<Message> m = ReceiveMessage(fd->get(), 64);
    s = m.ok() ? DecodeReply(m->bytes, m->fds.size(), Op::kPing).status() : m.status();
  }
  Give(std::move(*fd), s.ok());
  return s;
}

}  // namespace nopfs::share
