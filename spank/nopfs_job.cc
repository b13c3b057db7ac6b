// nopfs-job: what the SPANK plugin runs as root on each node at job start and end, in its own
// process with a hard time limit (the plugin stays thin and never blocks Slurm).
//
//   nopfs-job prolog|epilog --job-id=J --node=NAME --nodelist=LIST --uid=U --gid=G --user=NAME
//             [key=value plugin arguments ...] [--nopfs=DATASET --nopfs-... job options]
//
// prolog: asks the admission policy, reserves the node's capacity in the ledger, creates the
// job's run directory (owned by the user, 0700), starts nopfsd as the user and waits until it is
// ready. It writes <run dir>/refused or <run dir>/failed when the job gets no cache, so that
// task_init can tell the job's tasks. Exit 0: serving; 3: refused; 4: nopfsd failed; 1: error.
// epilog: stops the job's nopfsd (TERM, KILL after the grace period), removes its SSD directory
// and run directory, releases the reservation, then looks again. Idempotent. Exit 0: nothing is
// left; 1: something is (named in the message).
// One line on stdout says what happened; the plugin logs it and shows it to the user.
//
//   nopfs-job share-serve [--plugstack=FILE | --config=PATH --dir=DIR] [--node=NAME]
//             [--idle-exit=SECONDS]
//
// share-serve: the node's share service for the datasets the node config declares shared
// (launcher_share.cc), started by a prolog that needs it, or by nopfs-share.service.
//   nopfs-job placement [--node=NAME] [--plugstack=FILE | key=value plugin arguments ...]
//             [--syslog] [--force] [--for-job] [--list]
//
// placement: the node's marks in Slurm against its kept copies (spank/placement.h; docs/admin.md,
// "Placement"): run in the background by the prolog and the epilog, and by a timer. --node
// defaults to the short host name; --plugstack reads the plugin's arguments from the nopfs line
// of that file; --syslog logs the line to syslog instead of stdout; --force asks slurmctld
// whatever the rate limits say; --for-job (the prolog's and epilog's runs) leaves the line on a
// failure to the timer's runs; --list prints every kept copy on the node (user, dataset, bytes,
// last use as its MANIFEST says, mark) and changes nothing. Exit 0, also when slurmctld refuses
// (the line says so); 2 on bad arguments.
#include <syslog.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "common/printable.h"
#include "common/small_file.h"
#include "common/version.h"
#include "share/server.h"
#include "spank/launcher.h"
#include "spank/placement.h"

namespace nopfs::spank::launcher {
namespace {

Result<uint64_t> Number(std::string_view key, std::string_view v) {
  uint64_t n = 0;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size()) {
    return Status::InvalidArgument(std::string(key) + "=" + std::string(v) + ": not a number");
  }
  return n;
}

}  // namespace

// config=FILE with %n in it names one config per node (several slurmd on one host).
std::string NodeConfigPath(std::string config, const std::string& node) {
  for (size_t pos = config.find("%n"); pos != std::string::npos; pos = config.find("%n", pos)) {
    config.replace(pos, 2, node);
    pos += node.size();
  }
  return config;
}

namespace {

Result<Job> ParseCommandLine(int argc, char** argv) {
  if (argc < 2) return Status::InvalidArgument("usage: nopfs-job prolog|epilog --job-id=J ...");
  Job job;
  job.mode = argv[1];
  if (job.mode != "prolog" && job.mode != "epilog") {
    return Status::InvalidArgument("unknown mode '" + job.mode + "'; write prolog or epilog");
  }
  std::vector<std::string> plugin_args;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (key.rfind("--nopfs", 0) == 0) {
      NOPFS_RETURN_IF_ERROR(ApplyOption(&job.opts, key.substr(2), value));
    } else if (key == "--job-id" || key == "--uid" || key == "--gid") {
      Result<uint64_t> n = Number(key, value);
      if (!n.ok()) return n.status();
      if (key == "--job-id") job.job_id = *n;
      if (key == "--uid") job.uid = static_cast<uid_t>(*n);
      if (key == "--gid") job.gid = static_cast<gid_t>(*n);
    } else if (key == "--node") {
      job.node = value;
    } else if (key == "--nodelist") {
      job.nodelist = value;
    } else if (key == "--user") {
      job.user = value;
    } else if (key.rfind("--", 0) != 0) {
      plugin_args.push_back(a);
    } else {
      return Status::InvalidArgument("unknown argument " + a);
    }
  }
  Result<PluginArgs> pa = ParsePluginArgs(plugin_args);
  if (!pa.ok()) return pa.status();
  job.args = *pa;
  NOPFS_RETURN_IF_ERROR(CheckComponent("node name", job.node));
  job.args.config = NodeConfigPath(job.args.config, job.node);
  if (job.job_id == 0) return Status::InvalidArgument("--job-id is missing");
  if (job.uid == 0) return Status::InvalidArgument("refusing a job of uid 0 (root)");
  if (job.user.empty()) {
    const passwd* pw = ::getpwuid(job.uid);
    if (pw != nullptr) job.user = pw->pw_name;
  }
  Result<std::vector<std::string>> names = ExpandHostlist(job.nodelist);
  Result<uint32_t> index = NodeIndex(job.nodelist, job.node);
  if (names.ok() && index.ok()) {
    job.nodes = static_cast<uint32_t>(names->size());
    job.node_index = *index;
    job.names = std::move(*names);
  } else if (job.mode == "prolog") {
    return !names.ok() ? names.status() : index.status();
  } else {
    job.node_index = kUnknownIndex;  // the epilog takes it from the ledger entry
  }
  job.node_dir = job.args.rundir + "/" + job.node;
  job.run_dir = RunDir(job.args.rundir, job.node, job.job_id);
  job.ledger_dir = job.node_dir + "/.ledger";
  return job;
}

}  // namespace

// The plugin's arguments on the nopfs line of a plugstack.conf (the words after spank_nopfs.so).
Result<std::vector<std::string>> PlugstackArgs(const std::string& path) {
  Result<std::string> text =
      ReadSmallFile(path, SmallFileRules{.max_bytes = 1 << 20, .owner = std::nullopt});
  if (!text.ok()) return text.status();
  size_t pos = 0;
  while (pos < text->size()) {
    size_t nl = text->find('\n', pos);
    if (nl == std::string::npos) nl = text->size();
    std::vector<std::string> words;
    const std::string line = text->substr(pos, nl - pos);
    pos = nl + 1;
    size_t w = 0;
    while (w < line.size()) {
      const size_t start = line.find_first_not_of(" \t", w);
      if (start == std::string::npos) break;
      const size_t end = std::min(line.find_first_of(" \t", start), line.size());
      words.push_back(line.substr(start, end - start));
      w = end;
    }
    if (words.size() < 2 || words[0].front() == '#') continue;
    constexpr std::string_view kPlugin = "spank_nopfs.so";
    const std::string& plugin = words[1];
    if (plugin.size() < kPlugin.size() ||
        plugin.compare(plugin.size() - kPlugin.size(), kPlugin.size(), kPlugin) != 0) {
      continue;
    }
    return std::vector<std::string>(words.begin() + 2, words.end());
  }
  return Status::NotFound(path + ": no line names spank_nopfs.so");
}

namespace {

// nopfs-job placement: one reconcile of the node's marks (spank/placement.h).
int Placement(int argc, char** argv) {
  std::string node, plugstack;
  bool use_syslog = false, force = false, for_job = false, list = false;
  std::vector<std::string> plugin_args;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--node=", 0) == 0) {
      node = a.substr(7);
    } else if (a.rfind("--plugstack=", 0) == 0) {
      plugstack = a.substr(12);
    } else if (a == "--syslog") {
      use_syslog = true;
    } else if (a == "--force") {
      force = true;
    } else if (a == "--for-job") {
      for_job = true;
    } else if (a == "--list") {
      list = true;
    } else if (a.rfind("--", 0) != 0) {
      plugin_args.push_back(a);
    } else {
      std::printf(
          "nopfs: placement: unknown argument %s; write --node=NAME, --plugstack=FILE, "
          "--syslog, --force, --for-job, --list or key=value\n",
          a.c_str());
      return 2;
    }
  }
  if (node.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof(host) - 1) == 0) node = host;
    node = node.substr(0, node.find('.'));
  }
  auto say = [&](const std::string& line) {
    if (line.empty()) return;
    if (use_syslog) {
      ::openlog("nopfs-job", LOG_PID, LOG_DAEMON);
      ::syslog(LOG_NOTICE, "%s", line.c_str());
    } else {
      std::printf("nopfs: %s\n", line.c_str());
    }
  };
  if (!plugstack.empty()) {
    Result<std::vector<std::string>> words = PlugstackArgs(plugstack);
    if (!words.ok()) {
      say("placement: " + words.status().message());
      return 2;
    }
    plugin_args.insert(plugin_args.begin(), words->begin(), words->end());
  }
  Job job;
  Result<PluginArgs> pa = ParsePluginArgs(plugin_args);
  Status node_ok = CheckComponent("node name", node);
  if (!pa.ok() || !node_ok.ok()) {
    say("placement: " + (pa.ok() ? node_ok : pa.status()).message());
    return 2;
  }
  job.node = node;
  job.args = *pa;
  job.args.config = NodeConfigPath(job.args.config, job.node);
  if (job.args.placement_key.empty()) {
    say("placement: " + node + ": no placement_key= among the plugin's arguments; nothing to do");
    return 0;
  }
  // libslurm exits the process when it finds no configuration.
  const char* conf = std::getenv("SLURM_CONF");
  if ((conf == nullptr || ::access(conf, R_OK) != 0) &&
      ::access("/etc/slurm/slurm.conf", R_OK) != 0) {
    say("placement: " + node + ": no slurm.conf (SLURM_CONF, /etc/slurm/slurm.conf)");
    return 2;
  }
  Result<lua::NodeConfig> config = LoadConfig(job);
  if (!config.ok()) {
    say("placement: " + node + ": config: " + config.status().message());
    return 2;
  }
  PlacementRun run;
  run.node = node;
  run.node_dir = job.args.rundir + "/" + node;
  run.key_path = job.args.placement_key;
  run.ssd_paths = SsdPaths(*config);
  for (const lua::SharedDecl& d : config->shared()) {
    run.shared.push_back(
        {d.path, share::StoreDirOf(config->shared_store_dir() + "/" + node, d.path), d.ssd});
  }
  run.ledger_dir = run.node_dir + "/.ledger";
  run.force = force;
  run.report_failures = !for_job;
  run.load = LoadNodeFeatures;
  run.update = UpdateNodeFeatures;
  // A copy past its user's keep lifetime is not advertised, whether or not gc has removed it yet.
  // The lifetime is the policy's, as gc applies it; a user whose keep hook fails keeps the marks.
  lua::NodeState ns;
  ns.name = node;
  ns.ram_total = config->CapacityOf(policy::ClassKind::kRam);
  ns.ssd_total = config->CapacityOf(policy::ClassKind::kSsd);
  auto grants = std::make_shared<lua::KeepGrants>(job.args.policy, *config, ns);
  run.lifetime = [grants](uint32_t uid) -> int64_t {
    const lua::KeepGrant g = grants->For(uid);
    return grants->Failed(uid) ? 0 : g.lifetime;
  };
  if (list) {
    // The admin's view: which user's copies of which dataset the node holds, and their marks.
    Result<std::string> key = ReadPlacementKey(run.key_path);
    if (!key.ok()) {
      say("placement: " + node + ": " + key.status().message());
      return 2;
    }
    Result<std::vector<RunningJob>> running = RunningJobs(run.ledger_dir);
    if (!running.ok()) {
      std::printf("%s ledger: %s\n", node.c_str(),
                  Printable(running.status().message(), 300).c_str());
    }
    const int64_t now = static_cast<int64_t>(::time(nullptr));
    const NodeMarks marks = MarksOfNode(*key, run.ssd_paths, run.lifetime, now, run.shared,
                                        running.ok() ? *running : std::vector<RunningJob>{});
    for (const NodeMarks::Copy& c : marks.copies_held) {
      const passwd* pw = ::getpwuid(c.uid);
      std::printf("%s uid %u (%s) %s %s, last used %s ago, %s%s\n", node.c_str(), c.uid,
                  pw != nullptr ? pw->pw_name : "?", Printable(c.dataset, 300).c_str(),
                  FormatBytes(static_cast<double>(c.bytes)).c_str(),
                  kept::FormatAge(now - c.last_used).c_str(), c.mark.c_str(),
                  c.expired ? " (expired: not marked; gc removes it)" : "");
    }
    for (const NodeMarks::Shared& c : marks.shared_held) {
      std::printf(
          "%s shared %s %s of %s (%llu files), %s\n", node.c_str(),
          Printable(c.dataset, 300).c_str(), FormatBytes(static_cast<double>(c.bytes)).c_str(),
          FormatBytes(static_cast<double>(c.quota)).c_str(),
          static_cast<unsigned long long>(c.files),
          c.warm ? c.mark.c_str()
                 : ("no mark (below " + std::to_string(kSharedWarmPercent) + "% of ssd)").c_str());
    }
    for (const NodeMarks::Running& r : marks.running_held) {
      const passwd* pw = ::getpwuid(r.uid);
      std::printf("%s uid %u (%s) %s, running job %llu, %s\n", node.c_str(), r.uid,
                  pw != nullptr ? pw->pw_name : "?", Printable(r.dataset, 300).c_str(),
                  static_cast<unsigned long long>(r.job_id), r.mark.c_str());
    }
    for (const std::string& e : marks.errors)
      std::printf("%s %s\n", node.c_str(), Printable(e, 300).c_str());
    return marks.errors.empty() && running.ok() ? 0 : 1;
  }
  if (Status s = EnsureRootDir(run.node_dir, 0755); !s.ok()) {
    say("placement: " + node + ": " + s.message());
    return 2;
  }
  say(ReconcilePlacement(run));
  return 0;
}

// After a prolog or an epilog: the node's marks, in the background.
void PlacementLater(const Job& job) {
  if (job.args.placement_key.empty()) return;
  std::vector<std::string> argv = {"/proc/self/exe", "placement", "--node=" + job.node, "--syslog"};
  for (std::string& a : ToArgs(job.args))
    argv.push_back(std::move(a));
  // /proc/self/exe is this program as it runs; execv needs a path the child can open.
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) argv[0] = std::string(self, static_cast<size_t>(n));
  RunDetached(argv);
}

}  // namespace
}  // namespace nopfs::spank::launcher

int main(int argc, char** argv) {
  using namespace nopfs::spank::launcher;
  ::umask(022);
  if (argc == 2 && std::string_view(argv[1]) == "--version") {
    std::printf("nopfs-job (nopfs) %s\n", nopfs::kVersion);
    return 0;
  }
  if (argc >= 2 && std::string_view(argv[1]) == "share-serve") return ShareServe(argc, argv);
  if (argc >= 2 && std::string_view(argv[1]) == "placement") return Placement(argc, argv);
  nopfs::Result<Job> job = ParseCommandLine(argc, argv);
  if (!job.ok()) {
    std::printf("nopfs: %s: %s\n", argc > 1 ? argv[1] : "nopfs-job",
                job.status().message().c_str());
    return 1;
  }
  const int rc = job->mode == "prolog" ? Prolog(*job, argv[0]) : Epilog(*job);
  std::fflush(stdout);
  // A copy made or removed, by nopfsd or by the prolog's and epilog's rules, changes the node's
  // marks: Slurm learns it in the background (never delaying the job).
  PlacementLater(*job);
  return rc;
}
