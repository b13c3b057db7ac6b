#include "fabric/peer_link.h"

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "common/mutex.h"

namespace nopfs::fabric {
namespace {

constexpr std::string_view kServerLabel = "nopfs-peer-server";
constexpr std::string_view kClientLabel = "nopfs-peer-client";
constexpr auto kPollSlice = std::chrono::milliseconds(50);
// Exchange rounds a node may send before this node asks for them (Exchange is collective, so a
// node runs at most a round or two ahead); more are dropped, so that buffers cannot pile up.
constexpr uint32_t kMaxEarlyExchanges = 4;

uint64_t TagOf(uint32_t node) {
  return uint64_t{node} << 32;
}

}  // namespace

Result<std::vector<PeerAddress>> ParsePeerList(const std::string& list) {
  std::vector<PeerAddress> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(start, end - start);
    size_t colon = item.rfind(':');
    if (item.empty() || colon == std::string::npos || colon == 0 || colon + 1 == item.size()) {
      return Status::InvalidArgument("--peers: \"" + item + "\" is not HOST:PORT");
    }
    uint64_t port = 0;
    for (char c : item.substr(colon + 1)) {
      if (c < '0' || c > '9' || port > 65535) {
        return Status::InvalidArgument("--peers: bad port in \"" + item + "\"");
      }
      port = port * 10 + static_cast<uint64_t>(c - '0');
    }
    if (port == 0 || port > 65535) {
      return Status::InvalidArgument("--peers: bad port in \"" + item + "\"");
    }
    out.push_back({item.substr(0, colon), static_cast<uint16_t>(port)});
    start = end + 1;
  }
  return out;
}

// One Read waiting for its reply (on the reader's stack; in State::pending until answered).
struct PeerLink::Pending {
  uint32_t peer = 0;
  uint64_t sample = 0;
  bool sent = false;
  bool done = false;
  CondVar cv;                  // signalled (under the link's mutex) when done is set
  bool remote_posted = false;  // a kRemoteReply came: an RMA read is under way
  Status status;
  std::vector<std::byte> data;
  uint64_t data_xxh3 = 0;  // what the sealed reply says data hashes to
  // The RMA path: the bytes as the read delivered them and the xxh3 they must have.
  ReadBuffer remote;
  uint64_t remote_len = 0;
  uint64_t remote_xxh3 = 0;
  bool is_remote = false;
  std::chrono::steady_clock::time_point deadline{};
};

struct PeerLink::State {
  PeerLinkOptions opts;
  ServeFn serve;
  std::unique_ptr<Endpoint> ep;
  std::vector<PeerAddr> addr;  // fi_addr of every node

  // Server side, per client node: the session its last successful handshake opened (written
  // and read by the progress thread only). The server keeps no state per Hello: its nonce is a
  // MAC of the client's under `cookie`, and the Auth echoes both, so that a forged Hello changes
  // nothing.
  struct InState {
    bool authed = false;
    Nonce client_nonce{};
    std::unique_ptr<SessionKey> key;
    ReplayWindow window;    // the client's requests
    uint64_t send_seq = 0;  // our replies
  };
  std::vector<InState> in;
  Secret cookie{};

  // Client side, one per server node. `state` is written with mu held (by the progress thread,
  // which also reads it without mu); the session (key, window, send_seq) is written and read by
  // the progress thread only.
  enum class Out { kNone, kHelloSent, kAuthSent, kAuthed, kDead };
  struct OutState {
    Out state = Out::kNone;
    Nonce client_nonce{};
    std::chrono::steady_clock::time_point handshake_deadline{};
    std::unique_ptr<SessionKey> key;  // from the server's challenge on
    ReplayWindow window;              // the server's replies
    uint64_t send_seq = 0;            // our requests, exchanges, notices and pushes
  };
  using Pending = PeerLink::Pending;
  mutable Mutex mu;
  CondVar cv;  // exchanges, registrations and dead peers (each Read has its own)
  std::vector<OutState> out;
  std::map<uint64_t, Pending*> pending GUARDED_BY(mu);
  std::deque<std::pair<uint32_t, std::vector<std::byte>>> outbox GUARDED_BY(mu);  // (node, message)
  uint64_t next_id GUARDED_BY(mu) = 1;
  // Exchange buffers waiting for their peer's handshake, and buffers received per (round, node).
  // Exchange buffers and class-done notices waiting for their peer's handshake.
  std::deque<std::pair<uint32_t, PeerMessage>> exchange_out GUARDED_BY(mu);
  // Per node, the classes it reported done (bit c: class c < 64; larger classes never count).
  std::vector<uint64_t> peer_done GUARDED_BY(mu);
  std::chrono::steady_clock::time_point last_reject_log GUARDED_BY(mu){};
  std::map<std::pair<uint64_t, uint32_t>, std::vector<std::byte>> exchange_in GUARDED_BY(mu);
  PeerLinkCounters counters GUARDED_BY(mu);
  bool stop GUARDED_BY(mu) = false;
  std::atomic<bool> wake{false};  // a Read is waiting to be scheduled: end the receive slice
  std::thread thread;
  // Serving: authenticated read requests wait in serve_queue for the serving threads, so that a
  // slow tier read (an SSD) delays neither the progress thread nor the other requests.
  struct ServeJob {
    uint32_t node;
    uint64_t request_id;
    uint64_t sample;
    bool remote_ok;     // the reader asked with kAcceptsRemoteRead
    bool push = false;  // a Push to hand to on_push, not a read request
    uint64_t push_xxh3 = 0;
    std::vector<std::byte> push_data;
  };
  uint64_t push_queued_bytes GUARDED_BY(mu) = 0;  // pushes waiting in exchange_out
  static constexpr uint64_t kMaxPushQueued = uint64_t{64} << 20;
  std::deque<ServeJob> serve_queue GUARDED_BY(mu);
  CondVar serve_cv;
  std::vector<std::thread> servers;
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
  const Region* RegionOfLocked(const std::byte* p, uint64_t n) const REQUIRES(mu) {
    for (const Region& r : regions) {
      if (r.registered && p >= r.begin && n <= r.size &&
          static_cast<uint64_t>(p - r.begin) <= r.size - n) {
        return &r;
      }
    }
    return nullptr;
  }

  void ServeLoop() {
    for (;;) {
      ServeJob job{};
      {
        MutexLock lock(&mu);
        while (!stop && serve_queue.empty())
          serve_cv.Wait(&mu);
        if (stop) return;
        job = std::move(serve_queue.front());
        serve_queue.pop_front();
      }
      if (job.push) {
        opts.on_push(job.node, job.sample, job.push_xxh3, job.push_data);
      } else {
        Answer(job);
      }
    }
  }

  // Serves one request and queues its reply (any thread).
  void Answer(const ServeJob& job) {
    ServeResult r = serve(job.sample);
    ReadReply reply{job.request_id, job.sample, r.status, 0, {}};
    std::optional<RemoteReply> remote;
    if (r.status == ReadStatus::kOk && !r.in_place.empty()) {
      if (r.in_place.size() > kMaxSampleBytes) {
        reply.status = ReadStatus::kError;
      } else {
        if (job.remote_ok && r.in_place.size() >= opts.remote_read_min) {
          MutexLock lock(&mu);
          if (const Region* g = RegionOfLocked(r.in_place.data(), r.in_place.size())) {
            remote = RemoteReply{
                job.request_id,
                job.sample,
                r.in_place.size(),
                g->exposed.wire_base + static_cast<uint64_t>(r.in_place.data() - g->begin),
                g->exposed.key,
                r.xxh3};
          }
        }
        if (!remote) {  // copy it into the reply, checked as a tier read would be
          reply.data.assign(r.in_place.begin(), r.in_place.end());
          reply.xxh3 = r.xxh3;
          if (XXH3_64bits(reply.data.data(), reply.data.size()) != r.xxh3) {
            spdlog::warn("nopfsd: sample {} failed its checksum while being served to node {}",
                         job.sample, job.node);
            reply.status = ReadStatus::kError;
            reply.data.clear();
            reply.xxh3 = 0;
          }
        }
      }
    } else if (r.status == ReadStatus::kOk && r.data.size() > kMaxSampleBytes) {
      reply.status = ReadStatus::kError;
    } else if (r.status == ReadStatus::kOk) {
      reply.data = std::move(r.data);
      if (!reply.data.empty()) reply.xxh3 = XXH3_64bits(reply.data.data(), reply.data.size());
    }
    std::vector<std::byte> bytes = remote ? Encode(*remote) : Encode(reply);
    {
      MutexLock lock(&mu);
      if (remote) {
        ++counters.served_reads;
        ++counters.served_remote;
        counters.served_bytes += remote->length;
      } else if (reply.status == ReadStatus::kOk) {
        ++counters.served_reads;
        counters.served_bytes += reply.data.size();
      } else {
        ++counters.served_not_available;
      }
      outbox.emplace_back(job.node, std::move(bytes));
    }
    wake.store(true);
    ep->Wake();
  }

  // Progress thread: registers exposed regions, posts the RMA reads of RemoteReplies, and hands
  // completed reads to their waiting Read calls.
  void DriveRemote() {
    std::vector<Region*> todo;
    std::deque<std::pair<uint32_t, RemoteReply>> posts;
    {
      MutexLock lock(&mu);
      if (regions_pending) {
        for (Region& g : regions)
          if (!g.registered) todo.push_back(&g);
        regions_pending = false;
      }
      posts.swap(reads_to_post);
    }
    for (Region* g : todo) {
      const Nonce n = RandomNonce();
      uint64_t key = 0;
      std::memcpy(&key, n.data(), sizeof key);
      Result<ExposedRegion> e = ep->ExposeForRemoteRead({g->begin, g->size}, key);
      MutexLock lock(&mu);
      g->tried = true;
      if (e.ok()) {
        g->exposed = *e;
        g->registered = true;
      } else {
        g->status = e.status();
      }
      cv.SignalAll();
    }
    for (auto& [node, v] : posts) {
      Status st = ep->PostRead(addr[node], v.addr, v.key, v.length, v.request_id, opts.timeout);
      if (!st.ok()) {
        MutexLock lock(&mu);
        ++counters.remote_failed;
        auto it = pending.find(v.request_id);
        if (it != pending.end()) {
          it->second->done = true;
          it->second->status =
              Status::IoError("RMA read of sample " + std::to_string(v.sample) + " from node " +
                              std::to_string(node) + " not posted: " + st.ToString());
          it->second->cv.Signal();
          pending.erase(it);
        }
      }
    }
    std::vector<ReadCompletion> done = ep->TakeReads();
    if (done.empty()) return;
    MutexLock lock(&mu);
    for (ReadCompletion& c : done) {
      auto it = pending.find(c.cookie);
      if (it == pending.end()) continue;  // timed out or its peer died meanwhile
      Pending* w = it->second;
      pending.erase(it);
      w->done = true;
      w->cv.Signal();  // wakes it once the mutex is released, after the fields below are set
      if (c.error != 0) {
        ++counters.remote_failed;
        w->status = Status::IoError("RMA read of sample " + std::to_string(w->sample) +
                                    " from node " + std::to_string(w->peer) + " failed");
        // The provider drops the connection on a failed RMA read: treat the peer as gone.
        KillLocked(w->peer, "an RMA read failed: " + c.error_text);
      } else {
        w->is_remote = true;
        w->remote = std::move(c.data);
        w->remote_len = c.length;
      }
    }
  }

  void Queue(uint32_t node, const PeerMessage& m) REQUIRES(mu) {
    outbox.emplace_back(node, Encode(m));
  }

  // Kills `peer`, failing every read waiting on it.
  void KillLocked(uint32_t peer, const std::string& why) REQUIRES(mu) {
    if (out[peer].state != Out::kDead) {
      spdlog::warn("nopfsd: peer node {} marked dead: {}", peer, why);
    }
    out[peer].state = Out::kDead;
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->second->peer == peer) {
        it->second->done = true;
        it->second->cv.Signal();
        it->second->status =
            Status::Unavailable("peer node " + std::to_string(peer) + " is dead: " + why);
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
    cv.SignalAll();
  }

  void Malformed(uint32_t node, const std::string& why) {
    MutexLock lock(&mu);
    ++counters.malformed;
    if (ShouldLogLocked())
      spdlog::warn("nopfsd: peer message from node {} rejected: {}", node, why);
  }

  // Logs and counts a message refused for want of authentication.
  void Refused(uint32_t node, const std::string& why) {
    MutexLock lock(&mu);
    ++counters.auth_refused;
    if (ShouldLogLocked()) {
      spdlog::warn("nopfsd: peer message claiming to be from node {} refused: {}", node, why);
    }
  }

  // Whether to log one more rejected message. A flood of forged messages must not
  // fill the job's log: the first 20 are logged, then one line every 10 s with the totals (the
  // counters count every one).
  bool ShouldLogLocked() REQUIRES(mu) {
    constexpr uint64_t kFirst = 20;
    const uint64_t rejected = counters.auth_refused + counters.malformed;
    if (rejected <= kFirst) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_reject_log < std::chrono::seconds(10)) return false;
    last_reject_log = now;
    spdlog::warn("nopfsd: {} peer messages refused and {} malformed so far (logging one in 10 s)",
                 counters.auth_refused, counters.malformed);
    return false;
  }

  // Messages to this node as a server. Every one but Hello and Auth has passed its session's MAC
  // and replay check (Admit) before it gets here.
  void HandleServer(uint32_t node, PeerMessage& m) {
    InState& st = in[node];
    if (auto* h = std::get_if<Hello>(&m)) {
      if (h->node != node) return Malformed(node, "hello names another node");
      const Nonce server_nonce = CookieNonce(h->client_nonce, node);
      Challenge c{server_nonce, PeerMac(opts.secret, kServerLabel, h->client_nonce, server_nonce,
                                        node, opts.node)};
      MutexLock lock(&mu);
      Queue(node, c);
    } else if (auto* a = std::get_if<Auth>(&m)) {
      const bool ok = a->server_nonce == CookieNonce(a->client_nonce, node) &&
                      MacEqual(a->client_mac, PeerMac(opts.secret, kClientLabel, a->client_nonce,
                                                      a->server_nonce, node, opts.node));
      if (!ok) {
        Refused(node, "failed the challenge (wrong secret, or not that node)");
        MutexLock lock(&mu);
        Queue(node, AuthResult{false});  // unsealed: a courtesy the client cannot trust
        return;
      }
      if (st.authed && st.client_nonce == a->client_nonce) return;  // a duplicate
      st.authed = true;
      st.client_nonce = a->client_nonce;
      st.key = std::make_unique<SessionKey>(
          SessionKeyOf(opts.secret, a->client_nonce, a->server_nonce, node, opts.node));
      st.window = ReplayWindow();
      st.send_seq = 0;
      MutexLock lock(&mu);
      Queue(node, AuthResult{true});
    } else if (auto* x = std::get_if<ExchangeData>(&m)) {
      MutexLock lock(&mu);
      if (XXH3_64bits(x->data.data(), x->data.size()) != x->xxh3) {
        ++counters.malformed;
        spdlog::warn("nopfsd: exchange round {} from node {} failed its checksum", x->round, node);
        return;
      }
      uint32_t held = 0;
      for (const auto& [key, buf] : exchange_in)
        held += key.second == node ? 1 : 0;
      if (held >= kMaxEarlyExchanges) {
        ++counters.malformed;
        spdlog::warn(
            "nopfsd: node {} sent exchange round {} with {} of its rounds unclaimed; "
            "dropped",
            node, x->round, held);
        return;
      }
      if (!exchange_in.emplace(std::make_pair(x->round, node), std::move(x->data)).second) {
        ++counters.malformed;
        spdlog::warn("nopfsd: peer node {} sent exchange round {} twice", node, x->round);
        return;
      }
      cv.SignalAll();
    } else if (auto* d = std::get_if<ClassDone>(&m)) {
      MutexLock lock(&mu);
      if (d->cls < 64) peer_done[node] |= uint64_t{1} << d->cls;
    } else if (auto* u = std::get_if<PushSample>(&m)) {
      MutexLock lock(&mu);
      if (!opts.on_push) {
        ++counters.pushes_dropped;
        return;
      }
      ++counters.pushes_received;
      ServeJob job{node, 0, u->sample, false, true, u->xxh3, std::move(u->data)};
      if (servers.empty()) {
        lock.Unlock();
        opts.on_push(job.node, job.sample, job.push_xxh3, job.push_data);
        return;
      }
      serve_queue.push_back(std::move(job));
      serve_cv.Signal();
    } else if (auto* q = std::get_if<ReadRequest>(&m)) {
      const ServeJob job{
          node, q->request_id, q->sample, (q->flags & kAcceptsRemoteRead) != 0, false, 0, {}};
      if (servers.empty() || (opts.serve_inline && opts.serve_inline(q->sample))) {
        Answer(job);
        return;
      }
      MutexLock lock(&mu);
      serve_queue.push_back(job);
      serve_cv.Signal();
    }
  }

  // The server nonce for a client's Hello: a MAC of its nonce under this link's own random
  // cookie, so that an Auth proves which Hello it answers without the server keeping any state.
  Nonce CookieNonce(const Nonce& client_nonce, uint32_t client) const {
    return PeerMac(cookie, "nopfs-peer-cookie", client_nonce, Nonce{}, client, opts.node);
  }

  // Progress thread: checks a sealed message's MAC and sequence number under the session it
  // belongs to (the sender's requests: the session the sender opened with us; replies: ours with
  // it) and returns its seq; nullopt (refused, counted and logged) for anything else.
  std::optional<uint64_t> Admit(uint32_t node, PeerType type, std::span<const std::byte> bytes) {
    const bool reply = type == PeerType::kAuthResult || type == PeerType::kReadReply ||
                       type == PeerType::kRemoteReply;
    SessionKey* key = nullptr;
    ReplayWindow* window = nullptr;
    if (reply) {
      OutState& st = out[node];  // state is written by this thread only: read without mu
      const Out want = type == PeerType::kAuthResult ? Out::kAuthSent : Out::kAuthed;
      if (st.state == want && st.key) key = st.key.get(), window = &st.window;
    } else if (in[node].authed) {
      key = in[node].key.get(), window = &in[node].window;
    }
    if (key == nullptr) {
      Refused(node, "no session with that node");
      return std::nullopt;
    }
    Result<uint64_t> seq = Unseal(bytes, *key);
    if (!seq.ok()) {
      Refused(node, seq.status().message());
      return std::nullopt;
    }
    if (!window->Accept(*seq)) {
      Refused(node, "sequence number " + std::to_string(*seq) + " replayed or too old");
      return std::nullopt;
    }
    return *seq;
  }

  // Progress thread: seals an outgoing message under its session; false if it has none (the
  // session it answers is gone), and then it is not sent.
  bool SealOutgoing(uint32_t node, std::vector<std::byte>& bytes) {
    const PeerType type = *TypeOf(bytes);
    if (!IsSealed(type)) return true;
    if (type == PeerType::kAuthResult || type == PeerType::kReadReply ||
        type == PeerType::kRemoteReply) {
      InState& st = in[node];
      if (type == PeerType::kAuthResult && std::to_integer<uint8_t>(bytes[kPeerHeaderBytes]) == 0) {
        return true;  // a refusal: there is no session to seal it with
      }
      if (!st.authed) return false;
      Seal(bytes, ++st.send_seq, *st.key);
      return true;
    }
    OutState& st = out[node];
    if (!st.key) return false;
    Seal(bytes, ++st.send_seq, *st.key);
    return true;
  }

  // Replies to this node as a client; a sealed one has passed Admit with sequence number `seq`.
  void HandleClient(uint32_t node, uint64_t seq, PeerMessage& m) {
    MutexLock lock(&mu);
    OutState& st = out[node];
    if (auto* c = std::get_if<Challenge>(&m)) {
      if (st.state != Out::kHelloSent) {
        lock.Unlock();
        return Malformed(node, "unexpected challenge");
      }
      Mac expect =
          PeerMac(opts.secret, kServerLabel, st.client_nonce, c->server_nonce, opts.node, node);
      if (!MacEqual(expect, c->server_mac)) {
        // Not proof that node is bad: anybody can send a challenge in its name. The handshake's
        // deadline decides.
        ++counters.auth_refused;
        spdlog::warn(
            "nopfsd: a challenge in the name of node {} does not prove the job secret; "
            "ignored",
            node);
        return;
      }
      st.key = std::make_unique<SessionKey>(
          SessionKeyOf(opts.secret, st.client_nonce, c->server_nonce, opts.node, node));
      st.window = ReplayWindow();
      st.send_seq = 0;
      Queue(node, Auth{st.client_nonce, c->server_nonce,
                       PeerMac(opts.secret, kClientLabel, st.client_nonce, c->server_nonce,
                               opts.node, node)});
      st.state = Out::kAuthSent;
    } else if (auto* r = std::get_if<AuthResult>(&m)) {
      // Admit has checked it under the session of our Auth: only that server could seal it.
      if (!r->accepted) {
        ++counters.auth_refused;
        KillLocked(node, "it refused our authentication");
        return;
      }
      st.state = Out::kAuthed;
    } else if (auto* v = std::get_if<RemoteReply>(&m)) {
      auto it = pending.find(v->request_id);
      if (it == pending.end() || it->second->peer != node || it->second->sample != v->sample ||
          it->second->remote_posted || !ep->supports_remote_read()) {
        lock.Unlock();
        return Malformed(node, "remote reply to no outstanding request");
      }
      it->second->remote_posted = true;
      it->second->remote_xxh3 = v->xxh3;
      v->key ^= RemoteKeyMask(*st.key, seq);
      reads_to_post.emplace_back(node, *v);
    } else if (auto* p = std::get_if<ReadReply>(&m)) {
      auto it = pending.find(p->request_id);
      if (it == pending.end() || it->second->peer != node || it->second->sample != p->sample) {
        lock.Unlock();
        return Malformed(node, "reply to no outstanding request");
      }
      Pending* w = it->second;
      pending.erase(it);
      w->done = true;
      w->cv.Signal();  // wakes it once the mutex is released, after the fields below are set
      if (p->status == ReadStatus::kOk) {
        w->data = std::move(p->data);
        w->data_xxh3 = p->xxh3;
      } else if (p->status == ReadStatus::kNotAvailable) {
        w->status = Status::NotFound("sample " + std::to_string(p->sample) +
                                     " not ready on peer node " + std::to_string(node));
      } else {
        w->status = Status::IoError("peer node " + std::to_string(node) +
                                    " failed reading sample " + std::to_string(p->sample));
      }
    }
  }

  // Starts handshakes, queues reads of authenticated peers, expires deadlines.
  void ScheduleLocked() REQUIRES(mu) {
    auto now = std::chrono::steady_clock::now();
    for (auto& [id, w] : pending) {
      OutState& st = out[w->peer];
      if (st.state == Out::kNone) {
        st.client_nonce = RandomNonce();
        st.handshake_deadline = now + opts.timeout;
        st.state = Out::kHelloSent;
        Queue(w->peer, Hello{opts.node, st.client_nonce});
      }
      if (st.state == Out::kAuthed && !w->sent) {
        w->sent = true;
        Queue(w->peer,
              ReadRequest{id, w->sample, ep->supports_remote_read() ? kAcceptsRemoteRead : 0u});
      }
    }
    for (auto it = exchange_out.begin(); it != exchange_out.end();) {
      OutState& st = out[it->first];
      if (st.state == Out::kNone) {
        st.client_nonce = RandomNonce();
        st.handshake_deadline = now + opts.timeout;
        st.state = Out::kHelloSent;
        Queue(it->first, Hello{opts.node, st.client_nonce});
      }
      if (st.state == Out::kAuthed || st.state == Out::kDead) {
        if (const auto* u = std::get_if<PushSample>(&it->second)) {
          push_queued_bytes -= u->data.size();
          if (st.state == Out::kDead) ++counters.pushes_dropped;
        }
        if (st.state == Out::kAuthed) Queue(it->first, it->second);
        it = exchange_out.erase(it);
      } else {
        ++it;
      }
    }
    for (uint32_t p = 0; p < out.size(); ++p) {
      bool shaking = out[p].state == Out::kHelloSent || out[p].state == Out::kAuthSent;
      if (shaking && now >= out[p].handshake_deadline) {
        ++counters.timeouts;
        KillLocked(p, "no handshake within " + std::to_string(opts.timeout.count()) + " ms");
      }
    }
    for (auto it = pending.begin(); it != pending.end(); ++it) {
      if (now >= it->second->deadline) {
        uint32_t peer = it->second->peer;
        ++counters.timeouts;
        KillLocked(peer, "no reply within " + std::to_string(opts.timeout.count()) + " ms");
        break;  // KillLocked erased entries; the rest expire on the next turn
      }
    }
  }

  void Run() {
    for (;;) {
      std::deque<std::pair<uint32_t, std::vector<std::byte>>> sends;
      {
        MutexLock lock(&mu);
        if (stop) break;
        ScheduleLocked();
        sends.swap(outbox);
        wake.store(false);
      }
      for (auto& [node, bytes] : sends) {
        if (!SealOutgoing(node, bytes)) continue;  // its session is gone
        Status st = ep->Post(addr[node], TagOf(opts.node), std::move(bytes), opts.timeout);
        if (!st.ok()) {
          MutexLock lock(&mu);
          ++counters.timeouts;
          KillLocked(node, st.ToString());
        }
      }
      DriveRemote();
      auto msg = ep->Recv(0, ~uint64_t{0}, kMaxPeerMessageBytes, kPollSlice, [this] {
        return wake.load(std::memory_order_relaxed) || ep->has_reads();
      });
      DriveRemote();
      if (!msg.ok()) {
        if (msg.status().code() == StatusCode::kCorruption) Malformed(~0u, msg.status().ToString());
        continue;
      }
      uint64_t sender = msg->tag >> 32;
      if (sender >= opts.peers.size() || sender == opts.node || (msg->tag & 0xffffffffu) != 0) {
        Malformed(static_cast<uint32_t>(sender), "tag names no other node of the job");
        continue;
      }
      auto node = static_cast<uint32_t>(sender);
      auto decoded = Decode(msg->data);
      if (!decoded.ok()) {
        Malformed(node, decoded.status().ToString());
        continue;
      }
      const PeerType type = *TypeOf(msg->data);
      uint64_t seq = 0;
      if (IsSealed(type)) {
        std::optional<uint64_t> admitted = Admit(node, type, msg->data);
        if (!admitted) continue;
        seq = *admitted;
      }
      if (std::holds_alternative<Hello>(*decoded) || std::holds_alternative<Auth>(*decoded) ||
          std::holds_alternative<ReadRequest>(*decoded) ||
          std::holds_alternative<ExchangeData>(*decoded) ||
          std::holds_alternative<ClassDone>(*decoded) ||
          std::holds_alternative<PushSample>(*decoded)) {
        HandleServer(node, *decoded);
      } else {
        HandleClient(node, seq, *decoded);
      }
    }
  }
};

PeerLink::PeerLink(std::unique_ptr<State> state) : s_(std::move(state)) {}

Result<std::unique_ptr<PeerLink>> PeerLink::Start(const PeerLinkOptions& options, ServeFn serve) {
  if (options.node >= options.peers.size()) {
    return Status::InvalidArgument("peer link: node " + std::to_string(options.node) +
                                   " is not in the peer list of " +
                                   std::to_string(options.peers.size()));
  }
  auto s = std::make_unique<State>();
  s->opts = options;
  s->serve = std::move(serve);
  const PeerAddress& self = options.peers[options.node];
  auto ep = Endpoint::Open({options.provider, self.host, self.port, options.remote_read});
  if (!ep.ok()) return ep.status();
  s->ep = std::move(*ep);
  for (const PeerAddress& p : options.peers) {
    auto a = s->ep->AddPeer(p.host, p.port);
    if (!a.ok()) return a.status();
    s->addr.push_back(*a);
  }
  s->in.resize(options.peers.size());
  const Nonce cookie = RandomNonce();
  std::copy(cookie.begin(), cookie.end(), s->cookie.begin());
  s->out.resize(options.peers.size());
  {
    MutexLock lock(&s->mu);  // no other thread yet: for the analysis
    s->peer_done.assign(options.peers.size(), 0);
  }
  State* raw = s.get();
  s->thread = std::thread([raw] { raw->Run(); });
  for (uint32_t i = 0; i < options.serve_threads; ++i)
    s->servers.emplace_back([raw] { raw->ServeLoop(); });
  return std::unique_ptr<PeerLink>(new PeerLink(std::move(s)));
}

PeerLink::~PeerLink() {
  Stop();
}

void PeerLink::Stop() {
  {
    MutexLock lock(&s_->mu);
    if (s_->stop && !s_->thread.joinable()) return;
    s_->stop = true;
    s_->wake.store(true);
    s_->ep->Wake();
    for (auto& [id, w] : s_->pending) {
      w->done = true;
      w->cv.Signal();
      w->status = Status::Unavailable("peer link stopped");
    }
    s_->pending.clear();
    s_->cv.SignalAll();
    s_->serve_cv.SignalAll();
  }
  for (std::thread& t : s_->servers)
    if (t.joinable()) t.join();
  if (s_->thread.joinable()) s_->thread.join();
}

void PeerLink::AnnounceClassDone(uint32_t cls) {
  MutexLock lock(&s_->mu);
  if (s_->stop || cls > 0xFFFF) return;
  for (uint32_t k = 0; k < s_->out.size(); ++k) {
    if (k != s_->opts.node && s_->out[k].state != State::Out::kDead) {
      s_->exchange_out.emplace_back(k, ClassDone{cls});
    }
  }
  s_->wake.store(true);
  s_->ep->Wake();
}

void PeerLink::Push(uint32_t peer, uint64_t sample, uint64_t xxh3,
                    std::span<const std::byte> data) {
  if (data.size() > kMaxSampleBytes) {
    MutexLock lock(&s_->mu);
    ++s_->counters.pushes_dropped;
    return;
  }
  PushSample m{sample, xxh3, {data.begin(), data.end()}};  // copied before taking the lock
  MutexLock lock(&s_->mu);
  if (s_->stop || peer >= s_->out.size() || peer == s_->opts.node) return;
  if (s_->out[peer].state == State::Out::kDead ||
      s_->push_queued_bytes + m.data.size() > State::kMaxPushQueued) {
    ++s_->counters.pushes_dropped;
    return;
  }
  s_->push_queued_bytes += m.data.size();
  ++s_->counters.pushes_sent;
  s_->counters.push_bytes_sent += m.data.size();
  s_->exchange_out.emplace_back(peer, std::move(m));
  s_->wake.store(true);
  s_->ep->Wake();
}

bool PeerLink::PeerClassDone(uint32_t peer, uint32_t cls) const {
  MutexLock lock(&s_->mu);
  return peer < s_->peer_done.size() && cls < 64 && (s_->peer_done[peer] >> cls & 1) != 0;
}

Status PeerLink::Await(uint32_t peer, uint64_t sample, Pending& w) {
  if (peer >= s_->out.size() || peer == s_->opts.node) {
    return Status::InvalidArgument("peer link: no peer node " + std::to_string(peer));
  }
  w.peer = peer;
  w.sample = sample;
  MutexLock lock(&s_->mu);
  if (s_->stop) return Status::Unavailable("peer link stopped");
  if (s_->out[peer].state == State::Out::kDead) {
    return Status::Unavailable("peer node " + std::to_string(peer) + " is dead");
  }
  // The deadline covers the handshake too; the progress thread expires it.
  w.deadline = std::chrono::steady_clock::now() + s_->opts.timeout;
  uint64_t id = s_->next_id++;
  s_->pending.emplace(id, &w);
  s_->wake.store(true);
  s_->ep->Wake();
  while (!w.done)
    w.cv.Wait(&s_->mu);
  if (!w.status.ok()) {
    if (w.status.code() == StatusCode::kNotFound) ++s_->counters.fetch_not_available;
    return w.status;
  }
  return Status::Ok();  // counted as fetched by the caller, once the bytes are handed over
}

void PeerLink::CountFetched(uint64_t bytes, bool remote) {
  MutexLock lock(&s_->mu);
  ++s_->counters.fetched_reads;
  s_->counters.fetched_bytes += bytes;
  if (remote) ++s_->counters.fetched_remote;
}

namespace {

Status RemoteMismatch(uint32_t peer, uint64_t sample) {
  return Status::Corruption("sample " + std::to_string(sample) + " read from node " +
                            std::to_string(peer) + " by RMA failed its checksum");
}

}  // namespace

Result<std::vector<std::byte>> PeerLink::Read(uint32_t peer, uint64_t sample) {
  Pending w;
  NOPFS_RETURN_IF_ERROR(Await(peer, sample, w));
  if (!w.is_remote) {
    if (!w.data.empty() && XXH3_64bits(w.data.data(), w.data.size()) != w.data_xxh3) {
      return Status::Corruption("sample " + std::to_string(sample) + " from node " +
                                std::to_string(peer) + " failed its checksum");
    }
    CountFetched(w.data.size(), false);
    return std::move(w.data);
  }
  if (XXH3_64bits(w.remote.get(), w.remote_len) != w.remote_xxh3) {
    MutexLock lock(&s_->mu);
    ++s_->counters.remote_failed;
    return RemoteMismatch(peer, sample);
  }
  CountFetched(w.remote_len, true);
  return std::vector<std::byte>(w.remote.get(), w.remote.get() + w.remote_len);
}

Result<uint64_t> PeerLink::ReadInto(uint32_t peer, uint64_t sample, std::span<std::byte> dst) {
  Pending w;
  NOPFS_RETURN_IF_ERROR(Await(peer, sample, w));
  const std::byte* src = w.is_remote ? w.remote.get() : w.data.data();
  const uint64_t len = w.is_remote ? w.remote_len : w.data.size();
  if (len != dst.size()) {
    return Status::Corruption("peer node " + std::to_string(peer) + " sent " + std::to_string(len) +
                              " bytes of sample " + std::to_string(sample) + ", which has " +
                              std::to_string(dst.size()));
  }
  if (len > 0) std::memcpy(dst.data(), src, len);
  const uint64_t h = XXH3_64bits(dst.data(), dst.size());
  if (w.is_remote && h != w.remote_xxh3) {
    MutexLock lock(&s_->mu);
    ++s_->counters.remote_failed;
    return RemoteMismatch(peer, sample);
  }
  if (!w.is_remote && len > 0 && h != w.data_xxh3) {
    return Status::Corruption("sample " + std::to_string(sample) + " from node " +
                              std::to_string(peer) + " failed its checksum");
  }
  CountFetched(len, w.is_remote);
  return h;
}

Status PeerLink::ExposeForRemoteRead(std::span<const std::byte> region) {
  if (region.empty()) return Status::InvalidArgument("peer link: an empty region");
  if (!s_->ep->supports_remote_read()) {
    return Status::FailedPrecondition("provider " + s_->ep->provider() +
                                      " does no RMA reads with keys of our choosing");
  }
  MutexLock lock(&s_->mu);
  if (s_->stop) return Status::Unavailable("peer link stopped");
  State::Region& g = s_->regions.emplace_back();
  g.begin = region.data();
  g.size = region.size();
  s_->regions_pending = true;
  s_->wake.store(true);
  s_->ep->Wake();
  while (!g.tried && !s_->stop)
    s_->cv.Wait(&s_->mu);
  if (!g.tried) return Status::Unavailable("peer link stopped");
  return g.status;
}

bool PeerLink::supports_remote_read() const {
  return s_->ep->supports_remote_read();
}

Result<std::vector<std::vector<std::byte>>> PeerLink::Exchange(
    uint64_t round, std::vector<std::vector<std::byte>> out) {
  const uint32_t nodes = this->nodes();
  const uint32_t self = s_->opts.node;
  if (out.size() != nodes) {
    return Status::InvalidArgument("exchange: " + std::to_string(out.size()) + " buffers for " +
                                   std::to_string(nodes) + " nodes");
  }
  for (const auto& b : out) {
    if (b.size() > kMaxSampleBytes) {
      return Status::InvalidArgument("exchange: buffer over " + std::to_string(kMaxSampleBytes) +
                                     " bytes");
    }
  }
  MutexLock lock(&s_->mu);
  for (uint32_t k = 0; k < nodes; ++k) {
    if (k == self) continue;
    const uint64_t h = XXH3_64bits(out[k].data(), out[k].size());
    s_->exchange_out.emplace_back(k, ExchangeData{round, h, std::move(out[k])});
  }
  s_->wake.store(true);
  s_->ep->Wake();
  auto deadline = std::chrono::steady_clock::now() + 5 * s_->opts.timeout;
  std::vector<std::vector<std::byte>> in(nodes);
  for (uint32_t k = 0; k < nodes; ++k) {
    if (k == self) continue;
    auto key = std::make_pair(round, k);
    bool ready = false;
    bool timed_out = false;
    while (!(ready = s_->stop || s_->exchange_in.count(key) > 0 ||
                     s_->out[k].state == State::Out::kDead) &&
           !timed_out) {
      timed_out = !s_->cv.WaitUntil(&s_->mu, deadline);
    }
    auto it = s_->exchange_in.find(key);
    if (it == s_->exchange_in.end()) {
      if (!ready) {
        return Status::TimedOut("exchange round " + std::to_string(round) + ": nothing from node " +
                                std::to_string(k));
      }
      return Status::Unavailable("exchange round " + std::to_string(round) + ": node " +
                                 std::to_string(k) + " is dead or the link stopped");
    }
    in[k] = std::move(it->second);
    s_->exchange_in.erase(it);
  }
  in[self] = std::move(out[self]);
  return in;
}

bool PeerLink::IsDead(uint32_t peer) const {
  MutexLock lock(&s_->mu);
  return peer < s_->out.size() && s_->out[peer].state == State::Out::kDead;
}

PeerLinkCounters PeerLink::counters() const {
  MutexLock lock(&s_->mu);
  return s_->counters;
}

uint32_t PeerLink::node() const {
  return s_->opts.node;
}
uint32_t PeerLink::nodes() const {
  return static_cast<uint32_t>(s_->opts.peers.size());
}
const std::string& PeerLink::provider() const {
  return s_->ep->provider();
}

}  // namespace nopfs::fabric
