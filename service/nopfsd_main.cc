// nopfsd: the per-job per-node cache service. Started by the Slurm plugin at job start (as the
// job's user) or by `nopfs run`; stopped by SIGTERM (or SIGINT, SIGHUP). See docs/architecture.md.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include "common/units.h"
#include "launch/job_flags.h"
#include "service/daemon.h"
#include "service/run_dir.h"

namespace {

using nopfs::Status;
namespace service = nopfs::service;

struct Flags {
  nopfs::launch::JobFlags job;
  service::DaemonOptions daemon;
  std::string ram;
  std::string ssd;
  bool allow_root = false;
};

// --ready-fd: the write end of a pipe that the Slurm plugin's launcher (root) created. nopfsd
// writes "ready\n" plus the ready file's text, or "failed\n" and the reason, then closes it; the
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
    (void)service::WriteFileAtomically(run_dir, service::kFailedName, s.message() + "\n");
  TellLauncher("failed\n" + s.message() + "\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"nopfsd: the nopfs cache service of one job on one node"};
  Flags f;
  app.add_option("--run-dir", f.daemon.run_dir, "The job's run directory (socket, log)")
      ->required();
  app.add_option("--dataset", f.daemon.dataset, "ImageFolder directory or manifest file")
      ->required();
  nopfs::launch::AddJobFlags(&app, &f.job, /*samples_required=*/false);
  app.add_option("--node", f.daemon.node, "This node's index in the job")->capture_default_str();
  app.add_option("--config", f.daemon.config_path, "Node config (Lua)");
  app.add_option("--job-id", f.daemon.job_id,
                 "The job's id (names the shared memory and SSD "
                 "directory)")
      ->capture_default_str();
  app.add_option("--ram", f.ram, "RAM granted to the job on this node (default: the config's)");
  app.add_option("--ssd", f.ssd, "SSD granted to the job on this node (default: the config's)");
  app.add_option("--plan-threads", f.daemon.plan_threads, "Planner threads (0: all cores)");
  app.add_option("--peers", f.daemon.peers,
                 "Every node's HOST:PORT for peer reads, in node order (docs/fabric.md)");
  app.add_option("--peer-listen", f.daemon.peer_listen,
                 "This node's HOST:PORT (must be its entry of --peers)");
  app.add_option("--peer-secret-file", f.daemon.peer_secret_file,
                 "The job's peer secret: 32 bytes, mode 0600 (needed with --peers)");
  app.add_option("--peer-provider", f.daemon.peer_provider, "libfabric provider")
      ->capture_default_str();
  app.add_option("--peer-timeout-ms", f.daemon.peer_timeout_ms,
                 "A peer silent this long is dead for the rest of the job")
      ->capture_default_str();
  app.add_option("--ready-fd", g_ready_fd,
                 "Also say ready/failed on this inherited pipe (the Slurm launcher's)");
  app.add_flag("--allow-root", f.allow_root,
               "Run even as root (only for a personal machine: nopfsd is meant to run as the "
               "job's user)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
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
  const uint64_t samples = f.job.job.samples;
  if (samples == 0)
    f.job.job.samples = nopfs::policy::kMaxSamples;  // F from the dataset; check the rest
  if (Status s = nopfs::launch::FinishJobFlags(&f.job); !s.ok()) {
    std::fprintf(stderr, "nopfsd: %s\n", s.message().c_str());
    return 2;
  }
  f.job.job.samples = samples;
  f.daemon.job = f.job.job;
  f.daemon.uid = static_cast<uint32_t>(geteuid());
  for (auto [text, out] :
       {std::pair{&f.ram, &f.daemon.ram_grant}, std::pair{&f.ssd, &f.daemon.ssd_grant}}) {
    if (text->empty()) continue;
    nopfs::Result<uint64_t> v = nopfs::ParseSize(*text);
    if (!v.ok()) {
      std::fprintf(stderr, "nopfsd: %s\n", v.status().message().c_str());
      return 2;
    }
    *out = *v;
  }

  const std::string& dir = f.daemon.run_dir;
  if (Status s = service::PrepareRunDir(dir); !s.ok()) return StartFailed("", s);
  if (Status s = service::ClearStaleState(dir); !s.ok()) return StartFailed("", s);
  umask(077);
  try {
    auto log = spdlog::basic_logger_mt("nopfsd", dir + "/" + service::kLogName);
    log->set_pattern("%Y-%m-%d %H:%M:%S.%e %n[%t] %l: %v");
    log->flush_on(spdlog::level::info);
    spdlog::set_default_logger(log);
  } catch (const spdlog::spdlog_ex& e) {
    return StartFailed(dir, Status::IoError(std::string("opening the log: ") + e.what()));
  }
  if (Status s =
          service::WriteFileAtomically(dir, service::kPidName, std::to_string(getpid()) + "\n");
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

  nopfs::Result<std::unique_ptr<service::Daemon>> daemon = service::Daemon::Start(f.daemon);
  if (!daemon.ok()) {
    const int rc = StartFailed(dir, daemon.status());
    unlink((dir + "/" + service::kPidName).c_str());
    return rc;
  }
  spdlog::set_level(spdlog::level::from_str((*daemon)->log_level()));
  const std::string ready = "pid=" + std::to_string(getpid()) +
                            "\nsamples=" + std::to_string((*daemon)->samples()) + "\n";
  if (Status s = service::WriteFileAtomically(dir, service::kReadyName, ready); !s.ok()) {
    return StartFailed(dir, s);
  }
  TellLauncher("ready\n" + ready);
  spdlog::info("ready");

  int sig = 0;
  while (sigwait(&stop, &sig) != 0) {
  }
  spdlog::info("{} received: stopping", sigabbrev_np(sig) ? sigabbrev_np(sig) : "signal");
  unlink((dir + "/" + service::kReadyName).c_str());
  (*daemon)->Stop();
  daemon->reset();
  unlink((dir + "/" + service::kPidName).c_str());
  spdlog::info("exit");
  spdlog::shutdown();
  return 0;
}
