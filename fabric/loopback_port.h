// Free TCP ports on 127.0.0.1 (the kernel picks them), for the peer tests and the peer benchmark,
// which start PeerLinks on loopback. Both throw std::runtime_error when no port can be had.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>

namespace nopfs::fabric {

// A free TCP port on 127.0.0.1 held (bound, not listening) until Release() or destruction, for a
// test that names a node's port long before the node starts on it: while held, no connect() on
// this machine takes it as its local port and no bind to port 0 picks it (a free port would be
// either's for the asking, and a node that starts on it later would find it in use), and a
// connection to it is refused as to a port nobody listens on.
class HeldLoopbackPort {
 public:
  HeldLoopbackPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      Release();
      throw std::runtime_error("no free port on 127.0.0.1");
    }
    port_ = ntohs(a.sin_port);
  }
  HeldLoopbackPort(const HeldLoopbackPort&) = delete;
  HeldLoopbackPort& operator=(const HeldLoopbackPort&) = delete;
  ~HeldLoopbackPort() { Release(); }

  uint16_t port() const { return port_; }
  // Frees the port for the node about to start on it.
  void Release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// A port that is free right now. Best effort: another process may take it before the caller
// binds it (HeldLoopbackPort keeps it until then).
inline uint16_t FreeLoopbackPort() {
  return HeldLoopbackPort().port();
}

}  // namespace nopfs::fabric
