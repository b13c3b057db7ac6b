#include "fabric/endpoint.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "common/mutex.h"

namespace nopfs::fabric {
namespace {

constexpr uint32_t kFabricVersion = FI_VERSION(1, 11);

// libfabric is loaded on the first endpoint, not with the program: loading it runs its
// providers' libraries' constructors (libinfinipath's calibrates a clock with usleeps, libpsm2 and
// libnl probe the devices), about 0.25 s of every nopfsd's start, and a node without peers needs
// none of it. Only these five functions are called directly (the rest are inline, through the
// objects' operation tables); dlsym gives the default version of each, the one the linker binds.
struct Lib {
  decltype(&::fi_getinfo) getinfo = nullptr;
  decltype(&::fi_freeinfo) freeinfo = nullptr;
  decltype(&::fi_dupinfo) dupinfo = nullptr;
  decltype(&::fi_fabric) fabric = nullptr;
  decltype(&::fi_strerror) strerror = nullptr;
  std::string error;  // why it could not be loaded ("" = loaded)
};

const Lib& Libfabric() {
  static Lib lib;
  static std::once_flag once;
  std::call_once(once, [] {
    (void)SetLibfabricDefaults();
    void* h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      lib.error = e != nullptr ? e : "dlopen failed";
      return;
    }
    const auto sym = [h](const char* name) { return dlsym(h, name); };
    lib.getinfo = reinterpret_cast<decltype(lib.getinfo)>(sym("fi_getinfo"));
    lib.freeinfo = reinterpret_cast<decltype(lib.freeinfo)>(sym("fi_freeinfo"));
    lib.dupinfo = reinterpret_cast<decltype(lib.dupinfo)>(sym("fi_dupinfo"));
    lib.fabric = reinterpret_cast<decltype(lib.fabric)>(sym("fi_fabric"));
    lib.strerror = reinterpret_cast<decltype(lib.strerror)>(sym("fi_strerror"));
    if (!lib.getinfo || !lib.freeinfo || !lib.dupinfo || !lib.fabric || !lib.strerror) {
      lib = Lib();
      lib.error =
          "libfabric.so.1 lacks one of fi_getinfo, fi_freeinfo, fi_dupinfo, fi_fabric, "
          "fi_strerror";
    }
  });
  return lib;
}

}  // namespace

std::vector<std::string> SetLibfabricDefaults() {
  std::vector<std::string> set;
  for (const LibfabricDefault& d : kLibfabricDefaults) {
    if (std::getenv(d.name) != nullptr) continue;  // the admin's (or the job's) own value
    if (::setenv(d.name, d.value, 0) == 0) set.emplace_back(d.name);
  }
  return set;
}

namespace {

std::string FiError(const char* what, long rc) {
  return std::string(what) + ": " + Libfabric().strerror(static_cast<int>(rc < 0 ? -rc : rc));
}

struct InfoDeleter {
  void operator()(fi_info* info) const { Libfabric().freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// libfabric objects, each closed with fi_close when its owner goes (members are destroyed in
// reverse order of declaration: the endpoint before what it is bound to).
template <typename T>
struct FidCloser {
  void operator()(T* f) const { fi_close(&f->fid); }
};
template <typename T>
using FidPtr = std::unique_ptr<T, FidCloser<T>>;

// Opens a libfabric object through `open(&raw)` and hands it to `*out`; returns the call's rc.
template <typename T, typename Open>
int OpenFid(FidPtr<T>* out, Open&& open) {
  T* raw = nullptr;
  const int rc = open(&raw);
  if (rc == 0) out->reset(raw);
  return rc;
}

// With `remote_read`, the endpoint also does RMA reads, and registrations take the key the caller
// gives (no FI_MR_PROV_KEY: a provider's keys may be a counter, and with tcp the key is all that
// stands between a stranger on the port and the registered memory).
InfoPtr MakeHints(const std::string& provider, bool remote_read) {
  InfoPtr hints(Libfabric().dupinfo(nullptr));  // fi_allocinfo()
  if (!hints) throw std::bad_alloc();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  if (remote_read) {
    hints->caps |= FI_RMA | FI_READ | FI_REMOTE_READ;
    hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_ENDPOINT;
    hints->domain_attr->mr_key_size = 8;
  }
  hints->addr_format = FI_SOCKADDR_IN;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  if (hints->fabric_attr->prov_name == nullptr) throw std::bad_alloc();
  return hints;
}

}  // namespace

// Free read buffers by size class (a power of two, at least 4 KiB), up to kKeepBytes in all;
// beyond that a released buffer is freed.
class ReadBufferPool {
 public:
  static constexpr uint64_t kKeepBytes = uint64_t{64} << 20;

  static ReadBuffer Get(const std::shared_ptr<ReadBufferPool>& self, uint64_t length) {
    const uint64_t cap = std::bit_ceil(std::max<uint64_t>(length, 4096));
    std::byte* p = nullptr;
    {
      MutexLock lock(&self->mu_);
      auto it = self->free_.find(cap);
      if (it != self->free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        self->kept_ -= cap;
      }
    }
    if (p == nullptr) p = new std::byte[cap];  // uninitialised: no zeroing
    return ReadBuffer(p, ReturnToPool{self, cap});
  }

  void Put(std::byte* p, uint64_t cap) {
    {
      MutexLock lock(&mu_);
      if (kept_ + cap <= kKeepBytes) {
        free_[cap].push_back(p);
        kept_ += cap;
        return;
      }
    }
    delete[] p;
  }

  ~ReadBufferPool() {
    for (auto& [cap, list] : free_)
      for (std::byte* p : list)
        delete[] p;
  }

 private:
  Mutex mu_;
  std::map<uint64_t, std::vector<std::byte*>> free_ GUARDED_BY(mu_);
  uint64_t kept_ GUARDED_BY(mu_) = 0;
};

void ReturnToPool::operator()(std::byte* p) const {
  if (p == nullptr) return;
  if (pool) {
    pool->Put(p, capacity);
  } else {
    delete[] p;
  }
}

// One posted operation. `ctx` must come first: providers asking for FI_CONTEXT2 use it.
struct Op {
  fi_context2 ctx{};
  std::unique_ptr<std::byte[]> buffer;  // owned until libfabric completes the operation
  ReadBuffer read_buffer;               // an RMA read's destination, likewise
  std::vector<std::byte> message;       // a send's bytes, moved in by the caller (not copied)
  uint64_t capacity = 0;
  bool done = false;
  bool abandoned = false;  // the caller gave up; free on completion
  int error = 0;           // positive fi errno, 0 on success
  std::string error_text;  // the provider's account of a failed completion (fi_cq_strerror)
  uint64_t len = 0;
  uint64_t tag = 0;
  bool is_read = false;  // an RMA read (PostRead): handed to TakeReads on completion
  uint64_t cookie = 0;
};

struct Endpoint::Impl {
  InfoPtr info;
  std::list<std::unique_ptr<Op>> ops;
  bool remote_read = false;
  std::vector<ReadCompletion> reads_done;
  uint64_t failed_posts = 0;
  // The buffer of the last completed receive, reused by the next one of at most its size (a
  // peer link receives with a 64 MiB limit every few milliseconds).
  std::unique_ptr<std::byte[]> spare;
  uint64_t spare_capacity = 0;
  // A receive that a Recv left posted when it timed out or was interrupted, and what it was
  // posted for. It may have matched a message already: a large one arrives over many of a
  // caller's short waits (a rendezvous read, segments), and a receive cancelled mid-transfer
  // completes after the cancellation's grace or not at all, losing the message. So the next Recv
  // for the same messages waits on it again; only a Recv for others cancels it.
  Op* standing = nullptr;
  uint64_t standing_tag = 0;
  uint64_t standing_ignore = 0;
  uint64_t standing_max = 0;
  std::shared_ptr<ReadBufferPool> read_pool = std::make_shared<ReadBufferPool>();
  // Waiting without spinning: the completion queue's file descriptor (FI_WAIT_FD; -1 if the
  // provider has none, then idle waits sleep briefly) and an eventfd that Wake() signals.
  int cq_fd = -1;
  int wake_fd = -1;
  // When the queue last gave a completion: for a short while after one, an idle wait spins
  // (the next message of a busy exchange is likely microseconds away, and a sleep in poll()
  // costs tens of them to wake from); after that it sleeps.
  std::chrono::steady_clock::time_point last_completion{};
  static constexpr std::chrono::microseconds kSpin{200};
  // How long a post that found the provider's queue full for longer than kSpin sleeps (on the
  // completion queue's descriptor) before it tries again.
  static constexpr std::chrono::microseconds kRetryNap{1000};
  // The libfabric objects, last so that they are closed first (the endpoint, then the regions
  // registered for remote reads, the address vector, the queue, the domain, the fabric), while
  // the buffers of operations still posted on them are alive.
  FidPtr<fid_fabric> fabric;
  FidPtr<fid_domain> domain;
  FidPtr<fid_cq> cq;
  FidPtr<fid_av> av;
  std::vector<FidPtr<fid_mr>> regions;
  FidPtr<fid_ep> ep;

  ~Impl() {
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void Finish(Op* op) {
    op->done = true;
    last_completion = std::chrono::steady_clock::now();
    if (op->is_read) {
      reads_done.push_back({op->cookie, op->error, std::move(op->read_buffer), op->capacity,
                            std::move(op->error_text)});
      Drop(op);
      return;
    }
    if (op->abandoned && op->error != 0 && op->error != FI_ECANCELED) ++failed_posts;
    if (op->abandoned) ops.remove_if([op](const std::unique_ptr<Op>& o) { return o.get() == op; });
  }

  // "Connection reset by peer (provider: ...)": the generic error and, where the provider says
  // more, its own words for prov_errno.
  std::string CqErrorText(const fi_cq_err_entry& err) {
    std::string text = Libfabric().strerror(err.err != 0 ? err.err : FI_EIO);
    if (err.prov_errno != 0) {
      char buf[256] = {};
      const char* prov = fi_cq_strerror(cq.get(), err.prov_errno, err.err_data, buf, sizeof(buf));
      if (prov != nullptr && *prov != '\0') text += std::string(" (provider: ") + prov + ")";
    }
    return text;
  }

  void Poll() {
    fi_cq_tagged_entry entries[16];
    for (;;) {
      ssize_t n = fi_cq_read(cq.get(), entries, 16);
      if (n == -FI_EAGAIN) return;
      if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        if (fi_cq_readerr(cq.get(), &err, 0) < 1) return;
        auto* op = static_cast<Op*>(err.op_context);
        if (op == nullptr) continue;
        op->error = err.err != 0 ? err.err : FI_EIO;
        op->error_text = CqErrorText(err);
        op->len = err.len;
        op->tag = err.tag;
        Finish(op);
        continue;
      }
      if (n < 0) return;  // a broken queue: callers time out
      for (ssize_t i = 0; i < n; ++i) {
        auto* op = static_cast<Op*>(entries[i].op_context);
        if (op == nullptr) continue;
        op->len = entries[i].len;
        op->tag = entries[i].tag;
        Finish(op);
      }
    }
  }

  // Blocks until the completion queue may have something, Wake() is called, or `timeout` passes.
  // Callers poll the queue afterwards.
  void Idle(std::chrono::microseconds timeout) {
    if (std::chrono::steady_clock::now() - last_completion < kSpin) {
      std::this_thread::yield();
      return;
    }
    if (cq_fd < 0) {
      std::this_thread::sleep_for(std::min(timeout, std::chrono::microseconds(100)));
      return;
    }
    fid* f = &cq->fid;
    // FI_SUCCESS: nothing pending, the fd may be waited on; otherwise there is work already.
    if (fi_trywait(fabric.get(), &f, 1) != FI_SUCCESS) return;
    pollfd fds[2] = {{cq_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int ms = static_cast<int>(
        std::max<int64_t>(1, std::chrono::ceil<std::chrono::milliseconds>(timeout).count()));
    if (::poll(fds, 2, ms) > 0 && (fds[1].revents & POLLIN) != 0) {
      uint64_t n = 0;
      ssize_t ignored = ::read(wake_fd, &n, sizeof n);
      (void)ignored;
    }
  }

  // Posts a send of `data` (kept by the operation until it completes); retries while the queue
  // is full until `deadline`.
  Result<Op*> PostSend(PeerAddr peer, uint64_t tag, std::vector<std::byte> data,
                       std::chrono::steady_clock::time_point deadline);

  Op* NewOp() {
    ops.push_back(std::make_unique<Op>());
    return ops.back().get();
  }

  void Drop(Op* op) {
    ops.remove_if([op](const std::unique_ptr<Op>& o) { return o.get() == op; });
  }

  // Cancels `op`, a posted receive nobody waits for any more. The cancellation completes as an
  // error entry, and until then libfabric may still write the buffer: returns the message if it
  // arrived meanwhile (within a short grace), else nothing, leaving an op still in flight
  // abandoned (freed when its completion comes or the endpoint closes).
  std::optional<Message> CancelRecv(Op* op, uint64_t max_len) {
    fi_cancel(&ep->fid, &op->ctx);
    auto grace = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    while (!op->done && std::chrono::steady_clock::now() < grace)
      Poll();
    if (op->done && op->error == 0) {
      Message m;
      m.tag = op->tag;
      m.data.assign(op->buffer.get(), op->buffer.get() + std::min(op->len, max_len));
      Recycle(op);
      return m;
    }
    if (op->done) {
      Recycle(op);  // cancelled: libfabric is done with the buffer
    } else {
      op->abandoned = true;
    }
    return std::nullopt;
  }

  // Drops a finished receive and keeps its buffer as the spare for the next Recv. A receive
  // buffer is as large as the largest message (tens of MiB): freeing it is a munmap with a TLB
  // shootdown, and a fresh one page-faults in again, which cost about a tenth of a busy peer
  // link's time while every interrupted Recv gave its buffer back.
  void Recycle(Op* op) {
    if (op->buffer && (!spare || op->capacity >= spare_capacity)) {
      spare = std::move(op->buffer);
      spare_capacity = op->capacity;
    }
    Drop(op);
  }

  // Posts `op` by calling `post` (an fi_tsend/fi_trecv/fi_read), again while the provider's queue
  // is full (-FI_EAGAIN), until `deadline`; an op that was never posted is dropped. `call` names
  // the function in an error, `queue` the queue in a timeout.
  template <typename PostFn>
  Status PostRetrying(Op* op, std::chrono::steady_clock::time_point deadline, const char* call,
                      const char* queue, PostFn post) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const ssize_t rc = post();
      if (rc == 0) return Status::Ok();
      if (rc != -FI_EAGAIN) {
        Drop(op);
        return Status::IoError(FiError(call, rc));
      }
      Poll();
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        Drop(op);
        return Status::TimedOut(std::string("fabric: ") + queue + " queue full until the timeout");
      }
      // A queue that stays full past a moment (a connection still being set up: ofi_rxm
      // progresses it every 10 ms) is waited on, not spun on: a spinning sender took the CPU its
      // peers needed to answer.
      if (now - start >= kSpin) {
        Idle(std::min<std::chrono::microseconds>(
            std::chrono::duration_cast<std::chrono::microseconds>(deadline - now), kRetryNap));
      }
    }
  }
};

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
      what +=
          " (another process holds that port: another job's, or one bound on purpose to keep "
          "this job from its peers)";
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

Result<Op*> Endpoint::Impl::PostSend(PeerAddr peer, uint64_t tag, std::vector<std::byte> data,
                                     std::chrono::steady_clock::time_point deadline) {
  Impl* impl = this;
  Op* op = impl->NewOp();
  op->capacity = data.size();
  op->message = std::move(data);
  if (op->message.empty()) op->message.resize(1);  // a valid buffer for an empty message
  NOPFS_RETURN_IF_ERROR(impl->PostRetrying(op, deadline, "fabric: fi_tsend", "send", [&] {
    return fi_tsend(impl->ep.get(), op->message.data(), op->capacity, nullptr, peer, tag, &op->ctx);
  }));
  return op;
}

Status Endpoint::Post(PeerAddr peer, uint64_t tag, std::span<const std::byte> data,
                      std::chrono::milliseconds timeout) {
  return Post(peer, tag, std::vector<std::byte>(data.begin(), data.end()), timeout);
}

Status Endpoint::Post(PeerAddr peer, uint64_t tag, std::vector<std::byte>&& data,
                      std::chrono::milliseconds timeout) {
  auto posted =
      impl_->PostSend(peer, tag, std::move(data), std::chrono::steady_clock::now() + timeout);
  if (!posted.ok()) return posted.status();
  (*posted)->abandoned = true;  // freed by Poll when it completes
  impl_->Poll();
  return Status::Ok();
}

Status Endpoint::Send(PeerAddr peer, uint64_t tag, std::span<const std::byte> data,
                      std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto posted =
      impl_->PostSend(peer, tag, std::vector<std::byte>(data.begin(), data.end()), deadline);
  if (!posted.ok()) return posted.status();
  Op* op = *posted;
  while (!op->done) {
    impl_->Poll();
    if (op->done) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      op->abandoned = true;  // freed when libfabric completes it or the endpoint closes
      return Status::TimedOut("fabric: send not completed within " +
                              std::to_string(timeout.count()) + " ms");
    }
  }
  const int err = op->error;
  const std::string text = std::move(op->error_text);
  impl_->Drop(op);
  if (err != 0) return Status::IoError("fabric: send failed: " + text);
  return Status::Ok();
}

Result<Message> Endpoint::Recv(uint64_t tag, uint64_t ignore, uint64_t max_len,
                               std::chrono::milliseconds timeout,
                               const std::function<bool()>& interrupt) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  Op* op = nullptr;
  if (impl_->standing != nullptr) {
    Op* st = std::exchange(impl_->standing, nullptr);
    if (impl_->standing_tag == tag && impl_->standing_ignore == ignore &&
        impl_->standing_max == max_len) {
      op = st;  // the same messages: wait on it again
    } else if (std::optional<Message> m = impl_->CancelRecv(st, impl_->standing_max);
               m && (m->tag & ~ignore) == (tag & ~ignore) && m->data.size() <= max_len) {
      return *std::move(m);
    }  // else what the old receive got, if anything, was for another caller: dropped
  }
  if (op == nullptr) {
    op = impl_->NewOp();
    op->capacity = max_len;
    if (impl_->spare && impl_->spare_capacity >= max_len) {
      op->buffer = std::move(impl_->spare);
      op->capacity = impl_->spare_capacity;
    } else {
      op->buffer.reset(new std::byte[max_len == 0 ? 1 : max_len]);  // uninitialised: no zeroing
    }
    NOPFS_RETURN_IF_ERROR(impl_->PostRetrying(op, deadline, "fabric: fi_trecv", "receive", [&] {
      return fi_trecv(impl_->ep.get(), op->buffer.get(), max_len, nullptr, FI_ADDR_UNSPEC, tag,
                      ignore, &op->ctx);
    }));
  }
  while (!op->done) {
    impl_->Poll();
    if (op->done) break;
    if (interrupt && interrupt()) {
      // fall through to the end of the wait below
    } else {
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left > std::chrono::steady_clock::duration::zero()) {
        impl_->Idle(std::min<std::chrono::microseconds>(
            std::chrono::duration_cast<std::chrono::microseconds>(left),
            std::chrono::milliseconds(50)));
        continue;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline || (interrupt && interrupt())) {
      // The receive stays posted for the next Recv (Impl::standing).
      impl_->standing = op;
      impl_->standing_tag = tag;
      impl_->standing_ignore = ignore;
      impl_->standing_max = max_len;
      return Status::TimedOut("fabric: no message within " + std::to_string(timeout.count()) +
                              " ms");
    }
  }
  if (op->error != 0) {
    const int err = op->error;
    const std::string text = std::move(op->error_text);
    impl_->Recycle(op);
    if (err == FI_ETRUNC) {
      return Status::Corruption("fabric: message longer than " + std::to_string(max_len) +
                                " bytes rejected");
    }
    return Status::IoError("fabric: receive failed: " + text);
  }
  Message m;
  m.tag = op->tag;
  m.data.assign(op->buffer.get(), op->buffer.get() + std::min(op->len, max_len));
  impl_->Recycle(op);
  return m;
}

bool Endpoint::supports_remote_read() const {
  return impl_->remote_read;
}

Result<ExposedRegion> Endpoint::ExposeForRemoteRead(std::span<const std::byte> region,
                                                    uint64_t key) {
  if (!impl_->remote_read) {
    return Status::FailedPrecondition("fabric: this endpoint does not do RMA reads");
  }
  if (region.empty()) return Status::InvalidArgument("fabric: an empty region");
  FidPtr<fid_mr> mr;
  int rc = OpenFid(&mr, [&](fid_mr** m) {
    return fi_mr_reg(impl_->domain.get(), region.data(), region.size(), FI_REMOTE_READ, 0, key, 0,
                     m, nullptr);
  });
  if (rc != 0) return Status::IoError(FiError("fabric: fi_mr_reg", rc));
  if ((impl_->info->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0) {
    if ((rc = fi_mr_bind(mr.get(), &impl_->ep->fid, 0)) != 0 ||
        (rc = fi_mr_enable(mr.get())) != 0) {
      return Status::IoError(FiError("fabric: binding a registration to the endpoint", rc));
    }
  }
  if (fi_mr_key(mr.get()) != key) {  // the provider ignored the requested key: do not use it
    return Status::FailedPrecondition("fabric: the provider chose its own registration key");
  }
  impl_->regions.push_back(std::move(mr));
  ExposedRegion out;
  out.key = key;
  const bool virt = (impl_->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0;
  out.wire_base = virt ? reinterpret_cast<uint64_t>(region.data()) : 0;
  return out;
}

Status Endpoint::PostRead(PeerAddr peer, uint64_t addr, uint64_t key, uint64_t length,
                          uint64_t cookie, std::chrono::milliseconds timeout) {
  if (!impl_->remote_read) {
    return Status::FailedPrecondition("fabric: this endpoint does not do RMA reads");
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Op* op = impl_->NewOp();
  op->is_read = true;
  op->cookie = cookie;
  op->capacity = length;
  op->read_buffer = ReadBufferPool::Get(impl_->read_pool, length);
  if (length == 0) {  // nothing to read: complete at once
    impl_->Finish(op);
    return Status::Ok();
  }
  NOPFS_RETURN_IF_ERROR(impl_->PostRetrying(op, deadline, "fabric: fi_read", "read", [&] {
    return fi_read(impl_->ep.get(), op->read_buffer.get(), length, nullptr, peer, addr, key,
                   &op->ctx);
  }));
  impl_->Poll();
  return Status::Ok();
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

void Endpoint::Wake() {
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
