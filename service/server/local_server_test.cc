// LocalServer with the real client library, end to end, against a test Handler that fills rings
// from an in-memory generator (the daemon's own integration test covers the real staging path).
#include "service/server/local_server.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <thread>

#include "client/client.h"
#include "protocol/ring.h"

namespace nopfs::service {
namespace {

using namespace std::chrono_literals;

uint8_t ByteOf(uint32_t sample_id) {
  return static_cast<uint8_t>(sample_id & 0xff);
}

class TestHandler : public Handler {
 public:
  uint64_t count = 200;            // samples per stream
  uint64_t error_at = UINT64_MAX;  // stream position that fails
  uint32_t ranks = 4;

  ~TestHandler() override {
    std::map<uint64_t, Gen> left;
    {
      std::lock_guard lock(mu_);
      left.swap(streams_);
    }
    for (auto& [id, g] : left)
      Stop(g);
  }

  HelloInfo Hello() override { return HelloInfo{"job-7", ranks, 0, ranks}; }

  Result<StreamGrant> OpenStream(const OpenStreamRequest& req, ConnectionId) override {
    if (req.rank >= ranks) {
      return Status::NotFound("rank " + std::to_string(req.rank) + " is not served here");
    }
    auto w = ring::RingWriter::Create(64 * 1024, 16);
    if (!w.ok()) return w.status();
    std::lock_guard lock(mu_);
    uint64_t id = ++next_id_;
    Gen& g = streams_[id];
    g.writer = std::move(*w);
    ring::RingWriter* writer = g.writer.get();
    const uint64_t n = count, bad = error_at;
    g.thread = std::thread([writer, req, n, bad] {
      for (uint64_t i = req.step; i < n; ++i) {
        uint32_t sample = req.rank * 1000 + static_cast<uint32_t>(i);
        ring::SampleMeta meta{sample, static_cast<int64_t>(sample % 10), req.epoch, i / 8, i};
        const uint64_t size = i == bad ? 256 : (i * 37) % 4000 + 1;
        auto r = writer->Reserve(size, meta, std::chrono::steady_clock::now() + 30s);
        if (!r.ok()) return;  // cancelled: the client left
        if (i == bad) {
          Status st = writer->PublishError(
              r->seq,
              Status::NotFound("sample " + std::to_string(sample) + " (/pfs/data/" +
                               std::to_string(sample) + ".jpg): No such file or directory"));
          if (!st.ok()) return;
          continue;
        }
        std::memset(r->dst.data(), ByteOf(sample), r->dst.size());
        if (!writer->Publish(r->seq).ok()) return;
      }
      writer->Finish();
    });
    StreamGrant grant;
    grant.stream_id = id;
    grant.ring_fd = writer->fd();
    grant.capacity = writer->capacity();
    grant.slot_count = writer->slot_count();
    return grant;
  }

  std::function<void()> CloseStream(uint64_t id) override {
    auto g = std::make_shared<Gen>();
    {
      std::lock_guard lock(mu_);
      auto it = streams_.find(id);
      EXPECT_NE(it, streams_.end()) << "CloseStream of unknown stream " << id;
      if (it == streams_.end()) return nullptr;
      *g = std::move(it->second);
      streams_.erase(it);
    }
    return [this, id, g] {
      if (hold_release) hold_release->get_future().wait();
      Stop(*g);
      std::lock_guard lock(mu_);
      closed_.push_back(id);
      cv_.notify_all();
    };
  }

  std::string StatusText() override {
    std::lock_guard lock(mu_);
    std::string s = "job-7: " + std::to_string(streams_.size()) + " open streams\n";
    for (auto& [id, g] : streams_) {
      ring::RingStats st = g.writer->stats();
      s += "stream " + std::to_string(id) + ": samples " + std::to_string(st.samples) +
           " stall total " + std::to_string(st.stall_ns_total) + " ns\n";
    }
    return s;
  }

  report::StatusReport Report() override {
    std::lock_guard lock(mu_);
    report::StatusReport r;
    r.job_id = "job-7";
    for (auto& [id, g] : streams_) {
      ring::RingStats st = g.writer->stats();
      r.streams.push_back({id, 0, 0, 0, 0, st.samples});
      r.stall.reads += st.samples;
      r.stall.total_ns += st.stall_ns_total;
    }
    return r;
  }

  Result<wire::DescribeOk> Describe(uint32_t sample_id) override {
    if (sample_id >= 1000) {
      return Status::NotFound("sample " + std::to_string(sample_id) + " is not in the dataset");
    }
    return wire::DescribeOk{sample_id, "/pfs/set/" + std::to_string(sample_id) + ".bin",
                            sample_id * 10ull, 10, static_cast<int64_t>(sample_id % 3)};
  }

  // Set: the release of a closed stream waits for it (a ring slow to free).
  std::shared_ptr<std::promise<void>> hold_release;

  // Waits until `n` streams were closed.
  bool WaitClosed(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return closed_.size() >= n; });
  }
  size_t closed() {
    std::lock_guard lock(mu_);
    return closed_.size();
  }

 private:
  struct Gen {
    std::unique_ptr<ring::RingWriter> writer;
    std::thread thread;
  };
  static void Stop(Gen& g) {
    g.writer->Cancel();
    if (g.thread.joinable()) g.thread.join();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Gen> streams_;
  std::vector<uint64_t> closed_;
  uint64_t next_id_ = 0;
};

class LocalServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-ls-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
    path_ = dir_ + "/nopfsd.sock";
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }
  void StartServer(uint32_t uid = static_cast<uint32_t>(::getuid())) {
    server_ = std::make_unique<LocalServer>(LocalServer::Options{path_, uid, 16}, &handler_);
    Status st = server_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  void StartServerWith(LocalServer::Options o) {
    o.socket_path = path_;
    o.allowed_uid = static_cast<uint32_t>(::getuid());
    server_ = std::make_unique<LocalServer>(o, &handler_);
    Status st = server_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  // A raw connection for speaking malformed bytes.
  int RawConnect() {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path_.c_str());
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    return fd;
  }

  std::string dir_, path_;
  TestHandler handler_;
  std::unique_ptr<LocalServer> server_;
};

TEST_F(LocalServerTest, EndToEndInOrderZeroCopyWithErrorAndStats) {
  handler_.count = 300;
  handler_.error_at = 42;
  StartServer();
  struct stat st {};
  ASSERT_EQ(::lstat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  auto c = client::Client::Connect(path_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->info().job_id, "job-7");
  EXPECT_EQ((*c)->info().ranks, 4u);
  auto s = (*c)->Open(2, 1, 0);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<client::Sample> held;
  uint64_t seen = 0, errors = 0;
  for (uint64_t i = 0;; ++i) {
    auto r = (*s)->Next(10s);
    if (!r.ok()) {
      ++errors;
      EXPECT_EQ(i, 42u);
      EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
      EXPECT_EQ(r.status().message(),
                "sample 2042 (/pfs/data/2042.jpg): No such file or directory");
      continue;
    }
    if (!r->has_value()) break;
    const client::Sample& x = **r;
    ASSERT_EQ(x.position, i);
    ASSERT_EQ(x.sample_id, 2000 + i);
    ASSERT_EQ(x.epoch, 1u);
    ASSERT_EQ(x.size, (i * 37) % 4000 + 1);
    for (uint64_t b = 0; b < x.size; ++b) {
      ASSERT_EQ(static_cast<uint8_t>(x.data[b]), ByteOf(x.sample_id));
    }
    ++seen;
    held.push_back(x);
    if (held.size() == 3) {  // DataLoader style: hold a few, release out of order
      ASSERT_TRUE((*s)->Release(held[1]).ok());
      ASSERT_TRUE((*s)->Release(held[0]).ok());
      ASSERT_TRUE((*s)->Release(held[2]).ok());
      held.clear();
    }
  }
  for (auto& h : held)
    ASSERT_TRUE((*s)->Release(h).ok());
  EXPECT_EQ(seen, 299u);
  EXPECT_EQ(errors, 1u);
  client::Stats stats = (*s)->stats();
  EXPECT_EQ(stats.samples, 300u);
  EXPECT_EQ(stats.next_calls, 301u);
  EXPECT_GE(stats.stall_ns_p99, stats.stall_ns_median);

  auto text = (*c)->StatusText();
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_NE(text->find("1 open streams"), std::string::npos) << *text;
  EXPECT_NE(text->find("samples 300"), std::string::npos) << *text;
  // The structured status of the same moment, over the same socket.
  Result<report::StatusReport> rep = (*c)->Report();
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->job_id, "job-7");
  ASSERT_EQ(rep->streams.size(), 1u);
  EXPECT_EQ(rep->streams[0].read, 300u);
  EXPECT_EQ(rep->stall.reads, 300u);

  Result<client::SampleInfo> info = (*c)->Describe(42);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->path, "/pfs/set/42.bin");
  EXPECT_EQ(info->offset, 420u);
  EXPECT_EQ(info->length, 10u);
  EXPECT_EQ(info->label, 0);
  Result<client::SampleInfo> missing = (*c)->Describe(5000);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("sample 5000"), std::string::npos);

  EXPECT_TRUE((*s)->Close().ok());
  EXPECT_TRUE(handler_.WaitClosed(1, 5s));  // released right after CLOSE_OK was sent
  EXPECT_FALSE((*s)->Next(1s).ok());
}

TEST_F(LocalServerTest, OpenAtStepAndOpenErrors) {
  handler_.count = 20;
  StartServer();
  auto c = client::Client::Connect(path_);
  ASSERT_TRUE(c.ok());
  auto s = (*c)->Open(0, 0, 15);
  ASSERT_TRUE(s.ok());
  auto r = (*s)->Next(10s);
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((**r).position, 15u);
  auto bad = (*c)->Open(9);
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("rank 9"), std::string::npos);
  // The connection is still usable after an error answer.
  EXPECT_TRUE((*c)->StatusText().ok());
  s->reset();  // destructor closes the stream
  EXPECT_TRUE(handler_.WaitClosed(1, 5s));
}

TEST_F(LocalServerTest, CloseIsAnsweredBeforeTheRingIsReleased) {
  handler_.count = 20;
  handler_.hold_release = std::make_shared<std::promise<void>>();
  StartServer();
  auto c = client::Client::Connect(path_);
  ASSERT_TRUE(c.ok());
  auto s = (*c)->Open(0);
  ASSERT_TRUE(s.ok());
  // CLOSE_OK comes while the stream's release is still held: the client never waits for it.
  EXPECT_TRUE((*s)->Close().ok());
  EXPECT_EQ(handler_.closed(), 0u);
  handler_.hold_release->set_value();
  EXPECT_TRUE(handler_.WaitClosed(1, 5s));
}

TEST_F(LocalServerTest, SocketFromEnvironment) {
  StartServer();
  ::unsetenv("NOPFS_SOCKET");
  auto none = client::Client::Connect();
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("NOPFS_SOCKET"), std::string::npos);
  ::setenv("NOPFS_SOCKET", path_.c_str(), 1);
  auto c = client::Client::Connect();
  ::unsetenv("NOPFS_SOCKET");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  auto missing = client::Client::Connect(dir_ + "/nothing.sock");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(LocalServerTest, CApiProgram) {
  handler_.count = 50;
  StartServer();
  // Every program lands in <build>/bin, beside this test.
  std::string prog =
      (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "nopfs_c_api_test").string();
  ASSERT_TRUE(std::filesystem::exists(prog)) << prog;
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("NOPFS_SOCKET", path_.c_str(), 1);
    ::execl(prog.c_str(), prog.c_str(), "3", "50", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << prog;
  EXPECT_TRUE(handler_.WaitClosed(1, 5s));
}

// A client killed while holding samples (its producer blocked on back-pressure): the kernel
// closes the socket, the server calls CloseStream, and the producer is released.
TEST_F(LocalServerTest, DeadClientReleasesEverything) {
  handler_.count = 100000;  // far more than the ring holds: the producer will block
  StartServer();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(ready[0]);
    auto c = client::Client::Connect(path_);
    if (!c.ok()) ::_exit(2);
    auto s = (*c)->Open(1);
    if (!s.ok()) ::_exit(3);
    for (int i = 0; i < 5; ++i) {
      auto r = (*s)->Next(10s);
      if (!r.ok() || !r->has_value()) ::_exit(4);
    }
    char b = 1;
    if (::write(ready[1], &b, 1) != 1) ::_exit(5);
    ::pause();
    ::_exit(6);
  }
  ::close(ready[1]);
  char b = 0;
  ASSERT_EQ(::read(ready[0], &b, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(handler_.closed(), 0u);
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(handler_.WaitClosed(1, 5s));  // CloseStream joined the (unblocked) producer
  // The server keeps serving.
  auto c = client::Client::Connect(path_);
  EXPECT_TRUE(c.ok());
}

TEST_F(LocalServerTest, PeerWithAnotherUidIsRefused) {
  const uint32_t me = static_cast<uint32_t>(::getuid());
  StartServer(me + 1);  // the job belongs to someone else
  auto c = client::Client::Connect(path_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status().ToString();
  EXPECT_EQ(server_->refused_peers(), 1u);
}

TEST_F(LocalServerTest, ClientRefusesServiceOfAnotherUid) {
  StartServer();
  client::ConnectOptions o;
  o.socket_path = path_;
  o.expected_server_uid = static_cast<uint32_t>(::getuid()) + 1;
  auto c = client::Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(c.status().message().find("refusing"), std::string::npos);
}

// With real, different uids: the service runs as `nobody` in a forked child; root's client
// refuses it, and the service refuses root.
TEST_F(LocalServerTest, RealUidsBothWays) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root to switch uid; PeerWithAnotherUidIsRefused and "
                    "ClientRefusesServiceOfAnotherUid cover both checks without it";
  }
  constexpr uint32_t kNobody = 65534;
  ASSERT_EQ(::chown(dir_.c_str(), kNobody, kNobody), 0);
  int ready[2], quit[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(quit), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(ready[0]);
    ::close(quit[1]);
    if (::setresgid(kNobody, kNobody, kNobody) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0) {
      ::_exit(2);
    }
    TestHandler h;
    LocalServer server(LocalServer::Options{path_, kNobody, 4}, &h);
    if (!server.Start().ok()) ::_exit(3);
    char b = 1;
    if (::write(ready[1], &b, 1) != 1) ::_exit(4);
    if (::read(quit[0], &b, 1) < 0) ::_exit(5);
    server.Stop();
    ::_exit(server.refused_peers() == 2 ? 0 : 6);  // both of root's connections
  }
  ::close(ready[1]);
  ::close(quit[0]);
  char b = 0;
  ASSERT_EQ(::read(ready[0], &b, 1), 1);
  auto c = client::Client::Connect(path_);  // expects a service running as root
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(c.status().message().find("65534"), std::string::npos) << c.status().ToString();
  client::ConnectOptions o;
  o.socket_path = path_;
  o.expected_server_uid = kNobody;
  auto c2 = client::Client::Connect(o);  // the service refuses uid 0
  EXPECT_EQ(c2.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(c2.status().message().find("belongs to uid 65534"), std::string::npos)
      << c2.status().ToString();
  ::close(quit[1]);
  ::close(ready[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(LocalServerTest, MalformedMessagesAreRejectedAndServerKeepsServing) {
  StartServer();
  auto expect_error_then_close = [&](const std::vector<uint8_t>& bytes, const char* what) {
    wire::UniqueFd fd(RawConnect());
    ASSERT_EQ(::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
    auto r = wire::RecvMessage(fd.get(), 5000ms);
    ASSERT_TRUE(r.ok()) << what << ": " << r.status().ToString();
    EXPECT_TRUE(std::holds_alternative<wire::Error>(r->message.body)) << what;
    auto eof = wire::RecvMessage(fd.get(), 5000ms);
    EXPECT_EQ(eof.status().code(), StatusCode::kUnavailable) << what << ": not closed";
  };
  std::mt19937 rng(99);
  for (int i = 0; i < 20; ++i) {
    std::vector<uint8_t> junk(16 + rng() % 64);
    for (auto& x : junk)
      x = static_cast<uint8_t>(rng());
    expect_error_then_close(junk, "random bytes");
  }
  // A valid header announcing a 4 GiB payload.
  expect_error_then_close({'N', 'P', 'F', 'S', 1, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0},
                          "huge length");
  // A request before HELLO, then a message only the service sends.
  auto enc = [](const wire::Message& m) {
    auto b = wire::Encode(m);
    std::vector<uint8_t> v;
    for (std::byte x : *b)
      v.push_back(static_cast<uint8_t>(x));
    return v;
  };
  expect_error_then_close(enc({1, wire::StatusRequest{}}), "no hello");
  auto both = enc({1, wire::Hello{1, 1}});
  auto tail = enc({2, wire::HelloOk{}});
  {
    wire::UniqueFd fd(RawConnect());
    both.insert(both.end(), tail.begin(), tail.end());
    ASSERT_EQ(::send(fd.get(), both.data(), both.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(both.size()));
    auto hello = wire::RecvMessage(fd.get(), 5000ms);
    ASSERT_TRUE(hello.ok());
    EXPECT_TRUE(std::holds_alternative<wire::HelloOk>(hello->message.body));
    auto err = wire::RecvMessage(fd.get(), 5000ms);
    ASSERT_TRUE(err.ok());
    EXPECT_TRUE(std::holds_alternative<wire::Error>(err->message.body));
  }
  EXPECT_GE(server_->malformed_messages(), 23u);
  handler_.count = 10;
  auto c = client::Client::Connect(path_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto s = (*c)->Open(0);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE((*s)->Next(10s).ok());
}

TEST_F(LocalServerTest, StartRefusesUnsafePlacesAndCleansUp) {
  // A regular file where the socket goes is never replaced.
  { std::ofstream(path_) << "precious"; }
  LocalServer s1(LocalServer::Options{path_, 0, 4}, &handler_);
  EXPECT_EQ(s1.Start().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(std::filesystem::is_regular_file(path_));
  std::filesystem::remove(path_);
  // A stale socket (from a crashed daemon) is replaced.
  {
    LocalServer s2(LocalServer::Options{path_, 0, 4}, &handler_);
    ASSERT_TRUE(s2.Start().ok());
    // Simulate a crash: leave the file behind by re-creating it after Stop.
  }
  EXPECT_FALSE(std::filesystem::exists(path_));  // Stop unlinks
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, path_.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ::close(fd);  // the file stays: a stale socket
  }
  StartServer();
  EXPECT_TRUE(client::Client::Connect(path_).ok());
  server_.reset();
  // A directory others can enter is refused.
  ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
  LocalServer s3(LocalServer::Options{path_, 0, 4}, &handler_);
  EXPECT_EQ(s3.Start().code(), StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace nopfs::service

namespace nopfs::service {
namespace {

// Reads `n` samples of rank `rank`'s generated stream and checks every byte (TestHandler's
// pattern).
void ReadChecked(client::Stream* s, uint32_t rank, uint64_t from, uint64_t n) {
  for (uint64_t i = from; i < from + n; ++i) {
    auto r = s->Next(10s);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_value()) << "stream ended at " << i;
    const client::Sample& x = **r;
    ASSERT_EQ(x.sample_id, rank * 1000 + i);
    ASSERT_EQ(x.size, (i * 37) % 4000 + 1);
    for (uint64_t b = 0; b < x.size; ++b)
      ASSERT_EQ(static_cast<uint8_t>(x.data[b]), ByteOf(x.sample_id));
    ASSERT_TRUE(s->Release(x).ok());
  }
}

// Reads one message from a raw connection, waiting at most `timeout`.
Result<wire::Received> RecvRaw(int fd, std::chrono::milliseconds timeout) {
  return wire::RecvMessage(fd, timeout);
}

TEST_F(LocalServerTest, ConnectionsPastTheLimitAreRefusedWhileStreamsGoOn) {
  handler_.count = 900;
  LocalServer::Options o;
  o.max_connections = 3;
  o.hello_timeout = 60s;
  StartServerWith(o);
  auto c = client::Client::Connect(path_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto s = (*c)->Open(1);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ReadChecked(s->get(), 1, 0, 300);

  // Two idle connections fill the server; every further one is answered and closed at once.
  std::vector<wire::UniqueFd> idle;
  idle.emplace_back(RawConnect());
  idle.emplace_back(RawConnect());
  for (int i = 0; i < 50; ++i) {
    wire::UniqueFd fd(RawConnect());
    Result<wire::Received> r = RecvRaw(fd.get(), 5000ms);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto* e = std::get_if<wire::Error>(&r->message.body);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->code, static_cast<uint32_t>(StatusCode::kResourceExhausted));
    EXPECT_NE(e->message.find("3 connections are open, the most this job's service takes"),
              std::string::npos)
        << e->message;
    char b;
    EXPECT_EQ(::recv(fd.get(), &b, 1, 0), 0);  // closed
  }
  EXPECT_EQ(server_->refused_connections(), 50u);
  EXPECT_EQ(server_->connections(), 3u);
  auto refused = client::Client::Connect(path_);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("connections are open"), std::string::npos)
      << refused.status().ToString();

  ReadChecked(s->get(), 1, 300, 300);
  // A slot freed is a slot usable again.
  idle.pop_back();
  for (int i = 0; i < 100 && server_->connections() > 2; ++i)
    std::this_thread::sleep_for(20ms);
  auto again = client::Client::Connect(path_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ReadChecked(s->get(), 1, 600, 300);
}

TEST_F(LocalServerTest, HalfOpenConnectionsTimeOutWhileStreamsGoOn) {
  handler_.count = 600;
  LocalServer::Options o;
  o.max_connections = 400;
  o.hello_timeout = 300ms;
  o.request_timeout = 300ms;
  StartServerWith(o);
  auto c = client::Client::Connect(path_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto s = (*c)->Open(2);
  ASSERT_TRUE(s.ok()) << s.status().ToString();

  // 300 connections that never say HELLO, and one that says HELLO and then half a request.
  std::vector<wire::UniqueFd> half;
  for (int i = 0; i < 300; ++i)
    half.emplace_back(RawConnect());
  wire::UniqueFd partial(RawConnect());
  ASSERT_TRUE(
      wire::SendMessage(partial.get(), wire::Message{1, wire::Hello{wire::kVersion, 1}}).ok());
  Result<wire::Received> ok = RecvRaw(partial.get(), 5000ms);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  ASSERT_TRUE(std::holds_alternative<wire::HelloOk>(ok->message.body));
  Result<std::vector<std::byte>> req = wire::Encode(wire::Message{2, wire::StatusRequest{}});
  ASSERT_TRUE(req.ok());
  ASSERT_EQ(::send(partial.get(), req->data(), 5, MSG_NOSIGNAL), 5);
  EXPECT_GE(server_->connections(), 301u);

  ReadChecked(s->get(), 2, 0, 300);
  // Every one of them is told why and closed; the server's threads go with them.
  for (wire::UniqueFd& fd : half) {
    Result<wire::Received> r = RecvRaw(fd.get(), 5000ms);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto* e = std::get_if<wire::Error>(&r->message.body);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->code, static_cast<uint32_t>(StatusCode::kTimedOut));
    EXPECT_EQ(e->message, "nopfsd: no HELLO within 300 ms; connection closed");
  }
  Result<wire::Received> r = RecvRaw(partial.get(), 5000ms);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto* e = std::get_if<wire::Error>(&r->message.body);
  ASSERT_NE(e, nullptr);
  EXPECT_NE(e->message.find("a request begun more than 300 ms ago is still incomplete"),
            std::string::npos)
      << e->message;
  for (int i = 0; i < 100 && server_->connections() > 1; ++i)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(server_->connections(), 1u);
  EXPECT_EQ(server_->timed_out_connections(), 301u);

  // The client that said HELLO and idles between requests is kept, and its stream goes on.
  std::this_thread::sleep_for(500ms);
  ReadChecked(s->get(), 2, 300, 300);
  auto text = (*c)->StatusText();
  EXPECT_TRUE(text.ok()) << text.status().ToString();
}

}  // namespace
}  // namespace nopfs::service
