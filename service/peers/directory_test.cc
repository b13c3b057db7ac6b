// Tests of the peer directory (directory.h, directory_wire.h): N simulated nodes in threads with an
// in-process all-to-all, checked against the holdings every node really published; spreading; one
// node; empty inputs; strict decoding (specific malformations and random fuzz); exchange errors.
#include "service/peers/directory.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "service/peers/directory_wire.h"

namespace nopfs::service::dir {
namespace {

using Buffers = std::vector<std::vector<std::byte>>;

// An all-to-all among `nodes` threads: each deposits its out buffers, waits for all, collects.
class Network {
 public:
  explicit Network(uint32_t nodes) : nodes_(nodes), barrier_(nodes), mail_(nodes) {}
  Exchange For(uint32_t self) {
    return [this, self](Buffers out) -> Result<Buffers> {
      mail_[self] = std::move(out);
      barrier_.arrive_and_wait();
      Buffers in(nodes_);
      for (uint32_t k = 0; k < nodes_; ++k)
        in[k] = mail_[k][self];
      barrier_.arrive_and_wait();
      return in;
    };
  }

 private:
  uint32_t nodes_;
  std::barrier<> barrier_;
  std::vector<Buffers> mail_;
};

struct NodeInput {
  std::vector<Holding> held;
  std::vector<uint32_t> needs;
};

struct NodeOutput {
  Status status;
  PeerDirectory dir;
  DirectoryStats stats;
};

std::vector<NodeOutput> RunAll(const std::vector<NodeInput>& in) {
  const auto nodes = static_cast<uint32_t>(in.size());
  Network net(nodes);
  std::vector<NodeOutput> out(nodes);
  std::vector<std::thread> threads;
  for (uint32_t n = 0; n < nodes; ++n) {
    threads.emplace_back([&, n] {
      auto r = BuildDirectory(n, nodes, in[n].held, in[n].needs, net.For(n), &out[n].stats);
      if (r.ok()) {
        out[n].dir = std::move(r).value();
      } else {
        out[n].status = r.status();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  return out;
}

// Random holdings (each sample held by 0..3 nodes, random class and position) and needs (random
// samples this node does not hold, some repeated, some held by nobody).
std::vector<NodeInput> RandomJob(uint32_t nodes, uint32_t samples, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<NodeInput> in(nodes);
  std::vector<std::set<uint32_t>> holds(nodes);
  for (uint32_t s = 0; s < samples; ++s) {
    const uint32_t copies = rng() % 4;
    for (uint32_t c = 0; c < copies; ++c) {
      const uint32_t n = rng() % nodes;
      if (!holds[n].insert(s).second) continue;
      in[n].held.push_back({s, static_cast<uint16_t>(rng() % 3), static_cast<uint32_t>(rng())});
    }
  }
  for (uint32_t n = 0; n < nodes; ++n) {
    std::shuffle(in[n].held.begin(), in[n].held.end(), rng);
    const uint32_t want = samples / 2;
    for (uint32_t i = 0; i < want; ++i) {
      const uint32_t s = rng() % samples;
      if (holds[n].count(s) == 0) in[n].needs.push_back(s);
    }
  }
  return in;
}

// Every needed sample some other node holds is found at a real holder with that holder's class and
// position; nothing else is in the directory.
void CheckJob(const std::vector<NodeInput>& in, const std::vector<NodeOutput>& out) {
  const auto nodes = static_cast<uint32_t>(in.size());
  std::map<uint32_t, std::map<uint32_t, Holding>> holders;  // sample -> node -> holding
  uint64_t total_held = 0;
  for (uint32_t n = 0; n < nodes; ++n) {
    for (const Holding& h : in[n].held)
      holders[h.sample][n] = h;
    total_held += in[n].held.size();
  }
  uint64_t sent = 0;
  uint64_t received = 0;
  uint64_t owned = 0;
  for (uint32_t n = 0; n < nodes; ++n) {
    ASSERT_TRUE(out[n].status.ok()) << out[n].status.ToString();
    const PeerDirectory& dir = out[n].dir;
    std::set<uint32_t> needed(in[n].needs.begin(), in[n].needs.end());
    size_t expected = 0;
    for (uint32_t s : needed) {
      auto it = holders.find(s);
      const bool held_elsewhere = it != holders.end() && !it->second.empty();
      auto loc = dir.Find(s);
      if (!held_elsewhere) {
        EXPECT_FALSE(loc.has_value()) << "node " << n << " sample " << s;
        continue;
      }
      ++expected;
      ASSERT_TRUE(loc.has_value()) << "node " << n << " sample " << s;
      EXPECT_EQ(loc->sample, s);
      EXPECT_NE(loc->node, n);
      auto h = it->second.find(loc->node);
      ASSERT_NE(h, it->second.end()) << "node " << loc->node << " does not hold " << s;
      EXPECT_EQ(loc->cls, h->second.cls);
      EXPECT_EQ(loc->position, h->second.position);
    }
    EXPECT_EQ(dir.size(), expected);
    // Copies: for every sample this node holds along with others, the filler is the holder with
    // the smallest position (then the smallest node); every holder but the filler copies from it.
    size_t expected_copies = 0;
    for (const Holding& mine : in[n].held) {
      const auto& hs = holders[mine.sample];
      uint32_t filler = n;
      for (const auto& [node, h] : hs) {
        const Holding& f = hs.at(filler);
        if (h.position < f.position || (h.position == f.position && node < filler)) filler = node;
      }
      auto copy = dir.FindCopy(mine.sample);
      if (filler == n) {
        EXPECT_FALSE(copy.has_value()) << "node " << n << " fills sample " << mine.sample;
        continue;
      }
      ++expected_copies;
      ASSERT_TRUE(copy.has_value()) << "node " << n << " sample " << mine.sample;
      EXPECT_EQ(copy->node, filler);
      EXPECT_EQ(copy->cls, hs.at(filler).cls);
      EXPECT_EQ(copy->position, hs.at(filler).position);
    }
    EXPECT_EQ(dir.copy_count(), expected_copies);
    EXPECT_EQ(out[n].stats.copies, expected_copies);
    // Nothing that was not asked for.
    for (uint32_t s = 0; s < 64; ++s) {
      if (needed.count(s) == 0) {
        EXPECT_FALSE(dir.Find(s).has_value()) << s;
      }
    }
    sent += out[n].stats.bytes_sent;
    received += out[n].stats.bytes_received;
    owned += out[n].stats.owned_entries;
    EXPECT_GT(out[n].stats.peak_bytes, 0u);
  }
  EXPECT_EQ(sent, received);
  EXPECT_EQ(owned, total_held);
}

TEST(Directory, RandomJobsFindRealHolders) {
  for (uint32_t nodes : {2u, 3u, 7u, 16u}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE(testing::Message() << nodes << " nodes, seed " << seed);
      auto in = RandomJob(nodes, 2000, seed * 97 + nodes);
      auto out = RunAll(in);
      CheckJob(in, out);
    }
  }
}

TEST(Directory, LargeIdsAndValues) {
  const uint32_t top = 0xFFFFFFFFu;
  std::vector<NodeInput> in(3);
  in[0].held = {{top, 65535, top}, {top - 1, 7, 0}};
  in[1].needs = {top, top - 1, top - 2};
  in[2].needs = {top};
  auto out = RunAll(in);
  CheckJob(in, out);
  EXPECT_EQ(out[1].dir.Find(top), (Location{top, 0, 65535, top}));
}

TEST(Directory, PopularSampleSpreadsOverHolders) {
  const uint32_t nodes = 16;
  std::vector<NodeInput> in(nodes);
  const std::set<uint32_t> holders = {2, 5, 9, 13};
  for (uint32_t n : holders)
    in[n].held.push_back({77, 1, n * 10});
  for (uint32_t n = 0; n < nodes; ++n) {
    if (holders.count(n) == 0) in[n].needs.push_back(77);
  }
  auto out = RunAll(in);
  CheckJob(in, out);
  std::map<uint32_t, int> load;
  for (uint32_t n = 0; n < nodes; ++n) {
    if (holders.count(n) != 0) continue;
    auto loc = out[n].dir.Find(77);
    ASSERT_TRUE(loc.has_value());
    ++load[loc->node];
  }
  ASSERT_EQ(load.size(), holders.size()) << "every holder serves some requester";
  for (const auto& [node, count] : load)
    EXPECT_EQ(count, 3) << node;
}

TEST(Directory, OneNode) {
  std::vector<NodeInput> in(1);
  in[0].held = {{1, 0, 0}, {4, 1, 1}};
  in[0].needs = {2, 3, 3, 9};
  auto out = RunAll(in);
  ASSERT_TRUE(out[0].status.ok()) << out[0].status.ToString();
  EXPECT_EQ(out[0].dir.size(), 0u);
  EXPECT_FALSE(out[0].dir.Find(2).has_value());
  EXPECT_EQ(out[0].stats.bytes_sent, 0u);
  EXPECT_EQ(out[0].stats.bytes_received, 0u);
  EXPECT_EQ(out[0].stats.owned_entries, 2u);
}

TEST(Directory, EmptyInputs) {
  std::vector<NodeInput> in(5);
  auto out = RunAll(in);
  for (const auto& o : out) {
    ASSERT_TRUE(o.status.ok()) << o.status.ToString();
    EXPECT_EQ(o.dir.size(), 0u);
    EXPECT_EQ(o.dir.memory_bytes(), 0u);
  }
  in[1].needs = {3, 4};  // needs, but nobody holds anything
  out = RunAll(in);
  for (const auto& o : out)
    ASSERT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(out[1].dir.size(), 0u);
}

TEST(Directory, InvalidArguments) {
  auto never = [](Buffers) -> Result<Buffers> { return Status::Internal("not reached"); };
  std::vector<Holding> dup = {{3, 0, 0}, {3, 1, 1}};
  EXPECT_EQ(BuildDirectory(0, 0, {}, {}, never).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildDirectory(2, 2, {}, {}, never).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildDirectory(0, 2, dup, {}, never).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildDirectory(0, 2, {}, {}, Exchange()).status().code(), StatusCode::kInvalidArgument);
}

TEST(Directory, ExchangeErrorsPropagate) {
  for (int fail_round = 1; fail_round <= 3; ++fail_round) {
    int round = 0;
    Exchange ex = [&](Buffers out) -> Result<Buffers> {
      if (++round == fail_round) return Status::Unavailable("peer 1 unreachable");
      return out;  // a single node: what it sends itself comes back
    };
    std::vector<Holding> held = {{1, 0, 0}};
    std::vector<uint32_t> needs = {2};
    auto r = BuildDirectory(0, 1, held, needs, ex);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(r.status().message().find("peer 1 unreachable"), std::string::npos);
    EXPECT_NE(r.status().message().find(fail_round == 1   ? "publish"
                                        : fail_round == 2 ? "query"
                                                          : "answer"),
              std::string::npos)
        << r.status().message();
  }
  Exchange short_ex = [](Buffers) -> Result<Buffers> { return Buffers(1); };
  auto r = BuildDirectory(0, 2, {}, {}, short_ex);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
}

// Node 0 of a two-node job, whose peer (node 1) is scripted: node 1 holds `peer_held` and needs
// `peer_needs`; `tamper(round, buffer)` may change what node 1 sends node 0 in each round.
class ScriptedPeer {
 public:
  // Sample 5 is held by both nodes and node 1 reaches it first (position 0 < 2): node 0 copies it
  // from node 1. Sample 6 too, but node 0 reaches it first: node 0 reads it from the PFS.
  std::vector<Holding> peer_held = {{1, 1, 5},  {3, 2, 6}, {4, 0, 7}, {5, 0, 0},
                                    {6, 1, 10}, {9, 1, 8}, {12, 0, 9}};
  std::vector<uint32_t> peer_needs = {0, 2, 6, 8};
  std::function<void(int, std::vector<std::byte>*)> tamper = [](int, std::vector<std::byte>*) {};

  // What node 1 sends node 0 in `round`, given what node 0 sent node 1 in that round.
  Result<std::vector<std::byte>> PeerSends(int round, const std::vector<std::byte>& from0) {
    std::vector<Holding> to0;
    std::vector<uint32_t> q0;
    for (const Holding& h : peer_held) {
      if (h.sample % 2 == 0) to0.push_back(h);
    }
    for (uint32_t s : peer_needs) {
      if (s % 2 == 0) q0.push_back(s);
    }
    if (round == 1) {
      published_by_0_ = from0;
      return wire::EncodePublish(to0, 0, 2);
    }
    if (round == 2) return wire::EncodeQuery(q0, 0, 2);
    // Round 3: node 1 answers node 0's query from what node 0 and node 1 published to owner 1.
    std::vector<Holding> own;
    for (const Holding& h : peer_held) {
      if (h.sample % 2 == 1) own.push_back(h);
    }
    wire::OwnerTable table(1, 2);
    NOPFS_RETURN_IF_ERROR(table.AddPublished(0, published_by_0_));
    NOPFS_RETURN_IF_ERROR(table.AddPublished(1, wire::EncodePublish(own, 1, 2)));
    table.Seal();
    return table.Answer(0, query_from_0_);
  }

  Result<PeerDirectory> Run(std::span<const Holding> held, std::span<const uint32_t> needs) {
    int round = 0;
    Exchange ex = [&](Buffers out) -> Result<Buffers> {
      ++round;
      if (round == 2) query_from_0_ = out[1];
      auto peer = PeerSends(round, out[1]);
      if (!peer.ok()) return peer.status();
      tamper(round, &peer.value());
      Buffers in(2);
      in[0] = std::move(out[0]);
      in[1] = std::move(peer).value();
      return in;
    };
    return BuildDirectory(0, 2, held, needs, ex);
  }

 private:
  std::vector<std::byte> published_by_0_;
  std::vector<std::byte> query_from_0_;
};

const std::vector<Holding> kHeld0 = {{0, 0, 1}, {5, 1, 2}, {6, 0, 3}};
const std::vector<uint32_t> kNeeds0 = {1, 3, 4, 7, 9, 12};

TEST(Directory, ScriptedPeerIsCorrect) {
  ScriptedPeer p;
  auto r = p.Run(kHeld0, kNeeds0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->Find(1), (Location{1, 1, 1, 5}));
  EXPECT_EQ(r->Find(3), (Location{3, 1, 2, 6}));
  EXPECT_EQ(r->Find(4), (Location{4, 1, 0, 7}));
  EXPECT_FALSE(r->Find(7).has_value());
  EXPECT_EQ(r->Find(9), (Location{9, 1, 1, 8}));
  EXPECT_EQ(r->Find(12), (Location{12, 1, 0, 9}));
  EXPECT_EQ(r->size(), 5u);
  EXPECT_EQ(r->FindCopy(5), (Location{5, 1, 0, 0}));
  EXPECT_FALSE(r->FindCopy(6).has_value());
  EXPECT_FALSE(r->FindCopy(0).has_value());
  EXPECT_EQ(r->copy_count(), 1u);
}

void ExpectCorrupt(int round, const std::function<void(std::vector<std::byte>*)>& change,
                   const char* what) {
  ScriptedPeer p;
  p.tamper = [&](int r, std::vector<std::byte>* b) {
    if (r == round) change(b);
  };
  auto r = p.Run(kHeld0, kNeeds0);
  ASSERT_FALSE(r.ok()) << what << " in round " << round;
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find("from node 1"), std::string::npos) << r.status().message();
}

std::vector<std::byte> Bytes(std::initializer_list<int> v) {
  std::vector<std::byte> out;
  for (int x : v)
    out.push_back(static_cast<std::byte>(x));
  return out;
}

TEST(Directory, MalformedBuffersRejected) {
  for (int round = 1; round <= 3; ++round) {
    SCOPED_TRACE(round);
    ExpectCorrupt(
        round, [](auto* b) { b->clear(); }, "empty");
    ExpectCorrupt(
        round, [](auto* b) { (*b)[0] = std::byte{'X'}; }, "magic");
    ExpectCorrupt(
        round, [](auto* b) { (*b)[2] = std::byte{1}; }, "version 1");
    ExpectCorrupt(
        round, [](auto* b) { (*b)[3] = std::byte{9}; }, "round");
    ExpectCorrupt(
        round, [](auto* b) { b->pop_back(); }, "truncated");
    ExpectCorrupt(
        round, [](auto* b) { b->push_back(std::byte{0}); }, "trailing");
    // A count of 2^32-1 with a few bytes after it: rejected before any allocation.
    ExpectCorrupt(
        round,
        [round](auto* b) {
          *b = Bytes({'N', 'D', 2, round, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 1, 1, 1});
        },
        "huge count");
    // A varint that never ends.
    ExpectCorrupt(
        round,
        [round](auto* b) {
          *b = Bytes({'N', 'D', 2, round, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01});
        },
        "long varint");
  }
  // Publish: ids not ascending; class above 65535.
  ExpectCorrupt(
      1,
      [](auto* b) {
        *b = Bytes({'N', 'D', 2, 1, 2, 1, 0, 0, 0, 0, 0});
      },
      "repeated id");
  ExpectCorrupt(
      1,
      [](auto* b) {
        *b = Bytes({'N', 'D', 2, 1, 1, 1, 0x80, 0x80, 0x04, 0});
      },
      "class 65536");
  // A sample id above 32 bits: q = 2^31 at 2 nodes, owner 0 -> 2^32.
  ExpectCorrupt(
      1,
      [](auto* b) {
        *b = Bytes({'N', 'D', 2, 1, 1, 0x80, 0x80, 0x80, 0x80, 0x08, 0, 0});
      },
      "id above 32 bits");
  ExpectCorrupt(
      2,
      [](auto* b) {
        *b = Bytes({'N', 'D', 2, 2, 2, 3, 0});
      },
      "repeated query");
  // Answers: wrong count, holder outside the job, holder = the requester.
  ExpectCorrupt(
      3,
      [](auto* b) {
        *b = Bytes({'N', 'D', 2, 3, 1, 0, 0});
      },
      "answer count");
  ExpectCorrupt(
      3,
      [](auto* b) {
        *b = Bytes({'N', 'D', 2, 3, 4, 3, 0, 0, 0, 0, 0});
      },
      "holder 2");
  ExpectCorrupt(
      3,
      [](auto* b) {
        *b = Bytes({'N', 'D', 2, 3, 4, 1, 0, 0, 0, 0, 0});
      },
      "holder 0");
  // Copies (after 4 answers of "nobody"): the filler is the requester, outside the job; a sample
  // node 0 does not hold (q 0 = sample 1); ids not ascending.
  ExpectCorrupt(
      3,
      [](auto* b) {
        *b = Bytes({'N', 'D', 2, 3, 4, 0, 0, 0, 0, 1, 2, 1, 0, 0});
      },
      "filler 0");
  ExpectCorrupt(
      3,
      [](auto* b) {
        *b = Bytes({'N', 'D', 2, 3, 4, 0, 0, 0, 0, 1, 2, 3, 0, 0});
      },
      "filler 2");
  ExpectCorrupt(
      3,
      [](auto* b) {
        *b = Bytes({'N', 'D', 2, 3, 4, 0, 0, 0, 0, 1, 0, 2, 0, 0});
      },
      "copy of a sample not held");
  ExpectCorrupt(
      3,
      [](auto* b) {
        *b = Bytes({'N', 'D', 2, 3, 4, 0, 0, 0, 0, 2, 2, 2, 0, 0, 0, 2, 0, 0});
      },
      "copies not ascending");
}

TEST(Directory, FuzzedBuffersNeverCrash) {
  std::mt19937 rng(12345);
  int rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const int round = 1 + iter % 3;
    ScriptedPeer p;
    p.tamper = [&](int r, std::vector<std::byte>* b) {
      if (r != round) return;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        switch (rng() % 4) {
          case 0:
            if (!b->empty()) (*b)[rng() % b->size()] = static_cast<std::byte>(rng());
            break;
          case 1:
            if (!b->empty()) b->resize(rng() % b->size());
            break;
          case 2:
            b->insert(b->begin() + static_cast<long>(rng() % (b->size() + 1)),
                      static_cast<std::byte>(rng()));
            break;
          default:
            if (!b->empty()) (*b)[rng() % b->size()] ^= static_cast<std::byte>(1u << (rng() % 8));
            break;
        }
      }
    };
    auto r = p.Run(kHeld0, kNeeds0);
    if (r.ok()) {
      // A mutation that still decodes may only name the one peer, never this node.
      for (uint32_t s : kNeeds0) {
        auto loc = r->Find(s);
        if (loc) {
          EXPECT_EQ(loc->node, 1u);
        }
      }
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 2000);
}

TEST(DirectoryWire, RoundTripsAndRejectsCallerMistakes) {
  std::vector<Holding> held = {{3, 0, 0}, {8, 65535, 0xFFFFFFFFu}, {1003, 2, 17}};
  auto buf = wire::EncodePublish(held, 3, 5);
  std::vector<Holding> back;
  ASSERT_TRUE(wire::DecodePublish(buf, 3, 5, &back).ok());
  ASSERT_EQ(back.size(), held.size());
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_EQ(back[i].sample, held[i].sample);
    EXPECT_EQ(back[i].cls, held[i].cls);
    EXPECT_EQ(back[i].position, held[i].position);
  }
  std::vector<uint32_t> ids = {2, 7, 12};
  EXPECT_THROW(wire::EncodeQuery(ids, 1, 5), std::invalid_argument);
  std::vector<uint32_t> desc = {12, 7};
  EXPECT_THROW(wire::EncodeQuery(desc, 2, 5), std::invalid_argument);
  // Dense ids take about one byte each on the wire.
  std::vector<uint32_t> dense;
  for (uint32_t q = 0; q < 10000; ++q)
    dense.push_back(q * 1024 + 5);
  EXPECT_LT(wire::EncodeQuery(dense, 5, 1024).size(), 10010u);
  // An answer: one holder and one "nobody", then two copies (fillers of samples owner 3 owns).
  std::vector<Location> answers = {{3, 4, 1, 99}, {8, wire::kNoHolder, 0, 0}};
  std::vector<Location> copies = {{13, 2, 0, 7}, {1003, 4, 65535, 0xFFFFFFFFu}};
  auto ans = wire::EncodeAnswer(answers, copies, 3, 5);
  std::vector<uint32_t> queried = {3, 8};
  std::vector<Location> found;
  std::vector<Location> copied;
  ASSERT_TRUE(wire::DecodeAnswer(ans, queried, 0, 3, 5, &found, &copied).ok());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0], answers[0]);
  EXPECT_EQ(copied, copies);
  // Node 2 cannot read an answer that names it as the filler of its own copy.
  found.clear();
  copied.clear();
  EXPECT_EQ(wire::DecodeAnswer(ans, queried, 2, 3, 5, &found, &copied).code(),
            StatusCode::kCorruption);
  std::vector<Location> foreign = {{12, 2, 0, 7}};
  EXPECT_THROW(wire::EncodeAnswer(answers, foreign, 3, 5), std::invalid_argument);
}

}  // namespace
}  // namespace nopfs::service::dir
