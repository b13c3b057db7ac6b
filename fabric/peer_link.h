// fabric::PeerLink: one nopfsd's authenticated peer service over a fabric::Endpoint — it serves
// samples of this node's tiers to the other nodes of the job and fetches samples from them.
//
// What it is: a node `node` of `peers.size()` nodes listens on peers[node] and knows every other
// node by its HOST:PORT (node i = i-th entry of `--peers`). A progress thread owns the endpoint:
// it sends queued messages, receives every incoming one, hands authenticated read requests to a
// few serving threads (which answer them through the ServeFn) and hands replies to the waiting
// Read calls.
//
// What it promises:
//   - No request is served to, and no reply accepted from, a node that has not passed the HMAC
//     challenge/response on the per-job secret (both directions are proven: the server signs the
//     client's nonce, the client the server's). A refused peer is counted and logged.
//   - Every incoming message is length- and type-checked (peer_protocol.h); a malformed one is
//     counted, logged and dropped; nothing a peer sends can crash the daemon.
//   - A reply must match an outstanding request id, the node it was sent to, and the sample asked
//     for; any other reply is dropped as malformed.
//   - A peer that does not answer within `timeout` costs that one timeout: it is marked dead and
//     every later Read to it fails at once with Unavailable (callers fall back to local/PFS).
//   - The tag of every message carries the sending node in its high 32 bits; replies always go to
//     the address the `--peers` list gives for that node, so a forged tag earns no data.
//
// Thread safety: Read, IsDead and counters() may be called from any number of threads; the
// ServeFn is called from the serving threads concurrently (or from the progress thread alone
// when serve_threads is 0), and must be thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
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
};

// Answers a peer's request for `sample`: status kOk with the bytes, kNotAvailable when the slot
// is not ready, kError when the tier failed. Runs on the serving threads (several at once), or on
// the progress thread when serve_threads is 0.
struct ServeResult {
  ReadStatus status = ReadStatus::kNotAvailable;
  std::vector<std::byte> data;
};
using ServeFn = std::function<ServeResult(uint64_t sample)>;

struct PeerLinkCounters {
  uint64_t served_reads = 0;  // requests answered with data
  uint64_t served_bytes = 0;
  uint64_t served_not_available = 0;
  uint64_t fetched_reads = 0;  // Read calls that returned data
  uint64_t fetched_bytes = 0;
  uint64_t fetch_not_available = 0;
  uint64_t timeouts = 0;      // requests or handshakes that timed out (peer then dead)
  uint64_t auth_refused = 0;  // handshakes refused (wrong secret) or requests before auth
  uint64_t malformed = 0;     // messages rejected by the codec or unmatched replies
};

class PeerLink {
 public:
  // Opens the endpoint on peers[node] and starts the progress thread.
  static Result<std::unique_ptr<PeerLink>> Start(const PeerLinkOptions& options, ServeFn serve);
  ~PeerLink();  // Stop(), then closes the endpoint

  // Stops the threads and fails outstanding reads; later Reads fail at once with Unavailable
  // and nothing more is served. Idempotent.
  void Stop();
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  // Fetches `sample` from node `peer`: the bytes, NotFound if the peer does not have it ready,
  // Unavailable if the peer is dead or refused us, TimedOut on the timeout that kills it.
  Result<std::vector<std::byte>> Read(uint32_t peer, uint64_t sample);

  // One collective all-to-all round (the shape of service/directory.h's dir::Exchange): sends
  // out[k] to node k and returns in[k] from node k (in[node] = out[node]). Every node must call it
  // with the same rounds in the same order; `round` numbers them (distinct per call). Needs
  // out.size() == nodes(). Unavailable if a peer is dead or refused us, TimedOut after 5 x timeout.
  Result<std::vector<std::vector<std::byte>>> Exchange(uint64_t round,
                                                       std::vector<std::vector<std::byte>> out);

  // Tells every other node that this node's class `cls` is filled (peer_protocol.h, kClassDone);
  // sent once each peer's handshake is done.
  void AnnounceClassDone(uint32_t cls);
  // Whether node `peer` reported class `cls` done (classes 0..63).
  bool PeerClassDone(uint32_t peer, uint32_t cls) const;

  bool IsDead(uint32_t peer) const;
  PeerLinkCounters counters() const;
  uint32_t node() const;
  uint32_t nodes() const;
  const std::string& provider() const;

 private:
  struct State;
  explicit PeerLink(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace nopfs::fabric
