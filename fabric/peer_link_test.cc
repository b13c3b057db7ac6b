// Tests of fabric::PeerLink: two authenticated nodes in one process over loopback.
#include "fabric/peer_link.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "fabric/loopback_port.h"

namespace nopfs::fabric {
namespace {

using std::chrono::milliseconds;

std::vector<std::byte> SampleBytes(uint32_t node, uint64_t sample) {
  // Every fifth sample is large enough for the provider's rendezvous path (both nodes send such
  // replies to each other at the same time).
  std::vector<std::byte> v(sample % 5 == 0 ? (128 << 10) + sample : 1000 + sample % 4096);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<std::byte>((sample * 31 + i + node) & 0xff);
  return v;
}

// Node n holds the samples s with s % 2 == n and serves them; others are "not ready".
ServeFn Holder(uint32_t node) {
  return [node](uint64_t sample) {
    if (sample % 2 != node) return ServeResult{ReadStatus::kNotAvailable, {}};
    return ServeResult{ReadStatus::kOk, SampleBytes(node, sample)};
  };
}

PeerLinkOptions Options(uint32_t node, const std::vector<PeerAddress>& peers, uint8_t key) {
  PeerLinkOptions o;
  o.node = node;
  o.peers = peers;
  o.secret.fill(key);
  o.timeout = milliseconds(1500);
  return o;
}

TEST(PeerLinkTest, ParsePeerList) {
  auto p = ParsePeerList("a:1,10.0.0.2:65535");
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[1].host, "10.0.0.2");
  EXPECT_EQ((*p)[1].port, 65535);
  EXPECT_FALSE(ParsePeerList("").ok());
  EXPECT_FALSE(ParsePeerList("a:1,").ok());
  EXPECT_FALSE(ParsePeerList("a:0").ok());
  EXPECT_FALSE(ParsePeerList("a:65536").ok());
  EXPECT_FALSE(ParsePeerList("a").ok());
}

// A slow tier read (sample 1 is served only once sample 2 has been) does not hold up the other
// requests: with a single server the two reads would wait on each other until the timeout.
TEST(PeerLinkTest, ASlowServeDoesNotBlockTheOthers) {
  std::vector<PeerAddress> peers{{"127.0.0.1", FreeLoopbackPort()},
                                 {"127.0.0.1", FreeLoopbackPort()}};
  std::atomic<bool> second_served{false};
  std::atomic<bool> first_saw_it{false};
  ServeFn serve = [&](uint64_t sample) {
    if (sample == 1) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!second_served.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(milliseconds(1));
      first_saw_it.store(second_served.load());
    } else {
      second_served.store(true);
    }
    return ServeResult{ReadStatus::kOk, SampleBytes(0, sample)};
  };
  auto n0 = PeerLink::Start(Options(0, peers, 4), serve);
  ASSERT_TRUE(n0.ok()) << n0.status().ToString();
  PeerLinkOptions o1 = Options(1, peers, 4);
  o1.timeout = milliseconds(4000);
  auto n1 = PeerLink::Start(o1, Holder(1));
  ASSERT_TRUE(n1.ok()) << n1.status().ToString();
  Result<std::vector<std::byte>> slow = Status::Internal("not run");
  std::thread t([&] { slow = (*n1)->Read(0, 1); });
  // Let sample 1's request reach a server first (ordering only; if 2 overtook it the test would
  // pass without testing anything, never fail wrongly).
  std::this_thread::sleep_for(milliseconds(200));
  auto fast = (*n1)->Read(0, 2);
  t.join();
  ASSERT_TRUE(fast.ok()) << fast.status().ToString();
  ASSERT_TRUE(slow.ok()) << slow.status().ToString();
  EXPECT_EQ(*fast, SampleBytes(0, 2));
  EXPECT_EQ(*slow, SampleBytes(0, 1));
  EXPECT_TRUE(first_saw_it.load());
}

TEST(PeerLinkTest, ClassDoneReachesTheOtherNodeAndStopFailsReadsAtOnce) {
  std::vector<PeerAddress> peers{{"127.0.0.1", FreeLoopbackPort()},
                                 {"127.0.0.1", FreeLoopbackPort()}};
  auto n0 = PeerLink::Start(Options(0, peers, 6), Holder(0));
  ASSERT_TRUE(n0.ok()) << n0.status().ToString();
  auto n1 = PeerLink::Start(Options(1, peers, 6), Holder(1));
  ASSERT_TRUE(n1.ok()) << n1.status().ToString();
  EXPECT_FALSE((*n1)->PeerClassDone(0, 2));
  (*n0)->AnnounceClassDone(2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!(*n1)->PeerClassDone(0, 2) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(2));
  EXPECT_TRUE((*n1)->PeerClassDone(0, 2));
  EXPECT_FALSE((*n1)->PeerClassDone(0, 1));
  EXPECT_FALSE((*n0)->PeerClassDone(1, 2));  // only the announcer's classes
  (*n1)->Stop();
  (*n1)->Stop();  // idempotent
  auto r = (*n1)->Read(0, 4);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

TEST(PeerLinkTest, TwoNodesServeEachOtherExactBytes) {
  std::vector<PeerAddress> peers{{"127.0.0.1", FreeLoopbackPort()},
                                 {"127.0.0.1", FreeLoopbackPort()}};
  auto n0 = PeerLink::Start(Options(0, peers, 9), Holder(0));
  ASSERT_TRUE(n0.ok()) << n0.status().ToString();
  auto n1 = PeerLink::Start(Options(1, peers, 9), Holder(1));
  ASSERT_TRUE(n1.ok()) << n1.status().ToString();
  EXPECT_EQ((*n0)->provider(), "tcp;ofi_rxm");

  // Both nodes read concurrently from several threads.
  std::vector<std::thread> readers;
  for (uint32_t me = 0; me < 2; ++me) {
    for (int t = 0; t < 2; ++t) {
      readers.emplace_back([&, me, t] {
        PeerLink& link = me == 0 ? **n0 : **n1;
        uint32_t other = 1 - me;
        for (uint64_t s = static_cast<uint64_t>(t); s < 200; s += 2) {
          uint64_t sample = s * 2 + other;  // held by the other node
          auto got = link.Read(other, sample);
          ASSERT_TRUE(got.ok()) << got.status().ToString();
          EXPECT_EQ(*got, SampleBytes(other, sample));
        }
      });
    }
  }
  for (auto& t : readers)
    t.join();
  auto missing = (*n0)->Read(1, 2);  // even: node 1 does not hold it
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE((*n0)->IsDead(1));

  auto c0 = (*n0)->counters();
  auto c1 = (*n1)->counters();
  EXPECT_EQ(c0.fetched_reads, 200u);
  EXPECT_EQ(c1.served_reads, 200u);
  EXPECT_EQ(c0.fetched_bytes, c1.served_bytes);
  EXPECT_EQ(c1.fetched_reads, 200u);
  EXPECT_EQ(c0.served_reads, 200u);
  EXPECT_EQ(c1.served_not_available, 1u);
  EXPECT_EQ(c0.fetch_not_available, 1u);
  EXPECT_EQ(c0.auth_refused + c1.auth_refused + c0.malformed + c1.malformed, 0u);
}

TEST(PeerLinkTest, WrongSecretIsRefusedAndServesNothing) {
  std::vector<PeerAddress> peers{{"127.0.0.1", FreeLoopbackPort()},
                                 {"127.0.0.1", FreeLoopbackPort()}};
  auto n0 = PeerLink::Start(Options(0, peers, 1), Holder(0));
  ASSERT_TRUE(n0.ok()) << n0.status().ToString();
  auto intruder = PeerLink::Start(Options(1, peers, 2), Holder(1));
  ASSERT_TRUE(intruder.ok()) << intruder.status().ToString();
  auto got = (*intruder)->Read(0, 4);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_TRUE((*intruder)->IsDead(0));
  EXPECT_EQ((*n0)->counters().served_reads, 0u);
  EXPECT_GE((*intruder)->counters().auth_refused, 1u);  // n0's challenge did not prove the secret
  auto back = (*n0)->Read(1, 5);                        // and the other direction
  EXPECT_EQ(back.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ((*intruder)->counters().served_reads, 0u);
}

TEST(PeerLinkTest, DeadPeerCostsOneTimeout) {
  std::vector<PeerAddress> peers{{"127.0.0.1", FreeLoopbackPort()},
                                 {"127.0.0.1", FreeLoopbackPort()}};
  auto n0 = PeerLink::Start(Options(0, peers, 3), Holder(0));  // node 1 never starts
  ASSERT_TRUE(n0.ok());
  auto t0 = std::chrono::steady_clock::now();
  auto first = (*n0)->Read(1, 1);
  auto t1 = std::chrono::steady_clock::now();
  EXPECT_FALSE(first.ok());
  EXPECT_LT(t1 - t0, milliseconds(5000));
  EXPECT_TRUE((*n0)->IsDead(1));
  auto second = (*n0)->Read(1, 3);
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - t1, milliseconds(100));
  EXPECT_GE((*n0)->counters().timeouts, 1u);
}

TEST(PeerLinkTest, MalformedMessagesAreRejectedAndServiceContinues) {
  std::vector<PeerAddress> peers{{"127.0.0.1", FreeLoopbackPort()},
                                 {"127.0.0.1", FreeLoopbackPort()},
                                 {"127.0.0.1", FreeLoopbackPort()}};
  auto n0 = PeerLink::Start(Options(0, peers, 5), Holder(0));
  ASSERT_TRUE(n0.ok());
  auto n1 = PeerLink::Start(Options(1, peers, 5), Holder(1));
  ASSERT_TRUE(n1.ok());
  // Node 2's address is a raw endpoint sending junk, an unmatched reply, a request before auth,
  // and a message whose tag names no node of the job.
  auto raw = Endpoint::Open({"tcp;ofi_rxm", "127.0.0.1", peers[2].port});
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  auto to0 = (*raw)->AddPeer("127.0.0.1", peers[0].port);
  ASSERT_TRUE(to0.ok());
  const uint64_t tag2 = uint64_t{2} << 32;
  std::vector<std::byte> junk(40, std::byte{0x5a});
  ASSERT_TRUE((*raw)->Send(*to0, tag2, junk, milliseconds(2000)).ok());
  auto reply = Encode(ReadReply{777, 1, ReadStatus::kOk, std::vector<std::byte>(3)});
  ASSERT_TRUE((*raw)->Send(*to0, tag2, reply, milliseconds(2000)).ok());
  ASSERT_TRUE(
      (*raw)->Send(*to0, uint64_t{99} << 32, Encode(ReadRequest{1, 0}), milliseconds(2000)).ok());
  ASSERT_TRUE((*raw)->Send(*to0, tag2, Encode(ReadRequest{1, 0}), milliseconds(2000)).ok());
  auto deadline = std::chrono::steady_clock::now() + milliseconds(3000);
  while (std::chrono::steady_clock::now() < deadline &&
         ((*n0)->counters().malformed < 3 || (*n0)->counters().auth_refused < 1)) {
    (*raw)->Progress();
    std::this_thread::sleep_for(milliseconds(5));
  }
  auto c = (*n0)->counters();
  EXPECT_EQ(c.malformed, 3u);
  EXPECT_EQ(c.auth_refused, 1u);
  EXPECT_EQ(c.served_reads, 0u);
  // The raw endpoint got nothing back: no data for an unauthenticated request.
  EXPECT_EQ((*raw)->Recv(0, ~uint64_t{0}, 1 << 20, milliseconds(100)).status().code(),
            StatusCode::kTimedOut);
  // The daemon still serves its real peers.
  auto got = (*n1)->Read(0, 10);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, SampleBytes(0, 10));
}

TEST(PeerLinkTest, ExchangeIsAnAllToAllAmongThreeNodes) {
  std::vector<PeerAddress> peers{{"127.0.0.1", FreeLoopbackPort()},
                                 {"127.0.0.1", FreeLoopbackPort()},
                                 {"127.0.0.1", FreeLoopbackPort()}};
  std::vector<std::unique_ptr<PeerLink>> links;
  for (uint32_t n = 0; n < 3; ++n) {
    auto l = PeerLink::Start(Options(n, peers, 6), Holder(n % 2));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    links.push_back(std::move(*l));
  }
  // Buffer from i to k is "i k round" repeated (i + 1) * 1000 times (node 2's are 3000 x 3 bytes).
  auto buf = [](uint32_t i, uint32_t k, uint64_t round) {
    std::vector<std::byte> b;
    for (uint32_t r = 0; r < (i + 1) * 1000; ++r) {
      b.push_back(static_cast<std::byte>(i));
      b.push_back(static_cast<std::byte>(k));
      b.push_back(static_cast<std::byte>(round));
    }
    return b;
  };
  std::vector<std::thread> threads;
  std::vector<Status> results(3);
  for (uint32_t i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      for (uint64_t round = 1; round <= 3; ++round) {
        std::vector<std::vector<std::byte>> out;
        for (uint32_t k = 0; k < 3; ++k)
          out.push_back(buf(i, k, round));
        auto in = links[i]->Exchange(round, std::move(out));
        if (!in.ok()) {
          results[i] = in.status();
          return;
        }
        for (uint32_t k = 0; k < 3; ++k) {
          if ((*in)[k] != buf(k, i, round)) {
            results[i] = Status::Corruption("wrong buffer from " + std::to_string(k));
            return;
          }
        }
      }
    });
  }
  for (auto& t : threads)
    t.join();
  for (const Status& st : results)
    EXPECT_TRUE(st.ok()) << st.ToString();
  std::vector<std::vector<std::byte>> wrong(2);
  EXPECT_EQ(links[0]->Exchange(9, wrong).status().code(), StatusCode::kInvalidArgument);
}

TEST(PeerLinkTest, ExchangeWithADeadNodeFails) {
  std::vector<PeerAddress> peers{{"127.0.0.1", FreeLoopbackPort()},
                                 {"127.0.0.1", FreeLoopbackPort()}};
  auto n0 = PeerLink::Start(Options(0, peers, 7), Holder(0));
  ASSERT_TRUE(n0.ok());
  auto in = (*n0)->Exchange(1, std::vector<std::vector<std::byte>>(2));
  EXPECT_FALSE(in.ok());
  EXPECT_TRUE((*n0)->IsDead(1));
}

}  // namespace
}  // namespace nopfs::fabric
