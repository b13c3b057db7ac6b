// Endpoint's inside, shared by its files: libfabric loaded on first use, its objects' owners, the
// hints, the pool of RMA read buffers, a posted operation (Op) and the endpoint's state (Impl).
// endpoint_lib.cc loads the library and makes the hints, endpoint.cc opens the endpoint and adds
// peers, endpoint_io.cc sends, receives and reads. Private to fabric/.
#pragma once

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
#include <atomic>
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

#include "fabric/endpoint.h"

namespace nopfs::fabric {
namespace endpoint_detail {

inline constexpr uint32_t kFabricVersion = FI_VERSION(1, 11);

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

// The library, loaded on the first call; its `error` says why not.
const Lib& Libfabric();

// "what: <fi_strerror(rc)>".
std::string FiError(const char* what, long rc);

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
InfoPtr MakeHints(const std::string& provider, bool remote_read);

}  // namespace endpoint_detail

using namespace endpoint_detail;  // the endpoint's files' own vocabulary

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

// One posted operation. `ctx` must come first: providers asking for FI_CONTEXT2 use it.
struct Op {
  fi_context2 ctx{};
  std::unique_ptr<std::byte[]> buffer;  // owned until libfabric completes the operation
  ReadBuffer read_buffer;               // an RMA read's destination, likewise
  std::vector<std::byte> message;       // a send's bytes, moved in by the caller (not copied)
  std::vector<std::byte> tail;          // a gathered send's second part, likewise
  std::span<const std::byte> borrowed;  // or one in the caller's memory (PostBorrowed)
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
  // Whether a Recv sleeps in poll() on the descriptors above (or is about to): Wake() writes the
  // eventfd only then, since a busy link is woken thousands of times a second by threads that
  // queue work it would see anyway, and each write and read is a system call.
  std::atomic<bool> sleeping{false};
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
      // A short read emptied the queue. Another read would only say so: each fi_cq_read drives
      // the provider, which costs tcp an epoll_wait, a third of a busy link's system calls.
      if (n < 16) return;
    }
  }

  // Blocks until the completion queue may have something, Wake() is called (only with
  // `interrupt`, which is checked once more after `sleeping` is set, so that a Wake between the
  // caller's check and the sleep is not lost), or `timeout` passes. Callers poll the queue
  // afterwards.
  void Idle(std::chrono::microseconds timeout, const std::function<bool()>* interrupt = nullptr) {
    if (std::chrono::steady_clock::now() - last_completion < kSpin) {
      std::this_thread::yield();
      return;
    }
    if (cq_fd < 0) {
      std::this_thread::sleep_for(std::min(timeout, std::chrono::microseconds(100)));
      return;
    }
    if (interrupt != nullptr && *interrupt) {
      sleeping.store(true);
      if ((*interrupt)()) {
        sleeping.store(false);
        return;
      }
    }
    fid* f = &cq->fid;
    // FI_SUCCESS: nothing pending, the fd may be waited on; otherwise there is work already.
    if (fi_trywait(fabric.get(), &f, 1) == FI_SUCCESS) {
      pollfd fds[2] = {{cq_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      const int ms = static_cast<int>(
          std::max<int64_t>(1, std::chrono::ceil<std::chrono::milliseconds>(timeout).count()));
      if (::poll(fds, 2, ms) > 0 && (fds[1].revents & POLLIN) != 0) {
        uint64_t n = 0;
        ssize_t ignored = ::read(wake_fd, &n, sizeof n);
        (void)ignored;
      }
    }
    sleeping.store(false);
  }

  // Posts a send of `data` (kept by the operation until it completes); retries while the queue
  // is full until `deadline`.
  Result<Op*> PostSend(PeerAddr peer, uint64_t tag, std::vector<std::byte> data,
                       std::chrono::steady_clock::time_point deadline,
                       std::vector<std::byte> tail = {}, std::span<const std::byte> borrowed = {});

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

}  // namespace nopfs::fabric
