// Tests of the peer handshake state machine: every transition of both halves, a forged, replayed
// and expired message of each kind, and both directions of the proof. Two (or three) machines
// talk through Encode/Decode, as two links would, without an endpoint.
#include "fabric/peer_handshake.h"

#include <gtest/gtest.h>

namespace nopfs::fabric {
namespace {

using Clock = PeerHandshake::Clock;
using V = HandshakeStep::Verdict;
constexpr auto kTimeout = std::chrono::milliseconds(100);

Secret SecretOf(uint8_t fill) {
  Secret s;
  s.fill(fill);
  return s;
}

// Nonces 1, 2, 3, ... (the first one becomes the cookie): the tests see which nonce went where.
std::function<Nonce()> Counter(uint8_t base) {
  auto n = std::make_shared<uint8_t>(0);
  return [n, base] {
    Nonce out{};
    out.fill(base);
    out[0] = ++*n;
    return out;
  };
}

// What the wire does to a message: encoded, then decoded by the other side.
template <typename T>
T Wire(const PeerMessage& m) {
  Result<PeerMessage> d = Decode(Encode(m));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return std::get<T>(*d);
}

struct Pair {
  // node 0 (client) asks node 1 (server).
  PeerHandshake client{SecretOf(7), 0, 2, kTimeout, Counter(0x10)};
  PeerHandshake server{SecretOf(7), 1, 2, kTimeout, Counter(0x20)};
  Clock::time_point t0 = Clock::now();

  Challenge HelloToChallenge() {
    std::optional<Hello> h = client.Begin(1, t0);
    EXPECT_TRUE(h.has_value());
    HandshakeStep s = server.OnHello(0, Wire<Hello>(*h));
    EXPECT_EQ(s.verdict, V::kOk);
    return Wire<Challenge>(*s.reply);
  }
  Auth ChallengeToAuth() {
    HandshakeStep s = client.OnChallenge(1, HelloToChallenge());
    EXPECT_EQ(s.verdict, V::kOk) << s.why;
    return Wire<Auth>(*s.reply);
  }
  // The server's sealed AuthResult{true}, as bytes on the wire.
  std::vector<std::byte> AuthToResult() {
    HandshakeStep s = server.OnAuth(0, ChallengeToAuth());
    EXPECT_EQ(s.verdict, V::kOk) << s.why;
    std::vector<std::byte> bytes = Encode(*s.reply);
    EXPECT_TRUE(server.Seal(0, bytes));
    return bytes;
  }
  void Complete() {
    std::vector<std::byte> bytes = AuthToResult();
    Result<uint64_t> seq = client.Admit(1, PeerType::kAuthResult, bytes);
    ASSERT_TRUE(seq.ok()) << seq.status().ToString();
    EXPECT_EQ(client.OnAuthResult(1, Wire<AuthResult>(*Decode(bytes))).verdict, V::kOk);
    ASSERT_EQ(client.state(1), PeerState::kAuthed);
  }
};

TEST(PeerHandshakeTest, ClientWalksEveryStateToAuthed) {
  Pair p;
  EXPECT_EQ(p.client.state(1), PeerState::kNone);
  std::optional<Hello> h = p.client.Begin(1, p.t0);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->node, 0u);
  EXPECT_EQ(p.client.state(1), PeerState::kHelloSent);
  EXPECT_FALSE(p.client.Begin(1, p.t0).has_value()) << "a second Begin starts nothing";

  HandshakeStep c = p.server.OnHello(0, Wire<Hello>(*h));
  ASSERT_EQ(c.verdict, V::kOk);
  EXPECT_FALSE(p.server.authed(0)) << "a Hello opens nothing on the server";
  HandshakeStep a = p.client.OnChallenge(1, Wire<Challenge>(*c.reply));
  ASSERT_EQ(a.verdict, V::kOk);
  EXPECT_EQ(p.client.state(1), PeerState::kAuthSent);
  const Auth auth = Wire<Auth>(*a.reply);
  EXPECT_EQ(auth.client_nonce, h->client_nonce);

  HandshakeStep r = p.server.OnAuth(0, auth);
  ASSERT_EQ(r.verdict, V::kOk);
  EXPECT_EQ(std::get<AuthResult>(*r.reply), AuthResult{true});
  EXPECT_TRUE(p.server.authed(0));
  std::vector<std::byte> bytes = Encode(*r.reply);
  ASSERT_TRUE(p.server.Seal(0, bytes));
  ASSERT_TRUE(p.client.Admit(1, PeerType::kAuthResult, bytes).ok());
  EXPECT_EQ(p.client.OnAuthResult(1, AuthResult{true}).verdict, V::kOk);
  EXPECT_EQ(p.client.state(1), PeerState::kAuthed);
  EXPECT_FALSE(p.client.Begin(1, p.t0).has_value());
  EXPECT_TRUE(p.client.Expire(p.t0 + 10 * kTimeout).empty()) << "an open session never expires";
}

TEST(PeerHandshakeTest, SessionsCarrySealedMessagesBothWays) {
  Pair p;
  p.Complete();
  // A request, client to server: seq 1 (the client's first sealed message).
  std::vector<std::byte> req = Encode(ReadRequest{5, 42, 0});
  ASSERT_TRUE(p.client.Seal(1, req));
  Result<uint64_t> seq = p.server.Admit(0, PeerType::kReadRequest, req);
  ASSERT_TRUE(seq.ok()) << seq.status().ToString();
  EXPECT_EQ(*seq, 1u);
  // Its reply: the server's second (the AuthResult was its first).
  std::vector<std::byte> rep = Encode(ReadReply{5, 42, ReadStatus::kNotAvailable, 0, {}});
  ASSERT_TRUE(p.server.Seal(0, rep));
  seq = p.client.Admit(1, PeerType::kReadReply, rep);
  ASSERT_TRUE(seq.ok()) << seq.status().ToString();
  EXPECT_EQ(*seq, 2u);
  // A RemoteReply's key is masked on the wire and unmasked with the session and seq.
  std::vector<std::byte> remote = Encode(RemoteReply{6, 43, 100, 0x1000, 0xABCDEF, 9});
  ASSERT_TRUE(p.server.Seal(0, remote));
  seq = p.client.Admit(1, PeerType::kRemoteReply, remote);
  ASSERT_TRUE(seq.ok());
  const uint64_t masked = std::get<RemoteReply>(*Decode(remote)).key;
  EXPECT_NE(masked, 0xABCDEFu);
  EXPECT_EQ(p.client.UnmaskRemoteKey(1, *seq, masked), 0xABCDEFu);
}

// A Leave goes under the session its sender opened (a request), its LeaveAck under the same
// session the other way (a reply), and neither under any other.
TEST(PeerHandshakeTest, ALeaveIsARequestAndItsAckAReply) {
  Pair p;
  p.Complete();
  std::vector<std::byte> leave = Encode(Leave{});
  ASSERT_TRUE(p.client.Seal(1, leave));
  EXPECT_TRUE(p.server.Admit(0, PeerType::kLeave, leave).ok());
  std::vector<std::byte> ack = Encode(LeaveAck{});
  ASSERT_TRUE(p.server.Seal(0, ack));
  EXPECT_TRUE(p.client.Admit(1, PeerType::kLeaveAck, ack).ok());
  // An ack goes only under a session the other node opened: the client has none to seal one.
  std::vector<std::byte> own_ack = Encode(LeaveAck{});
  EXPECT_FALSE(p.client.Seal(1, own_ack));
  // Nor can the server, which opened no session with the client, seal a Leave to it.
  std::vector<std::byte> leave_back = Encode(Leave{});
  EXPECT_FALSE(p.server.Seal(0, leave_back));
}

TEST(PeerHandshakeTest, ReplayedSealedMessagesAreRefused) {
  Pair p;
  p.Complete();
  std::vector<std::byte> req = Encode(ClassDone{3});
  ASSERT_TRUE(p.client.Seal(1, req));
  ASSERT_TRUE(p.server.Admit(0, PeerType::kClassDone, req).ok());
  Result<uint64_t> again = p.server.Admit(0, PeerType::kClassDone, req);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(again.status().message().find("replayed"), std::string::npos)
      << again.status().message();
  // The AuthResult again, once authed: a reply of that type belongs to no session now.
  std::vector<std::byte> result = Encode(AuthResult{true});
  ASSERT_TRUE(p.server.Seal(0, result));
  Result<uint64_t> late = p.client.Admit(1, PeerType::kAuthResult, result);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().message(), "no session with that node");
}

TEST(PeerHandshakeTest, MessagesTooFarBehindTheWindowAreRefused) {
  Pair p;
  p.Complete();
  std::vector<std::byte> old = Encode(ClassDone{1});
  ASSERT_TRUE(p.client.Seal(1, old));  // seq 1, held back
  std::vector<std::byte> m;
  for (uint64_t i = 0; i < kReplayWindow + 1; ++i) {
    m = Encode(ClassDone{2});
    ASSERT_TRUE(p.client.Seal(1, m));
  }
  ASSERT_TRUE(p.server.Admit(0, PeerType::kClassDone, m).ok());  // seq kReplayWindow + 2
  Result<uint64_t> r = p.server.Admit(0, PeerType::kClassDone, old);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("too old"), std::string::npos);
}

TEST(PeerHandshakeTest, ForgedAndTamperedSealedMessagesAreRefused) {
  Pair p;
  p.Complete();
  std::vector<std::byte> req = Encode(ReadRequest{1, 2, 0});
  ASSERT_TRUE(p.client.Seal(1, req));
  std::vector<std::byte> tampered = req;
  tampered[kPeerHeaderBytes + 8] ^= std::byte{1};  // the sample
  EXPECT_EQ(p.server.Admit(0, PeerType::kReadRequest, tampered).status().code(),
            StatusCode::kPermissionDenied);
  // A third node of the same job opens its own session; its key does not open node 0's.
  PeerHandshake other{SecretOf(7), 2, 3, kTimeout, Counter(0x30)};
  PeerHandshake server3{SecretOf(7), 1, 3, kTimeout, Counter(0x40)};
  HandshakeStep c = server3.OnHello(2, *other.Begin(1, Clock::now()));
  HandshakeStep a = other.OnChallenge(1, std::get<Challenge>(*c.reply));
  ASSERT_EQ(server3.OnAuth(2, std::get<Auth>(*a.reply)).verdict, V::kOk);
  std::vector<std::byte> foreign = Encode(ReadRequest{1, 2, 0});
  ASSERT_TRUE(other.Seal(1, foreign));
  EXPECT_FALSE(p.server.Admit(0, PeerType::kReadRequest, foreign).ok());
  // The untouched original still passes (the refusals recorded nothing).
  EXPECT_TRUE(p.server.Admit(0, PeerType::kReadRequest, req).ok());
}

TEST(PeerHandshakeTest, NothingIsAdmittedOrSealedWithoutASession) {
  Pair p;
  std::vector<std::byte> req = Encode(ReadRequest{1, 2, 0});
  EXPECT_FALSE(p.client.Seal(1, req)) << "no key before the challenge";
  EXPECT_EQ(p.server.Admit(0, PeerType::kReadRequest, req).status().message(),
            "no session with that node");
  EXPECT_EQ(p.client.Admit(1, PeerType::kReadReply, req).status().message(),
            "no session with that node");
  std::vector<std::byte> reply = Encode(ReadReply{1, 2, ReadStatus::kNotAvailable, 0, {}});
  EXPECT_FALSE(p.server.Seal(0, reply)) << "the session it answers is gone";
  // The handshake passes unsealed; so does a refusing AuthResult, which has no session.
  std::vector<std::byte> hello = Encode(Hello{0, Nonce{}});
  const std::vector<std::byte> before = hello;
  EXPECT_TRUE(p.client.Seal(1, hello));
  EXPECT_EQ(hello, before);
  std::vector<std::byte> refusal = Encode(AuthResult{false});
  const std::vector<std::byte> refusal_before = refusal;
  EXPECT_TRUE(p.server.Seal(0, refusal));
  EXPECT_EQ(refusal, refusal_before);
  // ... and the client, waiting on its Auth, cannot trust it: only the server's session seals.
  p.ChallengeToAuth();
  EXPECT_FALSE(p.client.Admit(1, PeerType::kAuthResult, refusal).ok());
  EXPECT_EQ(p.client.state(1), PeerState::kAuthSent);
}

TEST(PeerHandshakeTest, ServerRefusesAClientWithoutTheSecret) {
  // The client proves itself: with another secret its Auth is refused.
  PeerHandshake client{SecretOf(8), 0, 2, kTimeout, Counter(0x10)};
  PeerHandshake server{SecretOf(7), 1, 2, kTimeout, Counter(0x20)};
  const std::optional<Hello> h = client.Begin(1, Clock::now());
  HandshakeStep c = server.OnHello(0, *h);
  // The server's challenge does not verify under the wrong secret either, and it answers the
  // client's Hello: the server has another secret.
  HandshakeStep a = client.OnChallenge(1, std::get<Challenge>(*c.reply));
  EXPECT_EQ(a.verdict, V::kWrongSecret);
  EXPECT_EQ(client.state(1), PeerState::kDead);
  // A client that skips the check and answers with its secret anyway (a forger) is refused.
  const Challenge ch = std::get<Challenge>(*c.reply);
  const Auth forged{
      h->client_nonce, ch.server_nonce,
      PeerMac(SecretOf(8), "nopfs-peer-client", h->client_nonce, ch.server_nonce, 0, 1)};
  HandshakeStep r = server.OnAuth(0, Wire<Auth>(forged));
  EXPECT_EQ(r.verdict, V::kRefused);
  EXPECT_EQ(std::get<AuthResult>(*r.reply), AuthResult{false});
  EXPECT_FALSE(server.authed(0));
}

TEST(PeerHandshakeTest, ClientRefusesAServerWithoutTheSecret) {
  // The server proves itself. A challenge that answers the client's Hello (its server nonce
  // begins with the client nonce's first 16 bytes) from a server with another secret: that
  // server has another secret, and the client gives up on it (revivably, as after a timeout).
  const auto t0 = Clock::now();
  PeerHandshake client{SecretOf(7), 0, 2, kTimeout, Counter(0x10)};
  PeerHandshake server{SecretOf(9), 1, 2, kTimeout, Counter(0x20)};
  const std::optional<Hello> hello = client.Begin(1, t0);
  HandshakeStep c = server.OnHello(0, *hello);
  const Challenge answer = std::get<Challenge>(*c.reply);
  EXPECT_TRUE(std::equal(hello->client_nonce.begin(), hello->client_nonce.begin() + 16,
                         answer.server_nonce.begin()));
  // The same answer with another nonce of the client's (a forger cannot know it): a forgery,
  // which changes no state.
  Challenge guessed = answer;
  guessed.server_nonce[0] ^= 1;
  HandshakeStep f = client.OnChallenge(1, guessed);
  EXPECT_EQ(f.verdict, V::kForged);
  EXPECT_FALSE(f.reply.has_value()) << "no Auth to a server that proved nothing";
  EXPECT_NE(f.why.find("node 1"), std::string::npos);
  EXPECT_EQ(client.state(1), PeerState::kHelloSent) << "a forgery changes no state";
  HandshakeStep a = client.OnChallenge(1, answer);
  EXPECT_EQ(a.verdict, V::kWrongSecret);
  EXPECT_FALSE(a.reply.has_value());
  EXPECT_EQ(a.why, "it answered this node's hello without proving the job secret");
  EXPECT_EQ(client.state(1), PeerState::kDead);
  EXPECT_TRUE(client.Revive(1, t0)) << "not final: the node may come back with the secret";
  EXPECT_EQ(client.state(1), PeerState::kNone);
  // The real server's challenge still completes the handshake after it.
  PeerHandshake real{SecretOf(7), 1, 2, kTimeout, Counter(0x20)};
  PeerHandshake fresh{SecretOf(7), 0, 2, kTimeout, Counter(0x10)};
  HandshakeStep c2 = real.OnHello(0, *fresh.Begin(1, Clock::now()));
  EXPECT_EQ(fresh.OnChallenge(1, Challenge{Nonce{}, Mac{}}).verdict, V::kForged);
  EXPECT_EQ(fresh.OnChallenge(1, std::get<Challenge>(*c2.reply)).verdict, V::kOk);
  EXPECT_EQ(fresh.state(1), PeerState::kAuthSent);
}

TEST(PeerHandshakeTest, ServerKeepsNoStatePerHelloAndChecksItsCookie) {
  Pair p;
  // A Hello in another node's name is malformed.
  HandshakeStep bad = p.server.OnHello(0, Hello{1, Nonce{}});
  EXPECT_EQ(bad.verdict, V::kMalformed);
  EXPECT_EQ(bad.why, "hello names another node");
  // An Auth whose server nonce is not the cookie's for its client nonce is refused, even when its
  // MAC is right for the secret: it answers no challenge of this server.
  Nonce cn{};
  cn.fill(1);
  Nonce sn{};
  sn.fill(2);
  Auth made_up{cn, sn, PeerMac(SecretOf(7), "nopfs-peer-client", cn, sn, 0, 1)};
  EXPECT_EQ(p.server.OnAuth(0, made_up).verdict, V::kRefused);
  // An Auth from the right secret but for another client node is refused.
  const Auth auth = p.ChallengeToAuth();
  PeerHandshake server3{SecretOf(7), 1, 3, kTimeout, Counter(0x20)};
  EXPECT_EQ(server3.OnAuth(2, auth).verdict, V::kRefused);
  // The valid one opens the session; the same Auth again (a replay) changes nothing.
  ASSERT_EQ(p.server.OnAuth(0, auth).verdict, V::kOk);
  std::vector<std::byte> req = Encode(ClassDone{1});
  ASSERT_TRUE(p.client.Seal(1, req));
  ASSERT_TRUE(p.server.Admit(0, PeerType::kClassDone, req).ok());
  HandshakeStep dup = p.server.OnAuth(0, auth);
  EXPECT_EQ(dup.verdict, V::kIgnored);
  EXPECT_FALSE(dup.reply.has_value());
  EXPECT_FALSE(p.server.Admit(0, PeerType::kClassDone, req).ok()) << "the window was not reset";
}

TEST(PeerHandshakeTest, ANewHandshakeReplacesTheServerSession) {
  Pair p;
  p.Complete();
  std::vector<std::byte> old = Encode(ClassDone{1});
  ASSERT_TRUE(p.client.Seal(1, old));
  // The client restarts (a new process: a new machine with new nonces).
  PeerHandshake restarted{SecretOf(7), 0, 2, kTimeout, Counter(0x50)};
  HandshakeStep c = p.server.OnHello(0, *restarted.Begin(1, Clock::now()));
  HandshakeStep a = restarted.OnChallenge(1, std::get<Challenge>(*c.reply));
  ASSERT_EQ(p.server.OnAuth(0, std::get<Auth>(*a.reply)).verdict, V::kOk);
  EXPECT_FALSE(p.server.Admit(0, PeerType::kClassDone, old).ok())
      << "the old session's messages open nothing";
  std::vector<std::byte> fresh = Encode(ClassDone{1});
  ASSERT_TRUE(restarted.Seal(1, fresh));
  EXPECT_TRUE(p.server.Admit(0, PeerType::kClassDone, fresh).ok());
}

TEST(PeerHandshakeTest, UnexpectedChallengesAreMalformed) {
  Pair p;
  const Challenge ch = p.HelloToChallenge();
  PeerHandshake idle{SecretOf(7), 0, 2, kTimeout, Counter(0x10)};
  EXPECT_EQ(idle.OnChallenge(1, ch).verdict, V::kMalformed) << "no Hello was sent";
  ASSERT_EQ(p.client.OnChallenge(1, ch).verdict, V::kOk);
  HandshakeStep again = p.client.OnChallenge(1, ch);  // replayed after the Auth
  EXPECT_EQ(again.verdict, V::kIgnored) << "the answer to a resent Hello";
  EXPECT_FALSE(again.reply.has_value());
  EXPECT_EQ(p.client.state(1), PeerState::kAuthSent);
  Challenge other = ch;
  other.server_nonce[0] ^= 1;  // proves nothing for our Hello
  HandshakeStep bad = p.client.OnChallenge(1, other);
  EXPECT_EQ(bad.verdict, V::kMalformed);
  EXPECT_EQ(bad.why, "unexpected challenge");
  EXPECT_EQ(p.client.state(1), PeerState::kAuthSent);
}

// A server that is not listening yet loses our Hello: Resend gives the same Hello again, once
// per interval, as long as no Challenge came; the server answers each copy alike and the client
// takes the first answer and ignores the others.
TEST(PeerHandshakeTest, AHelloIsResentUntilTheServerAnswers) {
  Pair p;
  const std::chrono::milliseconds every(10);
  std::optional<Hello> h = p.client.Begin(1, p.t0);
  ASSERT_TRUE(h.has_value());
  EXPECT_FALSE(p.client.Resend(1, p.t0 + every / 2, every).has_value()) << "too soon";
  std::optional<Hello> again = p.client.Resend(1, p.t0 + every, every);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->client_nonce, h->client_nonce);
  EXPECT_EQ(again->node, 0u);
  EXPECT_FALSE(p.client.Resend(1, p.t0 + every + every / 2, every).has_value());
  EXPECT_TRUE(p.client.Resend(1, p.t0 + 2 * every, every).has_value());
  const Challenge c1 = Wire<Challenge>(*p.server.OnHello(0, *h).reply);
  const Challenge c2 = Wire<Challenge>(*p.server.OnHello(0, *again).reply);
  EXPECT_EQ(p.client.OnChallenge(1, c1).verdict, V::kOk);
  EXPECT_EQ(p.client.OnChallenge(1, c2).verdict, V::kIgnored);
  EXPECT_FALSE(p.client.Resend(1, p.t0 + 10 * every, every).has_value()) << "answered";
  EXPECT_FALSE(p.client.Resend(0, p.t0 + 10 * every, every).has_value()) << "never begun";
}

// A start-up phase (Begin's `until`) gives a server that starts later more than one timeout;
// one begun earlier gets its deadline moved to it.
TEST(PeerHandshakeTest, AStartUpDeadlineOutlastsTheTimeout) {
  PeerHandshake client{SecretOf(7), 0, 3, kTimeout, Counter(0x10)};
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(client.Begin(1, t0).has_value());
  ASSERT_TRUE(client.Begin(2, t0, t0 + 10 * kTimeout).has_value());
  EXPECT_FALSE(client.Begin(1, t0, t0 + 10 * kTimeout).has_value()) << "under way: extended";
  EXPECT_TRUE(client.Expire(t0 + 5 * kTimeout).empty());
  EXPECT_FALSE(client.Begin(1, t0, t0 + kTimeout / 2).has_value()) << "never shortened";
  EXPECT_EQ(client.Expire(t0 + 10 * kTimeout), (std::vector<uint32_t>{1, 2}));
}

// A server whose handshake expired (it was not up) is revived when it shows up, at most once per
// ten timeouts; one that refused us or was killed is not.
TEST(PeerHandshakeTest, AnExpiredPeerMayBeRevivedARefusedOneMayNot) {
  PeerHandshake client{SecretOf(7), 0, 3, kTimeout, Counter(0x10)};
  PeerHandshake server{SecretOf(7), 1, 3, kTimeout, Counter(0x20)};
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(client.Begin(1, t0).has_value());
  ASSERT_EQ(client.Expire(t0 + kTimeout), std::vector<uint32_t>{1});
  client.Kill(1);  // as the link does after Expire: still revivable
  EXPECT_FALSE(client.Begin(1, t0 + kTimeout).has_value()) << "dead until revived";
  const Clock::time_point t1 = t0 + 2 * kTimeout;
  ASSERT_TRUE(client.Revive(1, t1));
  EXPECT_EQ(client.state(1), PeerState::kNone);
  EXPECT_FALSE(client.Revive(1, t1)) << "not dead";
  // It expires again at once: the next revival waits ten timeouts.
  ASSERT_TRUE(client.Begin(1, t1).has_value());
  ASSERT_EQ(client.Expire(t1 + kTimeout), std::vector<uint32_t>{1});
  EXPECT_FALSE(client.Revive(1, t1 + 9 * kTimeout));
  ASSERT_TRUE(client.Revive(1, t1 + 10 * kTimeout));
  // This time the server is up: the handshake completes after the revival.
  std::optional<Hello> h = client.Begin(1, t1 + 10 * kTimeout);
  ASSERT_TRUE(h.has_value());
  HandshakeStep c = server.OnHello(0, *h);
  HandshakeStep a = client.OnChallenge(1, std::get<Challenge>(*c.reply));
  ASSERT_EQ(a.verdict, V::kOk);
  HandshakeStep r = server.OnAuth(0, std::get<Auth>(*a.reply));
  std::vector<std::byte> bytes = Encode(*r.reply);
  ASSERT_TRUE(server.Seal(0, bytes));
  ASSERT_TRUE(client.Admit(1, PeerType::kAuthResult, bytes).ok());
  EXPECT_EQ(client.OnAuthResult(1, AuthResult{true}).verdict, V::kOk);
  EXPECT_EQ(client.state(1), PeerState::kAuthed);
  // Killed (a peer that died after answering) or refused: final.
  client.Kill(1);
  EXPECT_FALSE(client.Revive(1, t1 + 100 * kTimeout));
  ASSERT_TRUE(client.Begin(2, t0).has_value());
  client.Kill(2);
  EXPECT_FALSE(client.Revive(2, t0 + 100 * kTimeout)) << "killed before it expired";
}

TEST(PeerHandshakeTest, ARefusalKillsThePeer) {
  Pair p;
  p.ChallengeToAuth();
  HandshakeStep s = p.client.OnAuthResult(1, AuthResult{false});
  EXPECT_EQ(s.verdict, V::kDead);
  EXPECT_EQ(s.why, "it refused our authentication");
  EXPECT_EQ(p.client.state(1), PeerState::kDead);
  EXPECT_FALSE(p.client.Begin(1, p.t0).has_value()) << "dead is final";
}

TEST(PeerHandshakeTest, HandshakesExpireAtTheirDeadline) {
  PeerHandshake client{SecretOf(7), 0, 4, kTimeout, Counter(0x10)};
  PeerHandshake server{SecretOf(7), 2, 4, kTimeout, Counter(0x20)};
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(client.Begin(3, t0).has_value());  // stays kHelloSent
  std::optional<Hello> h = client.Begin(2, t0 + kTimeout / 2);
  HandshakeStep c = server.OnHello(0, *h);
  HandshakeStep a = client.OnChallenge(2, std::get<Challenge>(*c.reply));
  ASSERT_EQ(client.state(2), PeerState::kAuthSent);
  EXPECT_TRUE(client.Expire(t0 + kTimeout - std::chrono::milliseconds(1)).empty());
  EXPECT_EQ(client.Expire(t0 + kTimeout), std::vector<uint32_t>{3});
  EXPECT_EQ(client.state(3), PeerState::kDead);
  EXPECT_EQ(client.state(2), PeerState::kAuthSent);
  EXPECT_EQ(client.Expire(t0 + kTimeout * 3 / 2), std::vector<uint32_t>{2})
      << "the deadline counts from the Hello, not from the Auth";
  EXPECT_EQ(client.state(2), PeerState::kDead);
  EXPECT_EQ(client.state(1), PeerState::kNone) << "a peer never asked does not expire";
  // The AuthResult that arrives after the deadline belongs to no session.
  HandshakeStep r = server.OnAuth(0, std::get<Auth>(*a.reply));
  std::vector<std::byte> bytes = Encode(*r.reply);
  ASSERT_TRUE(server.Seal(0, bytes));
  EXPECT_EQ(client.Admit(2, PeerType::kAuthResult, bytes).status().message(),
            "no session with that node");
  EXPECT_TRUE(client.Expire(t0 + 10 * kTimeout).empty()) << "the dead expire once";
}

TEST(PeerHandshakeTest, KillEndsEveryState) {
  Pair p;
  p.Complete();
  p.client.Kill(1);
  EXPECT_EQ(p.client.state(1), PeerState::kDead);
  std::vector<std::byte> rep = Encode(ReadReply{1, 2, ReadStatus::kNotAvailable, 0, {}});
  ASSERT_TRUE(p.server.Seal(0, rep));
  EXPECT_FALSE(p.client.Admit(1, PeerType::kReadReply, rep).ok()) << "no replies from the dead";
  PeerHandshake fresh{SecretOf(7), 0, 2, kTimeout, Counter(0x10)};
  fresh.Kill(1);
  EXPECT_FALSE(fresh.Begin(1, Clock::now()).has_value());
  fresh.Kill(1);
  EXPECT_EQ(fresh.state(1), PeerState::kDead);
}

}  // namespace
}  // namespace nopfs::fabric
