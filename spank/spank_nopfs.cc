// spank_nopfs.so: the SPANK plugin. Every slurm_spank_* entry point is here and stays a few
// lines; the work is in options.cc (pure parsing, run again in each context since each context
// is its own process) and in the nopfs-job launcher, which the job prolog and epilog run with a
// hard time limit. No exception crosses into Slurm; errors are returned as -1 (the value every
// Slurm version treats as an error) with a message "nopfs: <phase>: <what>".
//
// Contexts: allocator/local (sbatch, salloc, srun; as the user): options are parsed and
// validated, a bad value fails the submission. job_script (slurmd's prolog and epilog; root):
// nopfs-job prolog/epilog. remote (slurmstepd): task_init exports NOPFS_* to each task.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

extern "C" {
#include <slurm/slurm.h>
#include <slurm/spank.h>

// SPANK_PLUGIN's constants are const, hence internal in C++ without these declarations.
extern const char plugin_name[];
extern const char plugin_type[];
extern const unsigned int plugin_version;
extern const unsigned int spank_plugin_version;
SPANK_PLUGIN(nopfs, 1)
}

#include "launch/process.h"
#include "launch/run_files.h"
#include "launch/task_env.h"
#include "spank/hostlist.h"
#include "spank/job_files.h"
#include "spank/options.h"

namespace nopfs::spank {
namespace {

PluginArgs g_args;
JobOptions g_opts;
std::vector<spank_option> g_spank_options;

int OnOption(int val, const char* optarg, int /*remote*/) {
  try {
    const auto& info = UserOptions();
    if (val < 0 || static_cast<size_t>(val) >= info.size()) return -1;
    Status s = ApplyOption(&g_opts, info[val].name, optarg != nullptr ? optarg : "");
    if (!s.ok()) {
      slurm_error("nopfs: option: %s", s.message().c_str());
      return -1;
    }
    return 0;
  } catch (const std::exception& e) {
    slurm_error("nopfs: option: %s", e.what());
    return -1;
  }
}

// The option table Slurm is given, built once per process (every entry point may be the first
// one called: slurm_spank_init does not run before the job prolog and epilog).
std::vector<spank_option>& SpankOptions() {
  if (g_spank_options.empty()) {
    const auto& info = UserOptions();
    for (size_t i = 0; i < info.size(); ++i) {
      g_spank_options.push_back(
          spank_option{const_cast<char*>(info[i].name), const_cast<char*>(info[i].arginfo),
                       const_cast<char*>(info[i].usage), info[i].arginfo != nullptr ? 1 : 0,
                       static_cast<int>(i), OnOption});
    }
  }
  return g_spank_options;
}

// Parses plugstack.conf's arguments into g_args (again in every entry point that needs them).
bool LoadArgs(const char* phase, int ac, char** av) {
  Result<PluginArgs> parsed = ParsePluginArgs(std::vector<std::string>(av, av + ac));
  if (!parsed.ok()) {
    slurm_error("nopfs: %s: %s", phase, parsed.status().message().c_str());
    return false;
  }
  g_args = *parsed;
  return true;
}

int Init(spank_t sp, int ac, char** av) {
  if (!LoadArgs("init", ac, av)) return -1;
  const spank_context_t ctx = spank_context();
  if (ctx == S_CTX_SLURMD) return 0;
  for (spank_option& o : SpankOptions()) {
    if (spank_option_register(sp, &o) != ESPANK_SUCCESS && ctx != S_CTX_JOB_SCRIPT) {
      slurm_error("nopfs: init: cannot register --%s", o.name);
      return -1;
    }
  }
  return 0;
}

// Reads the user's options back in a context where the callbacks did not run (job_script).
Result<JobOptions> GetOptions(spank_t sp) {
  JobOptions opts;
  for (spank_option& o : SpankOptions()) {
    char* value = nullptr;
    if (spank_option_getopt(sp, &o, &value) != ESPANK_SUCCESS) continue;
    NOPFS_RETURN_IF_ERROR(ApplyOption(&opts, o.name, value != nullptr ? value : ""));
  }
  return opts;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string SpankEnv(spank_t sp, const char* name) {
  char buf[8192];
  if (spank_getenv(sp, name, buf, sizeof(buf)) != ESPANK_SUCCESS) return "";
  return buf;
}

// The build tree's <build>/bin/nopfs-job beside <build>/lib/spank_nopfs.so, else the installed
// launcher (<prefix>/libexec/nopfs/nopfs-job).
std::string DefaultLauncher() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&DefaultLauncher), &info) != 0 && info.dli_fname != nullptr) {
    const std::string so = info.dli_fname;
    const size_t slash = so.rfind('/');
    const std::string built =
        (slash == std::string::npos ? std::string(".") : so.substr(0, slash)) + "/../bin/nopfs-job";
    if (::access(built.c_str(), X_OK) == 0) return built;
  }
  return NOPFS_INSTALLED_LAUNCHER;
}

// Runs nopfs-job with a hard limit; returns its exit code (or -1) and its output in *out.
int RunLauncher(const std::vector<std::string>& argv, int limit_s, std::string* out) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    *out = std::string("pipe: ") + std::strerror(errno);
    return -1;
  }
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  launch::Child::Options o;
  o.clear_env = true;
  o.env = {{"PATH", "/usr/sbin:/usr/bin:/sbin:/bin"}};
  if (const char* conf = std::getenv("SLURM_CONF")) o.env["SLURM_CONF"] = conf;
  o.stdin_fd = null_fd;
  o.stdout_fd = fds[1];
  o.stderr_fd = fds[1];
  Result<launch::Child> child = launch::Child::Spawn(argv, o);
  close(fds[1]);
  if (null_fd >= 0) close(null_fd);
  if (!child.ok()) {
    close(fds[0]);
    *out = "nopfs: " + child.status().message();
    return -1;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
  bool timed_out = false;
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n <= 0) break;
    if (out->size() < 65536) out->append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timed_out) {
    child->Signal(SIGKILL);  // its process group: nopfs-job and anything it started there
    out->append("nopfs: launcher killed after " + std::to_string(limit_s) + " s\n");
  }
  Result<int> status = child->Wait();
  while (!out->empty() && out->back() == '\n')
    out->pop_back();
  if (timed_out || !status.ok() || !WIFEXITED(*status)) return -1;
  return WEXITSTATUS(*status);
}

int JobScript(spank_t sp, int ac, char** av, const char* mode) {
  if (!LoadArgs(mode, ac, av)) return 0;
  Result<JobOptions> opts = GetOptions(sp);
  if (!opts.ok()) {
    slurm_error("nopfs: %s: %s", mode, opts.status().message().c_str());
    return 0;
  }
  if (opts->dataset.empty()) return 0;
  uint32_t job_id = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
    slurm_error("nopfs: %s: cannot get the job's id, uid and gid", mode);
    return 0;
  }
  std::string nodelist = Env("SLURM_NODELIST");
  if (nodelist.empty()) nodelist = Env("SLURM_JOB_NODELIST");
  std::vector<std::string> argv = {g_args.launcher.empty() ? DefaultLauncher() : g_args.launcher,
                                   mode,
                                   "--job-id=" + std::to_string(job_id),
                                   "--node=" + Env("SLURMD_NODENAME"),
                                   "--nodelist=" + nodelist,
                                   "--uid=" + std::to_string(uid),
                                   "--gid=" + std::to_string(gid),
                                   "--user=" + Env("SLURM_JOB_USER")};
  for (const std::string& a : ToArgs(g_args))
    argv.push_back(a);
  for (const std::string& a : ToArgs(*opts))
    argv.push_back(a);
  // nopfsd has `timeout` to become ready and the epilog `grace` to stop it; the rest is margin.
  const int limit = static_cast<int>(g_args.timeout + 2 * g_args.grace + 60);
  std::string out;
  const int rc = RunLauncher(argv, limit, &out);
  if (rc == 0) {
    slurm_info("%s", out.c_str());
  } else {
    slurm_error("%s (exit %d)", out.empty() ? "nopfs: launcher said nothing" : out.c_str(), rc);
  }
  // Never fail here: a failing prolog or epilog drains the node. A job without its cache learns
  // it in task_init (on_refusal decides whether it fails).
  return 0;
}

// Whether this task is the first to show a line that `marker` (a file of the job's run directory,
// the task's user's) stands for: it makes the marker, exclusively. A marker that cannot be made
// for another reason shows the line: twice is better than never.
bool FirstToShow(const std::string& marker) {
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
    return true;
  }
  return errno != EEXIST;
}

int TaskInit(spank_t sp) {
  if (g_opts.dataset.empty()) return 0;
  uint32_t job_id = 0;
  if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS) return 0;
  const std::string node = SpankEnv(sp, "SLURMD_NODENAME");
  std::string nodelist = SpankEnv(sp, "SLURM_JOB_NODELIST");
  if (nodelist.empty()) nodelist = SpankEnv(sp, "SLURM_NODELIST");
  const std::string local_s = SpankEnv(sp, "SLURM_LOCALID");
  Result<std::vector<std::string>> names = ExpandHostlist(nodelist);
  Result<uint32_t> index = NodeIndex(nodelist, node);
  if (!names.ok() || !index.ok()) {
    const Status& s = !names.ok() ? names.status() : index.status();
    slurm_error("nopfs: task: %s", s.message().c_str());
    return g_args.on_refusal == OnRefusal::kFail ? -1 : 0;
  }
  const uint32_t local = static_cast<uint32_t>(std::strtoul(local_s.c_str(), nullptr, 10));
  const std::string dir = RunDir(g_args.rundir, node, job_id);
  // The run directory is the job user's: its files are read with ReadUserFile (never a link, a
  // FIFO, another owner's file or more than 64 KiB), so nothing there can block this task or
  // show it another file. A file that is refused counts as absent.
  uid_t uid = ::getuid();
  (void)spank_get_item(sp, S_JOB_UID, &uid);
  const auto read = [&](const char* name) {
    Result<std::string> r = ReadUserFile(dir + "/" + name, uid, 64 * 1024);
    return r.ok() ? *r : std::string();
  };
  // The job's ranks per node, as nopfs-job's prolog decided them from the job's task layout
  // (<run dir>/layout: "ranks_per_node=N", or "error=<message>" for a layout nopfs refuses).
  // A bad layout fails every task whatever on_refusal says: reading without the cache would
  // give the ranks a lopsided stream just the same.
  const auto fail_task = [&](const std::string& message) {
    std::fprintf(stderr, "%s\nnopfs: task: the job fails\n", message.c_str());
    std::fflush(stderr);
    _exit(1);  // see below: Slurm 22.05 ignores a failing task_init in the batch step
  };
  const Result<uint32_t> layout = launch::ParseLayout(read(launch::kLayoutName));
  if (layout.status().code() == StatusCode::kFailedPrecondition) {
    fail_task(layout.status().message());
  }
  uint32_t per_node = layout.ok() ? *layout : 0;
  uint32_t step_id = 0;
  uint32_t step_nodes = 0;
  uint32_t step_local = 0;
  uint32_t step_tasks = 0;
  const bool is_step = spank_get_item(sp, S_JOB_STEPID, &step_id) == ESPANK_SUCCESS &&
                       step_id != SLURM_BATCH_SCRIPT && step_id != SLURM_EXTERN_CONT &&
                       spank_get_item(sp, S_JOB_NNODES, &step_nodes) == ESPANK_SUCCESS &&
                       spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &step_local) == ESPANK_SUCCESS &&
                       spank_get_item(sp, S_JOB_TOTAL_TASK_COUNT, &step_tasks) == ESPANK_SUCCESS &&
                       step_local != 0;
  if (per_node == 0) {
    // No layout from the prolog (it did not get that far): the user's option, else this
    // step's tasks on this node.
    per_node = OptionGiven(g_opts, "nopfs-ranks-per-node") || !is_step ? g_opts.ranks_per_node
                                                                       : step_local;
  }
  // A step over all the job's nodes is its training: it must run the same number of tasks on
  // every node, and the job's ranks per node must be that number or a multiple of it (a
  // launcher such as torchrun starts the rest). A step on fewer nodes is a helper and is not
  // checked.
  if (is_step && step_nodes == names->size()) {
    if (step_tasks != uint64_t{step_local} * step_nodes) {
      fail_task("nopfs: task: " + node + ": this step's " + std::to_string(step_tasks) +
                " tasks are not the same number on each of its " + std::to_string(step_nodes) +
                " nodes; start it with srun --ntasks-per-node=" + std::to_string(per_node));
    }
    if (per_node % step_local != 0) {
      fail_task("nopfs: task: " + node + ": this step runs " + std::to_string(step_local) +
                " tasks on each node, but the job's ranks per node is " + std::to_string(per_node) +
                "; submit the job with --ntasks-per-node=" + std::to_string(step_local) +
                ", or start the step with srun --ntasks-per-node=" + std::to_string(per_node));
    }
  }
  std::string why;
  const std::string ready = read(launch::kReadyName);
  if (ready.empty()) {
    why = read(launch::kRefusedName);
    if (why.empty()) why = read(launch::kFailedName);
    if (why.empty()) why = "nopfs: task: " + node + ": no cache was started (see slurmd's log)";
    while (!why.empty() && why.back() == '\n')
      why.pop_back();
  }
  if (!why.empty()) {
    if (g_args.on_refusal == OnRefusal::kFail) {
      std::fprintf(stderr, "%s\nnopfs: task: the job fails (the site set on_refusal=fail)\n",
                   why.c_str());
      std::fflush(stderr);
      // We are in the task's own process, just before it execs the user's program. Slurm
      // 22.05 ignores a failing task_init in the batch step, so end the task here: the job
      // ends FAILED with exit code 1 and the message above in its output.
      _exit(1);
    }
    if (local == 0) {
      std::fprintf(stderr, "%s\nnopfs: task: reading the dataset directly, without the cache\n",
                   why.c_str());
    }
  }
  // The catalog's size from nopfsd's ready file: what the Python package's len() needs without
  // asking the service. The file is the user's own: ParseReady takes only digits.
  const Result<launch::ReadyInfo> ready_info = launch::ParseReady(ready);
  launch::TaskEnv env;
  if (why.empty() && local < per_node) env.socket = dir + "/" + launch::kSocketName;
  env.run_dir = dir;
  env.dataset = g_opts.dataset;
  env.node = *index;
  env.nodes = static_cast<uint32_t>(names->size());
  env.local_rank = local;
  env.ranks = env.nodes * per_node;
  env.ranks_per_node = per_node;
  env.seed = g_opts.seed;
  env.epochs = g_opts.epochs;
  env.batch = g_opts.batch;
  env.scheme = g_opts.scheme;
  env.drop_last = g_opts.drop_last;
  env.samples = why.empty() && ready_info.ok() ? ready_info->samples : 0;
  // A step inherits the batch script's environment: a task without a service (or a size) must
  // not keep one from there.
  for (const char* name : launch::kOptionalVariables)
    spank_unsetenv(sp, name);
  for (const auto& [name, value] : env.Variables())
    spank_setenv(sp, name.c_str(), value.c_str(), 1);
  // The plan line nopfsd wrote (tiers, sizes, predicted stall), once, in the batch script's output.
  if (why.empty() && local == 0 && !is_step) std::fprintf(stderr, "%s", read("plan").c_str());
  // Whether placement brought the job to its user's kept copy (the prolog's `placement` file).
  if (local == 0 && !is_step) std::fprintf(stderr, "%s", read(launch::kPlacementName).c_str());
  // Why this node's peer link did not start, or not every other node answered (the prolog's
  // `peers` file), since the job runs on, reading from the PFS what its peers would have served:
  // once for each node, by the first task to start there (the batch script's on the first node,
  // else the node's first task of the first step on it), which leaves `peers.shown` in the run
  // directory for the tasks of later steps.
  if (why.empty() && local == 0) {
    const std::string peers = read(launch::kPeersName);
    if (!peers.empty() && FirstToShow(dir + "/" + launch::kPeersShownName)) {
      std::fprintf(stderr, "%s", peers.c_str());
    }
  }
  return 0;
}

template <typename F>
int Guard(const char* phase, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    slurm_error("nopfs: %s: %s", phase, e.what());
  } catch (...) {
    slurm_error("nopfs: %s: unexpected error", phase);
  }
  return -1;
}

}  // namespace
}  // namespace nopfs::spank

using nopfs::spank::Guard;

extern "C" int slurm_spank_init(spank_t sp, int ac, char** av) {
  return Guard("init", [&] { return nopfs::spank::Init(sp, ac, av); });
}

extern "C" int slurm_spank_init_post_opt(spank_t, int, char**) {
  return Guard("option", [&] {
    if (spank_context() != S_CTX_ALLOCATOR && spank_context() != S_CTX_LOCAL) return 0;
    nopfs::Status s = nopfs::spank::ValidateJob(nopfs::spank::g_opts);
    if (!s.ok()) {
      slurm_error("nopfs: option: %s", s.message().c_str());
      // sbatch 22.05 goes on submitting after a failing init_post_opt; this is the user's own
      // sbatch/salloc/srun process, so refuse the submission the way a bad option does.
      std::fflush(nullptr);
      std::exit(1);
    }
    return 0;
  });
}

extern "C" int slurm_spank_job_prolog(spank_t sp, int ac, char** av) {
  return Guard("prolog", [&] { return nopfs::spank::JobScript(sp, ac, av, "prolog"); });
}

extern "C" int slurm_spank_job_epilog(spank_t sp, int ac, char** av) {
  return Guard("epilog", [&] { return nopfs::spank::JobScript(sp, ac, av, "epilog"); });
}

extern "C" int slurm_spank_task_init(spank_t sp, int, char**) {
  return Guard("task", [&] { return nopfs::spank::TaskInit(sp); });
}
