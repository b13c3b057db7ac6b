#include "fabric/peer_handshake.h"

#include <algorithm>
#include <utility>

namespace nopfs::fabric {
namespace {

constexpr std::string_view kServerLabel = "nopfs-peer-server";
constexpr std::string_view kClientLabel = "nopfs-peer-client";
// The bytes of the client's nonce that the server nonce begins with.
constexpr size_t kEchoBytes = 16;

bool IsReply(PeerType type) {
  return type == PeerType::kAuthResult || type == PeerType::kReadReply ||
         type == PeerType::kRemoteReply || type == PeerType::kLeaveAck;
}

HandshakeStep Step(HandshakeStep::Verdict verdict, std::string why) {
  HandshakeStep s;
  s.verdict = verdict;
  s.why = std::move(why);
  return s;
}

}  // namespace

// This node as a client of one server node.
struct PeerHandshake::Client {
  PeerState state = PeerState::kNone;
  Nonce client_nonce{};
  Clock::time_point deadline{};
  Clock::time_point hello_sent{};            // the last Hello (Begin or Resend)
  bool revivable = false;                    // kDead because its handshake expired
  std::optional<Clock::time_point> revived;  // the last Revive
  std::unique_ptr<SessionKey> key;           // from the server's challenge on
  ReplayWindow window;                       // the server's replies
  uint64_t send_seq = 0;                     // our requests, exchanges, notices and pushes
};

// This node as the server of one client node: the session its last successful Auth opened.
struct PeerHandshake::Server {
  bool authed = false;
  Nonce client_nonce{};
  std::unique_ptr<SessionKey> key;
  ReplayWindow window;    // the client's requests
  uint64_t send_seq = 0;  // our replies
};

PeerHandshake::PeerHandshake(const Secret& secret, uint32_t self, uint32_t nodes,
                             std::chrono::milliseconds timeout, std::function<Nonce()> random)
    : secret_(secret),
      self_(self),
      timeout_(timeout),
      random_(std::move(random)),
      clients_(nodes),
      servers_(nodes) {
  const Nonce cookie = random_();
  std::copy(cookie.begin(), cookie.end(), cookie_.begin());
}

PeerHandshake::~PeerHandshake() = default;

PeerState PeerHandshake::state(uint32_t server) const {
  return clients_[server].state;
}

bool PeerHandshake::authed(uint32_t client) const {
  return servers_[client].authed;
}

std::optional<Hello> PeerHandshake::Begin(uint32_t server, Clock::time_point now,
                                          Clock::time_point until) {
  Client& c = clients_[server];
  if (c.state == PeerState::kHelloSent || c.state == PeerState::kAuthSent) {
    c.deadline = std::max(c.deadline, until);
  }
  if (c.state != PeerState::kNone) return std::nullopt;
  c.client_nonce = random_();
  c.deadline = until > now ? until : now + timeout_;
  c.hello_sent = now;
  c.state = PeerState::kHelloSent;
  return Hello{self_, c.client_nonce};
}

std::optional<Hello> PeerHandshake::Resend(uint32_t server, Clock::time_point now,
                                           std::chrono::milliseconds interval) {
  Client& c = clients_[server];
  if (c.state != PeerState::kHelloSent || now < c.hello_sent + interval) return std::nullopt;
  c.hello_sent = now;
  return Hello{self_, c.client_nonce};
}

HandshakeStep PeerHandshake::OnChallenge(uint32_t server, const Challenge& ch) {
  Client& c = clients_[server];
  const bool answered = c.state == PeerState::kAuthSent || c.state == PeerState::kAuthed;
  if (c.state != PeerState::kHelloSent && !answered) {
    return Step(HandshakeStep::Verdict::kMalformed, "unexpected challenge");
  }
  const Mac expect = PeerMac(secret_, kServerLabel, c.client_nonce, ch.server_nonce, self_, server);
  if (answered) {
    if (MacEqual(expect, ch.server_mac)) return Step(HandshakeStep::Verdict::kIgnored, "");
    return Step(HandshakeStep::Verdict::kMalformed, "unexpected challenge");
  }
  if (!MacEqual(expect, ch.server_mac)) {
    if (std::equal(c.client_nonce.begin(), c.client_nonce.begin() + kEchoBytes,
                   ch.server_nonce.begin())) {
      // Only who received our Hello at the server's listed address (or sits on the path to it)
      // knows our nonce: that node answers, without the job's secret.
      c.state = PeerState::kDead;
      c.revivable = true;
      c.key.reset();
      return Step(HandshakeStep::Verdict::kWrongSecret,
                  "it answered this node's hello without proving the job secret");
    }
    return Step(HandshakeStep::Verdict::kForged, "a challenge in the name of node " +
                                                     std::to_string(server) +
                                                     " does not prove the job secret; ignored");
  }
  c.key = std::make_unique<SessionKey>(
      SessionKeyOf(secret_, c.client_nonce, ch.server_nonce, self_, server));
  c.window = ReplayWindow();
  c.send_seq = 0;
  c.state = PeerState::kAuthSent;
  HandshakeStep s;
  s.reply = Auth{c.client_nonce, ch.server_nonce,
                 PeerMac(secret_, kClientLabel, c.client_nonce, ch.server_nonce, self_, server)};
  return s;
}

HandshakeStep PeerHandshake::OnAuthResult(uint32_t server, const AuthResult& r) {
  Client& c = clients_[server];
  if (!r.accepted) {
    c.state = PeerState::kDead;
    c.revivable = false;
    return Step(HandshakeStep::Verdict::kDead, "it refused our authentication");
  }
  c.state = PeerState::kAuthed;
  return {};
}

std::vector<uint32_t> PeerHandshake::Expire(Clock::time_point now) {
  std::vector<uint32_t> expired;
  for (uint32_t p = 0; p < clients_.size(); ++p) {
    Client& c = clients_[p];
    const bool shaking = c.state == PeerState::kHelloSent || c.state == PeerState::kAuthSent;
    if (shaking && now >= c.deadline) {
      c.state = PeerState::kDead;
      c.revivable = true;
      expired.push_back(p);
    }
  }
  return expired;
}

void PeerHandshake::Kill(uint32_t server) {
  Client& c = clients_[server];
  if (c.state != PeerState::kDead) c.revivable = false;
  c.state = PeerState::kDead;
}

bool PeerHandshake::Revive(uint32_t server, Clock::time_point now) {
  Client& c = clients_[server];
  if (c.state != PeerState::kDead || !c.revivable) return false;
  if (c.revived && now < *c.revived + 10 * timeout_) return false;
  c.revived = now;
  c.revivable = false;
  c.key.reset();
  c.state = PeerState::kNone;
  return true;
}

// The server nonce for a client's Hello: the first kEchoBytes of the client's nonce, so that the
// client sees that the Challenge answers its Hello even when its MAC fails (OnChallenge), then a
// MAC of the client's nonce under this node's own random cookie, so that an Auth proves which
// Hello it answers without the server keeping any state.
Nonce PeerHandshake::CookieNonce(const Nonce& client_nonce, uint32_t client) const {
  const Mac mac = PeerMac(cookie_, "nopfs-peer-cookie", client_nonce, Nonce{}, client, self_);
  Nonce out{};
  std::copy(client_nonce.begin(), client_nonce.begin() + kEchoBytes, out.begin());
  std::copy(mac.begin(), mac.begin() + (out.size() - kEchoBytes), out.begin() + kEchoBytes);
  return out;
}

HandshakeStep PeerHandshake::OnHello(uint32_t client, const Hello& h) {
  if (h.node != client) return Step(HandshakeStep::Verdict::kMalformed, "hello names another node");
  const Nonce server_nonce = CookieNonce(h.client_nonce, client);
  HandshakeStep s;
  s.reply = Challenge{server_nonce,
                      PeerMac(secret_, kServerLabel, h.client_nonce, server_nonce, client, self_)};
  return s;
}

HandshakeStep PeerHandshake::OnAuth(uint32_t client, const Auth& a) {
  const bool ok = a.server_nonce == CookieNonce(a.client_nonce, client) &&
                  MacEqual(a.client_mac, PeerMac(secret_, kClientLabel, a.client_nonce,
                                                 a.server_nonce, client, self_));
  if (!ok) {
    HandshakeStep s = Step(HandshakeStep::Verdict::kRefused,
                           "failed the challenge (wrong secret, or not that node)");
    s.reply = AuthResult{false};
    return s;
  }
  Server& st = servers_[client];
  if (st.authed && st.client_nonce == a.client_nonce)
    return Step(HandshakeStep::Verdict::kIgnored, "");
  st.authed = true;
  st.client_nonce = a.client_nonce;
  st.key = std::make_unique<SessionKey>(
      SessionKeyOf(secret_, a.client_nonce, a.server_nonce, client, self_));
  st.window = ReplayWindow();
  st.send_seq = 0;
  HandshakeStep s;
  s.reply = AuthResult{true};
  return s;
}

Result<uint64_t> PeerHandshake::Admit(uint32_t node, PeerType type,
                                      std::span<const std::byte> bytes) {
  SessionKey* key = nullptr;
  ReplayWindow* window = nullptr;
  if (IsReply(type)) {
    Client& c = clients_[node];
    const PeerState want =
        type == PeerType::kAuthResult ? PeerState::kAuthSent : PeerState::kAuthed;
    if (c.state == want && c.key) key = c.key.get(), window = &c.window;
  } else if (servers_[node].authed) {
    key = servers_[node].key.get(), window = &servers_[node].window;
  }
  if (key == nullptr) return Status::PermissionDenied("no session with that node");
  Result<uint64_t> seq = Unseal(bytes, *key);
  if (!seq.ok()) return Status::PermissionDenied(seq.status().message());
  if (!window->Accept(*seq)) {
    return Status::PermissionDenied("sequence number " + std::to_string(*seq) +
                                    " replayed or too old");
  }
  return *seq;
}

bool PeerHandshake::Seal(uint32_t node, std::vector<std::byte>& bytes) {
  const PeerType type = *TypeOf(bytes);
  if (!IsSealed(type)) return true;
  if (IsReply(type)) {
    Server& st = servers_[node];
    if (type == PeerType::kAuthResult && std::to_integer<uint8_t>(bytes[kPeerHeaderBytes]) == 0) {
      return true;  // a refusal: there is no session to seal it with
    }
    if (!st.authed) return false;
    fabric::Seal(bytes, ++st.send_seq, *st.key);
    return true;
  }
  Client& c = clients_[node];
  if (!c.key) return false;
  fabric::Seal(bytes, ++c.send_seq, *c.key);
  return true;
}

uint64_t PeerHandshake::UnmaskRemoteKey(uint32_t server, uint64_t seq, uint64_t masked) {
  return masked ^ RemoteKeyMask(*clients_[server].key, seq);
}

}  // namespace nopfs::fabric
