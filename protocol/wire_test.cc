#include "protocol/wire.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <random>

namespace nopfs::wire {
namespace {

// The sibling jobs' group of FullReport(): "77.0" as a string (4 + 4 bytes) and five u64.
constexpr size_t kSiblingsGroup = 4 + 4 + 5 * 8;

// A report with every field set to a distinct value, peers included.
report::StatusReport FullReport() {
  report::StatusReport r;
  r.job_id = "4711";
  r.node = 1;
  r.nodes = 2;
  r.pid = 999;
  r.uptime_ns = 12'345'678'901;
  r.dataset = "/pfs/imagenet";
  r.dataset_samples = 1000;
  r.dataset_bytes = 110'000'000;
  r.predicted_stall_ns = 3'000'000'000;
  r.tiers.push_back({"ram", report::TierState::kRunning, 1 << 30, 600, 66'000'000, 300, 33'000'000,
                     5, 7, 1, 250'000'000, 132'000'000});
  r.tiers.push_back({"ssd", report::TierState::kEmpty, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  r.streams.push_back({3, 2, 100, 2000, 1, 90});
  r.sources.push_back({"ram", 10, 1100, true, 8});
  r.sources.push_back({"peer", 2, 220, false, 0});
  r.sources.push_back({"pfs", 3, 330, false, 0});
  r.pfs_bytes = 77'000'000;
  r.corrupt = 1;
  r.changed = 2;
  r.kept = report::Kept{21, 22, 23, 24};
  r.siblings = report::Siblings{"77.0", 31, 32, 33, 34, 35};
  r.stall = {15, 1'500'000, 65'536, 1'048'576, {}};
  r.stall.histogram[0] = 4;
  r.stall.histogram[17] = 11;
  r.refusals = {1, 8, 2, 3, 4};
  r.cpu_user_ns = 1'230'000'000;
  r.cpu_system_ns = 450'000'000;
  report::Peers p;
  p.node = 1;
  p.nodes = 2;
  p.state = "directory of 10 samples held elsewhere";
  p.held_elsewhere = 10;
  p.needed = 12;
  p.served_samples = 11;
  p.fetched_samples = 12;
  p.dead = {0};
  p.rma = "RAM tiers by RMA reads";
  p.pushes_kept = 13;
  p.fill_gave_up = 14;
  p.served_in_place = 15;
  r.peers = p;
  return r;
}

std::vector<Message> Samples() {
  return {
      {1, Hello{kVersion, 4242}},
      {2, HelloOk{kVersion, "job-123", 16, 4, 4}},
      {3, OpenStream{3, 2, 1000000000007ULL, std::nullopt, std::nullopt, std::nullopt}},
      {3, OpenStream{3, 2, 7, StreamShare{1, 4, 32, 1}, std::nullopt, std::nullopt}},
      {3, OpenStream{3, 2, 7, StreamShare{1, 4, 32, 1}, kOpenAcceptRegion, std::nullopt}},
      {3, OpenStream{3, 2, 7, StreamShare{1, 4, 32, 1}, kOpenAcceptRegion, 4242}},
      {4, StreamOk{77, 1 << 20, 256, std::nullopt}},
      {4, StreamOk{77, 1 << 20, 256, uint64_t{3} << 30}},
      {5, StatusRequest{std::nullopt}},
      {6, StatusOk{"stall total 1.2 s\nmedian 3 ms\n", std::nullopt}},
      {5, StatusRequest{report::kReportVersion}},
      {6, StatusOk{"", FullReport()}},
      {6, StatusOk{"", report::StatusReport{}}},
      {7, CloseStream{77}},
      {8, CloseOk{77}},
      {9, Error{static_cast<uint32_t>(StatusCode::kNotFound), "sample 17 (/pfs/a.jpg): gone"}},
      {10, Describe{17}},
      {11, DescribeOk{17, "/pfs/train/n01/a.jpg", 4096, 110000, -1}},
      {12, ReadSample{0x0123456789abcdefULL, 17}},
      {13, SampleOk{17, 0xfeedULL, 5, "abcde"}},
      {13, SampleOk{17, 0xfeedULL, 0, ""}},
      {13, SampleOk{17, 0xfeedULL, kMaxInlineSample + 1, ""}},
  };
}

std::vector<std::byte> Bytes(const Message& m) {
  Result<std::vector<std::byte>> b = Encode(m);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? *b : std::vector<std::byte>{};
}

TEST(Wire, EveryMessageRoundTrips) {
  for (const Message& m : Samples()) {
    std::vector<std::byte> b = Bytes(m);
    Result<Message> d = Decode(b);
    ASSERT_TRUE(d.ok()) << TypeName(TypeOf(m.body)) << ": " << d.status().ToString();
    EXPECT_EQ(*d, m) << TypeName(TypeOf(m.body));
  }
}

TEST(Wire, HeaderIsLittleEndianAsDocumented) {
  std::vector<std::byte> b = Bytes({0x01020304, CloseStream{0x1122334455667788ULL}});
  ASSERT_EQ(b.size(), kHeaderSize + 8);
  const uint8_t want[] = {'N', 'P', 'F', 'S', 1,    0,    7,    0,    8,    0,    0,    0,
                          4,   3,   2,   1,   0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11};
  for (size_t i = 0; i < b.size(); ++i)
    EXPECT_EQ(static_cast<uint8_t>(b[i]), want[i]) << i;
}

// SAMPLE_OK carries a small sample's bytes exactly, and a large one's in a memfd, never both.
TEST(Wire, SampleOkIsInlineExactlyWhenSmall) {
  EXPECT_TRUE(Decode(Bytes({1, SampleOk{3, 9, 4, "abcd"}})).ok());
  EXPECT_FALSE(Decode(Bytes({1, SampleOk{3, 9, 5, "abcd"}})).ok());  // bytes missing
  EXPECT_FALSE(Decode(Bytes({1, SampleOk{3, 9, 3, "abcd"}})).ok());  // bytes too many
  EXPECT_TRUE(Decode(Bytes({1, SampleOk{3, 9, kMaxInlineSample + 1, ""}})).ok());
  EXPECT_FALSE(Decode(Bytes({1, SampleOk{3, 9, kMaxInlineSample + 1, "a"}})).ok());
}

// The base OPEN_STREAM (16 payload bytes) is what every version-1 peer speaks; the share is a
// tail of exactly 20 bytes after it. Anything in between is truncated, anything after trailing.
TEST(Wire, OpenStreamShareIsAnOptionalTail) {
  std::vector<std::byte> base =
      Bytes({5, OpenStream{1, 2, 3, std::nullopt, std::nullopt, std::nullopt}});
  std::vector<std::byte> full =
      Bytes({5, OpenStream{1, 2, 3, StreamShare{2, 3, 64, 1}, std::nullopt, std::nullopt}});
  ASSERT_EQ(base.size(), kHeaderSize + 16);
  ASSERT_EQ(full.size(), kHeaderSize + 36);
  // The base fields come first, unchanged.
  for (size_t i = kHeaderSize; i < base.size(); ++i)
    EXPECT_EQ(base[i], full[i]) << i;
  Result<Message> d = Decode(base);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(std::get<OpenStream>(d->body).share.has_value());
  for (size_t cut = 1; cut < 20; ++cut) {
    std::vector<std::byte> b(full.begin(), full.end() - static_cast<ptrdiff_t>(cut));
    b[8] = static_cast<std::byte>(36 - cut);  // a consistent header: the payload is short
    Result<Message> bad = Decode(b);
    EXPECT_FALSE(bad.ok()) << cut;
  }
  std::vector<std::byte> longer = full;
  longer.push_back(std::byte{0});
  longer[8] = std::byte{37};
  EXPECT_FALSE(Decode(longer).ok());
}

// The report's kept-area group is an optional tail of 32 bytes: without it the report has no kept
// figures; a partial group is malformed.
TEST(Wire, StatusReportKeptGroupIsAnOptionalTail) {
  report::StatusReport without_siblings = FullReport();
  without_siblings.siblings.reset();
  const StatusOk full_msg{"", without_siblings};
  std::vector<std::byte> full = Bytes({6, full_msg});
  const auto payload = [](std::vector<std::byte>* b, size_t n) {
    for (size_t i = 0; i < 4; ++i)
      (*b)[8 + i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  };
  const size_t n = full.size() - kHeaderSize;
  std::vector<std::byte> base(full.begin(), full.end() - 32);
  payload(&base, n - 32);
  Result<Message> d = Decode(base);
  ASSERT_TRUE(d.ok()) << d.status().message();
  report::StatusReport want = without_siblings;
  want.kept.reset();
  EXPECT_EQ(*std::get<StatusOk>(d->body).report, want);
  Result<Message> f = Decode(full);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(std::get<StatusOk>(f->body).report->kept, (report::Kept{21, 22, 23, 24}));
  for (size_t cut = 1; cut < 32; cut += 7) {
    std::vector<std::byte> b(full.begin(), full.end() - static_cast<ptrdiff_t>(cut));
    payload(&b, n - cut);
    EXPECT_FALSE(Decode(b).ok()) << cut;
  }
}

// The sibling jobs' group follows the kept area's, as an optional tail of its own (the job read
// through, then five u64): without it the report has no sibling figures; a partial group is
// malformed; a report with sibling figures and no kept group sends the kept group as zeros.
TEST(Wire, StatusReportSiblingsGroupIsAnOptionalTail) {
  std::vector<std::byte> full = Bytes({6, StatusOk{"", FullReport()}});
  const auto payload = [](std::vector<std::byte>* b, size_t n) {
    for (size_t i = 0; i < 4; ++i)
      (*b)[8 + i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  };
  const size_t n = full.size() - kHeaderSize;
  std::vector<std::byte> base(full.begin(), full.end() - kSiblingsGroup);
  payload(&base, n - kSiblingsGroup);
  Result<Message> d = Decode(base);
  ASSERT_TRUE(d.ok()) << d.status().message();
  report::StatusReport want = FullReport();
  want.siblings.reset();
  EXPECT_EQ(*std::get<StatusOk>(d->body).report, want);
  Result<Message> f = Decode(full);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(std::get<StatusOk>(f->body).report->siblings,
            (report::Siblings{"77.0", 31, 32, 33, 34, 35}));
  for (size_t cut = 1; cut < kSiblingsGroup; ++cut) {
    std::vector<std::byte> b(full.begin(), full.end() - static_cast<ptrdiff_t>(cut));
    payload(&b, n - cut);
    EXPECT_FALSE(Decode(b).ok()) << cut;
  }
  report::StatusReport no_kept = FullReport();
  no_kept.kept.reset();
  Result<Message> z = Decode(Bytes({6, StatusOk{"", no_kept}}));
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(std::get<StatusOk>(z->body).report->kept, report::Kept{});
  EXPECT_EQ(std::get<StatusOk>(z->body).report->siblings, no_kept.siblings);
}

// The flags are a second tail of 4 bytes after the share; a flags-only message carries the
// default share. Unknown flag bits are malformed. STREAM_OK's region size is an 8-byte tail.
TEST(Wire, OpenStreamFlagsAndStreamOkRegionAreOptionalTails) {
  std::vector<std::byte> flagged =
      Bytes({5, OpenStream{1, 2, 3, std::nullopt, kOpenAcceptRegion, std::nullopt}});
  ASSERT_EQ(flagged.size(), kHeaderSize + 40);
  Result<Message> d = Decode(flagged);
  ASSERT_TRUE(d.ok()) << d.status().message();
  const OpenStream& o = std::get<OpenStream>(d->body);
  EXPECT_EQ(o.share, StreamShare{});
  EXPECT_EQ(o.flags, kOpenAcceptRegion);
  std::vector<std::byte> unknown = flagged;
  unknown[kHeaderSize + 36] = std::byte{0x02};
  EXPECT_FALSE(Decode(unknown).ok());
  for (size_t cut = 1; cut < 4; ++cut) {
    std::vector<std::byte> b(flagged.begin(), flagged.end() - static_cast<ptrdiff_t>(cut));
    b[8] = static_cast<std::byte>(40 - cut);
    EXPECT_FALSE(Decode(b).ok()) << cut;
  }
  std::vector<std::byte> ok = Bytes({4, StreamOk{7, 4096, 8, uint64_t{1} << 33}});
  ASSERT_EQ(ok.size(), kHeaderSize + 28);
  Result<Message> r = Decode(ok);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::get<StreamOk>(r->body).region_bytes, uint64_t{1} << 33);
  std::vector<std::byte> partial(ok.begin(), ok.end() - 3);
  partial[8] = std::byte{25};
  EXPECT_FALSE(Decode(partial).ok());
}

// The owner (a DataLoader worker's share of another process's rank) is a third tail of 4 bytes,
// after the share and the flags, which are sent with it (defaults when unset).
TEST(Wire, OpenStreamOwnerIsAThirdOptionalTail) {
  std::vector<std::byte> owned =
      Bytes({5, OpenStream{1, 2, 3, std::nullopt, std::nullopt, 0x01020304}});
  ASSERT_EQ(owned.size(), kHeaderSize + 44);
  EXPECT_EQ(owned[kHeaderSize + 40], std::byte{0x04});
  EXPECT_EQ(owned[kHeaderSize + 43], std::byte{0x01});
  Result<Message> d = Decode(owned);
  ASSERT_TRUE(d.ok()) << d.status().message();
  const OpenStream& o = std::get<OpenStream>(d->body);
  EXPECT_EQ(o.share, StreamShare{});
  EXPECT_EQ(o.flags, 0u);
  EXPECT_EQ(o.owner, 0x01020304u);
  // Without the owner, the message is byte for byte the flagged one.
  std::vector<std::byte> flagged = Bytes({5, OpenStream{1, 2, 3, std::nullopt, 0u, std::nullopt}});
  ASSERT_EQ(flagged.size(), kHeaderSize + 40);
  Result<Message> f = Decode(flagged);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(std::get<OpenStream>(f->body).owner.has_value());
  for (size_t cut = 1; cut < 4; ++cut) {
    std::vector<std::byte> b(owned.begin(), owned.end() - static_cast<ptrdiff_t>(cut));
    b[8] = static_cast<std::byte>(44 - cut);
    EXPECT_FALSE(Decode(b).ok()) << cut;
  }
  std::vector<std::byte> longer = owned;
  longer.push_back(std::byte{0});
  longer[8] = std::byte{45};
  EXPECT_FALSE(Decode(longer).ok());
}

// STATUS's report version and STATUS_OK's report are optional tails: without them the messages
// are the base ones; a cut anywhere inside the report, a boolean byte other than 0 or 1, an
// unknown tier state or another report version is malformed.
TEST(Wire, StatusReportIsAnOptionalTail) {
  EXPECT_EQ(Bytes({1, StatusRequest{std::nullopt}}).size(), kHeaderSize);
  EXPECT_EQ(Bytes({1, StatusRequest{report::kReportVersion}}).size(), kHeaderSize + 2);
  const std::vector<std::byte> base = Bytes({1, StatusOk{"", std::nullopt}});
  const std::vector<std::byte> full = Bytes({1, StatusOk{"", FullReport()}});
  ASSERT_EQ(base.size(), kHeaderSize + 4);
  for (size_t cut = 1; cut < full.size() - base.size(); ++cut) {
    // Exactly the sibling jobs' group, or it and the kept area's: the optional tails
    // (StatusReportKeptGroupIsAnOptionalTail, StatusReportSiblingsGroupIsAnOptionalTail).
    if (cut == kSiblingsGroup || cut == kSiblingsGroup + 32) continue;
    std::vector<std::byte> b(full.begin(), full.end() - static_cast<ptrdiff_t>(cut));
    const size_t payload = b.size() - kHeaderSize;
    for (int i = 0; i < 4; ++i)
      b[8 + i] = static_cast<std::byte>((payload >> (8 * i)) & 0xff);
    EXPECT_FALSE(Decode(b).ok()) << cut;
  }
  for (const uint16_t version : {report::kReportVersion - 1, report::kReportVersion + 1}) {
    std::vector<std::byte> other = full;
    other[kHeaderSize + 4] = static_cast<std::byte>(version);  // another report version
    EXPECT_FALSE(Decode(other).ok()) << version;
  }
  // The last byte of a report without peers is its "has peers" boolean.
  std::vector<std::byte> no_peers = Bytes({1, StatusOk{"", report::StatusReport{}}});
  ASSERT_EQ(no_peers.back(), std::byte{0});
  no_peers.back() = std::byte{2};
  EXPECT_FALSE(Decode(no_peers).ok());
  // The first tier's state byte follows the job, node, nodes, pid, uptime, dataset, its counts,
  // the tier count and the tier's name.
  std::vector<std::byte> state = full;
  const size_t at =
      kHeaderSize + 4 + 2 + (4 + 4) + 4 + 4 + 4 + 8 + (4 + 13) + 8 + 8 + 8 + 4 + (4 + 3);
  ASSERT_EQ(state[at], std::byte{1});  // kRunning
  state[at] = std::byte{3};
  EXPECT_FALSE(Decode(state).ok());
}

TEST(Wire, RejectsMalformedInput) {
  std::vector<std::byte> good = Bytes({1, HelloOk{kVersion, "job", 2, 0, 2}});
  auto expect_bad = [](std::vector<std::byte> b, const char* what) {
    Result<Message> d = Decode(b);
    EXPECT_FALSE(d.ok()) << what;
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << what;
    }
  };
  auto b = good;
  b[0] = std::byte{'X'};
  expect_bad(b, "magic");
  b = good;
  b[4] = std::byte{2};
  expect_bad(b, "version");
  b = good;
  b[6] = std::byte{0};
  expect_bad(b, "type 0");
  b = good;
  b[6] = std::byte{12};
  expect_bad(b, "type 12");
  b = good;
  b.pop_back();
  expect_bad(b, "short message");
  b = good;
  b.push_back(std::byte{0});
  expect_bad(b, "longer than header says");
  // Trailing bytes inside the declared payload.
  b = good;
  b.push_back(std::byte{0});
  b[8] = static_cast<std::byte>(static_cast<uint8_t>(b[8]) + 1);
  expect_bad(b, "trailing field bytes");
  // A string length that runs past the payload.
  b = good;
  b[kHeaderSize + 2] = std::byte{0xff};
  expect_bad(b, "string length");
  // Payload length over the limit, whatever follows.
  b = good;
  b[8] = std::byte{0x01};
  b[9] = std::byte{0x00};
  b[10] = std::byte{0x01};  // 65537
  Result<Header> h = DecodeHeader(b);
  EXPECT_FALSE(h.ok());
  expect_bad(std::vector<std::byte>(b.begin(), b.begin() + 10), "truncated header");
}

TEST(Wire, EncodeRefusesOversizedPayload) {
  Result<std::vector<std::byte>> b =
      Encode({1, StatusOk{std::string(kMaxPayload, 'x'), std::nullopt}});
  EXPECT_FALSE(b.ok());
  b = Encode({1, StatusOk{std::string(kMaxPayload - 4, 'x'), std::nullopt}});
  EXPECT_TRUE(b.ok());
}

TEST(Wire, ErrorStatusMapping) {
  Status st = ToStatus(Error{static_cast<uint32_t>(StatusCode::kNotFound), "m"});
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.message(), "m");
  EXPECT_EQ(ToStatus(Error{0, "x"}).code(), StatusCode::kInternal);
  EXPECT_EQ(ToStatus(Error{9999, "x"}).code(), StatusCode::kInternal);
  Error e = FromStatus(Status::TimedOut("t"));
  EXPECT_EQ(ToStatus(e).code(), StatusCode::kTimedOut);
}

// Randomized decoding in every build (the coverage-guided target is fuzz/fuzz_wire.cc, in the
// clang fuzz tree: docs/fuzzing.md): random buffers and
// mutations of every valid message must decode to ok or to an InvalidArgument status, never crash
// (run under ASan/UBSan in the sanitizer build), and whatever decodes must re-encode identically.
TEST(Wire, FuzzDecode) {
  std::mt19937_64 rng(12345);
  std::vector<std::vector<std::byte>> seeds;
  for (const Message& m : Samples())
    seeds.push_back(Bytes(m));
  uint64_t accepted = 0;
  const int kIterations = 1'000'000;
  std::vector<std::byte> buf;
  for (int i = 0; i < kIterations; ++i) {
    if (i % 4 == 0) {
      buf.resize(rng() % 64);
      for (auto& x : buf)
        x = static_cast<std::byte>(rng());
      if (buf.size() >= 6 && rng() % 2) {  // plausible header so the payload decoders run
        buf[0] = std::byte{'N'}, buf[1] = std::byte{'P'}, buf[2] = std::byte{'F'};
        buf[3] = std::byte{'S'}, buf[4] = std::byte{1}, buf[5] = std::byte{0};
      }
    } else {
      buf = seeds[rng() % seeds.size()];
      int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        switch (rng() % 4) {
          case 0:
            if (!buf.empty()) buf[rng() % buf.size()] = static_cast<std::byte>(rng());
            break;
          case 1:
            if (!buf.empty()) buf.resize(rng() % buf.size());
            break;
          case 2:
            buf.push_back(static_cast<std::byte>(rng()));
            break;
          default:
            if (buf.size() > kHeaderSize) {  // keep the length field consistent
              uint32_t len = static_cast<uint32_t>(buf.size() - kHeaderSize);
              for (int k = 0; k < 4; ++k)
                buf[8 + k] = static_cast<std::byte>(len >> (8 * k));
            }
        }
      }
    }
    Result<Message> d = Decode(buf);
    if (d.ok()) {
      ++accepted;
      ASSERT_EQ(Bytes(*d), buf);
    } else {
      ASSERT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    }
  }
  EXPECT_GT(accepted, 0u);  // the mutator does reach valid messages (e.g. field value changes)
}

TEST(Wire, SendAndReceiveWithDescriptor) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd pr(p[0]), pw(p[1]);
  Message m{42, StreamOk{9, 4096, 8, std::nullopt}};
  ASSERT_TRUE(SendMessage(a.get(), m, pw.get()).ok());
  Result<Received> r = RecvMessage(b.get(), std::chrono::milliseconds(2000));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->message, m);
  ASSERT_TRUE(r->fd.valid());
  EXPECT_FALSE(r->fd2.valid());
  ASSERT_EQ(::write(r->fd.get(), "z", 1), 1);  // the received fd is the pipe's write end
  char c = 0;
  ASSERT_EQ(::read(pr.get(), &c, 1), 1);
  EXPECT_EQ(c, 'z');
  // Two descriptors arrive in order: the ring's, then the region's.
  int q[2];
  ASSERT_EQ(::pipe2(q, O_CLOEXEC), 0);
  UniqueFd qr(q[0]), qw(q[1]);
  Message two{43, StreamOk{9, 4096, 8, 4096}};
  ASSERT_TRUE(SendMessage(a.get(), two, pw.get(), qw.get()).ok());
  Result<Received> r2 = RecvMessage(b.get(), std::chrono::milliseconds(2000));
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->message, two);
  ASSERT_TRUE(r2->fd.valid() && r2->fd2.valid());
  ASSERT_EQ(::write(r2->fd2.get(), "y", 1), 1);
  ASSERT_EQ(::read(qr.get(), &c, 1), 1);
  EXPECT_EQ(c, 'y');
  // Timeout, then EOF.
  Result<Received> t = RecvMessage(b.get(), std::chrono::milliseconds(20));
  EXPECT_EQ(t.status().code(), StatusCode::kTimedOut);
  a.Reset();
  Result<Received> eof = RecvMessage(b.get(), std::chrono::milliseconds(2000));
  EXPECT_EQ(eof.status().code(), StatusCode::kUnavailable);
  Result<uint32_t> uid = PeerUid(b.get());
  ASSERT_TRUE(uid.ok());
  EXPECT_EQ(*uid, ::getuid());
}

}  // namespace
}  // namespace nopfs::wire
