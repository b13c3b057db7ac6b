#include "share/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/printable.h"

namespace nopfs::share {

std::string StoreDirOf(const std::string& store_dir, const std::string& dataset) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(dataset.data(), dataset.size())));
  return store_dir + "/" + buf;
}

Result<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  for (const SharedDataset& d : options.datasets) {
    if (d.path.empty() || d.path.front() != '/') {
      return Status::InvalidArgument("share: a shared dataset must be an absolute path, not '" +
                                     d.path + "'");
    }
  }
  if (::mkdir(options.store_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "share: creating " + options.store_dir);
  }
  {
    UniqueFd d(::open(options.store_dir.c_str(), O_DIRECTORY | O_NOFOLLOW | O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (!d.valid() || ::fstat(d.get(), &st) != 0) {
      return Status::FromErrno(errno, "share: " + options.store_dir);
    }
    if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
      return Status::FailedPrecondition(
          "share: " + options.store_dir +
          " must be a directory of the service's own user, mode 0700, that nobody else may "
          "read or write; remove it and the service makes it again");
    }
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options.socket_path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument("share: socket path too long: " + options.socket_path);
  }
  std::memcpy(addr.sun_path, options.socket_path.data(), options.socket_path.size());
  UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s.valid()) return Status::FromErrno(errno, "share: socket");
  (void)::unlink(options.socket_path.c_str());
  // Bound with a umask that leaves it 0666 from the start: a proof, not the socket's mode,
  // decides what an asker gets.
  const mode_t old = ::umask(0);
  const int b = ::bind(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  ::umask(old);
  if (b != 0) return Status::FromErrno(err, "share: bind " + options.socket_path);
  if (::listen(s.get(), 128) != 0) return Status::FromErrno(errno, "share: listen");
  return std::unique_ptr<Server>(new Server(std::move(options), std::move(s)));
}

Server::~Server() {
  Stop();
  Reap(true);
  MutexLock l(&mu_);
  for (auto& [name, store] : stores_)
    (void)store->Save();
}

void Server::Log(const std::string& line) const {
  if (o_.log) o_.log(line);
}

void Server::Stop() {
  stop_.store(true);
  MutexLock l(&mu_);
  for (auto& c : conns_)
    if (!c->done.load()) (void)::shutdown(c->fd.get(), SHUT_RDWR);
}

void Server::Reap(bool all) {
  std::vector<std::unique_ptr<Conn>> finished;
  {
    MutexLock l(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (all || (*it)->done.load()) {
        finished.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished)
    if (c->thread.joinable()) c->thread.join();
}

Result<Store*> Server::StoreOf(const std::string& dataset) {
  const SharedDataset* decl = nullptr;
  for (const SharedDataset& d : o_.datasets)
    if (d.path == dataset) decl = &d;
  if (decl == nullptr) return Status::NotFound("not a shared dataset");
  MutexLock l(&mu_);
  auto it = stores_.find(dataset);
  if (it != stores_.end()) return it->second.get();
  if (auto b = broken_.find(dataset); b != broken_.end()) return Status::Unavailable(b->second);
  Result<std::unique_ptr<Store>> s =
      Store::Open(StoreOptions{decl->path, StoreDirOf(o_.store_dir, decl->path), decl->quota});
  if (!s.ok()) {
    broken_[dataset] = s.status().message();
    Log("share: " + dataset + ": its copy cannot be used: " + s.status().message());
    return s.status();
  }
  Store* raw = s->get();
  stores_[dataset] = std::move(*s);
  return raw;
}

void Server::Run() {
  auto last_conn = std::chrono::steady_clock::now();
  auto last_save = last_conn;
  while (!stop_.load()) {
    pollfd p{listen_.get(), POLLIN, 0};
    const int n = ::poll(&p, 1, 200);
    Reap(false);
    const auto now = std::chrono::steady_clock::now();
    if (now - last_save >= o_.save_every) {
      last_save = now;
      std::vector<Store*> stores;
      {
        MutexLock l(&mu_);
        for (auto& [name, store] : stores_)
          stores.push_back(store.get());
      }
      for (Store* s : stores)
        if (Status st = s->Save(); !st.ok()) Log(st.message());
    }
    size_t open = 0;
    {
      MutexLock l(&mu_);
      open = conns_.size();
    }
    if (open > 0) last_conn = now;
    if (o_.idle_exit.count() > 0 && open == 0 && now - last_conn >= o_.idle_exit) break;
    if (n <= 0) continue;
    UniqueFd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!fd.valid()) continue;
    last_conn = now;
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) continue;
    MutexLock l(&mu_);
    size_t of_uid = 0;
    for (auto& c : conns_)
      if (c->uid == cred.uid && !c->done.load()) ++of_uid;
    if (conns_.size() >= o_.max_connections || of_uid >= o_.max_per_uid) {
      if (refused_.fetch_add(1) % 1000 == 0) {
        Log("share: connection of uid " + std::to_string(cred.uid) +
            " refused: too many open (later refusals counted, logged every 1000th)");
      }
      continue;  // closed
    }
    auto c = std::make_unique<Conn>();
    c->fd = std::move(fd);
    c->uid = cred.uid;
    Conn* raw = c.get();
    conns_.push_back(std::move(c));
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
  Stop();
  Reap(true);
  MutexLock l(&mu_);
  for (auto& [name, store] : stores_)
    if (Status st = store->Save(); !st.ok()) Log(st.message());
}

void Server::Serve(Conn* c) {
  while (!stop_.load()) {
    Result<Message> m = ReceiveMessage(c->fd.get(), kMaxRequestBytes);
    if (!m.ok()) {
      if (m.status().code() == StatusCode::kInvalidArgument) {
        refused_.fetch_add(1);
        Reply bad{ReplyStatus::kBadRequest, {}};
        (void)SendMessage(c->fd.get(), EncodeReply(bad), {});
      }
      break;
    }
    Result<Request> r = DecodeRequest(m->bytes, m->fds.size());
    if (!r.ok()) {
      if (refused_.fetch_add(1) % 1000 == 0) {
        Log("share: a malformed request from uid " + std::to_string(c->uid) + ": " +
            Printable(r.status().message(), 200) + " (later ones counted, every 1000th logged)");
      }
      Reply bad{ReplyStatus::kBadRequest, {}};
      (void)SendMessage(c->fd.get(), EncodeReply(bad), {});
      break;
    }
    std::vector<UniqueFd> copies;
    const std::vector<std::byte> reply = Answer(*r, m->fds, &copies, c->uid);
    m->fds.clear();  // the proofs are closed before the reply goes
    std::vector<int> raw;
    raw.reserve(copies.size());
    for (const UniqueFd& f : copies)
      raw.push_back(f.get());
    if (!SendMessage(c->fd.get(), reply, raw).ok()) break;
  }
  c->done.store(true);
}

std::vector<std::byte> Server::Answer(const Request& r, std::vector<UniqueFd>& proofs,
                                      std::vector<UniqueFd>* copies, uid_t uid) {
  Reply reply;
  if (r.op == Op::kPing) return EncodeReply(reply);
  Result<Store*> store = StoreOf(r.dataset);
  if (!store.ok()) {
    reply.status = store.status().code() == StatusCode::kNotFound ? ReplyStatus::kNotShared
                                                                  : ReplyStatus::kUnavailable;
    return EncodeReply(reply);
  }
  reply.files.resize(r.files.size());
  for (size_t i = 0; i < r.files.size(); ++i) {
    FileAnswer& out = reply.files[i];
    out.outcome = Outcome::kDenied;
    const int fd = proofs[i].get();
    struct stat st {};
    // The proof: a regular file this asker opened for reading. An O_PATH descriptor can be had
    // for a file one may not read, so it proves nothing.
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl < 0 || (fl & O_PATH) != 0 ||
        ((fl & O_ACCMODE) != O_RDONLY && (fl & O_ACCMODE) != O_RDWR) || ::fstat(fd, &st) != 0 ||
        !S_ISREG(st.st_mode)) {
      continue;
    }
    Store::Answer a = (*store)->Serve(r.files[i], IdOf(st), r.op == Op::kOpen);
    out.outcome = a.outcome;
    if (a.outcome != Outcome::kReady) continue;
    out.size = a.size;
    out.xxh3 = a.xxh3;
    if (r.op == Op::kOpen) copies->push_back(std::move(a.fd));
  }
  (void)uid;
  return EncodeReply(reply);
}

}  // namespace nopfs::share
