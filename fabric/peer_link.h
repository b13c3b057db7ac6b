// fabric::PeerLink: one nopfsd's authenticated peer service over a fabric::Endpoint: it serves
// samples of this node's tiers to the other nodes of the job (through a ServeFn, by copy or by
// RMA), fetches samples from them, runs the all-to-all Exchange and carries pushes and class-done
// notices. Node `node` of `peers.size()` listens on peers[node] and knows node i by the i-th entry
// of `--peers`. Its parts: fabric/peer_handshake.h (the HMAC handshake and the sealed sessions),
// fabric/serve_pool.h (the serving threads) and the link core in peer_link.cc (the progress
// thread, the waiting reads, RMA, exchanges, pushes, counters). What it promises (authentication,
// malformed and unmatched messages, dead peers, RMA, resource limits) is docs/fabric.md, "Peer
// transport".
//
// Thread safety: Read, ReadInto, Push, IsDead and counters() may be called from any number of
// threads; the ServeFn and on_push are called from the serving threads concurrently (or from the
// progress thread alone when serve_threads is 0, or for serve_inline requests), and must be
// thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "fabric/endpoint.h"
#include "fabric/peer_protocol.h"

namespace nopfs::fabric {

struct PeerAddress {
  std::string host;
  uint16_t port = 0;
};

// Parses "HOST:PORT,HOST:PORT,...".
Result<std::vector<PeerAddress>> ParsePeerList(const std::string& list);

struct ServeResult;  // below

struct PeerLinkOptions {
  std::string provider = "tcp;ofi_rxm";
  uint32_t node = 0;                        // this node's index in `peers`
  std::vector<PeerAddress> peers;           // every node of the job, this one included
  Secret secret{};                          // the per-job secret
  std::chrono::milliseconds timeout{2000};  // per request (and per handshake)
  // Threads that answer read requests (0: the progress thread answers them itself).
  uint32_t serve_threads = 2;
  // Requests for which this returns true are answered on the progress thread itself (a read from
  // memory: the hand-off to a serving thread and back would cost more than the read); the others
  // by the serving threads (a read that may block, e.g. from an SSD). Unset: all by the threads.
  std::function<bool(uint64_t sample)> serve_inline;
  // Tried on the progress thread for the requests serve_inline leaves to the serving threads: a
  // read that can be done at once (an SSD tier's bytes that are in the page cache: preadv2 with
  // RWF_NOWAIT) is answered there, which spares the hand-off to a serving thread and back; one
  // that would block returns ServeResult::WouldBlock() and goes to the serving threads, which call
  // the ServeFn. Must never block. Unset: not tried.
  std::function<ServeResult(uint64_t sample)> serve_nowait;
  // Use RMA reads where the provider does them (every node of a job must agree; off: tagged
  // replies only).
  bool remote_read = true;
  // Where the provider does RMA in software (tcp: the read is a request and a response over the
  // same connection, served by the other node's progress thread), an in-place sample comes
  // sooner in a reply sent straight from its memory (two messages instead of four), so this node
  // asks for RMA reads there only if this is set (the tests and the benchmark set it, to exercise
  // and measure that path). Where the provider does RMA in hardware, remote_read suffices.
  bool rma_in_software = false;
  // In-place samples smaller than this go in the reply even to a reader that does RMA: one round
  // trip instead of two (the RMA read is a second one), and below 16 KiB the copy into the reply
  // costs less than the wait.
  uint64_t remote_read_min = 16 << 10;
  // Receives the samples other nodes push (Push): runs on the serving threads (several at once),
  // or the progress thread when serve_threads is 0; must be thread-safe. Unset: pushes are
  // dropped.
  std::function<void(uint32_t node, uint64_t sample, uint64_t xxh3,
                     std::span<const std::byte> data)>
      on_push;
  // Called once the endpoint is bound (its port is this process's from then on), on the calling
  // thread and before the link starts a thread of its own: nopfsd gives up the capability that let
  // it bind a privileged port there. An error fails Start.
  std::function<Status()> after_bind;
};

// Answers a peer's request for `sample`: status kOk with the bytes, kNotAvailable when the slot
// is not ready, kError when the tier failed. Runs on the serving threads (several at once), or on
// the progress thread when serve_threads is 0.
//
// The bytes come either copied (`data`) or in place (`in_place`: memory that stays valid and
// unchanged until the link is destroyed, with the xxh3 recorded when it was filled). In place, the
// link answers with an RMA descriptor when the memory lies in a region given to
// ExposeForRemoteRead and the reader asked for RMA, and otherwise sends the reply's data straight
// from the memory (no copy; a send may still be under way when the ServeFn has returned); either
// way the reader checks `xxh3` before it uses a byte (kCorruption on a mismatch).
struct ServeResult {
  ReadStatus status = ReadStatus::kNotAvailable;
  std::vector<std::byte> data;
  std::span<const std::byte> in_place;
  uint64_t xxh3 = 0;      // of in_place, or of data when `verified`
  bool verified = false;  // data hashes to xxh3 (Verified)

  static ServeResult Copied(std::vector<std::byte> bytes) {
    ServeResult r;
    r.status = ReadStatus::kOk;
    r.data = std::move(bytes);
    return r;
  }
  // Copied bytes the server has verified to hash to `xxh3` (a tier's read checks the checksum
  // recorded at fill): the link sends it instead of hashing them again.
  static ServeResult Verified(std::vector<std::byte> bytes, uint64_t xxh3) {
    ServeResult r = Copied(std::move(bytes));
    r.xxh3 = xxh3;
    r.verified = true;
    return r;
  }
  static ServeResult InPlace(std::span<const std::byte> bytes, uint64_t xxh3) {
    ServeResult r;
    r.status = ReadStatus::kOk;
    r.in_place = bytes;
    r.xxh3 = xxh3;
    return r;
  }
  static ServeResult Refused(ReadStatus status) {  // kNotAvailable or kError
    ServeResult r;
    r.status = status;
    return r;
  }
  // PeerLinkOptions::serve_nowait's answer when the read would block: not an answer to the peer,
  // the request goes to the serving threads.
  static ServeResult WouldBlock() {
    ServeResult r;
    r.would_block = true;
    return r;
  }
  bool would_block = false;
};
using ServeFn = std::function<ServeResult(uint64_t sample)>;

struct PeerLinkCounters {
  uint64_t served_reads = 0;  // requests answered with data
  uint64_t served_bytes = 0;
  uint64_t served_not_available = 0;
  uint64_t fetched_reads = 0;  // Read/ReadInto calls that handed bytes over (checks passed)
  uint64_t fetched_bytes = 0;
  uint64_t fetch_not_available = 0;
  uint64_t timeouts = 0;         // requests or handshakes that timed out (peer then dead)
  uint64_t auth_refused = 0;     // handshakes refused (wrong secret) or requests before auth
  uint64_t malformed = 0;        // messages rejected by the codec or unmatched replies
  uint64_t served_remote = 0;    // of served_reads: answered with an RMA descriptor
  uint64_t served_in_place = 0;  // of served_reads: in a reply sent straight from the memory
  uint64_t served_nowait = 0;    // of served_reads: by serve_nowait, on the progress thread
  uint64_t fetched_remote = 0;   // of fetched_reads: fetched with an RMA read
  uint64_t remote_failed = 0;    // RMA reads that failed or delivered bytes failing their xxh3
  uint64_t pushes_sent = 0;      // Push messages queued to a peer
  uint64_t push_bytes_sent = 0;
  uint64_t pushes_dropped = 0;     // not sent: peer dead, or too many bytes waiting
  uint64_t pushes_received = 0;    // handed to on_push
  uint64_t peers_left = 0;         // nodes that said their link stops (Leave)
  uint64_t leaves_unanswered = 0;  // nodes that had not answered this link's Leave when it stopped
};

class PeerLink {
 public:
  // Opens the endpoint on peers[node] and starts the progress thread.
  static Result<std::unique_ptr<PeerLink>> Start(const PeerLinkOptions& options, ServeFn serve);
  ~PeerLink();  // Stop(), then closes the endpoint

  // Stops the threads and fails outstanding reads; later Reads fail at once with Unavailable
  // and nothing more is served. Before its progress thread ends, the link tells the nodes it has
  // sessions with that it stops, and waits (at most the timeout or 2 s) until each has answered
  // that it will send nothing more; those nodes fail their reads from this one at once instead
  // of waiting for the timeout. Idempotent.
  void Stop();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  // Fetches `sample` from node `peer`: the bytes, NotFound if the peer does not have it ready,
  // Unavailable if the peer is dead or refused us, TimedOut on the timeout that kills it,
  // Corruption if RMA-read bytes fail their xxh3.
  Result<std::vector<std::byte>> Read(uint32_t peer, uint64_t sample);
  // The same into `dst`, which must be the sample's exact size (Corruption otherwise); returns
  // the xxh3 of the bytes now in `dst`. One copy fewer than Read on the RMA path.
  Result<uint64_t> ReadInto(uint32_t peer, uint64_t sample, std::span<std::byte> dst);

  // Registers `region` for peers' RMA reads (see the class comment); in-place answers inside it
  // then go by RMA (the progress thread registers it; the call waits for that). Without RMA
  // support (FailedPrecondition) or if registration fails, in-place answers are copied into
  // replies. `region` must outlive the link.
  Status ExposeForRemoteRead(std::span<const std::byte> region);
  // Whether this link's endpoint does RMA reads.
  bool supports_remote_read() const;
  // Whether this node asks its peers for RMA reads of in-place samples (supports_remote_read(),
  // and the provider does them in hardware or rma_in_software is set).
  bool asks_remote_read() const;

  // The start-up phase (docs/fabric.md, "Start-up"): handshakes with every other node and waits
  // until every one has answered or `deadline` has passed. Until then every handshake waiting
  // for its Challenge sends its Hello again every kHelloRetryUnheard until the node has been
  // heard from (it may not be listening yet: such a Hello is lost), at once when it first is,
  // and every kHelloRetry after that; handshakes started by other
  // calls also last until the deadline. Ok once every other node has answered; Unavailable naming
  // the nodes that had not by the deadline (they are then dead; one that starts later still joins
  // when its Hello arrives), and those that answered this node's Hello without proving the job
  // secret (dead at once: waiting for them would change nothing; logged when it happens).
  Status WaitForPeers(std::chrono::steady_clock::time_point deadline);
  static constexpr std::chrono::milliseconds kHelloRetry{250};
  static constexpr std::chrono::milliseconds kHelloRetryUnheard{10};

  // One collective all-to-all round (the shape of service/peers/directory.h's dir::Exchange): sends
  // out[k] to node k and returns in[k] from node k (in[node] = out[node]). Every node must call it
  // with the same rounds in the same order; `round` numbers them (distinct per call). Needs
  // out.size() == nodes(). Unavailable if a peer is dead or refused us, TimedOut at `deadline`
  // (without one: 5 x timeout from the call).
  Result<std::vector<std::vector<std::byte>>> Exchange(uint64_t round,
                                                       std::vector<std::vector<std::byte>> out);
  Result<std::vector<std::vector<std::byte>>> Exchange(
      uint64_t round, std::vector<std::vector<std::byte>> out,
      std::chrono::steady_clock::time_point deadline);

  // Tells every other node that this node's class `cls` is filled (peer_protocol.h, kClassDone);
  // sent once each peer's handshake is done.
  void AnnounceClassDone(uint32_t cls);
  // Offers node `peer` the bytes of `sample` (xxh3 `xxh3`), read here from the PFS before that
  // node had them: best effort, never blocks; dropped (and counted) when the peer is dead or more
  // than 64 MiB of pushes wait to be sent.
  void Push(uint32_t peer, uint64_t sample, uint64_t xxh3, std::span<const std::byte> data);

  // Whether node `peer` reported class `cls` done (classes 0..63).
  bool PeerClassDone(uint32_t peer, uint32_t cls) const;

  bool IsDead(uint32_t peer) const;
  PeerLinkCounters counters() const;
  uint32_t node() const;
  uint32_t nodes() const;
  const std::string& provider() const;

 private:
  struct State;
  struct Pending;
  explicit PeerLink(std::unique_ptr<State> state);
  // Queues a read of `sample` from `peer` and waits for its reply (w's status and bytes).
  Status Await(uint32_t peer, uint64_t sample, const std::shared_ptr<Pending>& w);
  // Counts a read whose bytes reach the caller (of the right size; by RMA, checksum passed).
  void CountFetched(uint64_t bytes, bool remote);
  std::unique_ptr<State> s_;
};

}  // namespace nopfs::fabric
