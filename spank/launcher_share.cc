// Shared datasets on the node (docs/admin.md, "Shared datasets"): `nopfs-job share-serve`, the
// node's share service (share/server.h), and what the prolog does for a job whose dataset the node
// config declares shared: it makes sure the service runs (starting it, detached, when it does not
// answer) and tells nopfsd where it is.
//
//   nopfs-job share-serve [--plugstack=FILE | --config=PATH --dir=DIR] [--node=NAME]
//             [--idle-exit=SECONDS]
//
// The copies are kept in <first SSD class's path>/.nopfs-shared/<node>/ (root's, 0700; the node's
// name in the path because nodes on one machine, as in the local test cluster, share a path).
// DIR is <rundir>/<node>/share, root's, 0755: the service's lock (one service per node), its
// socket (0666: a proof per file, not the socket's mode, decides what an asker gets) and its log.
// The service runs as root with one capability, CAP_DAC_READ_SEARCH (reading the PFS), and
// no_new_privs; its copies are root's files in root's 0700 directory. It exits after
// kShareIdleExit without a connection (--idle-exit), and the next prolog that needs it starts it
// again; nopfs-share.service runs it with --plugstack (the plugin's config= and rundir=) and
// --idle-exit=0. --node defaults to the short host name.
#include <linux/capability.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <charconv>
#include <filesystem>

#include "common/lock_file.h"
#include "common/printable.h"
#include "share/client.h"
#include "share/server.h"
#include "spank/launcher.h"

namespace nopfs::spank::launcher {

using namespace std::chrono_literals;

namespace {

constexpr auto kShareIdleExit = 10min;
constexpr auto kShareStartWait = 10s;
constexpr char kShareDir[] = "share";
constexpr char kShareSocket[] = "socket";
constexpr char kShareLock[] = "lock";
constexpr char kShareLog[] = "serve.log";

// Keeps CAP_DAC_READ_SEARCH alone (permitted and effective; every other capability leaves the
// bounding set) and sets no_new_privs.
Status KeepReadSearchOnly() {
  for (int cap = 0; cap <= CAP_LAST_CAP; ++cap) {
    if (cap != CAP_DAC_READ_SEARCH && ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 &&
        errno != EINVAL) {
      return Status::FromErrno(errno, "share: dropping capability " + std::to_string(cap));
    }
  }
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  data[0].permitted = data[0].effective = 1u << CAP_DAC_READ_SEARCH;
  if (::syscall(SYS_capset, &header, data) != 0) return Status::FromErrno(errno, "share: capset");
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return Status::FromErrno(errno, "share: no_new_privs");
  }
  return Status::Ok();
}

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

std::string ShareDir(const std::string& node_dir) {
  return node_dir + "/" + kShareDir;
}

int ShareServe(int argc, char** argv) {
  constexpr char kUsage[] =
      "; usage: nopfs-job share-serve [--plugstack=FILE | --config=PATH --dir=DIR] [--node=NAME] "
      "[--idle-exit=SECONDS]";
  std::string config_path, dir, node, plugstack;
  auto idle_exit = std::chrono::duration_cast<std::chrono::milliseconds>(kShareIdleExit);
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--config=", 0) == 0) {
      config_path = a.substr(9);
    } else if (a.rfind("--dir=", 0) == 0) {
      dir = a.substr(6);
    } else if (a.rfind("--node=", 0) == 0) {
      node = a.substr(7);
    } else if (a.rfind("--plugstack=", 0) == 0) {
      plugstack = a.substr(12);
    } else if (a.rfind("--idle-exit=", 0) == 0) {
      const std::string v = a.substr(12);
      uint64_t s = 0;
      const auto r = std::from_chars(v.data(), v.data() + v.size(), s);
      if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size() || s > 1'000'000'000) {
        Say("nopfs-job share-serve: --idle-exit=" + Printable(v) +
            ": write the seconds without a connection before it exits (0: never)");
        return 1;
      }
      idle_exit = std::chrono::seconds(s);
    } else {
      Say("nopfs-job share-serve: unknown argument " + Printable(a) + kUsage);
      return 1;
    }
  }
  if (node.empty()) {
    // As `nopfs-job placement` and `nopfs share warm`: the short host name.
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) == 0) node = host;
    node = node.substr(0, node.find('.'));
  }
  if (!plugstack.empty()) {
    // The plugin's own config= and rundir=, so that the service is the one its prologs find.
    if (!config_path.empty() || !dir.empty()) {
      Say("nopfs-job share-serve: give --plugstack=FILE or --config and --dir, not both");
      return 1;
    }
    Result<std::vector<std::string>> words = PlugstackArgs(plugstack);
    Result<PluginArgs> pa = words.ok() ? ParsePluginArgs(*words) : words.status();
    if (!pa.ok()) {
      Say("nopfs-job share-serve: " + pa.status().message());
      return 1;
    }
    config_path = NodeConfigPath(pa->config, node);
    dir = ShareDir(pa->rundir + "/" + node);
  }
  if (dir.empty() || dir.front() != '/' || !CheckComponent("node name", node).ok()) {
    Say("nopfs-job share-serve: give --dir=<rundir>/<node>/share and --node=<node>" +
        std::string(kUsage));
    return 1;
  }
  if (::geteuid() != 0) {
    Say("nopfs-job share-serve: must run as root (it reads the PFS for every user)");
    return 1;
  }
  if (Status s = EnsureRootDir(dir, 0755); !s.ok()) {
    Say("nopfs-job share-serve: " + s.message());
    return 1;
  }
  Result<int> lock = LockFileIn(dir, kShareLock);
  if (!lock.ok()) {
    Say("nopfs-job share-serve: " + lock.status().message());
    return 1;
  }
  if (*lock < 0) return 0;  // another one serves
  const UniqueFd held(*lock);
  Result<lua::NodeConfig> config = config_path.empty()
                                       ? lua::DefaultNodeConfig(lua::HostMemoryBytes())
                                       : lua::LoadNodeConfig(config_path);
  if (!config.ok()) {
    Say("nopfs-job share-serve: config: " + config.status().message());
    return 1;
  }
  share::ServerOptions o;
  o.socket_path = dir + "/" + kShareSocket;
  if (Status s = EnsureRootDir(config->shared_store_dir(), 0700); !s.ok()) {
    Say("nopfs-job share-serve: " + s.message());
    return 1;
  }
  o.store_dir = config->shared_store_dir() + "/" + node;
  for (const lua::SharedDecl& d : config->shared())
    o.datasets.push_back({d.path, d.ssd});
  o.idle_exit = idle_exit;
  o.log = Say;
  if (o.datasets.empty()) {
    Say("nopfs-job share-serve: the node config declares no shared dataset");
    return 1;
  }
  // SIGTERM, SIGINT and SIGHUP end the service cleanly (its manifests written): blocked here,
  // before any thread, and taken by one thread with sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int sig : {SIGTERM, SIGINT, SIGHUP})
    sigaddset(&stop_signals, sig);
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  Result<std::unique_ptr<share::Server>> server = share::Server::Start(o);
  if (!server.ok()) {
    Say("nopfs-job share-serve: " + server.status().message());
    return 1;
  }
  if (Status s = KeepReadSearchOnly(); !s.ok()) {
    Say("nopfs-job share-serve: " + s.message());
    return 1;
  }
  std::string names;
  for (const share::SharedDataset& d : o.datasets)
    names += (names.empty() ? "" : ", ") + d.path + " (" +
             FormatBytes(static_cast<double>(d.quota)) + ")";
  Say("nopfs-job share-serve: pid " + std::to_string(::getpid()) + " serving " + names + " from " +
      o.store_dir + " on " + o.socket_path);
  share::Server* s = server->get();
  std::thread([s, stop_signals] {
    int sig = 0;
    if (::sigwait(&stop_signals, &sig) == 0) {
      Say("nopfs-job share-serve: signal " + std::to_string(sig) + ", stopping");
      s->Stop();
    }
  }).detach();
  s->Run();
  server->reset();  // the manifests are written
  Say("nopfs-job share-serve: exiting");
  std::fflush(stdout);
  ::_exit(0);  // the signal thread may still wait
}

Result<std::string> EnsureShareService(const Job& job, const char* self) {
  const std::string dir = ShareDir(job.node_dir);
  NOPFS_RETURN_IF_ERROR(EnsureRootDir(dir, 0755));
  const std::string socket = dir + "/" + kShareSocket;
  share::ShareClient probe(socket, "", 2s);
  if (probe.Ping().ok()) return socket;
  std::string me = self;
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) me.assign(buf, static_cast<size_t>(n));
  std::vector<std::string> argv = {me, "share-serve", "--dir=" + dir, "--node=" + job.node};
  if (!job.args.config.empty()) argv.push_back("--config=" + job.args.config);
  launch::Child::Options o;
  o.clear_env = true;
  o.env = {{"PATH", "/usr/sbin:/usr/bin:/sbin:/bin"}, {"LANG", "C.UTF-8"}};
  o.new_session = true;
  o.cwd = dir;
  o.output_path = kShareLog;
  const UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  o.stdin_fd = null_fd.get();
  std::fflush(nullptr);
  Result<launch::Child> child = launch::Child::Spawn(argv, o);
  if (!child.ok()) return child.status();
  // It outlives this launcher; it exits when idle. A second one started at the same moment
  // finds the lock held and exits at once: reaped here when it is ours.
  const pid_t pid = child->Release();
  const auto deadline = std::chrono::steady_clock::now() + kShareStartWait;
  while (std::chrono::steady_clock::now() < deadline) {
    if (probe.Ping().ok()) {
      ::waitpid(pid, nullptr, WNOHANG);
      return socket;
    }
    std::this_thread::sleep_for(50ms);
  }
  ::waitpid(pid, nullptr, WNOHANG);
  Result<std::string> log = ReadUserFile(dir + "/" + kShareLog, 0, 1 << 16);
  return Status::Unavailable(
      "the share service did not start" +
      (log.ok() && !LastLine(*log).empty() ? ": " + Printable(LastLine(*log)) : std::string()));
}

}  // namespace nopfs::spank::launcher
