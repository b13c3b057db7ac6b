// PeerLink::State's progress thread: the one thread that drives the endpoint and the handshake.
// It sends what is queued, receives and dispatches what arrives (handshake steps, requests,
// replies, exchanges, notices, pushes), starts handshakes and schedules reads, and expires
// deadlines, killing a peer that does not answer.
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "fabric/peer_link_state.h"

namespace nopfs::fabric {

using namespace peer_link_detail;  // the link's constants

void PeerLink::State::Queue(uint32_t node, const PeerMessage& m) REQUIRES(mu) {
  outbox.push_back({node, Encode(m), {}, {}});
}

void PeerLink::State::KillLocked(uint32_t peer, const std::string& why, bool left) REQUIRES(mu) {
  if (!dead[peer] && left) {
    spdlog::info("nopfsd: peer node {} {}: reads from it go elsewhere from now on", peer, why);
  } else if (!dead[peer]) {
    spdlog::warn("nopfsd: peer node {} marked dead: {}", peer, why);
  }
  dead[peer] = true;
  shake->Kill(peer);
  for (auto it = pending.begin(); it != pending.end();) {
    if (it->second->peer == peer) {
      it->second->done = true;
      it->second->status = Status::Unavailable("peer node " + std::to_string(peer) +
                                               (left ? " " : " is dead: ") + why);
      Release(*it->second);
      it = pending.erase(it);
    } else {
      ++it;
    }
  }
  cv.SignalAll();
}

void PeerLink::State::Malformed(uint32_t node, const std::string& why) {
  MutexLock lock(&mu);
  ++counters.malformed;
  if (ShouldLogLocked()) spdlog::warn("nopfsd: peer message from node {} rejected: {}", node, why);
}

void PeerLink::State::Refused(uint32_t node, const std::string& why) {
  MutexLock lock(&mu);
  ++counters.auth_refused;
  if (ShouldLogLocked()) {
    spdlog::warn("nopfsd: peer message claiming to be from node {} refused: {}", node, why);
  }
}

bool PeerLink::State::ShouldLogLocked() REQUIRES(mu) {
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

void PeerLink::State::Apply(uint32_t node, HandshakeStep step) {
  using V = HandshakeStep::Verdict;
  switch (step.verdict) {
    case V::kOk:
    case V::kIgnored:
      break;
    case V::kMalformed:
      return Malformed(node, step.why);
    case V::kRefused:
      Refused(node, step.why);
      break;
    case V::kForged: {
      // Not proof that node is bad: anybody can send a challenge in its name. The handshake's
      // deadline decides. Logged under the same limit as the other refusals.
      MutexLock lock(&mu);
      ++counters.auth_refused;
      if (ShouldLogLocked()) spdlog::warn("nopfsd: {}", step.why);
      break;
    }
    case V::kWrongSecret: {
      // The node at the listed address answered without the secret: waiting for it until the
      // deadline would change nothing (docs/fabric.md, "Start-up"). Logged at once, whatever
      // the flood of other refusals, the first time per node.
      MutexLock lock(&mu);
      ++counters.auth_refused;
      if (!failed_auth[node]) {
        failed_auth[node] = true;
        const PeerAddress& a = opts.peers[node];
        spdlog::warn(
            "nopfsd: peer node {} ({}:{}) failed authentication: a wrong or different job "
            "secret (or node list)? {}; this node does not wait for it",
            node, a.host, a.port, step.why);
      }
      KillLocked(node, "it failed authentication");
      break;
    }
    case V::kDead: {
      MutexLock lock(&mu);
      ++counters.auth_refused;
      KillLocked(node, step.why);
      break;
    }
  }
  if (step.reply) {
    MutexLock lock(&mu);
    Queue(node, *step.reply);
  }
}

void PeerLink::State::HandleRequest(uint32_t node, PeerMessage& m) {
  if (auto* x = std::get_if<ExchangeData>(&m)) {
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
    if (pool.inline_only()) {
      lock.Unlock();
      opts.on_push(job.node, job.sample, job.push_xxh3, job.push_data);
      return;
    }
    lock.Unlock();
    pool.Submit(std::move(job));
  } else if (auto* q = std::get_if<ReadRequest>(&m)) {
    ServeJob job{node, q->request_id, q->sample, (q->flags & kAcceptsRemoteRead) != 0, false, 0,
                 {}};
    if (pool.inline_only() || (opts.serve_inline && opts.serve_inline(q->sample))) {
      Answer(job);
      return;
    }
    if (opts.serve_nowait) {
      if (ServeResult r = opts.serve_nowait(q->sample); !r.would_block) {
        return Answer(job, std::move(r), true);
      }
    }
    pool.Submit(std::move(job));
  }
}

void PeerLink::State::HandleReply(uint32_t node, uint64_t seq, PeerMessage& m,
                                  std::span<const std::byte> reply_data) {
  MutexLock lock(&mu);
  if (auto* v = std::get_if<RemoteReply>(&m)) {
    auto it = pending.find(v->request_id);
    if (it == pending.end() || it->second->peer != node || it->second->sample != v->sample ||
        it->second->remote_posted || !ask_remote) {
      lock.Unlock();
      return Malformed(node, "remote reply to no outstanding request");
    }
    it->second->remote_posted = true;
    it->second->remote_xxh3 = v->xxh3;
    v->key = shake->UnmaskRemoteKey(node, seq, v->key);
    reads_to_post.emplace_back(node, *v);
  } else if (auto* p = std::get_if<ReadReply>(&m)) {
    auto it = pending.find(p->request_id);
    if (it == pending.end() || it->second->peer != node || it->second->sample != p->sample) {
      lock.Unlock();
      return Malformed(node, "reply to no outstanding request");
    }
    std::shared_ptr<Pending> w = std::move(it->second);
    pending.erase(it);
    if (p->status == ReadStatus::kOk && w->dst.data() != nullptr &&
        w->dst.size() == reply_data.size()) {
      // Out of `pending`, w is this thread's until it is released (its reader waits for that, and
      // Stop and KillLocked see only what is in `pending`): the copy needs no lock.
      lock.Unlock();
      if (!reply_data.empty()) std::memcpy(w->dst.data(), reply_data.data(), reply_data.size());
      lock.Lock();
      w->in_dst = true;
    }
    w->done = true;
    if (p->status == ReadStatus::kOk) {
      if (!w->in_dst) w->data.assign(reply_data.begin(), reply_data.end());
      w->data_xxh3 = p->xxh3;
    } else if (p->status == ReadStatus::kNotAvailable) {
      w->status = Status::NotFound("sample " + std::to_string(p->sample) +
                                   " not ready on peer node " + std::to_string(node));
    } else {
      w->status = Status::IoError("peer node " + std::to_string(node) + " failed reading sample " +
                                  std::to_string(p->sample));
    }
    lock.Unlock();
    Release(*w);  // after the mutex: the reader, woken, does not wait for it
  }
}

void PeerLink::State::Dispatch(uint32_t node, uint64_t seq, PeerMessage& m,
                               std::span<const std::byte> reply_data) {
  if (auto* h = std::get_if<Hello>(&m)) {
    HandshakeStep step = shake->OnHello(node, *h);
    const bool valid = step.verdict == HandshakeStep::Verdict::kOk;
    Apply(node, std::move(step));
    if (valid) ReviveOnHello(node);
  } else if (auto* a = std::get_if<Auth>(&m)) {
    Apply(node, shake->OnAuth(node, *a));
  } else if (auto* c = std::get_if<Challenge>(&m)) {
    Apply(node, shake->OnChallenge(node, *c));
  } else if (auto* r = std::get_if<AuthResult>(&m)) {
    Apply(node, shake->OnAuthResult(node, *r));
  } else if (std::holds_alternative<ReadReply>(m) || std::holds_alternative<RemoteReply>(m)) {
    HandleReply(node, seq, m, reply_data);
  } else if (std::holds_alternative<Leave>(m)) {
    OnLeave(node);
  } else if (std::holds_alternative<LeaveAck>(m)) {
    // This node sent no Leave (it would not be here but in Depart()): a node's mistake, harmless.
    Malformed(node, "leave acknowledged that this node did not send");
  } else {
    HandleRequest(node, m);
  }
}

void PeerLink::State::OnLeave(uint32_t node) {
  MutexLock lock(&mu);
  ++counters.peers_left;
  KillLocked(node, "stops (its nopfsd said so)", /*left=*/true);
  Queue(node, LeaveAck{});  // sent after every message queued to it before, and nothing after
}

void PeerLink::State::ReviveOnHello(uint32_t node) {
  MutexLock lock(&mu);
  const auto now = std::chrono::steady_clock::now();
  if (!shake->Revive(node, now)) return;
  dead[node] = false;
  spdlog::info("nopfsd: peer node {} sent a hello after this node gave up on it: handshaking again",
               node);
  BeginLocked(node, now);
}

void PeerLink::State::BeginLocked(uint32_t peer, std::chrono::steady_clock::time_point now)
    REQUIRES(mu) {
  if (std::optional<Hello> h = shake->Begin(peer, now, startup_until)) Queue(peer, *h);
}

void PeerLink::State::ScheduleLocked() REQUIRES(mu) {
  auto now = std::chrono::steady_clock::now();
  for (auto& [id, w] : pending) {
    BeginLocked(w->peer, now);
    if (shake->state(w->peer) == PeerState::kAuthed && !w->sent) {
      w->sent = true;
      Queue(w->peer, ReadRequest{id, w->sample, ask_remote ? kAcceptsRemoteRead : 0u});
    }
  }
  for (auto it = exchange_out.begin(); it != exchange_out.end();) {
    BeginLocked(it->first, now);
    const PeerState st = shake->state(it->first);
    if (st == PeerState::kAuthed || st == PeerState::kDead) {
      if (const auto* u = std::get_if<PushSample>(&it->second)) {
        push_queued_bytes -= u->data.size();
        if (st == PeerState::kDead) ++counters.pushes_dropped;
      }
      if (st == PeerState::kAuthed) Queue(it->first, it->second);
      it = exchange_out.erase(it);
    } else {
      ++it;
    }
  }
  bool changed = false;
  for (uint32_t p = 0; p < joined.size(); ++p) {
    if (p == opts.node) continue;
    if (now < startup_until) {  // the start-up phase: a node may not be listening yet
      const auto interval = heard[p] ? kHelloRetry : kHelloRetryUnheard;
      if (std::optional<Hello> h = shake->Resend(p, now, interval)) Queue(p, *h);
    }
    const bool j = shake->state(p) == PeerState::kAuthed;
    changed |= j != joined[p];
    joined[p] = j;
  }
  if (changed) cv.SignalAll();
  for (uint32_t p : shake->Expire(now)) {
    ++counters.timeouts;
    KillLocked(p, now < startup_until + opts.timeout
                      ? "no handshake by the start-up deadline"
                      : "no handshake within " + std::to_string(opts.timeout.count()) + " ms");
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

void PeerLink::State::Run() {
  for (;;) {
    std::deque<Outgoing> sends;
    bool starting = false;
    {
      MutexLock lock(&mu);
      if (stop) break;
      ScheduleLocked();
      sends.swap(outbox);
      wake.store(false);
      starting = std::chrono::steady_clock::now() < startup_until;
    }
    // In the start-up phase, while a node has not been heard from and its handshake waits for
    // its Challenge, the receive slice is as short as the Hello's retry.
    bool hello_waiting = false;
    for (uint32_t p = 0; starting && p < heard.size(); ++p) {
      hello_waiting |= p != opts.node && !heard[p] && shake->state(p) == PeerState::kHelloSent;
    }
    for (auto& [node, bytes, tail, borrowed] : sends) {
      if (acked_leave[node]) continue;          // it stops: it takes nothing after the LeaveAck
      if (!shake->Seal(node, bytes)) continue;  // its session is gone
      // In the start-up phase a Hello to a node that is not listening yet stays in the
      // provider's queue while it connects: until the node has been heard from, it is tried
      // once and dropped (Resend sends it again kHelloRetryUnheard later) rather than hold the
      // progress thread for a timeout. A Hello that cannot be sent never kills the node: the
      // handshake's deadline decides.
      const PeerType type = *TypeOf(bytes);
      const bool hello = type == PeerType::kHello;
      const auto patience = hello && starting && !heard[node] ? kHelloPost : opts.timeout;
      const uint64_t tag = TagOf(opts.node);
      Status st = !borrowed.empty()
                      ? ep->PostBorrowed(addr[node], tag, std::move(bytes), borrowed, patience)
                  : tail.empty()
                      ? ep->Post(addr[node], tag, std::move(bytes), patience)
                      : ep->Post(addr[node], tag, std::move(bytes), std::move(tail), patience);
      if (!st.ok() && hello) continue;
      if (type == PeerType::kLeaveAck) acked_leave[node] = true;
      if (!st.ok()) {
        MutexLock lock(&mu);
        ++counters.timeouts;
        KillLocked(node, st.ToString());
      }
    }
    DriveRemote();
    // The message is handled in the endpoint's receive buffer, not copied out of it first.
    const Status got = ep->RecvView(
        0, ~uint64_t{0}, kMaxPeerMessageBytes, hello_waiting ? kHelloRetryUnheard : kPollSlice,
        [this] { return wake.load(std::memory_order_relaxed) || ep->has_reads(); },
        [this](uint64_t tag, std::span<const std::byte> data) { OnMessage(tag, data); });
    DriveRemote();
    if (got.code() == StatusCode::kCorruption) Malformed(~0u, got.ToString());
  }
  Depart();
}

void PeerLink::State::Depart() {
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + std::min<std::chrono::milliseconds>(opts.timeout, kLeaveWait);
  const auto nodes = static_cast<uint32_t>(opts.peers.size());
  std::vector<bool> waiting(nodes, false);
  {
    MutexLock lock(&mu);
    for (uint32_t p = 0; p < nodes; ++p) {
      waiting[p] = p != opts.node && !dead[p] && shake->state(p) == PeerState::kAuthed;
    }
  }
  const auto send = [&](uint32_t node, const PeerMessage& m) {
    std::vector<std::byte> bytes = Encode(m);
    return shake->Seal(node, bytes) &&
           ep->Post(addr[node], TagOf(opts.node), std::move(bytes), kLeavePost).ok();
  };
  // The LeaveAcks queued before `stop` (a node that left meanwhile) go first: the nodes wait
  // for them. The rest of the outbox is dropped.
  std::deque<Outgoing> queued;
  {
    MutexLock lock(&mu);
    queued.swap(outbox);
  }
  for (Outgoing& o : queued) {
    if (*TypeOf(o.bytes) == PeerType::kLeaveAck && !acked_leave[o.node]) {
      acked_leave[o.node] = send(o.node, LeaveAck{});
    }
  }
  uint32_t told = 0;
  for (uint32_t p = 0; p < nodes; ++p) {
    if (waiting[p] && !send(p, Leave{})) waiting[p] = false;
    told += waiting[p] ? 1 : 0;
  }
  const auto remaining = [&] {
    return static_cast<uint32_t>(std::count(waiting.begin(), waiting.end(), true));
  };
  // Only Leaves and LeaveAcks count now: a reply, a request or a push is dropped unread (the
  // reads waiting here have failed, and nothing more is served).
  const auto take = [&](uint64_t tag, std::span<const std::byte> data) {
    const uint64_t sender = tag >> 32;
    const std::optional<PeerType> type = TypeOf(data);
    if (sender >= nodes || sender == opts.node || (tag & 0xffffffffu) != 0 || !type ||
        (*type != PeerType::kLeave && *type != PeerType::kLeaveAck)) {
      return;
    }
    const auto node = static_cast<uint32_t>(sender);
    if (!Decode(data).ok() || !shake->Admit(node, *type, data).ok()) return;
    if (*type == PeerType::kLeaveAck) {
      waiting[node] = false;
    } else if (!acked_leave[node]) {  // it stops too: it waits for this node's answer
      acked_leave[node] = send(node, LeaveAck{});
    }
  };
  for (auto now = start; remaining() > 0 && now < until; now = std::chrono::steady_clock::now()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now);
    (void)ep->RecvView(0, ~uint64_t{0}, kMaxPeerMessageBytes,
                       std::clamp(left, std::chrono::milliseconds(1), kPollSlice), nullptr, take);
  }
  // This node's own last messages (LeaveAcks) go out before the endpoint closes.
  (void)ep->Flush(std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                               until - std::chrono::steady_clock::now()),
                           kLeavePost));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  if (remaining() == 0) {
    if (told > 0) {
      spdlog::debug("nopfsd: peer link stopped: {} nodes told, all answered in {} ms", told,
                    took.count());
    }
  } else {
    {
      MutexLock lock(&mu);
      counters.leaves_unanswered += remaining();
    }
    std::string who;
    for (uint32_t p = 0; p < nodes; ++p) {
      if (waiting[p]) who += (who.empty() ? "" : ", ") + std::to_string(p);
    }
    spdlog::info(
        "nopfsd: peer link stopped: node(s) {} did not answer its leave within {} ms (a message "
        "of theirs may have been cut short)",
        who, took.count());
  }
}

void PeerLink::State::OnMessage(uint64_t tag, std::span<const std::byte> data) {
  uint64_t sender = tag >> 32;
  if (sender >= opts.peers.size() || sender == opts.node || (tag & 0xffffffffu) != 0) {
    return Malformed(static_cast<uint32_t>(sender), "tag names no other node of the job");
  }
  auto node = static_cast<uint32_t>(sender);
  if (!heard[node]) {
    // A claim only, but enough to wait for the provider's queue, and a sign that the node
    // listens now: a Hello sent before it did was lost, so the next goes at once.
    heard[node] = true;
    MutexLock lock(&mu);
    if (std::chrono::steady_clock::now() < startup_until) {
      const auto now = std::chrono::steady_clock::now();
      if (std::optional<Hello> h = shake->Resend(node, now, std::chrono::milliseconds(0))) {
        Queue(node, *h);
      }
    }
  }
  std::span<const std::byte> reply_data;  // a ReadReply's data, left in the receive buffer
  auto decoded = Decode(data, &reply_data);
  if (!decoded.ok()) return Malformed(node, decoded.status().ToString());
  const PeerType type = *TypeOf(data);
  uint64_t seq = 0;
  if (IsSealed(type)) {
    Result<uint64_t> admitted = shake->Admit(node, type, data);
    if (!admitted.ok()) return Refused(node, admitted.status().message());
    seq = *admitted;
  }
  Dispatch(node, seq, *decoded, reply_data);
}

}  // namespace nopfs::fabric
