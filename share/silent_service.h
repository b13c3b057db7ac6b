// For tests: a share service that answers a ping and nothing else, as a service does that hangs
// while it fills a batch (its PFS stalls, or it is stopped): every other request stays unanswered
// on an open connection until the service goes. It runs as the test's own uid, which ShareClient
// accepts.
//
// Thread safety: construct and destroy from one thread; the service runs on its own.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "share/wire.h"

namespace nopfs::share {

class SilentService {
 public:
  explicit SilentService(std::string path) : path_(std::move(path)) {
    listen_ = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), std::min(path_.size(), sizeof(addr.sun_path) - 1));
    ::unlink(path_.c_str());
    ok_ = listen_.valid() &&
          ::bind(listen_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 &&
          ::listen(listen_.get(), 64) == 0;
    thread_ = std::thread([this] { Run(); });
  }
  ~SilentService() {
    stop_.store(true);
    thread_.join();
    ::unlink(path_.c_str());
  }
  SilentService(const SilentService&) = delete;
  SilentService& operator=(const SilentService&) = delete;

  bool ok() const { return ok_; }
  // Requests left unanswered so far.
  size_t unanswered() const { return unanswered_.load(); }

 private:
  void Run() {
    std::vector<UniqueFd> conns;
    while (!stop_.load()) {
      std::vector<pollfd> p{{listen_.get(), POLLIN, 0}};
      for (const UniqueFd& c : conns)
        p.push_back({c.get(), POLLIN, 0});
      if (::poll(p.data(), p.size(), 20) <= 0) continue;
      if ((p[0].revents & POLLIN) != 0) {
        UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (c.valid()) conns.push_back(std::move(c));
      }
      for (size_t i = 1; i < p.size(); ++i) {
        if (p[i].revents == 0) continue;
        Result<Message> m = ReceiveMessage(p[i].fd, kMaxRequestBytes);
        if (!m.ok()) {
          conns[i - 1] = UniqueFd();  // the asker closed it: dropped below
          continue;
        }
        Result<Request> r = DecodeRequest(m->bytes, m->fds.size());
        if (r.ok() && r->op == Op::kPing) {
          (void)SendMessage(p[i].fd, EncodeReply(Reply{}), {});
        } else {
          unanswered_.fetch_add(1);
        }
      }
      std::erase_if(conns, [](const UniqueFd& c) { return !c.valid(); });
    }
  }

  const std::string path_;
  UniqueFd listen_;
  bool ok_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> unanswered_{0};
  std::thread thread_;
};

}  // namespace nopfs::share
