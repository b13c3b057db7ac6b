#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "launch/daemon_args.h"
#include "launch/process.h"
#include "launch/run_files.h"
#include "launch/task_env.h"

namespace nopfs::launch {
namespace {

using namespace std::chrono_literals;

TEST(RunFiles, ReadyRoundTrips) {
  const ReadyInfo in{4242, 1'281'167, 0, false, {}};
  EXPECT_EQ(FormatReady(in), "pid=4242\nsamples=1281167\n");
  Result<ReadyInfo> out = ParseReady(FormatReady(in));
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->pid, 4242);
  EXPECT_EQ(out->samples, 1'281'167u);
  // Unknown keys are ignored, the order does not matter.
  out = ParseReady("samples=7\nversion=2\npid=1\n");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->samples, 7u);
}

// The peer link's port and line ride along for a job with peers; the line stays one line.
TEST(RunFiles, ReadyCarriesThePeerLink) {
  const ReadyInfo in{7, 120, 648, true,
                     "listening on 127.0.0.1:648\nforged=1; every other node answered"};
  const std::string text = FormatReady(in);
  EXPECT_EQ(text,
            "pid=7\nsamples=120\npeer_port=648\npeers_joined=1\n"
            "peers=listening on 127.0.0.1:648 forged=1; every other node answered\n");
  Result<ReadyInfo> out = ParseReady(text);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->peer_port, 648);
  EXPECT_TRUE(out->peers_joined);
  EXPECT_EQ(out->peers, "listening on 127.0.0.1:648 forged=1; every other node answered");
  Result<ReadyInfo> none = ParseReady("pid=7\nsamples=120\n");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->peer_port, 0);
  EXPECT_TRUE(none->peers.empty());
  EXPECT_FALSE(ParseReady("pid=7\nsamples=120\npeer_port=65536\n").ok());
  EXPECT_FALSE(ParseReady("pid=7\nsamples=120\npeer_port=6x\n").ok());
  EXPECT_FALSE(ParseReady("pid=7\nsamples=120\npeers_joined=2\n").ok());
  // Through the pipe as nopfsd sends it.
  Result<ReadyInfo> piped = ParseReady(ReadyMessage(in).substr(6));
  ASSERT_TRUE(piped.ok());
  EXPECT_EQ(piped->peers, out->peers);
}

TEST(RunFiles, ReadyTakesOnlyDigits) {
  for (const char* bad :
       {"", "pid=1\n", "samples=3\n", "pid=1\nsamples=-3\n", "pid=1\nsamples=3x\n",
        "pid=1\nsamples= 3\n", "pid=x\nsamples=3\n", "pid=1\nsamples=99999999999999999999999\n",
        "pid=1\nsamples=\n", "pid=99999999999\nsamples=3\n"}) {
    EXPECT_FALSE(ParseReady(bad).ok()) << bad;
  }
}

TEST(RunFiles, Layout) {
  Result<uint32_t> n = ParseLayout(FormatLayout(8));
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 8u);
  Result<uint32_t> e = ParseLayout(FormatLayoutError("nopfs: layout: 3 tasks on 2 nodes"));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.status().message(), "nopfs: layout: 3 tasks on 2 nodes");
  for (const char* bad :
       {"", "ranks_per_node=0", "ranks_per_node=4097", "ranks_per_node=2a", "ranks=2"}) {
    Result<uint32_t> r = ParseLayout(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

// A pipe whose write end a thread fills with `text` after `delay` and then closes.
struct Pipe {
  int fd[2];
  std::thread writer;
  Pipe(std::string text, std::chrono::milliseconds delay, bool close_it = true) {
    EXPECT_EQ(::pipe2(fd, O_CLOEXEC), 0);
    writer = std::thread([this, text, delay, close_it] {
      std::this_thread::sleep_for(delay);
      if (!text.empty()) {
        EXPECT_EQ(::write(fd[1], text.data(), text.size()), ssize_t(text.size()));
      }
      if (close_it) ::close(fd[1]);
    });
  }
  ~Pipe() {
    writer.join();
    ::close(fd[0]);
  }
};

std::chrono::steady_clock::time_point In(std::chrono::milliseconds d) {
  return std::chrono::steady_clock::now() + d;
}

TEST(RunFiles, WaitReadySaysWhatNopfsdSaid) {
  {
    Pipe p(ReadyMessage({77, 3000, 0, false, {}}), 50ms);
    Result<ReadyInfo> r = WaitReady(p.fd[0], In(5s), nullptr);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->pid, 77);
    EXPECT_EQ(r->samples, 3000u);
  }
  {
    Pipe p(FailedMessage("catalog: /data: permission denied"), 0ms);
    Result<ReadyInfo> r = WaitReady(p.fd[0], In(5s), nullptr);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(r.status().message(), "catalog: /data: permission denied");
  }
  {
    Pipe p("", 20ms);
    Result<ReadyInfo> r = WaitReady(p.fd[0], In(5s), nullptr);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  }
}

TEST(RunFiles, WaitReadyGivesUp) {
  Pipe p("", 400ms, /*close_it=*/true);
  const auto t0 = std::chrono::steady_clock::now();
  Result<ReadyInfo> r = WaitReady(p.fd[0], In(100ms), nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kTimedOut);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 350ms);
  int polls = 0;
  Pipe q("", 400ms, /*close_it=*/true);
  r = WaitReady(q.fd[0], In(5s), [&] { return ++polls > 2; });
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

TEST(TaskEnv, Variables) {
  TaskEnv t;
  t.socket = "/run/nopfs/n1/42/nopfsd.sock";
  t.run_dir = "/run/nopfs/n1/42";
  t.dataset = "/data/imagenet";
  t.node = 1;
  t.nodes = 3;
  t.local_rank = 2;
  t.ranks = 12;
  t.ranks_per_node = 4;
  t.seed = 18446744073709551615u;
  t.epochs = 90;
  t.batch = 1024;
  t.scheme = "strided";
  t.drop_last = true;
  t.samples = 1281167;
  std::map<std::string, std::string> v;
  for (const auto& [k, value] : t.Variables())
    v[k] = value;
  EXPECT_EQ(v.size(), 15u);
  EXPECT_EQ(v["NOPFS_RANK"], "6");
  EXPECT_EQ(v["NOPFS_RANKS"], "12");
  EXPECT_EQ(v["NOPFS_SEED"], "18446744073709551615");
  EXPECT_EQ(v["NOPFS_DROP_LAST"], "1");
  EXPECT_EQ(v["NOPFS_SAMPLES"], "1281167");
  EXPECT_EQ(v["NOPFS_SOCKET"], t.socket);
  // Without a service and without a known size those two are not set.
  t.socket.clear();
  t.samples = 0;
  v.clear();
  for (const auto& [k, value] : t.Variables())
    v[k] = value;
  for (const char* optional : kOptionalVariables)
    EXPECT_EQ(v.count(optional), 0u) << optional;
  EXPECT_EQ(v.size(), 13u);
}

// Parses argv (after argv[0]) with nopfsd's flags.
DaemonArgs Parse(const std::vector<std::string>& argv) {
  CLI::App app;
  DaemonArgs out;
  AddDaemonFlags(&app, &out);
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());
  app.parse(reversed);
  // As nopfsd does: F may come from the dataset; the rest is checked with a placeholder.
  const uint64_t samples = out.job.job.samples;
  if (samples == 0) out.job.job.samples = policy::kMaxSamples;
  EXPECT_TRUE(FinishJobFlags(&out.job).ok());
  out.job.job.samples = samples;
  return out;
}

TEST(DaemonArgs, RoundTripsThroughArgv) {
  DaemonArgs a;
  a.run_dir = "/run/nopfs/n1/42";
  a.dataset = "/data/with space";
  a.job.job.seed = 18446744073709551615u;
  a.job.job.samples = 5000;
  a.job.job.epochs = 3;
  a.job.job.ranks = 8;
  a.job.job.batch = 64;
  a.job.scheme = "uniform";
  a.job.job.drop_last = true;
  a.job.job.ranks_per_node = 4;
  a.node = 1;
  a.config = "/etc/nopfs/nopfs.conf.lua";
  a.job_id = "42";
  a.ram = "1073741824";
  a.ssd = "2GiB";
  a.plan_threads = 3;
  a.peers = "10.0.0.1:7000,10.0.0.2:7001";
  a.peer_listen = "10.0.0.2:7001";
  a.peer_secret_file = "/run/nopfs/n1/42/peer.secret";
  a.peer_provider = "tcp";
  a.peer_timeout_ms = 1500;
  a.peer_startup_timeout_ms = 25000;
  a.keep = true;
  a.keep_max_bytes = 123'456'789'012;
  a.share_running = false;
  a.summary = true;
  a.ready_fd = 3;
  a.allow_root = true;
  const DaemonArgs b = Parse(a.ToArgv());
  EXPECT_EQ(b.ToArgv(), a.ToArgv());
  EXPECT_EQ(b.run_dir, a.run_dir);
  EXPECT_EQ(b.dataset, a.dataset);
  EXPECT_EQ(b.job.job.seed, a.job.job.seed);
  EXPECT_EQ(b.job.job.samples, 5000u);
  EXPECT_EQ(b.job.job.epochs, 3u);
  EXPECT_EQ(b.job.job.ranks, 8u);
  EXPECT_EQ(b.job.job.batch, 64u);
  EXPECT_EQ(b.job.job.scheme, policy::Scheme::kUniform);
  EXPECT_TRUE(b.job.job.drop_last);
  EXPECT_EQ(b.job.job.ranks_per_node, 4u);
  EXPECT_EQ(b.node, 1u);
  EXPECT_EQ(b.config, a.config);
  EXPECT_EQ(b.job_id, "42");
  EXPECT_EQ(b.ram, a.ram);
  EXPECT_EQ(b.ssd, a.ssd);
  EXPECT_EQ(b.plan_threads, 3u);
  EXPECT_EQ(b.peers, a.peers);
  EXPECT_EQ(b.peer_listen, a.peer_listen);
  EXPECT_EQ(b.peer_secret_file, a.peer_secret_file);
  EXPECT_EQ(b.peer_provider, "tcp");
  EXPECT_EQ(b.peer_timeout_ms, 1500u);
  EXPECT_EQ(b.peer_startup_timeout_ms, 25000u);
  EXPECT_TRUE(b.keep);
  EXPECT_EQ(b.keep_max_bytes, 123'456'789'012u);
  EXPECT_FALSE(b.share_running);
  EXPECT_TRUE(b.summary);
  EXPECT_EQ(b.ready_fd, 3);
  EXPECT_TRUE(b.allow_root);
}

TEST(DaemonArgs, DefaultsStayDefaults) {
  DaemonArgs a;
  a.run_dir = "/tmp/r";
  a.dataset = "/tmp/d";
  const std::vector<std::string> argv = a.ToArgv();
  for (const char* absent : {"--samples", "--config", "--job-id", "--ram", "--ssd", "--peers",
                             "--ready-fd", "--allow-root", "--drop-last", "--peer-provider",
                             "--keep", "--keep-max-bytes", "--share-running"}) {
    EXPECT_EQ(std::count(argv.begin(), argv.end(), absent), 0) << absent;
  }
  const DaemonArgs b = Parse(argv);
  EXPECT_EQ(b.ToArgv(), argv);
  EXPECT_EQ(b.job_id, "local");
  EXPECT_EQ(b.ready_fd, -1);
  EXPECT_EQ(b.job.job.samples, 0u);
}

// A fresh directory under the test's temporary directory.
std::string FreshDir(const std::string& name) {
  const std::string dir =
      std::filesystem::path(testing::TempDir()).lexically_normal().string() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return std::filesystem::canonical(dir).string();
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Child, CleanEnvironmentDirectoryAndOutputFile) {
  const std::string dir = FreshDir("launch_child");
  ::setenv("NOPFS_TEST_INHERITED", "yes", 1);
  Child::Options o;
  o.clear_env = true;
  o.env = {{"ONLY", "this"}};
  o.cwd = dir;
  o.output_path = "out.txt";
  Result<Child> c =
      Child::Spawn({"/bin/sh", "-c", "env | grep -c = ; echo ONLY=$ONLY; pwd; echo err >&2"}, o);
  ASSERT_TRUE(c.ok()) << c.status().message();
  Result<int> st = c->Wait(10s);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(ExitCodeOf(*st), 0);
  const std::string out = Slurp(dir + "/out.txt");
  // The shell adds PWD (and may add SHLVL, _): at most those besides ONLY.
  std::istringstream lines(out);
  int count = 0;
  lines >> count;
  EXPECT_LE(count, 4) << out;
  EXPECT_EQ(out.find("NOPFS_TEST_INHERITED"), std::string::npos);
  EXPECT_NE(out.find("ONLY=this\n" + dir + "\nerr\n"), std::string::npos) << out;
  struct stat sb {};
  ASSERT_EQ(::stat((dir + "/out.txt").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
  std::filesystem::remove_all(dir);
}

TEST(Child, OutputFileIsNeverALink) {
  const std::string dir = FreshDir("launch_link");
  std::ofstream(dir + "/victim") << "precious";
  std::filesystem::create_symlink(dir + "/victim", dir + "/out.txt");
  Child::Options o;
  o.cwd = dir;
  o.output_path = "out.txt";
  Result<Child> c = Child::Spawn({"/bin/echo", "overwritten"}, o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("creating the output file"), std::string::npos)
      << c.status().message();
  EXPECT_EQ(Slurp(dir + "/victim"), "precious");
  std::filesystem::remove_all(dir);
}

TEST(Child, StdoutToAPipeAndKeptDescriptor) {
  int out[2];
  int extra[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(extra, O_CLOEXEC), 0);
  Child::Options o;
  o.stdout_fd = out[1];
  o.keep_fds = {extra[1]};
  const std::string script = "echo hello; echo kept >&" + std::to_string(extra[1]);
  Result<Child> c = Child::Spawn({"/bin/sh", "-c", script}, o);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ::close(out[1]);
  ::close(extra[1]);
  ASSERT_TRUE(c->Wait(10s).ok());
  char buf[64] = {};
  EXPECT_EQ(::read(out[0], buf, sizeof buf), 6);
  EXPECT_STREQ(buf, "hello\n");
  char buf2[64] = {};
  EXPECT_EQ(::read(extra[0], buf2, sizeof buf2), 5);
  EXPECT_STREQ(buf2, "kept\n");
  ::close(out[0]);
  ::close(extra[0]);
}

TEST(Child, ExecFailureAndRelease) {
  Result<Child> bad = Child::Spawn({"/nonexistent/program"}, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cannot run '/nonexistent/program'"), std::string::npos);
  Child::Options o;
  o.new_session = true;
  Result<Child> c = Child::Spawn({"/bin/sleep", "30"}, o);
  ASSERT_TRUE(c.ok());
  const pid_t pid = c->Release();
  EXPECT_FALSE(c->running());
  { Child gone = std::move(*c); }  // destroying a released Child leaves the process alone
  EXPECT_EQ(::kill(pid, 0), 0);
  EXPECT_EQ(::getsid(pid), pid);  // its own session
  ::kill(pid, SIGKILL);
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, 0), pid);
}

// A detached process is in another session than its launcher (not leading it: it can never get a
// controlling terminal), has /dev/null as 0, 1 and 2 and no other descriptor, ignores SIGHUP, and
// outlives the middle process, which the launcher has reaped when Detach returns.
TEST(Detach, LeavesASessionlessProcessWithNothingOpen) {
  const std::string dir = FreshDir("launch_detach");
  const std::string report_path = dir + "/report";
  const std::string tmp_path = dir + "/report.tmp";
  int kept[2];
  ASSERT_EQ(::pipe(kept), 0);  // not close-on-exec: only Detach closes it
  const pid_t launcher = ::getpid();
  const Detached d = Detach();
  if (d == Detached::kDetached) {
    std::string r;
    r += "session=" + std::to_string(::getsid(0) != ::getsid(launcher)) + "\n";
    r += "leader=" + std::to_string(::getsid(0) == ::getpid()) + "\n";
    r += "parent=" + std::to_string(::getppid() != launcher) + "\n";
    for (int fd = 0; fd <= 2; ++fd) {
      char target[64] = {};
      const std::string link = "/proc/self/fd/" + std::to_string(fd);
      const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
      r += "fd" + std::to_string(fd) + "=" + (n > 0 ? std::string(target, n) : "closed") + "\n";
    }
    r += "pipe=" + std::to_string(::fcntl(kept[0], F_GETFD) < 0 && errno == EBADF) +
         std::to_string(::fcntl(kept[1], F_GETFD) < 0 && errno == EBADF) + "\n";
    struct sigaction hup {};
    ::sigaction(SIGHUP, nullptr, &hup);
    r += "sighup=" + std::to_string(hup.sa_handler == SIG_IGN) + "\n";
    const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      (void)!::write(fd, r.data(), r.size());
      ::close(fd);
      ::rename(tmp_path.c_str(), report_path.c_str());
    }
    _exit(0);
  }
  ASSERT_EQ(d, Detached::kCaller);
  ::close(kept[1]);
  // The middle process is reaped; the detached one is not this process's child.
  errno = 0;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
  // Its copy of the pipe's write end is closed: the read end sees the end of the pipe.
  pollfd p{kept[0], POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1);
  char c;
  EXPECT_EQ(::read(kept[0], &c, 1), 0);
  ::close(kept[0]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!std::filesystem::exists(report_path) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const std::string report = Slurp(report_path);
  EXPECT_EQ(report,
            "session=1\nleader=0\nparent=1\nfd0=/dev/null\nfd1=/dev/null\nfd2=/dev/null\n"
            "pipe=11\nsighup=1\n");
}

// The capability sets of this thread: "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb" as in
// /proc/<pid>/status, and "NoNewPrivs".
std::map<std::string, std::string> CapsOf(const std::string& status_path) {
  std::map<std::string, std::string> out;
  std::istringstream in(Slurp(status_path));
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, colon);
    if (key.rfind("Cap", 0) == 0 || key == "NoNewPrivs") {
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      out[key] = v;
    }
  }
  return out;
}

// Binds 127.0.0.1 on the first port of 600..987 that is free to bind; returns it, or -errno of
// the last refusal (-EACCES for a process that may not bind privileged ports).
int BindPrivileged() {
  int last = -EADDRINUSE;
  for (int port = 600; port <= 987; ++port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    last = rc == 0 ? port : -errno;
    ::close(fd);
    if (rc == 0 || last == -EACCES) return last;
  }
  return last;
}

constexpr uid_t kNobody = 65534;

// A user's program started with ambient CAP_NET_BIND_SERVICE holds that capability and no other
// (effective, permitted, ambient and bounding), can bind a privileged port, and cannot become
// root again; the same program started without it cannot bind one.
TEST(Child, KeepsOnlyTheAmbientCapabilityAskedFor) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  const std::string dir = FreshDir("launch_caps");
  ASSERT_EQ(::chown(dir.c_str(), kNobody, kNobody), 0);
  const std::string script =
      "import socket, sys\n"
      "print(open('/proc/self/status').read())\n"
      "for port in range(600, 988):\n"
      "    s = socket.socket()\n"
      "    try:\n"
      "        s.bind(('127.0.0.1', port)); print('bound', port); break\n"
      "    except PermissionError:\n"
      "        print('refused'); break\n"
      "    except OSError:\n"
      "        pass\n"
      "sys.stdout.flush()\n"
      "sys.stdin.read()\n";
  for (const bool keep : {true, false}) {
    int in[2];
    ASSERT_EQ(::pipe2(in, O_CLOEXEC), 0);
    Child::Options o;
    o.switch_user = true;
    o.uid = kNobody;
    o.gid = kNobody;
    if (keep) o.ambient_caps = {CAP_NET_BIND_SERVICE};
    o.cwd = dir;
    o.output_path = "out.txt";
    o.stdin_fd = in[0];
    Result<Child> c = Child::Spawn({"/usr/bin/python3", "-c", script}, o);
    ::close(in[0]);
    ASSERT_TRUE(c.ok()) << c.status().message();
    // Another process of the same user, with no capability, may not look into it while it holds
    // one (the kernel's ptrace access check, which /proc/PID/environ, /proc/PID/mem and ptrace
    // share: the target's permitted set must be within the caller's); it may once it holds none.
    const pid_t peeker = ::fork();
    ASSERT_GE(peeker, 0);
    if (peeker == 0) {
      if (setresgid(kNobody, kNobody, kNobody) != 0 || setresuid(kNobody, kNobody, kNobody) != 0) {
        _exit(3);
      }
      const std::string environ_path = "/proc/" + std::to_string(c->pid()) + "/environ";
      const int fd = ::open(environ_path.c_str(), O_RDONLY | O_CLOEXEC);
      _exit(fd >= 0 ? 0 : errno == EACCES ? 1 : 2);
    }
    int peeked = 0;
    ASSERT_EQ(::waitpid(peeker, &peeked, 0), peeker);
    EXPECT_EQ(ExitCodeOf(peeked), keep ? 1 : 0);
    ::close(in[1]);
    Result<int> st = c->Wait(30s);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(ExitCodeOf(*st), 0);
    const std::string out = Slurp(dir + "/out.txt");
    std::ofstream(dir + "/status") << out;
    const std::map<std::string, std::string> caps = CapsOf(dir + "/status");
    const std::string want = keep ? "0000000000000400" : "0000000000000000";  // bit 10
    EXPECT_EQ(caps.at("CapEff"), want) << out;
    EXPECT_EQ(caps.at("CapPrm"), want) << out;
    EXPECT_EQ(caps.at("CapAmb"), want) << out;
    if (keep) {
      EXPECT_EQ(caps.at("CapBnd"), want) << out;
    }
    EXPECT_NE(out.find(keep ? "bound " : "refused"), std::string::npos) << out;
  }
  std::filesystem::remove_all(dir);
}

// nopfsd's drop (DropAllCapabilities) in a process started as Child gives one: after it the
// process holds nothing, has no_new_privs, and may no longer bind a privileged port; with a
// second thread it refuses and drops nothing, since that thread would keep its own.
TEST(Capabilities, DropAllLeavesNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch users";
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // As Child::Spawn with ambient_caps: nobody with CAP_NET_BIND_SERVICE alone.
    std::string report;
    prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0);
    if (setresgid(kNobody, kNobody, kNobody) != 0 || setresuid(kNobody, kNobody, kNobody) != 0) {
      _exit(3);
    }
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2] = {};
    data[0].effective = data[0].permitted = data[0].inheritable = 1u << CAP_NET_BIND_SERVICE;
    if (syscall(SYS_capset, &header, data) != 0 ||
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_BIND_SERVICE, 0, 0) != 0) {
      _exit(4);
    }
    report += "before=" + std::to_string(BindPrivileged() > 0) + "\n";
    {
      // A second thread: refused, nothing dropped.
      std::atomic<bool> done{false};
      std::thread t([&] {
        while (!done)
          std::this_thread::sleep_for(1ms);
      });
      const Status s = DropAllCapabilities();
      report += "threaded=" + std::to_string(static_cast<int>(s.code())) + "\n";
      done = true;
      t.join();
    }
    report += "kept=" + std::to_string(BindPrivileged() > 0) + "\n";
    const Status s = DropAllCapabilities();
    report += "dropped=" + std::to_string(s.ok()) + "\n";
    report += "after=" + std::to_string(BindPrivileged()) + "\n";
    report += "again=" + std::to_string(DropAllCapabilities().ok()) + "\n";
    report += Slurp("/proc/self/status");
    ssize_t ignored = ::write(pipefd[1], report.data(), report.size());
    (void)ignored;
    _exit(0);
  }
  ::close(pipefd[1]);
  std::string report;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0)
    report.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_EQ(ExitCodeOf(status), 0) << report;
  EXPECT_NE(report.find("before=1\n"), std::string::npos) << report;
  EXPECT_NE(report.find("threaded=" +
                        std::to_string(static_cast<int>(StatusCode::kFailedPrecondition)) + "\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("kept=1\n"), std::string::npos) << report;
  EXPECT_NE(report.find("dropped=1\n"), std::string::npos) << report;
  EXPECT_NE(report.find("after=" + std::to_string(-EACCES) + "\n"), std::string::npos) << report;
  EXPECT_NE(report.find("again=1\n"), std::string::npos) << report;
  const std::string path = FreshDir("launch_drop") + "/status";
  std::ofstream(path) << report;
  const std::map<std::string, std::string> caps = CapsOf(path);
  for (const char* key : {"CapInh", "CapPrm", "CapEff", "CapAmb"})
    EXPECT_EQ(caps.at(key), "0000000000000000") << key << "\n" << report;
  EXPECT_EQ(caps.at("NoNewPrivs"), "1") << report;
}

}  // namespace
}  // namespace nopfs::launch
