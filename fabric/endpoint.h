// fabric::Endpoint: one reliable-datagram (FI_EP_RDM) libfabric endpoint with tagged messages.
//
// What it is: an RAII owner of the libfabric objects a nopfsd needs to talk to its peers
// (fi_info, fabric, domain, address vector, completion queue, endpoint), opened on a fixed
// HOST:PORT so that peers can reach it from the job's `--peers` list. The provider comes from the
// node config ("tcp;ofi_rxm" by default, "verbs;ofi_rxm" where present).
//
// What it promises:
//   - Send and Recv complete, fail or time out; they never leave libfabric writing into memory the
//     caller owns: every operation works on a buffer the endpoint owns until libfabric reports its
//     completion (a timed-out receive is cancelled, a timed-out send is kept until it completes or
//     the endpoint closes).
//   - A message longer than the receive limit is reported as an error, never truncated silently.
//   - The destructor closes every libfabric object in the right order, endpoint first.
//
//   - An RMA read (PostRead) lands in a buffer the endpoint owns and hands over only once it has
//     completed, so a read that outlives its caller's patience can never write into the caller's
//     memory.
//
// Thread safety: none. One thread drives an Endpoint (the peer layer's progress thread); the
// completion queue is polled only from inside Send/Recv/Progress/PostRead.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace nopfs::fabric {

struct EndpointOptions {
  std::string provider = "tcp;ofi_rxm";  // fi_info provider name, as fi_info -p accepts it
  std::string host = "127.0.0.1";        // address to listen on
  uint16_t port = 0;                     // port to listen on; 0 lets the provider pick
  // Ask for RMA reads (FI_RMA, with keys the caller chooses); an endpoint whose provider cannot
  // do them opens without (supports_remote_read() says which). Every node of a job must agree.
  bool remote_read = true;
};

// libfabric tunables nopfs gives a default of its own, each set in the environment only where the
// environment does not already set it (an admin's own setting wins). libfabric reads them when it
// is loaded, so they must be set before (Endpoint::Open's first call loads it and calls
// SetLibfabricDefaults first; nopfsd calls it at its start, before it has threads, since setenv
// is not safe against another thread's getenv).
//   FI_OFI_RXM_MSG_RX_SIZE=1024: ofi_rxm over tcp pre-posts this many receive buffers of 16 KiB
//   when the endpoint opens (4,096 by default: 68 MB zeroed, 0.26 s of CPU per daemon); its
//   buffer pool grows by 1,024 at a time, so 1,024 costs one chunk.
//   FI_OFI_RXM_EAGER_LIMIT=1048576: messages up to 1 MiB go eagerly, in one send, straight into
//   the receive the peer link keeps posted (tcp places them there), instead of by rendezvous
//   above 16 KiB (a request to send, an RMA read of the sender's buffer by the receiver and a
//   notice back: two more messages and the waits between them for every reply of a 128 KiB
//   sample). ofi_rxm refuses a connection between endpoints whose eager limits differ, so
//   every node of a job must run with the same value.
struct LibfabricDefault {
  const char* name;
  const char* value;
};
inline constexpr LibfabricDefault kLibfabricDefaults[] = {
    {"FI_OFI_RXM_MSG_RX_SIZE", "1024"},
    {"FI_OFI_RXM_EAGER_LIMIT", "1048576"},
};
// Sets each of kLibfabricDefaults that the environment does not set; returns the names it set.
std::vector<std::string> SetLibfabricDefaults();

// Memory registered for remote reads: a peer reads [base, base + length) of it with
// Endpoint::PostRead(addr = wire_base + offset, key).
struct ExposedRegion {
  uint64_t key = 0;
  uint64_t wire_base = 0;  // the region's first byte as a remote address (0: offset-based keys)
};

// RMA reads land in buffers from a pool that the endpoint and every buffer it handed out share:
// releasing a buffer, on whatever thread and after the endpoint is gone, returns it to the pool.
// A fresh 128 KiB buffer per read cost a page fault per page as the read wrote into it (a tenth
// of a busy link's time); a recycled one is already mapped.
class ReadBufferPool;
struct ReturnToPool {
  std::shared_ptr<ReadBufferPool> pool;
  uint64_t capacity = 0;
  void operator()(std::byte* p) const;
};
using ReadBuffer = std::unique_ptr<std::byte[], ReturnToPool>;

// A finished RMA read (PostRead): its cookie, its bytes, or the error.
struct ReadCompletion {
  uint64_t cookie = 0;
  int error = 0;  // positive fi errno, 0 on success
  ReadBuffer data;
  uint64_t length = 0;
  std::string error_text;  // what failed, in the provider's words where it gives them
};

// A received message: its tag and its bytes.
struct Message {
  uint64_t tag = 0;
  std::vector<std::byte> data;
};

// A peer as the address vector knows it (an fi_addr_t).
using PeerAddr = uint64_t;

class Endpoint {
 public:
  // Opens the endpoint. Fails with Unavailable if the provider is not present on this node and
  // with IoError if the address cannot be bound (port in use).
  static Result<std::unique_ptr<Endpoint>> Open(const EndpointOptions& options);

  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Resolves HOST:PORT with the endpoint's provider and inserts it into the address vector.
  Result<PeerAddr> AddPeer(const std::string& host, uint16_t port);

  // Sends `data` tagged `tag` to `peer`; waits for the local completion at most `timeout`.
  Status Send(PeerAddr peer, uint64_t tag, std::span<const std::byte> data,
              std::chrono::milliseconds timeout);

  // Posts `data` tagged `tag` to `peer` and returns without waiting for its completion (the
  // endpoint keeps the copy until libfabric completes it; a failed completion is counted in
  // failed_posts()). TimedOut if the send queue stays full for `timeout`. Messages above the
  // provider's eager limit complete only once the receiver has matched them, so a thread that
  // also receives must use Post, never Send, or two such threads can wait on each other. Post
  // does not poll the completion queue (Progress, Recv and TakeReads do), so that a caller
  // posting several messages pays for one poll, not one each.
  Status Post(PeerAddr peer, uint64_t tag, std::span<const std::byte> data,
              std::chrono::milliseconds timeout);
  // The same without the copy: the endpoint takes the bytes.
  Status Post(PeerAddr peer, uint64_t tag, std::vector<std::byte>&& data,
              std::chrono::milliseconds timeout);
  // One message of `head` followed by `tail` (a gathered send: the two are not copied into
  // one buffer); the endpoint takes both.
  Status Post(PeerAddr peer, uint64_t tag, std::vector<std::byte>&& head,
              std::vector<std::byte>&& tail, std::chrono::milliseconds timeout);
  // The same with `tail` sent straight from the caller's memory, neither copied nor owned: it must
  // stay valid and unchanged until the endpoint is closed (the send completes at some point
  // before; the caller is not told when).
  Status PostBorrowed(PeerAddr peer, uint64_t tag, std::vector<std::byte>&& head,
                      std::span<const std::byte> tail, std::chrono::milliseconds timeout);

  // Receives one message from any peer whose tag matches `tag` in the bits not set in `ignore`,
  // of at most `max_len` bytes; TimedOut after `timeout`, or as soon as `interrupt` (if given,
  // checked between polls) returns true. A receive that timed out stays posted, and the next Recv
  // with the same tag, ignore and max_len waits on it, so a large message whose transfer outlasts
  // many short waits arrives whole; a Recv for other messages cancels it.
  Result<Message> Recv(uint64_t tag, uint64_t ignore, uint64_t max_len,
                       std::chrono::milliseconds timeout,
                       const std::function<bool()>& interrupt = nullptr);

  // The same, handing the message to `take` while its bytes are still in the endpoint's receive
  // buffer (valid during the call only) instead of copying them out: Ok once `take` has run.
  // `take` must not call this endpoint's Recv.
  using MessageView = std::function<void(uint64_t tag, std::span<const std::byte> data)>;
  Status RecvView(uint64_t tag, uint64_t ignore, uint64_t max_len,
                  std::chrono::milliseconds timeout, const std::function<bool()>& interrupt,
                  const MessageView& take);

  // Whether the endpoint was opened with RMA reads (EndpointOptions::remote_read and a provider
  // that accepts keys chosen by the caller).
  bool supports_remote_read() const;
  // Whether the provider does RMA reads in hardware, not in software over its messages (tcp,
  // sockets, udp: a read is a request and a response on the connection, which the target's
  // progress serves).
  bool remote_read_in_hardware() const;

  // Registers `region` for remote reads only (FI_REMOTE_READ: peers can never write it) under
  // `key`, which the caller draws at random and tells only authenticated peers (a key is the
  // capability: with tcp anybody who can reach the port and guesses it could read the region).
  // The registration lasts as long as the endpoint. FailedPrecondition without RMA support.
  Result<ExposedRegion> ExposeForRemoteRead(std::span<const std::byte> region, uint64_t key);

  // Posts an RMA read of `length` bytes at (addr, key) of `peer` into a buffer the endpoint
  // allocates; its completion is collected by TakeReads() under `cookie`. TimedOut if the queue
  // stays full for `timeout`.
  Status PostRead(PeerAddr peer, uint64_t addr, uint64_t key, uint64_t length, uint64_t cookie,
                  std::chrono::milliseconds timeout);
  // The reads completed since the last call (successful or not).
  std::vector<ReadCompletion> TakeReads();
  // Whether TakeReads() has something (a cheap check for a receive's interrupt).
  bool has_reads() const;

  // Drives the completion queue once (reaps finished and abandoned operations).
  void Progress();
  // Drives the completion queue until every message posted (Post, PostBorrowed) has completed,
  // i.e. the provider is done with it (true), or `timeout` has passed (false): before a close
  // that must not drop the last messages sent.
  bool Flush(std::chrono::milliseconds timeout);
  // Ends the idle wait of a Recv that has an `interrupt` early (the interrupt is then checked);
  // safe from any thread. Set what the interrupt checks before calling: Wake signals only a Recv
  // that sleeps, and one that is about to checks the interrupt once more first.
  void Wake();
  // Whether idle waits sleep on the completion queue's file descriptor (else in 100 us naps).
  bool waits_on_fd() const;

  const std::string& provider() const { return provider_; }
  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  // Operations posted and not yet completed (abandoned ones included); for tests.
  uint64_t pending_ops() const;
  // Posted messages whose completion reported an error.
  uint64_t failed_posts() const;

 private:
  struct Impl;
  explicit Endpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string provider_;
  std::string host_;
  uint16_t port_ = 0;
};

}  // namespace nopfs::fabric
