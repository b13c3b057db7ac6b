#include "cli/cmd_run.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/job_flags.h"
#include "cli/process.h"
#include "cli/status_text.h"
#include "client/client.h"
#include "service/run_dir.h"

namespace nopfs::cli {
namespace {

namespace fs = std::filesystem;

struct RunFlags {
  JobFlags job;
  std::string dataset;
  std::string config;
  std::string run_dir;
  uint32_t node = 0;
  double start_timeout = 3600;  // seconds: a first scan of a large dataset takes a while
  double stop_timeout = 30;
  bool keep_run_dir = false;
  bool quiet = false;
  std::vector<std::string> command;
};

std::atomic<int> g_signal{0};
void OnSignal(int sig) {
  g_signal.store(sig);
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "nopfs run: %s\n", msg.c_str());
  return 2;
}

// nopfsd sits beside nopfs (both land in <build>/bin and in <prefix>/bin).
std::string DaemonPath() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path beside = self.parent_path() / "nopfsd";
    if (access(beside.c_str(), X_OK) == 0) return beside.string();
  }
  return "nopfsd";  // PATH
}

std::string ReadFileOr(const std::string& path, const std::string& fallback) {
  std::ifstream in(path);
  if (!in) return fallback;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// key=value lines of the ready file.
std::map<std::string, std::string> ParseReady(const std::string& text) {
  std::map<std::string, std::string> kv;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

std::string LogTail(const std::string& run_dir) {
  std::ifstream in(run_dir + "/" + service::kLogName);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (lines.size() > 20) lines.erase(lines.begin());
  }
  std::string out;
  for (const std::string& l : lines)
    out += "  " + l + "\n";
  return out;
}

int RunJob(RunFlags& f, bool ranks_per_node_given) {
  if (!ranks_per_node_given) f.job.job.ranks_per_node = f.job.job.ranks;
  // F comes from the dataset; validate the rest with a placeholder.
  const uint64_t given_samples = f.job.job.samples;
  if (f.job.job.samples == 0) f.job.job.samples = 1;
  if (Status s = FinishJobFlags(&f.job); !s.ok()) return Fail(s.message());
  f.job.job.samples = given_samples;
  const policy::JobSpec& job = f.job.job;
  if (f.node >= job.nodes()) {
    return Fail("--node " + std::to_string(f.node) + " is out of range: the job has " +
                std::to_string(job.nodes()) + " nodes");
  }
  std::error_code ec;
  const fs::path dataset = fs::absolute(f.dataset, ec);
  if (ec || !fs::exists(dataset)) {
    return Fail("--dataset " + f.dataset + ": no such file or directory");
  }

  bool made_run_dir = false;
  if (f.run_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    f.run_dir = std::string(tmp != nullptr && *tmp == '/' ? tmp : "/tmp") + "/nopfs-run-" +
                std::to_string(getuid()) + "-" + std::to_string(getpid());
    made_run_dir = true;
  } else {
    f.run_dir = fs::absolute(f.run_dir).string();
    made_run_dir = !fs::exists(f.run_dir);
  }
  if (Status s = service::PrepareRunDir(f.run_dir); !s.ok()) return Fail(s.message());
  const std::string socket = f.run_dir + "/" + service::kSocketName;

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);

  std::vector<std::string> dargv = {DaemonPath(),
                                    "--run-dir",
                                    f.run_dir,
                                    "--dataset",
                                    dataset.string(),
                                    "--seed",
                                    std::to_string(job.seed),
                                    "--epochs",
                                    std::to_string(job.epochs),
                                    "--ranks",
                                    std::to_string(job.ranks),
                                    "--batch",
                                    std::to_string(job.batch),
                                    "--scheme",
                                    f.job.scheme,
                                    "--ranks-per-node",
                                    std::to_string(job.ranks_per_node),
                                    "--node",
                                    std::to_string(f.node)};
  if (job.drop_last) dargv.push_back("--drop-last");
  if (job.samples != 0) {
    dargv.push_back("--samples");
    dargv.push_back(std::to_string(job.samples));
  }
  if (!f.config.empty()) {
    dargv.push_back("--config");
    dargv.push_back(fs::absolute(f.config).string());
  }
  Child::Options dopt;
  dopt.die_with_parent = true;
  Result<Child> daemon = Child::Spawn(dargv, dopt);
  if (!daemon.ok()) return Fail(daemon.status().message());

  // Wait for `ready` (or `failed`, or the daemon's death).
  const auto start = std::chrono::steady_clock::now();
  std::map<std::string, std::string> ready;
  for (;;) {
    const std::string text = ReadFileOr(f.run_dir + "/" + service::kReadyName, "");
    if (!text.empty()) {
      ready = ParseReady(text);
      break;
    }
    const std::string failed = ReadFileOr(f.run_dir + "/" + service::kFailedName, "");
    Result<int> exited = daemon->Wait(std::chrono::milliseconds(20));
    if (!failed.empty() || exited.ok()) {
      if (!exited.ok()) {
        daemon->Signal(SIGTERM);
        (void)daemon->Wait(std::chrono::milliseconds(static_cast<int64_t>(f.stop_timeout * 1000)));
      }
      std::string msg = "nopfsd did not start";
      if (!failed.empty()) msg += ": " + failed;
      if (exited.ok()) msg += " (" + DescribeWaitStatus(*exited) + ")";
      msg += "\nlast lines of " + f.run_dir + "/" + service::kLogName + ":\n" + LogTail(f.run_dir);
      return Fail(msg);
    }
    if (g_signal.load() != 0 ||
        std::chrono::steady_clock::now() - start > std::chrono::duration<double>(f.start_timeout)) {
      daemon->Signal(SIGTERM);
      (void)daemon->Wait(std::chrono::milliseconds(static_cast<int64_t>(f.stop_timeout * 1000)));
      return Fail(g_signal.load() != 0 ? "interrupted while nopfsd was starting"
                                       : "nopfsd was not ready within --start-timeout");
    }
  }
  if (!f.quiet) {
    std::fprintf(stderr, "nopfs run: nopfsd ready (pid %d, %s samples) in %.1f s; run dir %s\n",
                 daemon->pid(), ready.count("samples") ? ready["samples"].c_str() : "?",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 f.run_dir.c_str());
  }

  // One process per local rank, as srun would start them.
  const uint32_t first = job.first_rank(f.node);
  const uint32_t local = job.ranks_on_node(f.node);
  std::vector<Child> ranks;
  int exit_code = 0;
  for (uint32_t i = 0; i < local; ++i) {
    Child::Options o;
    o.new_group = false;
    o.env = {{"NOPFS_SOCKET", socket},
             {"NOPFS_RUN_DIR", f.run_dir},
             {"NOPFS_DATASET", dataset.string()},
             {"NOPFS_RANK", std::to_string(first + i)},
             {"NOPFS_LOCAL_RANK", std::to_string(i)},
             {"NOPFS_RANKS", std::to_string(job.ranks)},
             {"NOPFS_RANKS_PER_NODE", std::to_string(job.ranks_per_node)},
             {"NOPFS_NODE", std::to_string(f.node)},
             {"NOPFS_NODES", std::to_string(job.nodes())},
             {"NOPFS_SEED", std::to_string(job.seed)},
             {"NOPFS_EPOCHS", std::to_string(job.epochs)},
             {"NOPFS_BATCH", std::to_string(job.batch)},
             {"NOPFS_SCHEME", f.job.scheme},
             {"NOPFS_DROP_LAST", job.drop_last ? "1" : "0"}};
    if (ready.count("samples")) o.env["NOPFS_SAMPLES"] = ready["samples"];
    Result<Child> c = Child::Spawn(f.command, o);
    if (!c.ok()) {
      std::fprintf(stderr, "nopfs run: rank %u: %s\n", first + i, c.status().message().c_str());
      exit_code = 127;
      break;
    }
    ranks.push_back(std::move(*c));
  }
  // Wait for every rank; forward a signal to all of them.
  std::vector<int> statuses(ranks.size(), -1);
  size_t running = ranks.size();
  bool forwarded = false;
  while (running > 0) {
    if (g_signal.load() != 0 && !forwarded) {
      for (Child& c : ranks)
        c.Signal(SIGTERM);
      forwarded = true;
    }
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (!ranks[i].running()) continue;
      Result<int> st = ranks[i].Wait(std::chrono::milliseconds(10));
      if (st.ok()) {
        statuses[i] = *st;
        --running;
        if (exit_code == 0 && ExitCodeOf(*st) != 0) exit_code = ExitCodeOf(*st);
      }
    }
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (statuses[i] >= 0 && ExitCodeOf(statuses[i]) != 0) {
      std::fprintf(stderr, "nopfs run: rank %u %s\n", first + static_cast<uint32_t>(i),
                   DescribeWaitStatus(statuses[i]).c_str());
    }
  }

  // What the service saw, then stop it.
  std::string status_text;
  {
    Result<std::unique_ptr<client::Client>> c = client::Client::Connect(socket);
    if (c.ok()) {
      Result<std::string> t = (*c)->StatusText();
      if (t.ok()) status_text = *t;
    }
  }
  daemon->Signal(SIGTERM);
  Result<int> dstatus =
      daemon->Wait(std::chrono::milliseconds(static_cast<int64_t>(f.stop_timeout * 1000)));
  if (!dstatus.ok()) {
    std::fprintf(stderr, "nopfs run: nopfsd did not stop within %.0f s; killing it\n",
                 f.stop_timeout);
    daemon->Signal(SIGKILL);
    (void)daemon->Wait();
    if (exit_code == 0) exit_code = 1;
  } else if (ExitCodeOf(*dstatus) != 0) {
    std::fprintf(stderr, "nopfs run: nopfsd %s\nlast lines of its log:\n%s",
                 DescribeWaitStatus(*dstatus).c_str(), LogTail(f.run_dir).c_str());
    if (exit_code == 0) exit_code = 1;
  }

  if (!status_text.empty()) {
    std::printf("%s", FormatRunSummary(ParseStatusText(status_text)).c_str());
  } else {
    std::printf("nopfs run: no figures (the service did not answer)\n");
  }
  std::fflush(stdout);

  // nopfsd removes its socket, shared memory and SSD files; what may remain is its log.
  for (const char* name : {service::kSocketName, service::kPidName, service::kReadyName}) {
    if (fs::exists(f.run_dir + "/" + name)) {
      std::fprintf(stderr, "nopfs run: nopfsd left %s/%s behind\n", f.run_dir.c_str(), name);
      if (exit_code == 0) exit_code = 1;
    }
  }
  if (made_run_dir && !f.keep_run_dir) fs::remove_all(f.run_dir, ec);
  return exit_code;
}

}  // namespace

void RegisterRun(CLI::App* app, int* exit_code) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* sub = app->add_subcommand(
      "run", "Run a command once per rank with nopfsd serving the dataset (nopfs without Slurm)");
  sub->add_option("--dataset", f->dataset,
                  "The dataset: an ImageFolder directory or a manifest file")
      ->required();
  AddJobFlags(sub, &f->job, /*samples_required=*/false);
  sub->add_option("--node", f->node, "This node's index in the job (its ranks are started)")
      ->capture_default_str();
  sub->add_option("--config", f->config, "Node config (Lua); default: a RAM tier of 1/8 of memory")
      ->check(CLI::ExistingFile);
  sub->add_option("--run-dir", f->run_dir,
                  "Directory for nopfsd's socket and log (default: $TMPDIR/nopfs-run-UID-PID, "
                  "removed afterwards)");
  sub->add_flag("--keep-run-dir", f->keep_run_dir, "Keep the run directory (and the log)");
  sub->add_option("--start-timeout", f->start_timeout, "Seconds to wait for nopfsd to be ready")
      ->capture_default_str();
  sub->add_option("--stop-timeout", f->stop_timeout, "Seconds to wait for nopfsd to stop")
      ->capture_default_str();
  sub->add_flag("-q,--quiet", f->quiet, "Print only the summary");
  sub->add_option("command", f->command, "The command each rank runs (after --)")
      ->required()
      ->expected(-1);
  sub->callback(
      [f, exit_code, sub] { *exit_code = RunJob(*f, sub->count("--ranks-per-node") > 0); });
}

}  // namespace nopfs::cli
