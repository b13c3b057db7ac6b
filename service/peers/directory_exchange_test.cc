// The peer directory (service/peers/directory.h) built over the fabric: three nodes run
// dir::BuildDirectory with PeerLink::Exchange as the all-to-all.
#include <gtest/gtest.h>

#include <thread>

#include "fabric/loopback_port.h"
#include "fabric/peer_link.h"
#include "service/peers/directory.h"

namespace nopfs::fabric {
namespace {

namespace dir = nopfs::service::dir;

TEST(DirectoryExchangeTest, EveryNodeFindsTheHolderOfWhatItNeeds) {
  constexpr uint32_t kNodes = 3;
  constexpr uint32_t kSamples = 3000;
  std::vector<PeerAddress> peers;
  for (uint32_t n = 0; n < kNodes; ++n)
    peers.push_back({"127.0.0.1", FreeLoopbackPort()});
  std::vector<std::unique_ptr<PeerLink>> links;
  for (uint32_t n = 0; n < kNodes; ++n) {
    PeerLinkOptions o;
    o.node = n;
    o.peers = peers;
    o.secret.fill(0x33);
    o.timeout = std::chrono::milliseconds(2000);
    auto l = PeerLink::Start(o, [](uint64_t) { return ServeResult{}; });
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    links.push_back(std::move(*l));
  }
  // Node n holds the samples s with s % kNodes == n (class 1, position s / kNodes) and needs
  // every other sample.
  std::vector<Result<dir::PeerDirectory>> built(kNodes, Status::Internal("not built"));
  std::vector<std::thread> threads;
  for (uint32_t n = 0; n < kNodes; ++n) {
    threads.emplace_back([&, n] {
      std::vector<dir::Holding> held;
      std::vector<uint32_t> needs;
      for (uint32_t s = 0; s < kSamples; ++s) {
        if (s % kNodes == n) {
          held.push_back({s, 1, s / kNodes});
        } else {
          needs.push_back(s);
        }
      }
      uint64_t round = 0;
      dir::Exchange exchange = [&](std::vector<std::vector<std::byte>> out) {
        return links[n]->Exchange(++round, std::move(out));
      };
      built[n] = dir::BuildDirectory(n, kNodes, held, needs, exchange);
    });
  }
  for (auto& t : threads)
    t.join();
  for (uint32_t n = 0; n < kNodes; ++n) {
    ASSERT_TRUE(built[n].ok()) << built[n].status().ToString();
    for (uint32_t s = 0; s < kSamples; ++s) {
      auto loc = built[n]->Find(s);
      if (s % kNodes == n) continue;  // held locally, not asked
      ASSERT_TRUE(loc.has_value()) << "node " << n << " sample " << s;
      EXPECT_EQ(loc->node, s % kNodes);
      EXPECT_EQ(loc->cls, 1);
      EXPECT_EQ(loc->position, s / kNodes);
    }
  }
}

}  // namespace
}  // namespace nopfs::fabric
