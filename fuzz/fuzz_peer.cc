// Fuzz target: the peer protocol (fabric/peer_protocol.h), what a nopfsd decodes from any host
// that reaches its peer port: the clear handshake (Hello, Challenge, Auth) and the sealed
// messages, with their authentication block and replay window.
// Properties, on every input:
//   - Decode never reads outside the input; a message it accepts re-encodes to the same bytes,
//     but for the authentication block (seq, mac), which Seal writes and Unseal checks.
//   - Unseal under the job's session key refuses the raw input unless its MAC verifies; after
//     Seal with that key and a seq, Unseal returns that seq, and a flipped byte anywhere in the
//     sealed part makes it refuse.
//   - A Hello is carried through the handshake (Challenge, Auth, each through the codec): the
//     right Auth is admitted; the server's own MAC sent back, or one for another node, is not; a
//     foreign Auth is admitted exactly when its MAC is the one the secret gives.
//   - ReplayWindow admits a seq exactly when a set-of-seen-numbers model does.
#include <cstring>
#include <set>

#include "fabric/peer_protocol.h"
#include "fuzz/fuzz_check.h"

namespace fabric = nopfs::fabric;
using nopfs::fuzz::AsBytes;

namespace {

constexpr fabric::Secret kSecret = {7,  1,  2,  3,  4,  5,  6,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
constexpr uint32_t kServerNode = 1;

// Where the authentication block of an accepted sealed message starts (after its fixed fields).
uint64_t AuthBlockAt(fabric::PeerType t) {
  switch (t) {
    case fabric::PeerType::kAuthResult:
    case fabric::PeerType::kClassDone:
    case fabric::PeerType::kLeave:
    case fabric::PeerType::kLeaveAck:
      return fabric::kPeerHeaderBytes + 4;
    case fabric::PeerType::kReadRequest:
      return fabric::kPeerHeaderBytes + 24;
    case fabric::PeerType::kReadReply:
      return fabric::kPeerHeaderBytes + 32;
    case fabric::PeerType::kExchange:
    case fabric::PeerType::kPush:
      return fabric::kPeerHeaderBytes + 16;
    case fabric::PeerType::kRemoteReply:
      return fabric::kPeerHeaderBytes + 48;
    default:
      return 0;
  }
}

void CheckRoundTrip(std::span<const std::byte> in, const fabric::PeerMessage& m) {
  std::vector<std::byte> again = fabric::Encode(m);
  const fabric::PeerType type = *fabric::TypeOf(in);
  NOPFS_FUZZ_CHECK(fabric::TypeOf(again) == type);
  if (fabric::IsSealed(type)) {
    const uint64_t at = AuthBlockAt(type);
    NOPFS_FUZZ_CHECK(at != 0 && at + fabric::kAuthBlockBytes <= in.size());
    NOPFS_FUZZ_CHECK(again.size() == in.size());
    std::memcpy(again.data() + at, in.data() + at, fabric::kAuthBlockBytes);
  }
  NOPFS_FUZZ_CHECK(nopfs::fuzz::SameBytes(again, in));
}

void CheckSeal(std::span<const std::byte> in, fabric::SessionKey& key) {
  // The raw input verifies only if it carries the MAC of this key (never, in practice).
  nopfs::Result<uint64_t> raw = fabric::Unseal(in, key);
  (void)raw;
  // Seal a copy with a seq taken from the input; Unseal must give it back, and refuse any flip.
  std::vector<std::byte> msg(in.begin(), in.end());
  const uint64_t at = AuthBlockAt(*fabric::TypeOf(in));
  uint64_t seq = 1;
  std::memcpy(&seq, in.data() + at, sizeof seq);
  seq = seq == 0 ? 1 : seq;
  fabric::Seal(msg, seq, key);
  nopfs::Result<uint64_t> got = fabric::Unseal(msg, key);
  NOPFS_FUZZ_CHECK(got.ok() && *got == seq);
  const size_t covered = at + 8;  // header, fixed fields, seq
  const size_t flip = static_cast<size_t>(seq % (covered + 16));
  msg[flip] ^= std::byte{0x20};
  nopfs::Result<uint64_t> flipped = fabric::Unseal(msg, key);
  NOPFS_FUZZ_CHECK(!flipped.ok());
}

void CheckHandshake(const fabric::PeerMessage& m) {
  if (const auto* h = std::get_if<fabric::Hello>(&m)) {
    // The server answers the Hello; the client checks the Challenge and sends its Auth, which the
    // server admits after the trip through the codec. The server's own MAC sent back, or a MAC
    // for another node, is refused: a reply cannot be replayed as a request.
    const fabric::Nonce server_nonce = fabric::RandomNonce();
    const fabric::Challenge c{
        server_nonce, fabric::PeerMac(kSecret, "nopfs-peer-server", h->client_nonce, server_nonce,
                                      h->node, kServerNode)};
    nopfs::Result<fabric::PeerMessage> got = fabric::Decode(fabric::Encode(c));
    NOPFS_FUZZ_CHECK(got.ok());
    const auto& back = std::get<fabric::Challenge>(*got);
    NOPFS_FUZZ_CHECK(back == c);
    NOPFS_FUZZ_CHECK(fabric::MacEqual(back.server_mac,
                                      fabric::PeerMac(kSecret, "nopfs-peer-server", h->client_nonce,
                                                      back.server_nonce, h->node, kServerNode)));
    auto admitted = [&](const fabric::Mac& mac, uint32_t node) {
      const fabric::Auth a{h->client_nonce, server_nonce, mac};
      nopfs::Result<fabric::PeerMessage> in = fabric::Decode(fabric::Encode(a));
      NOPFS_FUZZ_CHECK(in.ok());
      const auto& auth = std::get<fabric::Auth>(*in);
      return fabric::MacEqual(auth.client_mac,
                              fabric::PeerMac(kSecret, "nopfs-peer-client", auth.client_nonce,
                                              auth.server_nonce, node, kServerNode));
    };
    NOPFS_FUZZ_CHECK(admitted(fabric::PeerMac(kSecret, "nopfs-peer-client", h->client_nonce,
                                              server_nonce, h->node, kServerNode),
                              h->node));
    NOPFS_FUZZ_CHECK(!admitted(c.server_mac, h->node));
    NOPFS_FUZZ_CHECK(!admitted(fabric::PeerMac(kSecret, "nopfs-peer-client", h->client_nonce,
                                               server_nonce, h->node + 1, kServerNode),
                               h->node));
  } else if (const auto* a = std::get_if<fabric::Auth>(&m)) {
    // A foreign Auth is admitted exactly when its MAC is the one the secret gives.
    const fabric::Mac expected = fabric::PeerMac(kSecret, "nopfs-peer-client", a->client_nonce,
                                                 a->server_nonce, 0, kServerNode);
    NOPFS_FUZZ_CHECK(fabric::MacEqual(a->client_mac, expected) == (a->client_mac == expected));
  }
}

void CheckReplayWindow(std::span<const std::byte> in) {
  fabric::ReplayWindow window;
  std::set<uint64_t> seen;
  uint64_t top = 0;
  for (size_t i = 0; i + 2 <= in.size() && i < 4096; i += 2) {
    // Steps of -28,672 .. +36,863 around the highest seq: late, repeated and far-ahead messages.
    const auto b0 = std::to_integer<uint8_t>(in[i]);
    const auto b1 = std::to_integer<uint8_t>(in[i + 1]);
    const int64_t delta = static_cast<int64_t>((b0 << 8) | b1) - 0x7000;
    const uint64_t seq =
        delta < 0 && static_cast<uint64_t>(-delta) > top ? 0 : top + static_cast<uint64_t>(delta);
    const bool model = seq != 0 && seq + fabric::kReplayWindow > top && !seen.contains(seq);
    NOPFS_FUZZ_CHECK(window.Accept(seq) == model);
    if (model) {
      seen.insert(seq);
      top = std::max(top, seq);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fabric::SessionKey key(
      fabric::SessionKeyOf(kSecret, fabric::Nonce{1}, fabric::Nonce{2}, 0, kServerNode));
  const std::span<const std::byte> in = AsBytes(data, size);
  nopfs::Result<fabric::PeerMessage> m = fabric::Decode(in);
  if (m.ok()) {
    CheckRoundTrip(in, *m);
    if (fabric::IsSealed(*fabric::TypeOf(in))) CheckSeal(in, key);
    CheckHandshake(*m);
  } else if (size >= fabric::kPeerHeaderBytes && fabric::IsSealed(*fabric::TypeOf(in))) {
    nopfs::Result<uint64_t> raw = fabric::Unseal(in, key);  // what PeerLink does before Decode
    (void)raw;
  }
  CheckReplayWindow(in);
  return 0;
}
