// Tests of the peer protocol codec (round trips, every rejection, fuzzed decode) and the secret /
// HMAC helpers.
#include "fabric/peer_protocol.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>

namespace nopfs::fabric {
namespace {

std::vector<PeerMessage> Samples() {
  Nonce n1{}, n2{};
  for (int i = 0; i < 32; ++i) {
    n1[i] = static_cast<uint8_t>(i);
    n2[i] = static_cast<uint8_t>(255 - i);
  }
  std::vector<std::byte> data(1000);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<std::byte>(i * 7);
  return {Hello{3, n1},
          Challenge{n1, n2},
          Auth{n1, n2, n2},
          AuthResult{true},
          AuthResult{false},
          ReadRequest{9, 123456789012ull},
          ReadRequest{9, 5, kAcceptsRemoteRead},
          RemoteReply{9, 5, 131072, 0x7f0012345000ull, 0xfedcba9876543210ull, 42},
          RemoteReply{10, 6, 0, 0, 0, 0},
          PushSample{77, 0x1234, data},
          PushSample{78, 0, {}},
          ReadReply{9, 5, ReadStatus::kOk, 0xabcdef, data},
          ReadReply{10, 6, ReadStatus::kOk, 0, {}},
          ReadReply{11, 7, ReadStatus::kNotAvailable, 0, {}},
          ReadReply{12, 8, ReadStatus::kError, 0, {}},
          ExchangeData{2, 0x55, data},
          ExchangeData{3, 0, {}},
          ClassDone{0},
          ClassDone{65535},
          Leave{},
          LeaveAck{}};
}

// The bytes of a message's variable data (after its authentication block).
size_t DataSize(const PeerMessage& m) {
  if (const auto* p = std::get_if<ReadReply>(&m)) return p->data.size();
  if (const auto* u = std::get_if<PushSample>(&m)) return u->data.size();
  if (const auto* x = std::get_if<ExchangeData>(&m)) return x->data.size();
  return 0;
}

TEST(PeerProtocolTest, RoundTripsEveryType) {
  for (const PeerMessage& m : Samples()) {
    auto bytes = Encode(m);
    auto back = Decode(bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, m);
    // Decoded with a view, a reply's data stays in the buffer; everything else is the same.
    std::span<const std::byte> view;
    auto viewed = Decode(bytes, &view);
    ASSERT_TRUE(viewed.ok()) << viewed.status().ToString();
    if (const auto* p = std::get_if<ReadReply>(&m)) {
      ReadReply r = std::get<ReadReply>(*viewed);
      EXPECT_TRUE(r.data.empty());
      EXPECT_TRUE(std::equal(view.begin(), view.end(), p->data.begin(), p->data.end()));
      EXPECT_EQ(view.data(), bytes.data() + bytes.size() - p->data.size());
      r.data.assign(view.begin(), view.end());
      EXPECT_EQ(PeerMessage(r), m);
    } else {
      EXPECT_EQ(*viewed, m);
      EXPECT_TRUE(view.empty());
    }
  }
}

// A reply sent as its head and its data apart is, byte for byte, the reply Encode makes, and seals
// the same way; EncodeReplyHead refuses what Encode refuses.
TEST(PeerProtocolTest, AReplysHeadAndDataApartAreTheEncodedReply) {
  for (const uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{128} << 10}) {
    ReadReply r{7, 9, n == 0 ? ReadStatus::kNotAvailable : ReadStatus::kOk, 0, {}};
    std::vector<std::byte> data(n);
    for (uint64_t i = 0; i < n; ++i)
      data[i] = static_cast<std::byte>(i * 7);
    if (n > 0) r.xxh3 = 0x1234 + n;
    ReadReply whole = r;
    whole.data = data;
    std::vector<std::byte> head = EncodeReplyHead(r, n);
    std::vector<std::byte> joined = head;
    joined.insert(joined.end(), data.begin(), data.end());
    EXPECT_EQ(joined, Encode(whole)) << n;
    Mac k{};
    k.fill(5);
    SessionKey a(k), b(k);
    std::vector<std::byte> sealed_whole = Encode(whole);
    Seal(head, 3, a);
    Seal(sealed_whole, 3, b);
    joined = head;
    joined.insert(joined.end(), data.begin(), data.end());
    EXPECT_EQ(joined, sealed_whole) << n;
    auto back = Decode(joined);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
  }
  ReadReply refused{1, 2, ReadStatus::kNotAvailable, 0, {}};
  EXPECT_THROW(EncodeReplyHead(refused, 10), std::invalid_argument);  // data with a non-ok status
  ReadReply ok{1, 2, ReadStatus::kOk, 0, {}};
  EXPECT_THROW(EncodeReplyHead(ok, kMaxSampleBytes + 1), std::invalid_argument);
  ok.data.resize(1);
  EXPECT_THROW(EncodeReplyHead(ok, 1), std::invalid_argument);  // the data goes apart
}

TEST(PeerProtocolTest, HeaderLayoutIsLittleEndian) {
  auto b = Encode(ReadRequest{1, 2, kAcceptsRemoteRead});
  ASSERT_EQ(b.size(), kPeerHeaderBytes + 24 + kAuthBlockBytes);
  EXPECT_EQ(std::to_integer<int>(b[0]), 0x4E);  // "NPFP"
  EXPECT_EQ(std::to_integer<int>(b[3]), 0x50);
  EXPECT_EQ(std::to_integer<int>(b[4]), kPeerVersion);
  EXPECT_EQ(std::to_integer<int>(b[5]), static_cast<int>(PeerType::kReadRequest));
  EXPECT_EQ(std::to_integer<int>(b[8]), 48);
  EXPECT_EQ(std::to_integer<int>(b[16]), 1);
  EXPECT_EQ(std::to_integer<int>(b[24]), 2);
  EXPECT_EQ(std::to_integer<int>(b[32]), 1);  // flags
}

TEST(PeerProtocolTest, RejectsEveryMalformation) {
  auto good = Encode(ReadReply{1, 2, ReadStatus::kOk, 3, std::vector<std::byte>(8)});
  auto bad = [&](size_t at, uint8_t v) {
    auto b = good;
    b[at] = static_cast<std::byte>(v);
    std::span<const std::byte> view;
    EXPECT_EQ(Decode(b, &view).status().code(), Decode(b).status().code());
    return Decode(b).status().code();
  };
  EXPECT_EQ(bad(0, 0), StatusCode::kCorruption);   // magic
  EXPECT_EQ(bad(4, 1), StatusCode::kCorruption);   // version 1 (no kClassDone)
  EXPECT_EQ(bad(4, 2), StatusCode::kCorruption);   // version 2 (16-byte requests)
  EXPECT_EQ(bad(4, 3), StatusCode::kCorruption);   // version 3 (unsealed)
  EXPECT_EQ(bad(4, 4), StatusCode::kCorruption);   // version 4 (no kLeave)
  EXPECT_EQ(bad(4, 6), StatusCode::kCorruption);   // version 6
  EXPECT_EQ(bad(5, 99), StatusCode::kCorruption);  // type
  EXPECT_EQ(bad(5, 0), StatusCode::kCorruption);   // type 0
  EXPECT_EQ(bad(6, 1), StatusCode::kCorruption);   // reserved
  EXPECT_EQ(bad(12, 1), StatusCode::kCorruption);  // reserved
  EXPECT_EQ(bad(8, 0), StatusCode::kCorruption);   // body length
  EXPECT_EQ(bad(32, 3), StatusCode::kCorruption);  // status
  EXPECT_EQ(bad(32, 1), StatusCode::kCorruption);  // not-available with data
  EXPECT_EQ(bad(36, 1), StatusCode::kCorruption);  // reserved reply field
  auto shorter = good;
  shorter.pop_back();
  EXPECT_EQ(Decode(shorter).status().code(), StatusCode::kCorruption);
  auto longer = good;
  longer.push_back(std::byte{0});
  EXPECT_EQ(Decode(longer).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(Decode({}).status().code(), StatusCode::kCorruption);
  // A fixed-size type with a consistent header but the wrong body size.
  auto req = Encode(ReadRequest{1, 2});
  req.push_back(std::byte{0});
  req[8] = std::byte{49};
  EXPECT_EQ(Decode(req).status().code(), StatusCode::kCorruption);
  // ReadRequest: an unknown flag; a non-zero reserved field.
  auto flagged = Encode(ReadRequest{1, 2});
  flagged[32] = std::byte{2};
  EXPECT_EQ(Decode(flagged).status().code(), StatusCode::kCorruption);
  flagged[32] = std::byte{0};
  flagged[36] = std::byte{1};
  EXPECT_EQ(Decode(flagged).status().code(), StatusCode::kCorruption);
  EXPECT_THROW(Encode(ReadRequest{1, 2, 2}), std::invalid_argument);
  // RemoteReply: a length over the sample limit; a body of the wrong size.
  auto remote = Encode(RemoteReply{1, 2, 3, 4, 5, 6});
  remote[16 + 16 + 7] = std::byte{1};  // length's top byte
  EXPECT_EQ(Decode(remote).status().code(), StatusCode::kCorruption);
  auto remote_short = Encode(RemoteReply{1, 2, 3, 4, 5, 6});
  remote_short.pop_back();
  remote_short[8] = std::byte{71};
  EXPECT_EQ(Decode(remote_short).status().code(), StatusCode::kCorruption);
  EXPECT_THROW(Encode(RemoteReply{1, 2, kMaxSampleBytes + 1, 0, 0, 0}), std::invalid_argument);
  // Push: shorter than its fixed part.
  auto push = Encode(PushSample{1, 2, {}});
  push.pop_back();
  push[8] = std::byte{39};
  EXPECT_EQ(Decode(push).status().code(), StatusCode::kCorruption);
  EXPECT_THROW(Encode(ReadReply{1, 1, ReadStatus::kNotAvailable, 0, std::vector<std::byte>(1)}),
               std::invalid_argument);
  EXPECT_THROW(Encode(ReadReply{1, 1, ReadStatus::kOk, 5, {}}), std::invalid_argument);
  auto empty_reply = Encode(ReadReply{1, 1, ReadStatus::kOk, 0, {}});
  empty_reply[40] = std::byte{1};  // a checksum without data
  EXPECT_EQ(Decode(empty_reply).status().code(), StatusCode::kCorruption);
  // ClassDone: a class above 65535; a body of the wrong size.
  auto done = Encode(ClassDone{7});
  done[18] = std::byte{1};  // cls = 7 + 65536
  EXPECT_EQ(Decode(done).status().code(), StatusCode::kCorruption);
  auto done_long = Encode(ClassDone{7});
  done_long.push_back(std::byte{0});
  done_long[8] = std::byte{29};
  EXPECT_EQ(Decode(done_long).status().code(), StatusCode::kCorruption);
  EXPECT_THROW(Encode(ClassDone{65536}), std::invalid_argument);
  // Leave and LeaveAck: a reserved field not zero; a body of the wrong size.
  for (const PeerMessage& m : {PeerMessage(Leave{}), PeerMessage(LeaveAck{})}) {
    auto leave = Encode(m);
    ASSERT_EQ(leave.size(), kPeerHeaderBytes + 4 + kAuthBlockBytes);
    leave[16] = std::byte{1};
    EXPECT_EQ(Decode(leave).status().code(), StatusCode::kCorruption);
    auto leave_long = Encode(m);
    leave_long.push_back(std::byte{0});
    leave_long[8] = std::byte{29};
    EXPECT_EQ(Decode(leave_long).status().code(), StatusCode::kCorruption);
  }
}

TEST(PeerProtocolTest, FuzzedDecodeNeverCrashesAndOnlyAcceptsCanonicalBuffers) {
  std::mt19937_64 rng(12345);
  auto samples = Samples();
  uint64_t accepted = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    std::vector<std::byte> b;
    if (iter % 2 == 0) {
      // Mutations of valid messages: flip bytes, cut, extend.
      b = Encode(samples[rng() % samples.size()]);
      int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips && !b.empty(); ++f) {
        b[rng() % b.size()] = static_cast<std::byte>(rng());
      }
      if (rng() % 4 == 0) b.resize(rng() % (b.size() + 8));
    } else {
      b.resize(rng() % 128);
      for (auto& c : b)
        c = static_cast<std::byte>(rng());
      if (b.size() >= 6 && rng() % 2 == 0) {  // valid magic/version so deeper checks run
        b[0] = std::byte{0x4E}, b[1] = std::byte{0x50}, b[2] = std::byte{0x46},
        b[3] = std::byte{0x50}, b[4] = std::byte{kPeerVersion},
        b[5] = static_cast<std::byte>(1 + rng() % 7);
      }
    }
    auto m = Decode(b);
    std::span<const std::byte> view;
    EXPECT_EQ(Decode(b, &view).status().code(), m.status().code());  // the same checks
    if (m.ok()) {
      ++accepted;
      // Canonical but for the authentication block, which Decode leaves to Unseal.
      auto expect = b;
      if (IsSealed(*TypeOf(b))) {
        const size_t end = b.size() - DataSize(*m);
        std::fill(expect.begin() + static_cast<long>(end - kAuthBlockBytes),
                  expect.begin() + static_cast<long>(end), std::byte{0});
      }
      EXPECT_EQ(Encode(*m), expect) << "decode accepted a non-canonical buffer";
    }
  }
  EXPECT_GT(accepted, 0u);
}

TEST(PeerProtocolTest, SecretFileAndMacs) {
  std::string dir = ::testing::TempDir() + "/peer_secret_" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  std::string path = dir + "/secret";
  ASSERT_TRUE(WriteSecretFile(path).ok());
  EXPECT_FALSE(WriteSecretFile(path).ok());  // never overwrites
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto s = ReadSecretFile(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_NE(*s, Secret{});
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  EXPECT_EQ(ReadSecretFile(path).status().code(), StatusCode::kPermissionDenied);
  std::string shortp = dir + "/short";
  { std::ofstream(shortp) << "abc"; }
  ASSERT_EQ(::chmod(shortp.c_str(), 0600), 0);
  EXPECT_EQ(ReadSecretFile(shortp).status().code(), StatusCode::kInvalidArgument);

  Nonce c = RandomNonce(), v = RandomNonce();
  EXPECT_NE(c, v);
  Secret other = *s;
  other[0] ^= 1;
  Mac m = PeerMac(*s, "nopfs-peer-server", c, v, 1, 0);
  EXPECT_TRUE(MacEqual(m, PeerMac(*s, "nopfs-peer-server", c, v, 1, 0)));
  EXPECT_FALSE(MacEqual(m, PeerMac(other, "nopfs-peer-server", c, v, 1, 0)));
  EXPECT_FALSE(MacEqual(m, PeerMac(*s, "nopfs-peer-client", c, v, 1, 0)));
  EXPECT_FALSE(MacEqual(m, PeerMac(*s, "nopfs-peer-server", v, c, 1, 0)));
  EXPECT_FALSE(MacEqual(m, PeerMac(*s, "nopfs-peer-server", c, v, 2, 0)));
  EXPECT_FALSE(MacEqual(m, PeerMac(*s, "nopfs-peer-server", c, v, 1, 2)));
  EXPECT_FALSE(MacEqual(SessionKeyOf(*s, c, v, 1, 0), SessionKeyOf(*s, c, v, 0, 1)));
  std::remove(path.c_str());
  std::remove(shortp.c_str());
  ::rmdir(dir.c_str());
}

Mac TestKey(uint8_t fill) {
  Mac k{};
  k.fill(fill);
  return k;
}

// Sealed messages verify under their session's key only, and any change of a byte the MAC
// covers (header, fixed fields, seq) is caught; data is bound through the xxh3 field.
TEST(PeerProtocolTest, SealedMessagesVerifyOnlyUnderTheirKeyAndUnchanged) {
  SessionKey key(TestKey(1)), other(TestKey(2));
  for (const PeerMessage& m : Samples()) {
    auto b = Encode(m);
    const PeerType type = *TypeOf(b);
    if (!IsSealed(type)) continue;
    Seal(b, 77, key);
    auto copy = b;
    auto seq = Unseal(copy, key);
    ASSERT_TRUE(seq.ok()) << seq.status().ToString();
    EXPECT_EQ(*seq, 77u);
    auto back = Decode(copy);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    if (auto* v = std::get_if<RemoteReply>(&*back)) v->key ^= RemoteKeyMask(key, *seq);
    EXPECT_EQ(*back, m);
    auto forged = b;
    EXPECT_EQ(Unseal(forged, other).status().code(), StatusCode::kPermissionDenied);
    // Every byte up to the end of the authentication block is covered.
    const size_t covered = b.size() - DataSize(m);
    for (size_t i = 0; i < covered; ++i) {
      auto flipped = b;
      flipped[i] ^= std::byte{0x10};
      EXPECT_FALSE(Unseal(flipped, key).ok()) << "byte " << i << " of type " << int(type);
    }
  }
  // The RMA key does not cross the wire in the clear.
  auto r = Encode(RemoteReply{1, 2, 3, 4, 0x1122334455667788ull, 6});
  Seal(r, 1, key);
  uint64_t on_wire = 0;
  for (int i = 0; i < 8; ++i)
    on_wire |= uint64_t{std::to_integer<uint8_t>(r[kPeerHeaderBytes + 32 + i])} << (8 * i);
  EXPECT_NE(on_wire, 0x1122334455667788ull);
  // The handshake is not sealed, and Unseal says so.
  auto hello = Encode(Hello{1, Nonce{}});
  EXPECT_EQ(Unseal(hello, key).status().code(), StatusCode::kCorruption);
  auto cut = Encode(ClassDone{1});
  cut.resize(kPeerHeaderBytes + 10);
  EXPECT_EQ(Unseal(cut, key).status().code(), StatusCode::kCorruption);
}

TEST(PeerProtocolTest, ReplayWindowAcceptsEachSequenceNumberOnce) {
  ReplayWindow w;
  EXPECT_FALSE(w.Accept(0));
  EXPECT_TRUE(w.Accept(1));
  EXPECT_FALSE(w.Accept(1));
  EXPECT_TRUE(w.Accept(5));
  EXPECT_TRUE(w.Accept(3));  // overtaken, still new
  EXPECT_FALSE(w.Accept(3));
  EXPECT_TRUE(w.Accept(2));
  EXPECT_TRUE(w.Accept(4 + kReplayWindow));
  EXPECT_FALSE(w.Accept(4));  // too far behind
  EXPECT_TRUE(w.Accept(5 + 1));
  EXPECT_FALSE(w.Accept(5 + 1));
  EXPECT_TRUE(w.Accept(100 * kReplayWindow));  // a jump clears the window
  EXPECT_FALSE(w.Accept(100 * kReplayWindow));
  EXPECT_TRUE(w.Accept(100 * kReplayWindow - 1));
  // Each of a long run exactly once, in a shuffled order within the window.
  ReplayWindow v;
  std::mt19937_64 rng(3);
  std::vector<uint64_t> seqs;
  for (uint64_t i = 1; i <= 20000; ++i)
    seqs.push_back(i);
  for (size_t i = 0; i + 64 < seqs.size(); i += 64)
    std::shuffle(seqs.begin() + static_cast<long>(i), seqs.begin() + static_cast<long>(i + 64),
                 rng);
  for (uint64_t s : seqs)
    EXPECT_TRUE(v.Accept(s)) << s;
  for (uint64_t s = 20000 - kReplayWindow + 1; s <= 20000; ++s)
    EXPECT_FALSE(v.Accept(s)) << s;
}

}  // namespace
}  // namespace nopfs::fabric
