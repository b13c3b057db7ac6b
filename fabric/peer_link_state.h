// PeerLink's inside, shared by its files: a read waiting for its reply (Pending) and the link core
// (State): the endpoint, the reads waiting for replies, the outgoing queue, exchanges, pushes, RMA
// registration and the counters. peer_link.cc holds PeerLink's own methods, peer_link_serve.cc
// State's serving of requests and its RMA, peer_link_progress.cc the progress thread (handshake,
// dispatch of what arrives, scheduling, expiry). Private to fabric/.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "fabric/peer_handshake.h"
#include "fabric/peer_link.h"
#include "fabric/serve_pool.h"

namespace nopfs::fabric {
namespace peer_link_detail {

inline constexpr auto kPollSlice = std::chrono::milliseconds(50);
// Exchange rounds a node may send before this node asks for them (Exchange is collective, so a
// node runs at most a round or two ahead); more are dropped, so that buffers cannot pile up.
inline constexpr uint32_t kMaxEarlyExchanges = 4;
// How long a start-up Hello to a node not heard from yet may wait for the provider's queue (a
// connection under way): not at all. It is tried once and, if the queue is full, dropped; it is
// sent again kHelloRetryUnheard later (the progress thread's receive slice is that short
// meanwhile), so that the progress thread neither blocks nor spins while the connection is made.
inline constexpr auto kHelloPost = std::chrono::milliseconds(0);
// How long a stopping link waits for its peers' LeaveAcks (at most the link's timeout), and how
// long each of its Leave and LeaveAck sends may wait for the provider's queue.
inline constexpr auto kLeaveWait = std::chrono::milliseconds(2000);
inline constexpr auto kLeavePost = std::chrono::milliseconds(100);

inline uint64_t TagOf(uint32_t node) {
  return uint64_t{node} << 32;
}

}  // namespace peer_link_detail

// One Read waiting for its reply (shared by the reader and, while in State::pending, the link:
// whoever lets go of it last frees it, so that the reader can be woken without the link's mutex).
struct PeerLink::Pending {
  uint32_t peer = 0;
  uint64_t sample = 0;
  bool sent = false;
  bool done = false;  // under the link's mutex: answered, failed or given up; set before `ready`
  // Set (release) once the fields below are final, and notified: the reader waits on it alone (a
  // futex), so that it is woken once, not woken and then made to wait for the mutex of the thread
  // that woke it.
  std::atomic<uint32_t> ready{0};
  bool remote_posted = false;  // a kRemoteReply came: an RMA read is under way
  Status status;
  std::vector<std::byte> data;
  uint64_t data_xxh3 = 0;  // what the sealed reply says data hashes to
  // ReadInto's destination: a reply of its size is copied there by the progress thread, out of
  // the receive buffer (in_dst), instead of into `data`. The reader cannot leave before done.
  std::span<std::byte> dst;
  bool in_dst = false;
  // The RMA path: the bytes as the read delivered them and the xxh3 they must have.
  ReadBuffer remote;
  uint64_t remote_len = 0;
  uint64_t remote_xxh3 = 0;
  bool is_remote = false;
  std::chrono::steady_clock::time_point deadline{};
};

// The link core: the endpoint, the reads waiting for replies, the outgoing queue, exchanges,
// pushes, RMA registration and the counters. The progress thread (Run) alone drives the endpoint
// and the handshake; the serving threads answer requests through Answer.
struct PeerLink::State {
  PeerLinkOptions opts;
  ServeFn serve;
  std::unique_ptr<Endpoint> ep;
  // Whether this node asks for RMA reads (PeerLink::asks_remote_read); set before the threads.
  bool ask_remote = false;
  std::vector<PeerAddr> addr;  // fi_addr of every node
  // The handshake and the sessions, read and written by the progress thread only (the other
  // threads see a peer's death through `dead`).
  std::unique_ptr<PeerHandshake> shake;
  // Per node, whether a message claiming to be from it has arrived (progress thread only).
  std::vector<bool> heard;
  // Per node, whether this node has sent it a LeaveAck, after which it sends it nothing (progress
  // thread only).
  std::vector<bool> acked_leave;
  ServePool pool;

  using Pending = PeerLink::Pending;
  mutable Mutex mu;
  CondVar cv;  // exchanges, registrations and dead peers (a Read waits on its Pending::ready)
  // Per node, whether it is dead (as shake's client state kDead, for the threads other than the
  // progress thread; both are set together by KillLocked).
  std::vector<bool> dead GUARDED_BY(mu);
  // Per node, whether this node's handshake with it is done (shake's client state kAuthed).
  std::vector<bool> joined GUARDED_BY(mu);
  // Per node, whether it answered this node's Hello without proving the job secret (logged once).
  std::vector<bool> failed_auth GUARDED_BY(mu);
  // WaitForPeers' deadline: handshakes started before it last until it.
  std::chrono::steady_clock::time_point startup_until GUARDED_BY(mu){};
  std::map<uint64_t, std::shared_ptr<Pending>> pending GUARDED_BY(mu);
  // A message to send: its encoded bytes and, for a reply whose data was not copied into it, the
  // data (sent after them in the same message: Endpoint::Post with a tail), or, for an in-place
  // sample, where it is (Endpoint::PostBorrowed: the memory outlives the link).
  struct Outgoing {
    uint32_t node = 0;
    std::vector<std::byte> bytes;
    std::vector<std::byte> tail;
    std::span<const std::byte> borrowed;
  };
  std::deque<Outgoing> outbox GUARDED_BY(mu);
  uint64_t next_id GUARDED_BY(mu) = 1;
  // Exchange buffers, class-done notices and pushes waiting for their peer's handshake.
  std::deque<std::pair<uint32_t, PeerMessage>> exchange_out GUARDED_BY(mu);
  // Per node, the classes it reported done (bit c: class c < 64; larger classes never count).
  std::vector<uint64_t> peer_done GUARDED_BY(mu);
  std::chrono::steady_clock::time_point last_reject_log GUARDED_BY(mu){};
  // Exchange buffers received per (round, node).
  std::map<std::pair<uint64_t, uint32_t>, std::vector<std::byte>> exchange_in GUARDED_BY(mu);
  PeerLinkCounters counters GUARDED_BY(mu);
  bool stop GUARDED_BY(mu) = false;
  std::atomic<bool> wake{false};  // a Read is waiting to be scheduled: end the receive slice
  std::thread thread;
  uint64_t push_queued_bytes GUARDED_BY(mu) = 0;  // pushes waiting in exchange_out
  static constexpr uint64_t kMaxPushQueued = uint64_t{64} << 20;
  // RMA: memory exposed for peers' reads (registered by the progress thread; a Region's fields are
  // read and written with mu held).
  struct Region {
    const std::byte* begin = nullptr;
    uint64_t size = 0;
    bool registered = false;
    bool tried = false;  // the progress thread has tried to register it
    Status status;       // why not, if it failed
    ExposedRegion exposed;
  };
  // A deque: the progress thread keeps pointers while others append.
  std::deque<Region> regions GUARDED_BY(mu);
  bool regions_pending GUARDED_BY(mu) = false;
  // RemoteReplies whose RMA read the progress thread must post: (node, reply).
  std::deque<std::pair<uint32_t, RemoteReply>> reads_to_post GUARDED_BY(mu);

  // The registered region holding [p, p + n), if any.
  const Region* RegionOfLocked(const std::byte* p, uint64_t n) const REQUIRES(mu);

  // A serving thread's job (or the progress thread's, without serving threads).
  void Serve(ServeJob& job);
  // Serves one request and queues its reply (any thread).
  void Answer(const ServeJob& job);
  // Queues the reply `r` to `job` (any thread); `nowait`: r came from serve_nowait.
  void Answer(const ServeJob& job, ServeResult r, bool nowait);

  // Progress thread: registers exposed regions, posts the RMA reads of RemoteReplies, and hands
  // completed reads to their waiting Read calls.
  void DriveRemote();

  void Queue(uint32_t node, const PeerMessage& m) REQUIRES(mu);

  // Ends `w`'s wait: its fields are final (`done` set). Any thread; the caller holds a reference.
  static void Release(Pending& w) {
    w.ready.store(1, std::memory_order_release);
    // A futex wake, not std::atomic::notify_one: the waiter (AwaitReady) sleeps in the futex at
    // once instead of spinning and yielding first, which cost a busy link's readers a quarter of
    // their CPU time.
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w.ready), FUTEX_WAKE_PRIVATE, 1, nullptr,
              nullptr, 0);
  }
  // Waits until Release(w).
  static void AwaitReady(Pending& w) {
    static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
    while (w.ready.load(std::memory_order_acquire) == 0) {
      ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w.ready), FUTEX_WAIT_PRIVATE, 0, nullptr,
                nullptr, 0);
    }
  }

  // Kills `peer`, failing every read waiting on it (logged as a warning unless `left`: the peer
  // said it stops).
  void KillLocked(uint32_t peer, const std::string& why, bool left = false) REQUIRES(mu);

  void Malformed(uint32_t node, const std::string& why);

  // Logs and counts a message refused for want of authentication.
  void Refused(uint32_t node, const std::string& why);

  // Whether to log one more rejected message. A flood of forged messages must not
  // fill the job's log: the first 20 are logged, then one line every 10 s with the totals (the
  // counters count every one).
  bool ShouldLogLocked() REQUIRES(mu);

  // Progress thread: acts on what the handshake made of a message from `node`.
  void Apply(uint32_t node, HandshakeStep step);

  // Requests, exchanges, notices and pushes to this node as a server; each has passed its
  // session's Admit.
  void HandleRequest(uint32_t node, PeerMessage& m);

  // Replies to this node as a client; a sealed one has passed Admit with sequence number `seq`.
  // A ReadReply's data is `reply_data`, a view of the receive buffer (Decode leaves it there).
  void HandleReply(uint32_t node, uint64_t seq, PeerMessage& m,
                   std::span<const std::byte> reply_data);

  // Progress thread: hands a message from `node` (sealed ones admitted with seq `seq`) to the
  // handshake or to the request and reply handlers.
  void Dispatch(uint32_t node, uint64_t seq, PeerMessage& m, std::span<const std::byte> reply_data);

  // Progress thread: checks a message that arrived tagged `tag` (its sender, its decoding, its
  // session) and dispatches it; `data` is the endpoint's receive buffer, valid during the call.
  void OnMessage(uint64_t tag, std::span<const std::byte> data);

  // Progress thread: `node` says its link stops: it is dead to this node from now on, and the
  // LeaveAck queued here is the last message this node sends it.
  void OnLeave(uint32_t node);

  // Progress thread, once `stop` is set: tells every node this node has a session with that it
  // stops (Leave) and receives until each has answered (LeaveAck: nothing of theirs is in flight
  // any more, so that closing the endpoint cuts no message short) or min(timeout, kLeaveWait) has
  // passed. What arrives meanwhile is dropped, but for Leaves, which it answers.
  void Depart();

  // Progress thread: a node that this one gave up on because it did not answer the handshake
  // (it started later) has sent a Hello: it is up now, so this node tries again (at most once per
  // ten timeouts, PeerHandshake::Revive).
  void ReviveOnHello(uint32_t node);

  // Starts the handshake with `peer` if none was started.
  void BeginLocked(uint32_t peer, std::chrono::steady_clock::time_point now) REQUIRES(mu);

  // Starts handshakes, queues reads of authenticated peers, expires deadlines.
  void ScheduleLocked() REQUIRES(mu);

  void Run();
};

}  // namespace nopfs::fabric
