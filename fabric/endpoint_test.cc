// Tests of fabric::Endpoint over the default provider on loopback.
#include "fabric/endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "fabric/loopback_port.h"

namespace nopfs::fabric {
namespace {

using std::chrono::milliseconds;

std::vector<std::byte> Pattern(uint64_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (uint64_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return v;
}

// nopfs's libfabric defaults fill in only what the environment leaves unset: an admin's (or a
// job's) own FI_OFI_RXM_MSG_RX_SIZE is kept as it is.
TEST(EndpointTest, LibfabricDefaultsKeepTheEnvironmentsOwnSetting) {
  const char* name = "FI_OFI_RXM_MSG_RX_SIZE";
  const char* before = std::getenv(name);
  const std::string saved = before != nullptr ? before : "";
  ASSERT_EQ(::setenv(name, "77", 1), 0);
  std::vector<std::string> set = SetLibfabricDefaults();
  EXPECT_EQ(std::count(set.begin(), set.end(), name), 0);
  EXPECT_STREQ(std::getenv(name), "77");
  ASSERT_EQ(::unsetenv(name), 0);
  set = SetLibfabricDefaults();
  EXPECT_EQ(std::count(set.begin(), set.end(), name), 1);
  EXPECT_STREQ(std::getenv(name), "1024");
  // Set once, it is the environment's: a second call changes nothing.
  EXPECT_TRUE(SetLibfabricDefaults().empty());
  if (before != nullptr) {
    ::setenv(name, saved.c_str(), 1);
  } else {
    ::unsetenv(name);
  }
}

TEST(EndpointTest, TaggedMessagesArriveIntactAndMatchTags) {
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = Endpoint::Open({});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE((*a)->port(), 0);
  auto to_b = (*a)->AddPeer("127.0.0.1", (*b)->port());
  ASSERT_TRUE(to_b.ok()) << to_b.status().ToString();

  auto big = Pattern(uint64_t{2} << 20, 7);  // above the eager limit (1 MiB, nopfs's default)
  auto small = Pattern(100, 3);
  // The small message goes first and waits unexpected at b; the large one completes only once b
  // has posted a matching receive (rendezvous), so b asks for tag 42 first: tag matching, not
  // arrival order, decides what each receive gets.
  std::thread sender([&] {
    EXPECT_TRUE((*a)->Send(*to_b, 7, small, milliseconds(5000)).ok());
    EXPECT_TRUE((*a)->Send(*to_b, 42, big, milliseconds(5000)).ok());
  });
  auto m42 = (*b)->Recv(42, 0, uint64_t{2} << 20, milliseconds(5000));
  auto m7 = (*b)->Recv(7, 0, 1000, milliseconds(5000));
  sender.join();
  ASSERT_TRUE(m7.ok()) << m7.status().ToString();
  ASSERT_TRUE(m42.ok()) << m42.status().ToString();
  EXPECT_EQ(m7->tag, 7u);
  EXPECT_EQ(m7->data, small);
  EXPECT_EQ(m42->tag, 42u);
  EXPECT_EQ(m42->data, big);
  EXPECT_EQ((*a)->pending_ops(), 0u);
  EXPECT_EQ((*b)->pending_ops(), 0u);
}

TEST(EndpointTest, PostDoesNotWaitForTheReceiver) {
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok());
  auto b = Endpoint::Open({});
  ASSERT_TRUE(b.ok());
  auto to_b = (*a)->AddPeer("127.0.0.1", (*b)->port());
  ASSERT_TRUE(to_b.ok());
  auto big = Pattern(uint64_t{1} << 20, 9);
  // b receives on its own thread (libfabric needs both sides to progress to connect); a's posts
  // return without waiting for the large messages to be matched and delivered.
  Result<Message> m1 = Status::Internal("not received");
  Result<Message> m2 = Status::Internal("not received");
  std::thread receiver([&] {
    m1 = (*b)->Recv(1, 0, big.size(), milliseconds(5000));
    m2 = (*b)->Recv(2, 0, big.size(), milliseconds(5000));
  });
  ASSERT_TRUE((*a)->Post(*to_b, 1, big, milliseconds(4000)).ok());
  ASSERT_TRUE((*a)->Post(*to_b, 2, big, milliseconds(4000)).ok());
  auto until = std::chrono::steady_clock::now() + milliseconds(5000);
  while ((*a)->pending_ops() > 0 && std::chrono::steady_clock::now() < until)
    (*a)->Progress();
  receiver.join();
  ASSERT_TRUE(m1.ok()) << m1.status().ToString();
  ASSERT_TRUE(m2.ok()) << m2.status().ToString();
  EXPECT_EQ(m1->data, big);
  EXPECT_EQ(m2->data, big);
  EXPECT_EQ((*a)->pending_ops(), 0u);
  EXPECT_EQ((*a)->failed_posts(), 0u);
}

// Flush waits for posted messages until the provider is done with them: not while the receiver
// takes nothing (a message above the eager limit completes only once matched), at once after.
TEST(EndpointTest, FlushReturnsOnceEveryPostedMessageHasGone) {
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok());
  auto b = Endpoint::Open({});
  ASSERT_TRUE(b.ok());
  auto to_b = (*a)->AddPeer("127.0.0.1", (*b)->port());
  ASSERT_TRUE(to_b.ok());
  auto big = Pattern(uint64_t{2} << 20, 4);
  // b progresses (the connection needs it) but first waits for another tag only.
  std::atomic<bool> take{false};
  Result<Message> m1 = Status::Internal("not received");
  Result<Message> m2 = Status::Internal("not received");
  std::thread receiver([&] {
    while (!take.load())
      (void)(*b)->Recv(99, 0, 100, milliseconds(10));
    m1 = (*b)->Recv(1, 0, big.size(), milliseconds(10000));
    m2 = (*b)->Recv(2, 0, big.size(), milliseconds(10000));
  });
  ASSERT_TRUE((*a)->Post(*to_b, 1, big, milliseconds(4000)).ok());
  ASSERT_TRUE((*a)->Post(*to_b, 2, big, milliseconds(4000)).ok());
  EXPECT_FALSE((*a)->Flush(milliseconds(200)));
  EXPECT_EQ((*a)->pending_ops(), 2u);
  take.store(true);
  EXPECT_TRUE((*a)->Flush(milliseconds(10000)));
  EXPECT_EQ((*a)->pending_ops(), 0u);
  receiver.join();
  ASSERT_TRUE(m1.ok()) << m1.status().ToString();
  ASSERT_TRUE(m2.ok()) << m2.status().ToString();
  EXPECT_EQ(m2->data, big);
  EXPECT_EQ((*a)->failed_posts(), 0u);
}

// A message posted in two parts (a head and a tail, as the peer link sends a reply's data) arrives
// as one, at sizes below and above the provider's eager limit.
TEST(EndpointTest, APostInTwoPartsArrivesAsOneMessage) {
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok());
  auto b = Endpoint::Open({});
  ASSERT_TRUE(b.ok());
  auto to_b = (*a)->AddPeer("127.0.0.1", (*b)->port());
  ASSERT_TRUE(to_b.ok());
  for (const uint64_t tail_size :
       {uint64_t{1}, uint64_t{4} << 10, uint64_t{128} << 10, uint64_t{3} << 20}) {
    auto head = Pattern(56, 3);
    auto tail = Pattern(tail_size, 4);
    std::vector<std::byte> whole = head;
    whole.insert(whole.end(), tail.begin(), tail.end());
    Result<Message> got = Status::Internal("not received");
    std::thread receiver([&] { got = (*b)->Recv(5, 0, whole.size(), milliseconds(5000)); });
    ASSERT_TRUE((*a)->Post(*to_b, 5, std::move(head), std::move(tail), milliseconds(4000)).ok());
    auto until = std::chrono::steady_clock::now() + milliseconds(5000);
    while ((*a)->pending_ops() > 0 && std::chrono::steady_clock::now() < until)
      (*a)->Progress();
    receiver.join();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->data, whole) << tail_size;
    EXPECT_EQ((*a)->failed_posts(), 0u);
  }
}

TEST(EndpointTest, RecvTimesOutAndTheNextOneGetsWhatCameAfter) {
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto m = (*a)->Recv(1, 0, 64, milliseconds(50));
  EXPECT_EQ(m.status().code(), StatusCode::kTimedOut);
  // A message sent after the timeout is received by the next Recv, not lost into the old one
  // (which stays posted for it).
  auto self = (*a)->AddPeer("127.0.0.1", (*a)->port());
  ASSERT_TRUE(self.ok());
  auto data = Pattern(64, 1);
  ASSERT_TRUE((*a)->Send(*self, 1, data, milliseconds(2000)).ok());
  auto again = (*a)->Recv(1, 0, 64, milliseconds(2000));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->data, data);
}

// A receiver that polls in short slices (as the peer link's progress thread does, 50 ms, or
// shorter when woken to send) still gets a large message whose transfer spans many slices: a
// receive that matched it is not given up at the end of a slice.
TEST(EndpointTest, ALargeMessageOutlastingManyShortReceivesArrivesWhole) {
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = Endpoint::Open({});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto to_a = (*b)->AddPeer("127.0.0.1", (*a)->port());
  ASSERT_TRUE(to_a.ok());
  const auto big = Pattern(uint64_t{48} << 20, 5);
  std::atomic<bool> done{false};
  std::thread sender([&] {
    EXPECT_TRUE((*b)->Post(*to_a, 7, big, milliseconds(20000)).ok());
    while (!done.load())
      (*b)->Progress();
  });
  Result<Message> got = Status::Internal("not received");
  uint64_t slices = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    got = (*a)->Recv(7, 0, big.size(), milliseconds(1));
    ++slices;
    if (got.ok() || got.status().code() != StatusCode::kTimedOut) break;
  }
  done.store(true);
  sender.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString() << " after " << slices << " receives";
  EXPECT_EQ(got->data, big);
}

// An idle endpoint sleeps on its completion queue's descriptor (tcp;ofi_rxm has one) instead of
// spinning, and a Recv sleeping there still honours its interrupt (signalled with Wake, as the
// peer link does): it returns long before its timeout.
TEST(EndpointTest, IdleRecvWaitsOnTheQueueAndHonoursItsInterrupt) {
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE((*a)->waits_on_fd());
  std::atomic<bool> stop{false};
  std::thread waker([&] {
    std::this_thread::sleep_for(milliseconds(100));
    stop.store(true);
    (*a)->Wake();
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto m = (*a)->Recv(1, 0, 64, milliseconds(20000), [&] { return stop.load(); });
  const auto took = std::chrono::steady_clock::now() - t0;
  waker.join();
  EXPECT_EQ(m.status().code(), StatusCode::kTimedOut);
  EXPECT_LT(took, std::chrono::seconds(10));  // ended by the interrupt, not the 20 s timeout
}

TEST(EndpointTest, OversizedMessageIsRejectedNotTruncated) {
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok());
  auto self = (*a)->AddPeer("127.0.0.1", (*a)->port());
  ASSERT_TRUE(self.ok());
  (void)(*a)->Send(*self, 5, Pattern(4096, 2), milliseconds(200));
  auto m = (*a)->Recv(5, 0, 16, milliseconds(2000));
  EXPECT_FALSE(m.ok());
}

// Drives `ep` (a target of RMA reads needs progress of its own over tcp) on a thread of its own
// until destroyed.
class Driver {
 public:
  explicit Driver(Endpoint& ep)
      : ep_(ep), thread_([this] {
          while (!stop_.load())
            (void)ep_.Recv(77, 0, 64, milliseconds(20), [this] { return stop_.load(); });
        }) {}
  ~Driver() {
    stop_.store(true);
    ep_.Wake();
    thread_.join();
  }

 private:
  Endpoint& ep_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Waits for the completion of the read posted under `cookie`.
ReadCompletion WaitRead(Endpoint& ep, uint64_t cookie) {
  auto until = std::chrono::steady_clock::now() + milliseconds(5000);
  while (std::chrono::steady_clock::now() < until) {
    for (ReadCompletion& c : ep.TakeReads())
      if (c.cookie == cookie) return std::move(c);
  }
  ReadCompletion none;
  none.cookie = cookie;
  none.error = -1;
  return none;
}

// RMA: a region exposed read-only under a random key is read byte for byte by a peer; a wrong key
// and a range past the region's end are refused (the tcp provider then drops that reader's
// connection), the target keeps serving its other peers, and the region is never changed.
TEST(EndpointTest, RemoteReadsOfAnExposedRegion) {
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = Endpoint::Open({});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto c = Endpoint::Open({});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_TRUE((*a)->supports_remote_read()) << "tcp;ofi_rxm does RMA reads with chosen keys";
  const std::vector<std::byte> region = Pattern(uint64_t{3} << 20, 5);
  const std::vector<std::byte> before = region;
  const uint64_t key = 0x9e3779b97f4a7c15ull;
  auto exposed = (*a)->ExposeForRemoteRead(region, key);
  ASSERT_TRUE(exposed.ok()) << exposed.status().ToString();
  EXPECT_EQ(exposed->key, key);
  auto b_to_a = (*b)->AddPeer("127.0.0.1", (*a)->port());
  auto c_to_a = (*c)->AddPeer("127.0.0.1", (*a)->port());
  ASSERT_TRUE(b_to_a.ok() && c_to_a.ok());
  const Driver driver(**a);

  const uint64_t off = 12345, len = uint64_t{1} << 20;
  ASSERT_TRUE(
      (*b)->PostRead(*b_to_a, exposed->wire_base + off, key, len, 1, milliseconds(2000)).ok());
  ReadCompletion got = WaitRead(**b, 1);
  ASSERT_EQ(got.error, 0) << "the read did not complete";
  ASSERT_EQ(got.length, len);
  EXPECT_EQ(0, std::memcmp(got.data.get(), region.data() + off, len));

  // A wrong key and a range past the end complete with an error and deliver nothing.
  ASSERT_TRUE(
      (*b)->PostRead(*b_to_a, exposed->wire_base + off, key ^ 1, 4096, 2, milliseconds(2000)).ok());
  EXPECT_NE(WaitRead(**b, 2).error, 0);
  ASSERT_TRUE((*b)->PostRead(*b_to_a, exposed->wire_base + region.size() - 100, key, 4096, 3,
                             milliseconds(2000))
                  .ok());
  EXPECT_NE(WaitRead(**b, 3).error, 0);
  // The target is unharmed: another peer reads it as before.
  ASSERT_TRUE((*c)->PostRead(*c_to_a, exposed->wire_base, key, 4096, 4, milliseconds(2000)).ok());
  ReadCompletion again = WaitRead(**c, 4);
  ASSERT_EQ(again.error, 0);
  EXPECT_EQ(0, std::memcmp(again.data.get(), region.data(), 4096));
  EXPECT_EQ(region, before);
}

// Read buffers come from a pool: a released buffer carries the next read of its size class (its
// old bytes fully replaced), and a buffer held past the endpoint's end stays valid.
TEST(EndpointTest, ReadBuffersAreRecycledAndOutliveTheirEndpoint) {
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = Endpoint::Open({});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const std::vector<std::byte> region = Pattern(uint64_t{1} << 20, 9);
  const uint64_t key = 0x51ed270b27a5f1c3ull;
  auto exposed = (*a)->ExposeForRemoteRead(region, key);
  ASSERT_TRUE(exposed.ok()) << exposed.status().ToString();
  auto b_to_a = (*b)->AddPeer("127.0.0.1", (*a)->port());
  ASSERT_TRUE(b_to_a.ok());
  const Driver driver(**a);

  const uint64_t len = 128 << 10;
  ASSERT_TRUE((*b)->PostRead(*b_to_a, exposed->wire_base, key, len, 1, milliseconds(2000)).ok());
  ReadCompletion first = WaitRead(**b, 1);
  ASSERT_EQ(first.error, 0);
  ASSERT_EQ(0, std::memcmp(first.data.get(), region.data(), len));
  const std::byte* buffer = first.data.get();
  first.data.reset();  // back to the pool, not to the allocator, which would hand it to this:
  std::unique_ptr<std::byte[]> other(new std::byte[len]);
  const uint64_t off = 300001;
  ASSERT_TRUE(
      (*b)->PostRead(*b_to_a, exposed->wire_base + off, key, len - 7, 2, milliseconds(2000)).ok());
  ReadCompletion second = WaitRead(**b, 2);
  ASSERT_EQ(second.error, 0);
  EXPECT_EQ(second.data.get(), buffer) << "a read of the same size class reuses the buffer";
  EXPECT_EQ(0, std::memcmp(second.data.get(), region.data() + off, len - 7));

  b->reset();  // the endpoint goes; the buffer it handed out stays the reader's
  EXPECT_EQ(0, std::memcmp(second.data.get(), region.data() + off, len - 7));
}

TEST(EndpointTest, WithoutRemoteReadNothingIsExposed) {
  EndpointOptions o;
  o.remote_read = false;
  auto a = Endpoint::Open(o);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_FALSE((*a)->supports_remote_read());
  std::vector<std::byte> region(4096);
  EXPECT_EQ((*a)->ExposeForRemoteRead(region, 7).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*a)->PostRead(0, 0, 7, 16, 1, milliseconds(10)).code(),
            StatusCode::kFailedPrecondition);
}

TEST(EndpointTest, UnknownProviderAndBusyPortFail) {
  EndpointOptions bad;
  bad.provider = "no-such-provider";
  EXPECT_EQ(Endpoint::Open(bad).status().code(), StatusCode::kUnavailable);
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok());
  EndpointOptions same;
  same.port = (*a)->port();
  EXPECT_FALSE(Endpoint::Open(same).ok());
}

// A port another process holds (here: a plain TCP socket, as another user would bind it) is an
// error that says so, never a silent fallback to another port.
TEST(EndpointTest, APortSomebodyElseHoldsIsRefusedWithTheReason) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(FreeLoopbackPort());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  auto ep = Endpoint::Open({"tcp;ofi_rxm", "127.0.0.1", ntohs(a.sin_port)});
  ::close(fd);
  ASSERT_FALSE(ep.ok());
  EXPECT_NE(ep.status().message().find("another process holds that port"), std::string::npos)
      << "[" << ep.status().ToString() << "]";
}

TEST(EndpointTest, AddPeerTakesANameOrAnAddressAndNamesWhatItCannotResolve) {
  auto a = Endpoint::Open({});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = Endpoint::Open({});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  // The same node by name and by address: both reach it.
  for (const char* host : {"localhost", "127.0.0.1"}) {
    SCOPED_TRACE(host);
    auto to_b = (*a)->AddPeer(host, (*b)->port());
    ASSERT_TRUE(to_b.ok()) << to_b.status().ToString();
    auto msg = Pattern(64, 5);
    std::thread sender([&] { EXPECT_TRUE((*a)->Send(*to_b, 9, msg, milliseconds(5000)).ok()); });
    auto got = (*b)->Recv(9, 0, 1024, milliseconds(5000));
    sender.join();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->data, msg);
  }
  auto bad = (*a)->AddPeer("", 7000);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("cannot resolve peer :7000"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace nopfs::fabric
