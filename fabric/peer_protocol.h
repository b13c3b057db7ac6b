// The peer protocol: the messages two nopfsd exchange over the fabric, their strict binary codec,
// and the per-job HMAC-SHA256 challenge/response that admits a peer.
//
// Wire format (all integers little-endian), one message per fabric message:
//   header (16 bytes): magic u32 = 0x5046504E ("NPFP"), version u8 = 5, type u8, reserved u16 = 0,
//                      body_len u32, reserved u32 = 0
//   body (body_len bytes), by type. The handshake (the first three) is in the clear:
//     kHello       node u32, client_nonce[32]                      (36 bytes)
//     kChallenge   server_nonce[32], server_mac[32]                (64 bytes)
//     kAuth        client_nonce[32], server_nonce[32], client_mac[32] (96 bytes)
//   every other type is *sealed*: its fixed fields, then an authentication block (seq u64,
//   mac[16]), then its variable data, if any:
//     kAuthResult  accepted u32 (0 or 1)                           (4 + 24 bytes)
//     kReadRequest request_id u64, sample u64, flags u32, reserved u32 = 0 (24 + 24 bytes); flags
//                  bit 0 (kAcceptsRemoteRead): the reader can take a kRemoteReply; other bits 0
//     kReadReply   request_id u64, sample u64, status u32, reserved u32 = 0, xxh3 u64 (of the
//                  data; 0 without data), then the data (32 + 24 + n bytes)
//     kExchange    round u64, xxh3 u64, data (16 + 24 + n bytes; one node's buffer of a
//                  collective all-to-all)
//     kClassDone   cls u32 (<= 65535): the sender has filled every entry of its class-cls list
//                  (docs/algorithm.md §7: the receiver then presumes all of them ready) (4 + 24
//                  bytes)
//     kRemoteReply request_id u64, sample u64, length u64, addr u64, key u64, xxh3 u64 (48 + 24
//                  bytes): the sample is ready in memory the sender registered for remote reads;
//                  the reader fetches `length` bytes at (addr, key) with an RMA read and checks
//                  them against `xxh3` (length <= kMaxSampleBytes). On the wire `key` is masked
//                  (XOR) with 8 bytes derived from the session key and seq.
//     kPush        sample u64, xxh3 u64, data (16 + 24 + n bytes): the sender read `sample` from
//                  the PFS for a staging read before the receiver (which holds it in its plan, or
//                  fills it for the job) had it; the receiver may keep the bytes instead of reading
//                  them
//     kLeave       reserved u32 = 0 (4 + 24 bytes): the sender's link stops; the receiver answers
//                  kLeaveAck and sends the sender nothing after it
//     kLeaveAck    reserved u32 = 0 (4 + 24 bytes), a reply under the leaving node's session: the
//                  last message the sender sends the receiver
// Versions 1 to 3 had no sealed messages (version 3's tags named the sender, and anybody could
// claim to be a node); version 1 had no kClassDone; version 2 no request flags, no kRemoteReply
// and no kPush; version 4 no kLeave and kLeaveAck.
//
// Sealing: the handshake gives both ends a session key (SessionKeyOf). The sender numbers the
// messages of each session and direction from 1 (seq) and sets mac = the first 16 bytes of
// HMAC-SHA256(session key, the message's bytes from the header up to and including seq), i.e.
// over the header, the fixed fields and seq; the variable data is bound through the xxh3 that the
// fixed fields carry (so that sample bytes move at memory speed; the receiver checks the xxh3
// before it uses the data). The receiver checks the mac (Unseal), refuses a seq it has already
// seen or one more than kReplayWindow behind the highest (ReplayWindow), and only then decodes.
//
// What it promises: Decode accepts exactly the buffers Encode produces (with any authentication
// block) and rejects every other buffer with Corruption (wrong magic, version, type, length,
// non-zero reserved field, unknown status, data over kMaxSampleBytes) without reading outside
// the buffer. The handshake MACs bind both nonces, both nodes and a direction label, so a reply
// cannot be replayed as a request; a sealed message verifies only under its session's key.
//
// Thread safety: every function is pure or uses only thread-safe OpenSSL calls; call from any
// thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"

namespace nopfs::fabric {

inline constexpr uint32_t kPeerMagic = 0x5046504E;
inline constexpr uint8_t kPeerVersion = 5;
inline constexpr uint64_t kPeerHeaderBytes = 16;
inline constexpr uint64_t kMaxSampleBytes = uint64_t{64} << 20;  // largest sample served to a peer
inline constexpr uint64_t kAuthBlockBytes = 24;                  // seq u64, mac[16]
inline constexpr uint64_t kMaxPeerMessageBytes =
    kPeerHeaderBytes + 32 + kAuthBlockBytes + kMaxSampleBytes;
// How far behind the highest sequence number seen a sealed message may arrive (messages can
// overtake each other: a large one completes after a small one posted later).
inline constexpr uint64_t kReplayWindow = 4096;

using Nonce = std::array<uint8_t, 32>;
using Mac = std::array<uint8_t, 32>;
using Secret = std::array<uint8_t, 32>;
using SealMac = std::array<uint8_t, 16>;

enum class PeerType : uint8_t {
  kHello = 1,
  kChallenge = 2,
  kAuth = 3,
  kAuthResult = 4,
  kReadRequest = 5,
  kReadReply = 6,
  kExchange = 7,
  kClassDone = 8,
  kRemoteReply = 9,
  kPush = 10,
  kLeave = 11,
  kLeaveAck = 12,
};

// ReadRequest flags.
inline constexpr uint32_t kAcceptsRemoteRead = 1;

enum class ReadStatus : uint32_t {
  kOk = 0,
  kNotAvailable = 1,  // the slot is not ready (not staged yet, evicted): ask someone else
  kError = 2,         // the peer failed reading its tier
};

struct Hello {
  uint32_t node = 0;
  Nonce client_nonce{};
  bool operator==(const Hello&) const = default;
};
struct Challenge {
  Nonce server_nonce{};
  Mac server_mac{};
  bool operator==(const Challenge&) const = default;
};
struct Auth {
  Nonce client_nonce{};  // echoed, so that the server keeps no state per Hello
  Nonce server_nonce{};
  Mac client_mac{};
  bool operator==(const Auth&) const = default;
};
struct AuthResult {
  bool accepted = false;
  bool operator==(const AuthResult&) const = default;
};
struct ReadRequest {
  uint64_t request_id = 0;
  uint64_t sample = 0;
  uint32_t flags = 0;  // kAcceptsRemoteRead
  bool operator==(const ReadRequest&) const = default;
};
struct ReadReply {
  uint64_t request_id = 0;
  uint64_t sample = 0;
  ReadStatus status = ReadStatus::kOk;
  uint64_t xxh3 = 0;            // of data (0 when empty), as the sender checked it
  std::vector<std::byte> data;  // empty unless status == kOk
  bool operator==(const ReadReply&) const = default;
};

// "Read it yourself": where the sample lies in the sender's registered memory.
struct RemoteReply {
  uint64_t request_id = 0;
  uint64_t sample = 0;
  uint64_t length = 0;  // at most kMaxSampleBytes
  uint64_t addr = 0;    // the remote address of its first byte, as the RMA read takes it
  uint64_t key = 0;     // the registration's key
  uint64_t xxh3 = 0;    // of the sample's bytes, recorded when the sender filled them
  bool operator==(const RemoteReply&) const = default;
};

// Bytes of a sample the receiver holds but may not have yet (read from the PFS by the sender).
struct PushSample {
  uint64_t sample = 0;
  uint64_t xxh3 = 0;
  std::vector<std::byte> data;  // at most kMaxSampleBytes
  bool operator==(const PushSample&) const = default;
};

struct ExchangeData {
  uint64_t round = 0;
  uint64_t xxh3 = 0;            // of data
  std::vector<std::byte> data;  // at most kMaxSampleBytes
  bool operator==(const ExchangeData&) const = default;
};

struct ClassDone {
  uint32_t cls = 0;  // at most 65535
  bool operator==(const ClassDone&) const = default;
};

// "This node's link stops": sent to every node it has a session with, each of which answers with
// a LeaveAck after which it sends this node nothing (so that nothing is in flight to it when it
// closes its endpoint).
struct Leave {
  bool operator==(const Leave&) const = default;
};
struct LeaveAck {
  bool operator==(const LeaveAck&) const = default;
};

using PeerMessage = std::variant<Hello, Challenge, Auth, AuthResult, ReadRequest, ReadReply,
                                 ExchangeData, ClassDone, RemoteReply, PushSample, Leave, LeaveAck>;

// Encodes `m`; throws std::invalid_argument for a reply whose data (or remote length) exceeds
// kMaxSampleBytes or carries data with a non-ok status, a class above 65535 or unknown request
// flags (a caller bug, not a peer's).
std::vector<std::byte> Encode(const PeerMessage& m);

// The first bytes of Encode(reply) for a reply whose data (`data_len` bytes, not in `head`, whose
// data must be empty) is sent after them as a part of its own: Encode(r) is EncodeReplyHead(r
// without its data, n) followed by the n bytes. Seal works on it as on the whole message (the
// MAC ends at the authentication block). Throws as Encode does.
std::vector<std::byte> EncodeReplyHead(const ReadReply& head, uint64_t data_len);

// Decodes exactly one message occupying all of `buf`.
Result<PeerMessage> Decode(std::span<const std::byte> buf);
// The same, except that a kReadReply's data is not copied into it: it is left in `buf`, and
// *reply_data is set to it (a view, valid as long as `buf`), with the same checks.
Result<PeerMessage> Decode(std::span<const std::byte> buf, std::span<const std::byte>* reply_data);

// Whether messages of `type` carry an authentication block (all but Hello, Challenge and Auth).
bool IsSealed(PeerType type);
// The type byte of an encoded message (nullopt: shorter than a header).
std::optional<PeerType> TypeOf(std::span<const std::byte> buf);

// The MAC of one handshake's session. Not thread-safe: one thread (the link's progress thread)
// seals and unseals with it.
class SessionKey {
 public:
  explicit SessionKey(const Mac& key);
  ~SessionKey();
  SessionKey(const SessionKey&) = delete;
  SessionKey& operator=(const SessionKey&) = delete;
  // The first 16 bytes of HMAC-SHA256(key, bytes).
  SealMac Compute(std::span<const std::byte> bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Fills the authentication block of `msg` (an encoded sealed message) with `seq` and its MAC,
// masking a kRemoteReply's key first (RemoteKeyMask).
void Seal(std::span<std::byte> msg, uint64_t seq, SessionKey& key);
// Checks the authentication block of `msg` (a sealed type, as TypeOf says) under `key` and
// returns its seq: Corruption if the buffer is too short for its type's block, PermissionDenied
// if the MAC does not verify. A decoded kRemoteReply's key is still masked: XOR it with
// RemoteKeyMask(key, seq).
Result<uint64_t> Unseal(std::span<const std::byte> msg, SessionKey& key);
// The 8 bytes that hide a kRemoteReply's key on the wire, from the session key and seq.
uint64_t RemoteKeyMask(SessionKey& key, uint64_t seq);

// The sequence numbers a receiver has accepted within the last kReplayWindow.
class ReplayWindow {
 public:
  // Whether `seq` is new (and records it): false for 0, a number seen before, or one at least
  // kReplayWindow behind the highest seen.
  bool Accept(uint64_t seq);

 private:
  uint64_t top_ = 0;
  std::array<uint64_t, kReplayWindow / 64> seen_{};
};

// Reads a per-job secret: a regular file of exactly 32 bytes, not readable or writable by group
// or others (PermissionDenied otherwise).
Result<Secret> ReadSecretFile(const std::string& path);

// Creates `path` with mode 0600 holding 32 random bytes (fails if it exists).
Status WriteSecretFile(const std::string& path);

// 32 random bytes from the OpenSSL CSPRNG.
Nonce RandomNonce();

// HMAC-SHA256(secret, label || client_nonce || server_nonce || client_node u32 LE ||
// server_node u32 LE). The server signs with label "nopfs-peer-server", the client with
// "nopfs-peer-client"; "nopfs-peer-session" gives the session key (SessionKeyOf) and a node's
// own "nopfs-peer-cookie" key its stateless server nonces.
Mac PeerMac(const Secret& secret, std::string_view label, const Nonce& client_nonce,
            const Nonce& server_nonce, uint32_t client_node, uint32_t server_node);
// The key that seals the session of a handshake.
Mac SessionKeyOf(const Secret& secret, const Nonce& client_nonce, const Nonce& server_nonce,
                 uint32_t client_node, uint32_t server_node);

// Constant-time equality of two MACs.
bool MacEqual(const Mac& a, const Mac& b);

}  // namespace nopfs::fabric
