// fabric::PeerHandshake: the peer link's HMAC challenge/response and the sessions it opens, as a
// state machine without I/O or threads. Its inputs are decoded handshake messages, encoded sealed
// messages and the time; its outputs are the messages to send and what to make of each input.
// The protocol (messages, MACs, sealing) is docs/wire.md's "Peer protocol"; the link that drives
// this machine is fabric/peer_link.h.
//
// Per other node it holds two halves:
//   - as a client (this node asks that one): kNone -> kHelloSent (Begin) -> kAuthSent (a
//     Challenge that proves the job secret) -> kAuthed (the sealed AuthResult); kDead on a
//     refusal, a handshake past its deadline (Expire) or Kill. kDead is final, except after an
//     expired handshake: Revive (the server was not listening yet, e.g. it started later) puts
//     it back to kNone, at most once per ten timeouts;
//   - as a server (that node asks this one): no state per Hello (the server nonce is the first 16
//     bytes of the client's, then 16 bytes of a MAC of it under this node's random cookie, echoed
//     in the Auth), a session once an Auth proves the secret; a later valid Auth with another
//     client nonce replaces it.
// A message sealed under a session is admitted once (Admit: its MAC, then its sequence number in
// the session's ReplayWindow); everything else is refused with the reason.
//
// Thread safety: none; one thread (the link's progress thread) owns an instance.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "fabric/peer_protocol.h"

namespace nopfs::fabric {

// The client half's state towards one server node.
enum class PeerState { kNone, kHelloSent, kAuthSent, kAuthed, kDead };

// What to make of one handshake message, and what to answer.
struct HandshakeStep {
  enum class Verdict {
    kOk,           // a valid step (`reply`, if set, goes back to the sender)
    kIgnored,      // nothing to do (a duplicate Auth)
    kMalformed,    // not a message this state takes: count and log it as malformed
    kRefused,      // it fails to prove the secret: count it as refused (`reply`, if set, is sent)
    kForged,       // a Challenge in the server's name that does not prove the secret: counted as
                   // refused; not proof that the server is bad, so the handshake goes on
    kWrongSecret,  // a Challenge that answers our Hello (it echoes our nonce, which went only to
                   // the server's listed address) and does not prove the secret: the server has
                   // another secret (or node list); the peer is now kDead, revivable as after an
                   // expired handshake
    kDead,         // the server refused our Auth: the peer is now kDead
  };
  Verdict verdict = Verdict::kOk;
  std::optional<PeerMessage> reply;
  std::string why;  // for everything but kOk and kIgnored
};

class PeerHandshake {
 public:
  using Clock = std::chrono::steady_clock;

  // This node is `self` of `nodes`; `timeout` bounds each client handshake; `random` gives the
  // nonces (the client nonces and this node's cookie, drawn here).
  PeerHandshake(const Secret& secret, uint32_t self, uint32_t nodes,
                std::chrono::milliseconds timeout, std::function<Nonce()> random = RandomNonce);
  ~PeerHandshake();
  PeerHandshake(const PeerHandshake&) = delete;
  PeerHandshake& operator=(const PeerHandshake&) = delete;

  // --- client half (towards server node `server`) ---
  PeerState state(uint32_t server) const;
  // Starts the handshake with `server` if none was started: the Hello to send. Its deadline is
  // `until` if that is later than `now` (a start-up phase: a node that starts later has until
  // then), else now + timeout. nullopt if one is under way (its deadline is then moved to `until`
  // if that is later), done or dead.
  std::optional<Hello> Begin(uint32_t server, Clock::time_point now, Clock::time_point until = {});
  // The Hello of a handshake still waiting for the server's Challenge again, if the last one went
  // out `interval` or more before `now` (a Hello to a node not listening yet is lost); else
  // nullopt. The server answers each copy; the Challenges after the first are ignored.
  std::optional<Hello> Resend(uint32_t server, Clock::time_point now,
                              std::chrono::milliseconds interval);
  // kHelloSent + a Challenge proving the secret -> kAuthSent, reply Auth. In kAuthSent or
  // kAuthed, a Challenge proving the secret for our Hello: kIgnored (the answer to a resent
  // Hello). In another state: kMalformed. In kHelloSent, a Challenge that proves nothing:
  // kWrongSecret (-> kDead) if its server nonce begins with the first 16 bytes of our client
  // nonce (the server saw our Hello), else kForged (the state stays).
  HandshakeStep OnChallenge(uint32_t server, const Challenge& c);
  // An AuthResult that Admit has admitted under the session of our Auth: accepted -> kAuthed;
  // refused -> kDead (verdict kDead).
  HandshakeStep OnAuthResult(uint32_t server, const AuthResult& r);
  // Handshakes (kHelloSent or kAuthSent) past their deadline at `now`: those servers, ascending,
  // now kDead.
  std::vector<uint32_t> Expire(Clock::time_point now);
  // Marks `server` kDead (idempotent); such a death is final.
  void Kill(uint32_t server);
  // A server whose handshake expired back to kNone (a new Begin may start), unless it was revived
  // less than ten timeouts before `now` (someone could send Hellos in its name to make this node
  // try again and again); true if so. A refusal or a Kill stays final.
  bool Revive(uint32_t server, Clock::time_point now);

  // --- server half (towards client node `client`) ---
  // A Hello from `client`: reply Challenge (nothing is kept); kMalformed if it names another node.
  HandshakeStep OnHello(uint32_t client, const Hello& h);
  // An Auth from `client`: proving the secret and answering our Challenge, it opens a session
  // (reply AuthResult{true}); the same Auth again: kIgnored; otherwise kRefused with reply
  // AuthResult{false} (sent unsealed: a courtesy the client cannot trust).
  HandshakeStep OnAuth(uint32_t client, const Auth& a);
  // Whether `client` has a session with this node as its server.
  bool authed(uint32_t client) const;

  // --- sessions ---
  // Checks a sealed message from `node` (its type is `type`, as TypeOf says) under the session
  // it belongs to: a reply (kAuthResult, kReadReply, kRemoteReply, kLeaveAck) under ours with
  // `node` as server (a kAuthResult while our Auth waits, the others once kAuthed), anything else
  // under the one `node` opened with us. Returns its seq; PermissionDenied with the reason for no
  // session, a MAC that fails or a seq replayed or too old.
  Result<uint64_t> Admit(uint32_t node, PeerType type, std::span<const std::byte> bytes);
  // Seals an encoded message to `node` under its session (unsealed types pass as they are, and
  // so does a refusing AuthResult); false if there is no session to seal it with (do not send it).
  bool Seal(uint32_t node, std::vector<std::byte>& bytes);
  // A kRemoteReply's key as sent, from the key on the wire and the seq Admit returned.
  uint64_t UnmaskRemoteKey(uint32_t server, uint64_t seq, uint64_t masked);

 private:
  struct Client;
  struct Server;
  Nonce CookieNonce(const Nonce& client_nonce, uint32_t client) const;

  const Secret secret_;
  const uint32_t self_;
  const std::chrono::milliseconds timeout_;
  const std::function<Nonce()> random_;
  Secret cookie_{};
  std::vector<Client> clients_;  // by server node
  std::vector<Server> servers_;  // by client node
};

}  // namespace nopfs::fabric
