// The peer protocol: the messages two nopfsd exchange over the fabric, their strict binary codec,
// and the per-job HMAC-SHA256 challenge/response that admits a peer.
//
// Wire format (all integers little-endian), one message per fabric message:
//   header (16 bytes): magic u32 = 0x5046504E ("NPFP"), version u8 = 3, type u8, reserved u16 = 0,
//                      body_len u32, reserved u32 = 0
//   body (body_len bytes), by type:
//     kHello       node u32, client_nonce[32]                      (36 bytes)
//     kChallenge   server_nonce[32], server_mac[32]                (64 bytes)
//     kAuth        client_mac[32]                                  (32 bytes)
//     kAuthResult  accepted u32 (0 or 1)                           (4 bytes)
//     kReadRequest request_id u64, sample u64, flags u32, reserved u32 = 0 (24 bytes); flags bit 0
//                  (kAcceptsRemoteRead): the reader can take a kRemoteReply; other bits must be 0
//     kReadReply   request_id u64, sample u64, status u32, reserved u32 = 0, data (24 + n bytes)
//     kExchange    round u64, data (8 + n bytes; one node's buffer of a collective all-to-all)
//     kClassDone   cls u32 (<= 65535): the sender has filled every entry of its class-cls list
//                  (ALGORITHM.md §6: the receiver then presumes all of them ready) (4 bytes)
//     kRemoteReply request_id u64, sample u64, length u64, addr u64, key u64, xxh3 u64 (48 bytes):
//                  the sample is ready in memory the sender registered for remote reads; the
//                  reader fetches `length` bytes at (addr, key) with an RMA read and checks them
//                  against `xxh3` (length <= kMaxSampleBytes)
//     kPush        sample u64, xxh3 u64, data (16 + n bytes): the sender read `sample` from the PFS
//                  for a staging read before the receiver (which holds it in its plan, or fills it
//                  for the job) had it; the receiver may keep the bytes instead of reading them
// Version 1 had no kClassDone; version 2 no flags in kReadRequest, no kRemoteReply and no kPush.
//
// What it promises: Decode accepts exactly the buffers Encode produces and rejects every other
// buffer with Corruption (wrong magic, version, type, length, non-zero reserved field, unknown
// status, data over kMaxSampleBytes) without reading outside the buffer. The MACs bind both
// nonces, the client's node and a direction label, so a reply cannot be replayed as a request.
//
// Thread safety: every function is pure or uses only thread-safe OpenSSL calls; call from any
// thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"

namespace nopfs::fabric {

inline constexpr uint32_t kPeerMagic = 0x5046504E;
inline constexpr uint8_t kPeerVersion = 3;
inline constexpr uint64_t kPeerHeaderBytes = 16;
inline constexpr uint64_t kMaxSampleBytes = uint64_t{64} << 20;  // largest sample served to a peer
inline constexpr uint64_t kMaxPeerMessageBytes = kPeerHeaderBytes + 24 + kMaxSampleBytes;

using Nonce = std::array<uint8_t, 32>;
using Mac = std::array<uint8_t, 32>;
using Secret = std::array<uint8_t, 32>;

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
  std::vector<std::byte> data;  // at most kMaxSampleBytes
  bool operator==(const ExchangeData&) const = default;
};

struct ClassDone {
  uint32_t cls = 0;  // at most 65535
  bool operator==(const ClassDone&) const = default;
};

using PeerMessage = std::variant<Hello, Challenge, Auth, AuthResult, ReadRequest, ReadReply,
                                 ExchangeData, ClassDone, RemoteReply, PushSample>;

// Encodes `m`; throws std::invalid_argument for a reply whose data (or remote length) exceeds
// kMaxSampleBytes or carries data with a non-ok status, a class above 65535 or unknown request
// flags (a caller bug, not a peer's).
std::vector<std::byte> Encode(const PeerMessage& m);

// Decodes exactly one message occupying all of `buf`.
Result<PeerMessage> Decode(std::span<const std::byte> buf);

// Reads a per-job secret: a regular file of exactly 32 bytes, not readable or writable by group
// or others (PermissionDenied otherwise).
Result<Secret> ReadSecretFile(const std::string& path);

// Creates `path` with mode 0600 holding 32 random bytes (fails if it exists).
Status WriteSecretFile(const std::string& path);

// 32 random bytes from the OpenSSL CSPRNG.
Nonce RandomNonce();

// HMAC-SHA256(secret, label || client_nonce || server_nonce || node as u32 LE). The server signs
// with label "nopfs-peer-server", the client with "nopfs-peer-client".
Mac PeerMac(const Secret& secret, std::string_view label, const Nonce& client_nonce,
            const Nonce& server_nonce, uint32_t node);

// Constant-time equality of two MACs.
bool MacEqual(const Mac& a, const Mac& b);

}  // namespace nopfs::fabric
