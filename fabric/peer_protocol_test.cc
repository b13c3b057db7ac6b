// Tests of the peer protocol codec (round trips, every rejection, fuzzed decode) and the secret /
// HMAC helpers.
#include "fabric/peer_protocol.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

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
          Auth{n2},
          AuthResult{true},
          AuthResult{false},
          ReadRequest{9, 123456789012ull},
          ReadRequest{9, 5, kAcceptsRemoteRead},
          RemoteReply{9, 5, 131072, 0x7f0012345000ull, 0xfedcba9876543210ull, 42},
          RemoteReply{10, 6, 0, 0, 0, 0},
          PushSample{77, 0x1234, data},
          PushSample{78, 0, {}},
          ReadReply{9, 5, ReadStatus::kOk, data},
          ReadReply{10, 6, ReadStatus::kOk, {}},
          ReadReply{11, 7, ReadStatus::kNotAvailable, {}},
          ReadReply{12, 8, ReadStatus::kError, {}},
          ExchangeData{2, data},
          ExchangeData{3, {}},
          ClassDone{0},
          ClassDone{65535}};
}

TEST(PeerProtocolTest, RoundTripsEveryType) {
  for (const PeerMessage& m : Samples()) {
    auto bytes = Encode(m);
    auto back = Decode(bytes);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, m);
  }
}

TEST(PeerProtocolTest, HeaderLayoutIsLittleEndian) {
  auto b = Encode(ReadRequest{1, 2, kAcceptsRemoteRead});
  ASSERT_EQ(b.size(), kPeerHeaderBytes + 24);
  EXPECT_EQ(std::to_integer<int>(b[0]), 0x4E);  // "NPFP"
  EXPECT_EQ(std::to_integer<int>(b[3]), 0x50);
  EXPECT_EQ(std::to_integer<int>(b[4]), kPeerVersion);
  EXPECT_EQ(std::to_integer<int>(b[5]), static_cast<int>(PeerType::kReadRequest));
  EXPECT_EQ(std::to_integer<int>(b[8]), 24);
  EXPECT_EQ(std::to_integer<int>(b[16]), 1);
  EXPECT_EQ(std::to_integer<int>(b[24]), 2);
  EXPECT_EQ(std::to_integer<int>(b[32]), 1);  // flags
}

TEST(PeerProtocolTest, RejectsEveryMalformation) {
  auto good = Encode(ReadReply{1, 2, ReadStatus::kOk, std::vector<std::byte>(8)});
  auto bad = [&](size_t at, uint8_t v) {
    auto b = good;
    b[at] = static_cast<std::byte>(v);
    return Decode(b).status().code();
  };
  EXPECT_EQ(bad(0, 0), StatusCode::kCorruption);   // magic
  EXPECT_EQ(bad(4, 1), StatusCode::kCorruption);   // version 1 (no kClassDone)
  EXPECT_EQ(bad(4, 2), StatusCode::kCorruption);   // version 2 (16-byte requests)
  EXPECT_EQ(bad(4, 4), StatusCode::kCorruption);   // version 4
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
  req[8] = std::byte{25};
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
  remote_short[8] = std::byte{47};
  EXPECT_EQ(Decode(remote_short).status().code(), StatusCode::kCorruption);
  EXPECT_THROW(Encode(RemoteReply{1, 2, kMaxSampleBytes + 1, 0, 0, 0}), std::invalid_argument);
  // Push: shorter than its fixed part.
  auto push = Encode(PushSample{1, 2, {}});
  push.pop_back();
  push[8] = std::byte{15};
  EXPECT_EQ(Decode(push).status().code(), StatusCode::kCorruption);
  EXPECT_THROW(Encode(ReadReply{1, 1, ReadStatus::kNotAvailable, std::vector<std::byte>(1)}),
               std::invalid_argument);
  // ClassDone: a class above 65535; a body of the wrong size.
  auto done = Encode(ClassDone{7});
  done[18] = std::byte{1};  // cls = 7 + 65536
  EXPECT_EQ(Decode(done).status().code(), StatusCode::kCorruption);
  auto done_long = Encode(ClassDone{7});
  done_long.push_back(std::byte{0});
  done_long[8] = std::byte{5};
  EXPECT_EQ(Decode(done_long).status().code(), StatusCode::kCorruption);
  EXPECT_THROW(Encode(ClassDone{65536}), std::invalid_argument);
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
        b[3] = std::byte{0x50}, b[4] = std::byte{1}, b[5] = static_cast<std::byte>(1 + rng() % 7);
      }
    }
    auto m = Decode(b);
    if (m.ok()) {
      ++accepted;
      EXPECT_EQ(Encode(*m), b) << "decode accepted a non-canonical buffer";
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
  Mac m = PeerMac(*s, "nopfs-peer-server", c, v, 1);
  EXPECT_TRUE(MacEqual(m, PeerMac(*s, "nopfs-peer-server", c, v, 1)));
  EXPECT_FALSE(MacEqual(m, PeerMac(other, "nopfs-peer-server", c, v, 1)));
  EXPECT_FALSE(MacEqual(m, PeerMac(*s, "nopfs-peer-client", c, v, 1)));
  EXPECT_FALSE(MacEqual(m, PeerMac(*s, "nopfs-peer-server", v, c, 1)));
  EXPECT_FALSE(MacEqual(m, PeerMac(*s, "nopfs-peer-server", c, v, 2)));
  std::remove(path.c_str());
  std::remove(shortp.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace nopfs::fabric
