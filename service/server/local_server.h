// LocalServer: nopfsd's end of the client wire format (protocol/wire.h, docs/wire.md), a UNIX
// stream socket in the job's run directory.
//
// Security: Start() only creates the socket inside an existing directory of mode 0700 owned by
// this process's uid, and gives the socket mode 0600. Each accepted peer's uid (SO_PEERCRED) must
// equal Options::allowed_uid; another uid gets an ERROR message, is logged and disconnected.
//
// Threads: one accept thread plus one thread per connection (a node has a handful of local ranks).
// Bounds (docs/security.md, "What a client can make nopfsd allocate"): at most
// Options::max_connections connections are open at once; one more is answered with ERROR
// (resource exhausted) and closed by the accept thread, without a thread of its own. A connection
// that has not completed HELLO within Options::hello_timeout, or that starts a request and does not
// finish it within Options::request_timeout, gets ERROR (timed out) and is closed; the accept
// thread checks both about every 100 ms. A connection idle between requests after HELLO is kept
// (a rank reads its ring for hours without a request). Streams are bounded by the Handler.
// Each connection is a strict request/answer loop. A malformed message (bad magic, version, type,
// length over 64 KiB, truncated or trailing fields, a message only the service sends) gets an
// ERROR answer and the connection is closed; other connections are unaffected. When a connection
// ends (CLOSE or disconnect, including the client's death) the handler's CloseStream() is called
// for every stream it still had open: that is how a dead client releases what it held.
//
// Thread safety: Start() and Stop() from one owner thread. Handler methods are called from
// connection threads, concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "protocol/wire.h"

namespace nopfs::service {

using ConnectionId = uint64_t;

struct OpenStreamRequest {
  uint32_t rank = 0;
  uint32_t epoch = 0;
  uint64_t step = 0;
  wire::StreamShare share;  // the whole stream unless the client sent the optional tail
  uint32_t flags = 0;       // wire::kOpenAcceptRegion, ...
  uint32_t client_pid = 0;  // as the client said in HELLO (informational)
  // The process the stream is read for: OPEN_STREAM's owner (a DataLoader worker's share) or
  // else client_pid. Streams of one rank whose epochs overlap must have one owner.
  uint32_t owner_pid = 0;
  uint32_t client_uid = 0;  // from SO_PEERCRED
};

// What the handler hands back for an open stream. The server dups and sends `ring_fd`; the
// handler keeps ownership of its descriptor (and of the ring).
struct StreamGrant {
  uint64_t stream_id = 0;  // unique for the daemon's lifetime
  int ring_fd = -1;
  uint64_t capacity = 0;
  uint32_t slot_count = 0;
  // The region ring slots may point into (only when the request accepted one): a read-only
  // descriptor the server sends after the ring's and then closes, and the bytes to map.
  wire::UniqueFd region_fd;
  uint64_t region_bytes = 0;
};

struct HelloInfo {
  std::string job_id;
  uint32_t ranks = 0;
  uint32_t first_rank = 0;
  uint32_t local_ranks = 0;
};

// Implemented by the daemon. It must outlive the LocalServer's Stop(): Stop() ends connections,
// which calls CloseStream() for their open streams.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual HelloInfo Hello() = 0;
  // Opens a rank's stream. An error status is sent to the client as ERROR.
  virtual Result<StreamGrant> OpenStream(const OpenStreamRequest& request, ConnectionId conn) = 0;
  // The client closed `stream_id`, or its connection ended. The daemon forgets the stream at
  // once (its count against the limits, its stall figures) and returns the rest: cancelling the
  // ring's writer and freeing the ring, which the server runs after it has sent CLOSE_OK (at
  // once when the connection ended), so that a client never waits for the ring's unmapping.
  // Called exactly once per granted stream.
  virtual std::function<void()> CloseStream(uint64_t stream_id) = 0;
  virtual std::string StatusText() = 0;
  // The structured status (STATUS with a report version, docs/wire.md "Structured status").
  virtual report::StatusReport Report() = 0;
  // Where a sample's bytes come from on the PFS (for clients that verify what they received).
  virtual Result<wire::DescribeOk> Describe(uint32_t sample_id) = 0;
  // A sibling job's read (READ_SAMPLE, docs/wire.md "Sibling reads"): fills `bytes` with sample
  // `sample_id` of the catalog whose fingerprint is `fingerprint` and returns their xxh3. The
  // default serves nobody (failed precondition).
  virtual Result<uint64_t> ReadSample(uint64_t fingerprint, uint32_t sample_id,
                                      std::vector<std::byte>* bytes) {
    (void)fingerprint;
    (void)sample_id;
    (void)bytes;
    return Status::FailedPrecondition("nopfsd: this service does not serve sibling reads");
  }
};

class LocalServer {
 public:
  struct Options {
    std::string socket_path;   // inside the job's run directory (mode 0700)
    uint32_t allowed_uid = 0;  // the job's uid
    int backlog = 64;          // listen() backlog
    // Connections open at once (each holds a thread); one more is refused with ERROR.
    size_t max_connections = 64;
    // From accept to a complete HELLO.
    std::chrono::milliseconds hello_timeout{5000};
    // From a request's first byte to its last.
    std::chrono::milliseconds request_timeout{5000};
  };

  LocalServer(Options options, Handler* handler);
  ~LocalServer();  // Stop()
  LocalServer(const LocalServer&) = delete;
  LocalServer& operator=(const LocalServer&) = delete;

  // Creates the socket (removing a stale socket file; refusing to replace anything else) and
  // starts accepting.
  Status Start();
  // Closes the listener and every connection, joins all threads, unlinks the socket. Idempotent.
  void Stop();

  // Connections currently open (for status and tests).
  size_t connections() const;
  // Peers refused for their uid, and malformed messages seen, since Start.
  uint64_t refused_peers() const { return refused_.load(); }
  uint64_t malformed_messages() const { return malformed_.load(); }
  // Connections refused because max_connections were open, and closed for a timeout, since Start.
  uint64_t refused_connections() const { return refused_full_.load(); }
  uint64_t timed_out_connections() const { return timed_out_.load(); }

 private:
  struct Conn {
    ConnectionId id = 0;
    wire::UniqueFd fd;
    std::thread thread;
    std::atomic<bool> done{false};
    // Watched by the accept thread: the connection is closed when now passes `deadline_ns`
    // (steady clock; 0 = no deadline): set at accept for HELLO and at each request's first byte.
    std::atomic<int64_t> deadline_ns{0};
    std::atomic<bool> timed_out{false};
  };

  // One connection's state between its requests (Serve's thread only).
  struct Session {
    Conn* conn = nullptr;
    uint32_t uid = 0;            // the client's, checked at accept
    bool hello = false;          // HELLO received: other requests are accepted
    uint32_t client_pid = 0;     // from HELLO
    std::set<uint64_t> streams;  // opened on this connection, closed when it ends
  };
  // The answer to one request, and the descriptors that go with it.
  struct Reply {
    wire::Message message;
    int pass_fd = -1;                  // sent with the message (owned elsewhere, or by sample_fd)
    wire::UniqueFd region_fd;          // sent after pass_fd, then closed
    wire::UniqueFd sample_fd;          // SAMPLE_OK's memfd (pass_fd), closed after sending
    bool close_after = false;          // not a request: the connection is closed after the answer
    std::function<void()> after_send;  // run once the answer is sent (or could not be)
  };

  void AcceptLoop();
  // A connection's thread: checks the peer's uid, then answers requests until the client goes,
  // a message is malformed or a request times out; closes the connection's streams.
  void Serve(Conn* conn);
  // Receives the next message; nullopt when the connection is to be closed (after saying why).
  std::optional<wire::Received> NextRequest(Session* s);
  Reply Answer(Session* s, const wire::Message& request);
  void AnswerOpenStream(Session* s, const wire::OpenStream& o, Reply* reply);
  void AnswerStatus(const wire::StatusRequest& st, Reply* reply);
  void AnswerReadSample(const wire::ReadSample& rs, Reply* reply);
  void ReapLocked() REQUIRES(mu_);
  void ExpireLocked() REQUIRES(mu_);
  void RefuseFull(int fd);

  Options options_;
  Handler* handler_;
  wire::UniqueFd listen_fd_;
  wire::UniqueFd wake_fd_;  // eventfd: wakes the accept loop on Stop
  std::thread accept_thread_;
  bool started_ = false;
  bool socket_created_ = false;

  mutable Mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  ConnectionId next_id_ GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> malformed_{0};
  std::atomic<uint64_t> refused_full_{0};
  std::atomic<uint64_t> timed_out_{0};
};

}  // namespace nopfs::service
