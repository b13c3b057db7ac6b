#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "share/ahead.h"
#include "share/client.h"
#include "share/server.h"
#include "share/silent_service.h"
#include "share/store.h"
#include "share/wire.h"

namespace nopfs::share {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/share_test.XXXXXX";
    path_ = ::mkdtemp(tmpl);
    ::chmod(path_.c_str(), 0755);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void Write(const std::string& path, const std::string& text, mode_t mode = 0644) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  ::chmod(path.c_str(), mode);
}

FileId Proof(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return IdOf(st);
}

std::string ReadFd(int fd) {
  std::string s;
  char buf[4096];
  off_t off = 0;
  for (;;) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), off);
    if (n <= 0) break;
    s.append(buf, static_cast<size_t>(n));
    off += n;
  }
  return s;
}

// A dataset and a store beside it.
struct Fixture {
  TempDir tmp;
  std::string root = tmp.path() + "/pfs/data";
  std::string store_dir = tmp.path() + "/ssd/.nopfs-shared";
  Fixture() {
    fs::create_directories(tmp.path() + "/ssd");
    Write(root + "/a/1.jpg", std::string(1000, 'a'));
    Write(root + "/a/2.jpg", std::string(2000, 'b'));
    Write(root + "/b/3.jpg", std::string(3000, 'c'));
    ::mkdir(store_dir.c_str(), 0700);
  }
  std::unique_ptr<Store> Open(uint64_t quota = 1 << 20) {
    Result<std::unique_ptr<Store>> s =
        Store::Open(StoreOptions{root, StoreDirOf(store_dir, root), quota});
    EXPECT_TRUE(s.ok()) << s.status().message();
    return s.ok() ? std::move(*s) : nullptr;
  }
};

TEST(ShareWire, RequestAndReplyRoundTrip) {
  Request r{Op::kOpen, "/pfs/data", {"a/1.jpg", "b/3.jpg"}};
  Result<Request> back = DecodeRequest(EncodeRequest(r), 2);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->dataset, r.dataset);
  EXPECT_EQ(back->files, r.files);
  Reply rep{ReplyStatus::kOk, {{Outcome::kReady, 5, 7}, {Outcome::kDenied, 0, 0}}};
  Result<Reply> rb = DecodeReply(EncodeReply(rep), 1, Op::kOpen);
  ASSERT_TRUE(rb.ok()) << rb.status().message();
  EXPECT_EQ(rb->files[0].size, 5u);
  EXPECT_EQ(rb->files[0].xxh3, 7u);
  EXPECT_EQ(rb->files[1].outcome, Outcome::kDenied);
  EXPECT_FALSE(DecodeReply(EncodeReply(rep), 0, Op::kOpen).ok());
  EXPECT_TRUE(DecodeReply(EncodeReply(rep), 0, Op::kWarm).ok());
}

TEST(ShareWire, HostileRequestsAreRefusedWithTheReason) {
  const std::vector<std::byte> good = EncodeRequest({Op::kOpen, "/pfs/data", {"a/1.jpg"}});
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_FALSE(DecodeRequest(std::span(good).first(n), 1).ok()) << n;
  EXPECT_FALSE(DecodeRequest(good, 0).ok());  // a file without its proof
  EXPECT_FALSE(DecodeRequest(good, 2).ok());  // a proof without its file
  std::vector<std::byte> extra = good;
  extra.push_back(std::byte{0});
  EXPECT_FALSE(DecodeRequest(extra, 1).ok());
  for (const char* bad : {"../etc/shadow", "/etc/shadow", "a//b", "a/./b", "a/..", "", "a/"}) {
    EXPECT_FALSE(DecodeRequest(EncodeRequest({Op::kOpen, "/pfs/data", {bad}}), 1).ok()) << bad;
  }
  std::vector<std::string> many(251, "x");
  Result<Request> r = DecodeRequest(EncodeRequest({Op::kOpen, "/d", many}), 251);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than 250"), std::string::npos);
  std::vector<std::byte> op = good;
  op[6] = std::byte{9};
  EXPECT_FALSE(DecodeRequest(op, 1).ok());
}

TEST(ShareWire, AMessageTooLongOrWithTooManyDescriptorsIsRefusedAndItsDescriptorsClosed) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  std::vector<std::byte> big(kMaxRequestBytes + 10);
  ASSERT_TRUE(SendMessage(sv[0], big, {}).ok());
  Result<Message> m = ReceiveMessage(sv[1], kMaxRequestBytes);
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  ::close(sv[0]);
  ::close(sv[1]);
}

TEST(ShareStore, FillsOnceAndServesAReadOnlyCopy) {
  Fixture f;
  std::unique_ptr<Store> s = f.Open();
  Store::Answer a = s->Serve("a/1.jpg", Proof(f.root + "/a/1.jpg"), true);
  ASSERT_EQ(a.outcome, Outcome::kReady);
  EXPECT_EQ(ReadFd(a.fd.get()), std::string(1000, 'a'));
  EXPECT_EQ(a.xxh3, XXH3_64bits(std::string(1000, 'a').data(), 1000));
  Store::Answer b = s->Serve("a/1.jpg", Proof(f.root + "/a/1.jpg"), true);
  ASSERT_EQ(b.outcome, Outcome::kReady);
  EXPECT_EQ(s->stats().filled, 1u);
  EXPECT_EQ(s->stats().served, 2u);
  // Read-only: no write, no writable shared mapping.
  EXPECT_LT(::write(b.fd.get(), "x", 1), 0);
  EXPECT_EQ(::mmap(nullptr, 1000, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd.get(), 0), MAP_FAILED);
  EXPECT_EQ(errno, EACCES);
  struct stat st {};
  ASSERT_EQ(::fstat(b.fd.get(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0400u);
}

TEST(ShareStore, AFileChangedOnThePfsIsFilledAgainAndNeverServedStale) {
  Fixture f;
  std::unique_ptr<Store> s = f.Open();
  const FileId old = Proof(f.root + "/a/1.jpg");
  ASSERT_EQ(s->Serve("a/1.jpg", old, false).outcome, Outcome::kReady);
  Write(f.root + "/a/1.jpg", std::string(1000, 'z'));  // same size, new bytes
  const FileId now = Proof(f.root + "/a/1.jpg");
  ASSERT_NE(old, now);
  Store::Answer a = s->Serve("a/1.jpg", now, true);
  ASSERT_EQ(a.outcome, Outcome::kReady);
  EXPECT_EQ(ReadFd(a.fd.get()), std::string(1000, 'z'));
  EXPECT_EQ(s->stats().replaced, 1u);
  EXPECT_EQ(s->stats().files, 1u);
  // A proof of the old state is of no file now: never served, never filled, and it removes
  // nothing.
  EXPECT_EQ(s->Serve("a/1.jpg", old, true).outcome, Outcome::kNotStored);
  EXPECT_EQ(s->stats().files, 1u);
  Store::Answer again = s->Serve("a/1.jpg", now, true);
  ASSERT_EQ(again.outcome, Outcome::kReady);
  EXPECT_EQ(ReadFd(again.fd.get()), std::string(1000, 'z'));
  EXPECT_EQ(s->stats().filled, 2u);
}

TEST(ShareStore, APathThatDoesNotLeadToTheProofsFileIsDenied) {
  Fixture f;
  std::unique_ptr<Store> s = f.Open();
  // The proof of one file with the name of another: denied, and the other's copy stays.
  ASSERT_EQ(s->Serve("a/2.jpg", Proof(f.root + "/a/2.jpg"), false).outcome, Outcome::kReady);
  EXPECT_EQ(s->Serve("a/2.jpg", Proof(f.root + "/a/1.jpg"), true).outcome, Outcome::kDenied);
  EXPECT_EQ(s->stats().files, 1u);
  EXPECT_EQ(s->Serve("a/2.jpg", Proof(f.root + "/a/2.jpg"), false).outcome, Outcome::kReady);
  EXPECT_EQ(s->stats().filled, 1u);
  // A file outside the dataset, reached through a link inside it, or named directly.
  Write(f.tmp.path() + "/secret", "secret");
  ASSERT_EQ(::symlink((f.tmp.path() + "/secret").c_str(), (f.root + "/a/link").c_str()), 0);
  EXPECT_EQ(s->Serve("a/link", Proof(f.tmp.path() + "/secret"), true).outcome, Outcome::kDenied);
  ASSERT_EQ(::symlink((f.root + "/b").c_str(), (f.root + "/c").c_str()), 0);
  EXPECT_EQ(s->Serve("c/3.jpg", Proof(f.root + "/b/3.jpg"), true).outcome, Outcome::kDenied);
  EXPECT_EQ(s->stats().filled, 1u);
}

TEST(ShareStore, TheQuotaEvictsTheLeastRecentlyUsedCopy) {
  Fixture f;
  std::unique_ptr<Store> s = f.Open(/*quota=*/5000);
  ASSERT_EQ(s->Serve("a/1.jpg", Proof(f.root + "/a/1.jpg"), false).outcome, Outcome::kReady);
  ASSERT_EQ(s->Serve("a/2.jpg", Proof(f.root + "/a/2.jpg"), false).outcome, Outcome::kReady);
  ASSERT_EQ(s->Serve("a/1.jpg", Proof(f.root + "/a/1.jpg"), false).outcome, Outcome::kReady);
  ASSERT_EQ(s->Serve("b/3.jpg", Proof(f.root + "/b/3.jpg"), false).outcome, Outcome::kReady);
  EXPECT_EQ(s->stats().evicted, 1u);  // a/2.jpg, used before a/1.jpg's second use
  EXPECT_EQ(s->stats().bytes, 4000u);
  EXPECT_EQ(s->stats().filled, 3u);
  ASSERT_EQ(s->Serve("a/1.jpg", Proof(f.root + "/a/1.jpg"), false).outcome, Outcome::kReady);
  EXPECT_EQ(s->stats().filled, 3u);
  Write(f.root + "/big", std::string(6000, 'x'));
  EXPECT_EQ(s->Serve("big", Proof(f.root + "/big"), false).outcome, Outcome::kNotStored);
}

TEST(ShareStore, TheCopyOutlivesTheServiceAndADamagedCopyIsFilledAgain) {
  Fixture f;
  {
    std::unique_ptr<Store> s = f.Open();
    ASSERT_EQ(s->Serve("a/1.jpg", Proof(f.root + "/a/1.jpg"), false).outcome, Outcome::kReady);
    ASSERT_EQ(s->Serve("a/2.jpg", Proof(f.root + "/a/2.jpg"), false).outcome, Outcome::kReady);
  }
  const std::string dir = StoreDirOf(f.store_dir, f.root);
  Write(dir + "/stray", "left by nobody");
  // Damage one copy in place (what only root could do, or the disk).
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() == "0000000000000001") {
      const int fd = ::open(e.path().c_str(), O_WRONLY);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::pwrite(fd, "X", 1, 10), 1);
      ::close(fd);
    }
  }
  std::unique_ptr<Store> s = f.Open();
  EXPECT_FALSE(fs::exists(dir + "/stray"));
  EXPECT_EQ(s->stats().files, 2u);
  Store::Answer a = s->Serve("a/1.jpg", Proof(f.root + "/a/1.jpg"), true);
  ASSERT_EQ(a.outcome, Outcome::kReady);
  EXPECT_EQ(ReadFd(a.fd.get()), std::string(1000, 'a'));
  EXPECT_EQ(s->stats().corrupt, 1u);
  EXPECT_EQ(s->stats().filled, 1u);
  Store::Answer b = s->Serve("a/2.jpg", Proof(f.root + "/a/2.jpg"), true);
  ASSERT_EQ(b.outcome, Outcome::kReady);
  EXPECT_EQ(s->stats().filled, 1u);
}

TEST(ShareStore, AStoreDirectoryOthersMayReadIsRefused) {
  Fixture f;
  const std::string dir = StoreDirOf(f.store_dir, f.root);
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ::chmod(dir.c_str(), 0755);
  Result<std::unique_ptr<Store>> s = Store::Open(StoreOptions{f.root, dir, 1 << 20});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("0700"), std::string::npos);
}

// A server on its own thread.
struct Running {
  std::unique_ptr<Server> server;
  std::thread thread;
  explicit Running(ServerOptions o) {
    Result<std::unique_ptr<Server>> s = Server::Start(std::move(o));
    EXPECT_TRUE(s.ok()) << s.status().message();
    server = std::move(*s);
    thread = std::thread([this] { server->Run(); });
  }
  ~Running() {
    server->Stop();
    thread.join();
  }
};

ServerOptions OptionsFor(const Fixture& f) {
  ServerOptions o;
  o.socket_path = f.tmp.path() + "/share.sock";
  o.store_dir = f.store_dir;
  o.datasets = {{f.root, 1 << 20}};
  return o;
}

TEST(ShareServer, TwoAskersGetTheCopyTheServiceFilledOnce) {
  Fixture f;
  Running r(OptionsFor(f));
  const std::vector<std::string> files = {"a/1.jpg", "a/2.jpg", "b/3.jpg", "missing"};
  for (int job = 0; job < 2; ++job) {
    ShareClient c(f.tmp.path() + "/share.sock", f.root, std::chrono::seconds(5));
    Result<std::vector<ShareClient::Copy>> got = c.Ask(Op::kOpen, files);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ((*got)[0].outcome, Outcome::kReady);
    EXPECT_EQ(ReadFd((*got)[1].fd.get()), std::string(2000, 'b'));
    EXPECT_EQ((*got)[3].outcome, Outcome::kDenied);
    EXPECT_EQ((*got)[3].open_errno, ENOENT);
  }
  Result<Store*> s = r.server->StoreOf(f.root);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().filled, 3u);
  EXPECT_EQ((*s)->stats().served, 6u);
  ShareClient other(f.tmp.path() + "/share.sock", f.tmp.path(), std::chrono::seconds(5));
  std::vector<std::string> one = {"pfs/data/a/1.jpg"};
  EXPECT_EQ(other.Ask(Op::kOpen, one).status().code(), StatusCode::kFailedPrecondition);
}

// Raw requests, as a hostile asker would write them.
int Dial(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

TEST(ShareServer, ForgedRequestsGetNothingAndTheServiceServesOn) {
  Fixture f;
  Running r(OptionsFor(f));
  const std::string sock = f.tmp.path() + "/share.sock";
  // An O_PATH descriptor proves nothing (one can be had for a file one may not read).
  {
    const int s = Dial(sock);
    const int p = ::open((f.root + "/a/1.jpg").c_str(), O_PATH | O_CLOEXEC);
    ASSERT_TRUE(SendMessage(s, EncodeRequest({Op::kOpen, f.root, {"a/1.jpg"}}), {&p, 1}).ok());
    Result<Message> m = ReceiveMessage(s, 4096);
    ASSERT_TRUE(m.ok());
    Result<Reply> rep = DecodeReply(m->bytes, m->fds.size(), Op::kOpen);
    ASSERT_TRUE(rep.ok());
    EXPECT_EQ(rep->files[0].outcome, Outcome::kDenied);
    EXPECT_TRUE(m->fds.empty());
    ::close(p);
    ::close(s);
  }
  // A directory, a proof of another file, garbage, a count that does not match.
  {
    const int s = Dial(sock);
    const int d = ::open(f.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const int p = ::open((f.root + "/a/1.jpg").c_str(), O_RDONLY | O_CLOEXEC);
    const int fds[2] = {d, p};
    ASSERT_TRUE(SendMessage(s, EncodeRequest({Op::kOpen, f.root, {"a", "b/3.jpg"}}), fds).ok());
    Result<Message> m = ReceiveMessage(s, 4096);
    ASSERT_TRUE(m.ok());
    Result<Reply> rep = DecodeReply(m->bytes, m->fds.size(), Op::kOpen);
    ASSERT_TRUE(rep.ok());
    EXPECT_EQ(rep->files[0].outcome, Outcome::kDenied);
    EXPECT_EQ(rep->files[1].outcome, Outcome::kDenied);
    const std::byte junk[7] = {};
    ASSERT_TRUE(SendMessage(s, junk, fds).ok());
    m = ReceiveMessage(s, 4096);
    ASSERT_TRUE(m.ok());
    rep = DecodeReply(m->bytes, 0, Op::kPing);
    ASSERT_TRUE(rep.ok());
    EXPECT_EQ(rep->status, ReplyStatus::kBadRequest);
    ::close(d);
    ::close(p);
    ::close(s);
  }
  EXPECT_GE(r.server->refused(), 1u);
  ShareClient c(sock, f.root, std::chrono::seconds(5));
  std::vector<std::string> one = {"a/1.jpg"};
  Result<std::vector<ShareClient::Copy>> got = c.Ask(Op::kOpen, one);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(ReadFd((*got)[0].fd.get()), std::string(1000, 'a'));
}

// In a child process as `uid`: runs `body`, whose return value is the child's exit status.
int AsUser(uid_t uid, const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 ||
        ::setresuid(uid, uid, uid) != 0) {
      ::_exit(99);
    }
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 98;
}

TEST(ShareServer, AUserGetsOnlyWhatTheyCanReadAndNothingOfTheStore) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  Fixture f;
  ::chmod(f.tmp.path().c_str(), 0755);
  ::chmod((f.tmp.path() + "/pfs").c_str(), 0755);
  ::chmod((f.tmp.path() + "/ssd").c_str(), 0755);
  ::chmod(f.root.c_str(), 0755);
  ::chmod((f.root + "/a").c_str(), 0755);
  ::chmod((f.root + "/b").c_str(), 0700);  // b/ is root's alone
  ::chmod((f.root + "/a/2.jpg").c_str(), 0600);
  Running r(OptionsFor(f));
  const std::string sock = f.tmp.path() + "/share.sock";
  // root fills every file first.
  {
    ShareClient c(sock, f.root, std::chrono::seconds(5));
    std::vector<std::string> all = {"a/1.jpg", "a/2.jpg", "b/3.jpg"};
    Result<std::vector<ShareClient::Copy>> got = c.Ask(Op::kWarm, all);
    ASSERT_TRUE(got.ok());
    for (const auto& g : *got)
      EXPECT_EQ(g.outcome, Outcome::kReady);
  }
  const std::string store = StoreDirOf(f.store_dir, f.root);
  const int rc = AsUser(65534, [&]() -> int {
    ShareClient c(sock, f.root, std::chrono::seconds(5));
    std::vector<std::string> all = {"a/1.jpg", "a/2.jpg", "b/3.jpg"};
    Result<std::vector<ShareClient::Copy>> got = c.Ask(Op::kOpen, all);
    if (!got.ok()) return 1;
    if ((*got)[0].outcome != Outcome::kReady ||
        ReadFd((*got)[0].fd.get()) != std::string(1000, 'a'))
      return 2;
    if ((*got)[1].outcome != Outcome::kDenied || (*got)[1].open_errno != EACCES) return 3;
    if ((*got)[2].outcome != Outcome::kDenied || (*got)[2].open_errno != EACCES) return 4;
    // The copy handed out cannot be reopened for writing, nor written.
    const std::string self = "/proc/self/fd/" + std::to_string((*got)[0].fd.get());
    if (::open(self.c_str(), O_RDWR) >= 0 || ::write((*got)[0].fd.get(), "x", 1) >= 0) return 5;
    // The store: nothing to list or open.
    if (::open(f.store_dir.c_str(), O_RDONLY) >= 0 || errno != EACCES) return 6;
    if (::open((store + "/0000000000000001").c_str(), O_RDONLY) >= 0) return 7;
    // A proof of a file it can read, named as a file it cannot: denied.
    const int s = Dial(sock);
    const int p = ::open((f.root + "/a/1.jpg").c_str(), O_RDONLY | O_CLOEXEC);
    if (!SendMessage(s, EncodeRequest({Op::kOpen, f.root, {"a/2.jpg"}}), {&p, 1}).ok()) return 8;
    Result<Message> m = ReceiveMessage(s, 4096);
    if (!m.ok() || !m->fds.empty()) return 9;
    Result<Reply> rep = DecodeReply(m->bytes, 0, Op::kOpen);
    if (!rep.ok() || rep->files[0].outcome != Outcome::kDenied) return 10;
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

// A dataset of n files of distinct bytes, for the reads asked ahead.
std::vector<std::string> ManyFiles(const Fixture& f, size_t n) {
  std::vector<std::string> rels;
  for (size_t i = 0; i < n; ++i) {
    rels.push_back("many/" + std::to_string(i) + ".bin");
    Write(f.root + "/" + rels.back(), std::string(100 + i, static_cast<char>('A' + i % 26)));
  }
  return rels;
}

bool WaitHeld(const AheadReader& r, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (r.held() != n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(ShareAhead, ReadsInTheOrderFindTheirDescriptorsAskedAheadWithinTheBound) {
  Fixture f;
  Running r(OptionsFor(f));
  const std::vector<std::string> rels = ManyFiles(f, 40);
  ShareClient c(f.tmp.path() + "/share.sock", f.root, std::chrono::seconds(5));
  AheadReader ahead(c, std::vector<std::string_view>(rels.begin(), rels.end()),
                    std::vector<uint32_t>(rels.size(), 1), {.max_held = 16, .max_batch = 8});
  ahead.Start();
  // The asking stops at the bound while no read comes.
  ASSERT_TRUE(WaitHeld(ahead, 16));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ahead.held(), 16u);
  for (size_t i = 0; i < rels.size(); ++i) {
    std::string got(100 + i, '\0');
    ASSERT_TRUE(ahead.Read(i, 0, std::as_writable_bytes(std::span(got))).ok()) << i;
    EXPECT_EQ(got, std::string(100 + i, static_cast<char>('A' + i % 26))) << i;
    EXPECT_LE(ahead.held(), 16u);
  }
  // The first 16 were asked before any read; every read was served from a descriptor asked
  // ahead or asked alone, and no descriptor outlives its file's last read.
  EXPECT_GE(ahead.read_ahead(), 16u);
  EXPECT_EQ(ahead.read_ahead() + ahead.asked_alone(), rels.size());
  EXPECT_EQ(ahead.held(), 0u);
  ahead.Stop();
  Result<Store*> s = r.server->StoreOf(f.root);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().filled, rels.size());
}

TEST(ShareAhead, AFileTheUserCannotOpenIsNotFoundAndAFileOfManyReadsIsHeldUntilItsLast) {
  Fixture f;
  Running r(OptionsFor(f));
  const std::vector<std::string> rels = {"a/1.jpg", "gone.jpg", "b/3.jpg"};
  Write(f.root + "/gone.jpg", "x");
  ShareClient c(f.tmp.path() + "/share.sock", f.root, std::chrono::seconds(5));
  // a/1.jpg holds two samples: [0, 500) and [500, 1000).
  AheadReader ahead(c, std::vector<std::string_view>(rels.begin(), rels.end()), {2, 1, 1}, {});
  fs::remove(f.root + "/gone.jpg");
  ahead.Start();
  ASSERT_TRUE(WaitHeld(ahead, 2));
  std::string half(500, '\0');
  ASSERT_TRUE(ahead.Read(0, 0, std::as_writable_bytes(std::span(half))).ok());
  EXPECT_EQ(ahead.held(), 2u);
  ASSERT_TRUE(ahead.Read(0, 500, std::as_writable_bytes(std::span(half))).ok());
  EXPECT_EQ(half, std::string(500, 'a'));
  EXPECT_EQ(ahead.held(), 1u);
  std::string one(1, '\0');
  EXPECT_EQ(ahead.Read(1, 0, std::as_writable_bytes(std::span(one))).code(), StatusCode::kNotFound);
  // Past the copy's end: NotFound, never short bytes.
  std::string more(3001, '\0');
  EXPECT_EQ(ahead.Read(2, 0, std::as_writable_bytes(std::span(more))).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(ahead.read_ahead(), 3u);
  EXPECT_EQ(ahead.asked_alone(), 0u);
}

TEST(ShareAhead, DescriptorsTheReadsPassedByAreClosedForTheFilesAheadOfThem) {
  Fixture f;
  Running r(OptionsFor(f));
  const std::vector<std::string> rels = ManyFiles(f, 20);
  ShareClient c(f.tmp.path() + "/share.sock", f.root, std::chrono::seconds(5));
  AheadReader ahead(c, std::vector<std::string_view>(rels.begin(), rels.end()),
                    std::vector<uint32_t>(rels.size(), 1), {.max_held = 4, .max_batch = 4});
  ahead.Start();
  ASSERT_TRUE(WaitHeld(ahead, 4));  // files 0-3
  // The reads jump to file 10 (files 0-9 came from elsewhere): it is asked alone, and the
  // descriptors of 0-3 make room for the files ahead of it.
  std::string got(110, '\0');
  ASSERT_TRUE(ahead.Read(10, 0, std::as_writable_bytes(std::span(got))).ok());
  EXPECT_EQ(ahead.asked_alone(), 1u);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ahead.asked_ahead() < 8 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(WaitHeld(ahead, 4));
  std::string next(111, '\0');
  ASSERT_TRUE(ahead.Read(11, 0, std::as_writable_bytes(std::span(next))).ok());
  EXPECT_EQ(next, std::string(111, static_cast<char>('A' + 11)));
  EXPECT_EQ(ahead.asked_alone(), 1u);
  EXPECT_EQ(ahead.read_ahead(), 1u);
  // A file left behind is still read, asked alone.
  std::string first(100, '\0');
  ASSERT_TRUE(ahead.Read(0, 0, std::as_writable_bytes(std::span(first))).ok());
  EXPECT_EQ(first, std::string(100, 'A'));
  EXPECT_EQ(ahead.asked_alone(), 2u);
}

TEST(ShareAhead, WithoutTheServiceEveryReadFailsAndNothingIsHeld) {
  Fixture f;
  const std::vector<std::string> rels = {"a/1.jpg", "a/2.jpg"};
  ShareClient c(f.tmp.path() + "/none.sock", f.root, std::chrono::seconds(1));
  AheadReader ahead(c, std::vector<std::string_view>(rels.begin(), rels.end()), {1, 1}, {});
  ahead.Start();
  std::string got(1000, '\0');
  const Status s = ahead.Read(0, 0, std::as_writable_bytes(std::span(got)));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
  ahead.Stop();
  EXPECT_EQ(ahead.held(), 0u);
}

bool WaitUnanswered(const SilentService& svc, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (svc.unanswered() < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A service that does not answer holds a request for the client's whole timeout (a minute in
// nopfsd); Cancel ends it at once, and every later one, so that a job's end never waits for it.
TEST(ShareClient, CancelEndsTheRequestsAServiceDoesNotAnswerAtOnce) {
  Fixture f;
  SilentService svc(f.tmp.path() + "/silent.sock");
  ASSERT_TRUE(svc.ok());
  ShareClient c(f.tmp.path() + "/silent.sock", f.root, std::chrono::seconds(60));
  ASSERT_TRUE(c.Ping().ok());
  const std::vector<std::string> rels = {"a/1.jpg"};
  auto asked = std::async(std::launch::async, [&] { return c.Ask(Op::kOpen, rels).status(); });
  ASSERT_TRUE(WaitUnanswered(svc, 1));
  EXPECT_EQ(asked.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(c.Cancel(), 1u);
  ASSERT_EQ(asked.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "the request still waits for the service";
  const Status s = asked.get();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(c.cancelled());
  const Result<std::vector<ShareClient::Copy>> later = c.Ask(Op::kOpen, rels);
  EXPECT_EQ(later.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(later.status().message(), "share: stopped");
  EXPECT_EQ(svc.unanswered(), 1u) << "a request after Cancel reached the service";
}

// The same for the reads asked ahead: a read waiting for its batch and the asking threads end
// with Cancel, and Stop returns.
TEST(ShareAhead, CancelEndsAReadWaitingForItsBatchAndStopReturns) {
  Fixture f;
  SilentService svc(f.tmp.path() + "/silent.sock");
  ASSERT_TRUE(svc.ok());
  ShareClient c(f.tmp.path() + "/silent.sock", f.root, std::chrono::seconds(60));
  const std::vector<std::string> rels = {"a/1.jpg", "a/2.jpg", "b/3.jpg"};
  AheadReader ahead(c, std::vector<std::string_view>(rels.begin(), rels.end()), {1, 1, 1},
                    {.threads = 1});
  ahead.Start();
  ASSERT_TRUE(WaitUnanswered(svc, 1));
  auto read = std::async(std::launch::async, [&] {
    std::string got(1000, '\0');
    return ahead.Read(0, 0, std::as_writable_bytes(std::span(got)));
  });
  EXPECT_EQ(read.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  const auto t0 = std::chrono::steady_clock::now();
  c.Cancel();
  ASSERT_EQ(read.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_FALSE(read.get().ok());
  ahead.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(ahead.held(), 0u);
}

}  // namespace
}  // namespace nopfs::share
