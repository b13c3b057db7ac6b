#include "fabric/endpoint.h"

#include <algorithm>

#include "fabric/endpoint_impl.h"

namespace nopfs::fabric {

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Endpoint::~Endpoint() = default;

Result<std::unique_ptr<Endpoint>> Endpoint::Open(const EndpointOptions& options) {
  if (const std::string& e = Libfabric().error; !e.empty()) {
    return Status::Unavailable("fabric: libfabric cannot be loaded (" + e +
                               "); install libfabric 1.11 or later (Debian: libfabric1)");
  }
  std::string service = std::to_string(options.port);
  fi_info* raw = nullptr;
  bool remote_read = options.remote_read;
  int rc = -FI_ENODATA;
  if (remote_read) {
    InfoPtr hints = MakeHints(options.provider, true);
    rc = Libfabric().getinfo(kFabricVersion, options.host.c_str(), service.c_str(), FI_SOURCE,
                             hints.get(), &raw);
    // Cannot do RMA with keys of our choosing: tagged messages only.
    if (rc != 0) remote_read = false;
  }
  if (!remote_read) {
    InfoPtr hints = MakeHints(options.provider, false);
    rc = Libfabric().getinfo(kFabricVersion, options.host.c_str(), service.c_str(), FI_SOURCE,
                             hints.get(), &raw);
  }
  if (rc != 0) {
    return Status::Unavailable(FiError(("fabric: provider \"" + options.provider +
                                        "\" cannot listen on " + options.host + ":" + service)
                                           .c_str(),
                                       rc));
  }
  auto impl = std::make_unique<Impl>();
  impl->info.reset(raw);
  impl->remote_read = remote_read;
  fi_info* info = impl->info.get();
  if ((rc = OpenFid(&impl->fabric, [&](fid_fabric** f) {
         return Libfabric().fabric(info->fabric_attr, f, nullptr);
       })) != 0) {
    return Status::IoError(FiError("fabric: fi_fabric", rc));
  }
  if ((rc = OpenFid(&impl->domain, [&](fid_domain** d) {
         return fi_domain(impl->fabric.get(), info, d, nullptr);
       })) != 0) {
    return Status::IoError(FiError("fabric: fi_domain", rc));
  }
  // A completion queue with a file descriptor to wait on, so that an idle endpoint sleeps in
  // poll() instead of spinning; a provider without one gets a plain queue (idle waits then sleep
  // 100 us at a time).
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.wait_obj = FI_WAIT_FD;
  cq_attr.size = 1024;
  const auto open_cq = [&](fid_cq** q) {
    return fi_cq_open(impl->domain.get(), &cq_attr, q, nullptr);
  };
  if (OpenFid(&impl->cq, open_cq) == 0) {
    if (fi_control(&impl->cq->fid, FI_GETWAIT, &impl->cq_fd) != 0) impl->cq_fd = -1;
  } else {
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((rc = OpenFid(&impl->cq, open_cq)) != 0) {
      return Status::IoError(FiError("fabric: fi_cq_open", rc));
    }
  }
  impl->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wake_fd < 0) return Status::FromErrno(errno, "fabric: eventfd");
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  if ((rc = OpenFid(&impl->av, [&](fid_av** a) {
         return fi_av_open(impl->domain.get(), &av_attr, a, nullptr);
       })) != 0) {
    return Status::IoError(FiError("fabric: fi_av_open", rc));
  }
  // The port is bound at fi_endpoint (tcp) or fi_enable (others).
  const auto listen_error = [&](const char* call, int code) {
    std::string what =
        std::string("fabric: ") + call + ": cannot listen on " + options.host + ":" + service;
    if (code == -FI_EADDRINUSE) {
      what += " (another process holds that port: another job's nopfsd, or a service of the node)";
    } else if (code == -FI_EACCES) {
      what +=
          " (a privileged port: only a process with CAP_NET_BIND_SERVICE may bind it, which "
          "nopfs-job gives nopfsd)";
    }
    return Status::IoError(FiError(what.c_str(), code));
  };
  if ((rc = OpenFid(&impl->ep, [&](fid_ep** e) {
         return fi_endpoint(impl->domain.get(), info, e, nullptr);
       })) != 0) {
    return listen_error("fi_endpoint", rc);
  }
  if ((rc = fi_ep_bind(impl->ep.get(), &impl->cq->fid, FI_TRANSMIT | FI_RECV)) != 0 ||
      (rc = fi_ep_bind(impl->ep.get(), &impl->av->fid, 0)) != 0) {
    return Status::IoError(FiError("fabric: fi_ep_bind", rc));
  }
  if ((rc = fi_enable(impl->ep.get())) != 0) return listen_error("fi_enable", rc);
  sockaddr_in bound{};
  size_t len = sizeof(bound);
  if ((rc = fi_getname(&impl->ep->fid, &bound, &len)) != 0) {
    return Status::IoError(FiError("fabric: fi_getname", rc));
  }
  std::unique_ptr<Endpoint> ep(new Endpoint(std::move(impl)));
  ep->provider_ = info->fabric_attr->prov_name != nullptr ? info->fabric_attr->prov_name : "";
  ep->host_ = options.host;
  ep->port_ = ntohs(bound.sin_port);
  return ep;
}

Result<PeerAddr> Endpoint::AddPeer(const std::string& host, uint16_t port) {
  // The endpoint addresses peers by IPv4 socket address (MakeHints: FI_SOCKADDR_IN), so the
  // address is resolved here, as fi_getinfo would, without the provider's work that fi_getinfo
  // does besides (0.28 ms per call: 0.3 s of a daemon's start at 1,024 nodes).
  const std::string service = std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (gai != 0 || found == nullptr) {
    return Status::InvalidArgument("fabric: cannot resolve peer " + host + ":" + service + ": " +
                                   (gai != 0 ? ::gai_strerror(gai) : "no IPv4 address"));
  }
  sockaddr_in sin{};
  std::memcpy(&sin, found->ai_addr, sizeof sin);
  ::freeaddrinfo(found);
  fi_addr_t addr = FI_ADDR_UNSPEC;
  const int rc = fi_av_insert(impl_->av.get(), &sin, 1, &addr, 0, nullptr);
  if (rc != 1) {
    return Status::IoError(FiError(("fabric: fi_av_insert " + host + ":" + service).c_str(),
                                   rc < 0 ? rc : -FI_EINVAL));
  }
  return static_cast<PeerAddr>(addr);
}

bool Endpoint::supports_remote_read() const {
  return impl_->remote_read;
}

bool Endpoint::remote_read_in_hardware() const {
  if (!impl_->remote_read) return false;
  // "tcp;ofi_rxm": the core provider is the first part.
  const std::string core = provider_.substr(0, provider_.find(';'));
  return core != "tcp" && core != "sockets" && core != "udp" && core != "net";
}

std::vector<ReadCompletion> Endpoint::TakeReads() {
  impl_->Poll();
  std::vector<ReadCompletion> out;
  out.swap(impl_->reads_done);
  return out;
}

bool Endpoint::has_reads() const {
  return !impl_->reads_done.empty();
}

void Endpoint::Progress() {
  impl_->Poll();
}

bool Endpoint::Flush(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    impl_->Poll();
    // A posted send is abandoned by its caller and dropped when it completes; a receive or an RMA
    // read has a buffer of its own.
    const bool sending = std::any_of(impl_->ops.begin(), impl_->ops.end(), [](const auto& op) {
      return !op->done && !op->is_read && !op->buffer;
    });
    const auto now = std::chrono::steady_clock::now();
    if (!sending) return true;
    if (now >= deadline) return false;
    impl_->Idle(std::min<std::chrono::microseconds>(
        std::chrono::duration_cast<std::chrono::microseconds>(deadline - now),
        std::chrono::milliseconds(1)));
  }
}

void Endpoint::Wake() {
  // The caller has set what the sleeper's interrupt checks before calling; the sleeper sets
  // `sleeping` before its last check of it, so one of the two sees the other (both seq_cst).
  if (!impl_->sleeping.load()) return;
  const uint64_t one = 1;
  ssize_t ignored = ::write(impl_->wake_fd, &one, sizeof one);
  (void)ignored;
}

bool Endpoint::waits_on_fd() const {
  return impl_->cq_fd >= 0;
}

uint64_t Endpoint::pending_ops() const {
  return impl_->ops.size();
}

uint64_t Endpoint::failed_posts() const {
  return impl_->failed_posts;
}

}  // namespace nopfs::fabric
