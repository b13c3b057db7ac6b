// nopfsd: the per-job per-node cache service. Started by the Slurm plugin at job start (as the
// job's user) or by `nopfs run`; stopped by SIGTERM (or SIGINT, SIGHUP). See docs/architecture.md.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/phases.h"
#include "common/units.h"
#include "common/version.h"
#include "fabric/endpoint.h"
#include "launch/daemon_args.h"
#include "launch/process.h"
#include "launch/run_files.h"
#include "service/daemon/daemon.h"
#include "service/daemon/log_file.h"
#include "service/daemon/run_dir.h"

namespace {

using nopfs::Status;
namespace service = nopfs::service;
namespace launch = nopfs::launch;

// --ready-fd: the write end of a pipe that the launcher (nopfs-job as root, or `nopfs run`)
// created. nopfsd writes launch::ReadyMessage or launch::FailedMessage there, then closes it; the
// launcher learns readiness there instead of reading files in the user's run directory.
int g_ready_fd = -1;

void TellLauncher(const std::string& text) {
  if (g_ready_fd < 0) return;
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(g_ready_fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(g_ready_fd);
  g_ready_fd = -1;
}

// Start-up failed: say why where `nopfs run` and the Slurm plugin look (the `failed` file, the
// launcher's pipe and stderr) and in the log.
int StartFailed(const std::string& run_dir, const Status& s) {
  spdlog::error("start-up failed: {}", s.message());
  std::fprintf(stderr, "nopfsd: %s\n", s.message().c_str());
  if (!run_dir.empty())
    (void)service::WriteFileAtomically(run_dir, launch::kFailedName, s.message() + "\n");
  TellLauncher(launch::FailedMessage(s.message()));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  nopfs::Phases phases;  // the start-up's, logged once ready
  CLI::App app{"nopfsd: the nopfs cache service of one job on one node"};
  nopfs::launch::DaemonArgs f;
  nopfs::launch::AddDaemonFlags(&app, &f);
  app.set_version_flag("--version", std::string("nopfsd (nopfs) ") + nopfs::kVersion);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  g_ready_fd = f.ready_fd;
  if (g_ready_fd >= 0) {
    signal(SIGPIPE, SIG_IGN);  // a launcher that gave up must not kill us with our answer
    if (fcntl(g_ready_fd, F_SETFD, FD_CLOEXEC) != 0) g_ready_fd = -1;
  }
  if (geteuid() == 0 && !f.allow_root) {
    std::fprintf(stderr,
                 "nopfsd: refusing to run as root: it runs as the job's user, so that the job's "
                 "files, sockets and memory belong to that user (the Slurm plugin starts it so); "
                 "pass --allow-root on a personal machine\n");
    return 2;
  }
  // libfabric's tunables that nopfs sets a default for (fabric/endpoint.h), while this process
  // has one thread: setenv is not safe against another thread's getenv.
  const std::vector<std::string> fabric_defaults =
      f.peers.empty() ? std::vector<std::string>() : nopfs::fabric::SetLibfabricDefaults();
  const uint64_t samples = f.job.job.samples;
  if (samples == 0)
    f.job.job.samples = nopfs::policy::kMaxSamples;  // F from the dataset; check the rest
  if (Status s = nopfs::launch::FinishJobFlags(&f.job); !s.ok()) {
    std::fprintf(stderr, "nopfsd: %s\n", s.message().c_str());
    return 2;
  }
  f.job.job.samples = samples;
  service::DaemonOptions options;
  options.run_dir = f.run_dir;
  options.dataset = f.dataset;
  options.config_path = f.config;
  options.job_id = f.job_id;
  options.job = f.job.job;
  options.node = f.node;
  options.plan_threads = f.plan_threads;
  options.uid = static_cast<uint32_t>(geteuid());
  options.peers = f.peers;
  options.peer_listen = f.peer_listen;
  options.peer_secret_file = f.peer_secret_file;
  options.peer_provider = f.peer_provider;
  options.peer_timeout_ms = f.peer_timeout_ms;
  options.peer_startup_timeout_ms = f.peer_startup_timeout_ms;
  options.keep = f.keep;
  options.keep_max_bytes = f.keep_max_bytes;
  options.share_running = f.share_running;
  options.shared_socket = f.shared_socket;
  options.shared_dataset = f.shared_dataset;
  options.summary = f.summary;
  // The Slurm launcher starts nopfsd with CAP_NET_BIND_SERVICE alone (ambient), so that it can
  // bind its peer port in the privileged range no user can take; it is given up for good as soon
  // as the port is bound, before the daemon reads the node config or the dataset. (A root
  // nopfsd, --allow-root on a personal machine, keeps what root has.)
  if (geteuid() != 0) options.after_peer_bind = [] { return launch::DropAllCapabilities(); };
  for (auto [text, out] :
       {std::pair{&f.ram, &options.ram_grant}, std::pair{&f.ssd, &options.ssd_grant}}) {
    if (text->empty()) continue;
    nopfs::Result<uint64_t> v = nopfs::ParseSize(*text);
    if (!v.ok()) {
      std::fprintf(stderr, "nopfsd: %s\n", v.status().message().c_str());
      return 2;
    }
    *out = *v;
  }

  const std::string& dir = options.run_dir;
  if (Status s = service::PrepareRunDir(dir); !s.ok()) return StartFailed("", s);
  if (Status s = service::ClearStaleState(dir); !s.ok()) return StartFailed("", s);
  umask(077);
  {
    nopfs::Result<std::shared_ptr<service::LogFileSink>> sink =
        service::LogFileSink::Open(dir + "/" + launch::kLogName);
    if (!sink.ok()) return StartFailed(dir, sink.status());
    auto log = std::make_shared<spdlog::logger>("nopfsd", *sink);
    log->set_pattern("%Y-%m-%d %H:%M:%S.%e %n[%t] %l: %v");
    spdlog::set_default_logger(log);
  }
  if (Status s =
          service::WriteFileAtomically(dir, launch::kPidName, std::to_string(getpid()) + "\n");
      !s.ok()) {
    return StartFailed(dir, s);
  }

  // Signals are taken by sigwait below; every thread started from here on inherits the mask.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  for (const std::string& name : fabric_defaults) {
    spdlog::info("peers: {}={} (nopfs's default; the environment did not set it)", name,
                 std::getenv(name.c_str()));
  }
  phases.Mark("setup");
  nopfs::Result<std::unique_ptr<service::Daemon>> daemon = service::Daemon::Start(options);
  phases.Skip();  // the daemon's own phases
  if (!daemon.ok()) {
    const int rc = StartFailed(dir, daemon.status());
    (void)service::LocalIo::Default()->Unlink(dir + "/" + launch::kPidName);
    return rc;
  }
  spdlog::set_level(spdlog::level::from_str((*daemon)->log_level()));
  const nopfs::launch::ReadyInfo ready{getpid(), (*daemon)->samples(), (*daemon)->peer_port(),
                                       (*daemon)->peers_joined(), (*daemon)->peer_note()};
  if (Status s = service::WriteFileAtomically(dir, launch::kReadyName, launch::FormatReady(ready));
      !s.ok()) {
    // No ready file, no job: stop serving before saying so, and leave no pid file behind.
    (*daemon)->Stop();
    (void)service::LocalIo::Default()->Unlink(dir + "/" + launch::kPidName);
    return StartFailed(dir, s);
  }
  TellLauncher(launch::ReadyMessage(ready));
  phases.Mark("ready");
  spdlog::info("ready");
  // One line of where the start-up went (docs/service.md, "Start-up"): from main() to the ready
  // pipe, the daemon's phases between this process's own.
  {
    std::string text = phases.ToString();
    const size_t ready_at = text.rfind(", ready ");
    text.insert(ready_at, ", " + (*daemon)->startup_phases().ToString());
    spdlog::info("start-up in {:.2f} s: {}", phases.total() + (*daemon)->startup_phases().total(),
                 text);
  }

  int sig = 0;
  while (sigwait(&stop, &sig) != 0) {
  }
  spdlog::info("{} received: stopping", sigabbrev_np(sig) ? sigabbrev_np(sig) : "signal");
  service::LocalIo* io = service::LocalIo::Default();
  (void)io->Unlink(dir + "/" + launch::kReadyName);
  (*daemon)->Stop();
  daemon->reset();
  (void)io->Unlink(dir + "/" + launch::kPidName);
  spdlog::info("exit");
  spdlog::shutdown();
  return 0;
}
