#include "cli/cmd_where.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/lexical_path.h"
#include "common/printable.h"
#include "common/unique_fd.h"
#include "common/units.h"
#include "kept/area.h"
#include "kept/space.h"
#include "launch/process.h"
#include "lua/config.h"

namespace nopfs::cli {
namespace {

using namespace std::chrono_literals;

struct WhereFlags {
  std::string dataset;
  std::string config = NOPFS_INSTALLED_CONFIG;
  std::string node;  // this host's name in Slurm; "": $SLURMD_NODENAME, else the short host name
};

int Fail(const std::string& msg) {
  std::fprintf(stderr, "nopfs where: %s\n", msg.c_str());
  return 2;
}

struct Ran {
  int status = 0;    // wait status
  std::string text;  // standard output and error, interleaved
};

// Runs a Slurm client command (from PATH) and collects what it prints; a minute at most.
Result<Ran> RunCommand(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno(errno, "pipe");
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  UniqueFd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  launch::Child::Options o;
  o.stdin_fd = null_fd.get();
  o.stdout_fd = write_end.get();
  o.stderr_fd = write_end.get();
  Result<launch::Child> child = launch::Child::Spawn(argv, o);
  write_end.Reset();
  if (!child.ok()) {
    return Status(child.status().code(),
                  child.status().message() + " (Slurm's client commands must be on PATH)");
  }
  Ran out;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{read_end.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    const ssize_t n = ::read(read_end.get(), buf, sizeof buf);
    if (n > 0) {
      if (out.text.size() < (1 << 20)) out.text.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  Result<int> status = child->Wait(5s);
  if (!status.ok()) {
    child->Signal(SIGKILL);
    return Status::Unavailable(argv[0] + " did not finish within a minute");
  }
  out.status = *status;
  return out;
}

// The last non-empty line of `text`, for an error.
std::string LastLine(const std::string& text) {
  size_t end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return "(it printed nothing)";
  const size_t start = text.rfind('\n', end);
  return Printable(text.substr(start == std::string::npos ? 0 : start + 1,
                               end + 1 - (start == std::string::npos ? 0 : start + 1)),
                   300);
}

std::string ThisNode(const WhereFlags& f) {
  if (!f.node.empty()) return f.node;
  if (const char* n = std::getenv("SLURMD_NODENAME"); n != nullptr && *n != '\0') return n;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "";
  const std::string h = host;
  return h.substr(0, h.find('.'));
}

// The node config's SSD class paths ("" when it does not load): where the user's kept area and
// sibling registry are on this node.
std::vector<std::string> SsdPaths(const WhereFlags& f) {
  std::vector<std::string> paths;
  Result<lua::NodeConfig> config = lua::LoadNodeConfig(f.config);
  if (!config.ok()) return paths;
  for (const policy::StorageClass& c : config->model().classes) {
    if (c.kind == policy::ClassKind::kSsd && !c.path.empty()) paths.push_back(c.path);
  }
  return paths;
}

// Size and last use of the user's kept copies of `dataset` on this node, or "" when it holds none.
std::string LocalCopy(const std::vector<std::string>& ssd_paths, const std::string& dataset) {
  const kept::KeptNode mine = kept::KeptNode::Scan(ssd_paths, ::getuid());
  uint64_t bytes = 0;
  int64_t last_used = 0;
  bool found = false;
  for (const kept::KeptEntry& e : mine.entries()) {
    if (!e.Complete() || LexicalPath(e.data.dataset) != dataset) continue;
    found = true;
    bytes += e.data.bytes;
    last_used = std::max(last_used, e.data.last_used);
  }
  if (!found) return "";
  return "your kept copy, " + FormatBytes(static_cast<double>(bytes)) + ", last used " +
         kept::FormatAge(static_cast<int64_t>(::time(nullptr)) - last_used) + " ago";
}

// The jobs of this user whose nopfsd runs on this node on `dataset` and serves its tiers to the
// user's other jobs: their entries in the user's sibling registry (service/reader/sibling.h,
// <first SSD path>/nopfs-<uid>/live/<key>.<job>.<node index>) whose process lives. The job ids,
// sorted.
std::vector<std::string> LocalRunning(const std::vector<std::string>& ssd_paths,
                                      const std::string& dataset) {
  std::vector<std::string> jobs;
  if (ssd_paths.empty()) return jobs;
  std::error_code ec;
  const std::filesystem::path canonical = std::filesystem::canonical(dataset, ec);
  if (ec) return jobs;
  const std::string prefix = kept::KeptKey(canonical.string(), kept::kKeptScanOptions) + ".";
  const std::string live =
      ssd_paths.front() + "/nopfs-" + std::to_string(::getuid()) + "/" + "live";
  UniqueFd dir(::open(live.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir.valid()) return jobs;
  DIR* d = ::fdopendir(::dup(dir.get()));
  if (d == nullptr) return jobs;
  std::set<std::string> found;
  while (const dirent* ent = ::readdir(d)) {
    const std::string name = ent->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string job =
        name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size());
    if (job.empty() ||
        !std::all_of(job.begin(), job.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    UniqueFd fd(::openat(dir.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!fd.valid()) continue;
    char text[4097] = {};
    const ssize_t n = ::read(fd.get(), text, sizeof text - 1);
    if (n <= 0) continue;
    // Its nopfsd's pid: an entry whose process is gone is stale (the next sibling removes it).
    const char* pid = std::strstr(text, "\npid ");
    const long p = pid != nullptr ? std::strtol(pid + 5, nullptr, 10) : 0;
    if (p <= 0 || ::kill(static_cast<pid_t>(p), 0) != 0) continue;
    found.insert(job);
  }
  ::closedir(d);
  return {found.begin(), found.end()};
}

// The names of a Slurm node list: plain names as they are, a list with ranges through
// `scontrol show hostnames`; empty when it cannot be expanded.
std::vector<std::string> NodeNames(const std::string& list) {
  std::vector<std::string> names;
  std::string text = list;
  if (list.find('[') != std::string::npos) {
    Result<Ran> r = RunCommand({"scontrol", "show", "hostnames", list});
    if (!r.ok() || launch::ExitCodeOf(r->status) != 0) return names;
    text = r->text;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find_first_of(",\n", pos);
    const std::string name = text.substr(pos, end == std::string::npos ? end : end - pos);
    if (!name.empty()) names.push_back(name);
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return names;
}

// This user's running jobs by node (squeue --me); nullopt when Slurm does not say.
std::optional<std::map<std::string, std::vector<std::string>>> RunningJobsByNode() {
  Result<Ran> r =
      RunCommand({"squeue", "--me", "--states=RUNNING", "--noheader", "--format=%i %N"});
  if (!r.ok() || launch::ExitCodeOf(r->status) != 0) return std::nullopt;
  std::map<std::string, std::vector<std::string>> out;
  size_t pos = 0;
  while (pos < r->text.size()) {
    size_t nl = r->text.find('\n', pos);
    if (nl == std::string::npos) nl = r->text.size();
    const std::string line = r->text.substr(pos, nl - pos);
    pos = nl + 1;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) continue;
    for (const std::string& node : NodeNames(line.substr(sp + 1)))
      out[node].push_back(line.substr(0, sp));
  }
  return out;
}

std::string JobList(const std::vector<std::string>& jobs) {
  std::string out = jobs.size() == 1 ? "job " : "jobs ";
  for (size_t i = 0; i < jobs.size(); ++i)
    out += (i == 0 ? "" : ", ") + Printable(jobs[i], 40);
  return out;
}

int RunWhere(const WhereFlags& f) {
  if (f.dataset.empty() || f.dataset.front() != '/') {
    return Fail("the dataset is " + Printable(f.dataset, 200) +
                "; write its absolute path, as after --nopfs= (e.g. nopfs where "
                "/pfs/datasets/imagenet)");
  }
  const std::string dataset = LexicalPath(f.dataset);
  const std::string shown = Printable(dataset, 300);
  // The test job: one node, no script run, nothing submitted; its comment asks job_submit.lua.
  Result<Ran> test = RunCommand({"sbatch", "--test-only", "--job-name=nopfs-where", "--nodes=1",
                                 "--ntasks=1", "--comment=nopfs where:" + dataset, "--wrap=true"});
  if (!test.ok()) return Fail(test.status().message());
  static const std::regex kMark(R"(nopfs where: mark (nopfs_[0-9a-f]{16}))");
  static const std::regex kShared(
      R"(nopfs where: mark nopfs_[0-9a-f]{16}; shared (nopfs_[0-9a-f]{16}))");
  static const std::regex kError(R"(nopfs where: error: ([^\n]*))");
  static const std::regex kStart(
      R"(Job \d+ to start at (\S+) using \d+ processors on nodes (\S+) in partition (\S+))");
  std::smatch m;
  if (std::regex_search(test->text, m, kError)) {
    return Fail("placement is not set up on slurmctld's side: " + Printable(m[1].str(), 300) +
                " (for the admin: docs/admin.md, \"Placement\")");
  }
  if (!std::regex_search(test->text, m, kMark)) {
    if (launch::ExitCodeOf(test->status) != 0) {
      return Fail("cannot ask Slurm where your copy is: sbatch --test-only says: " +
                  LastLine(test->text));
    }
    return Fail(
        "placement is not set up on this cluster: slurmctld did not answer with your copy's "
        "mark (its JobSubmitPlugins has no nopfs job_submit.lua; for the admin: docs/admin.md, "
        "\"Placement\")");
  }
  const std::string mark = m[1].str();
  // A dataset the site shares: slurmctld names its shared copy's mark too, the same for every
  // user. A shared copy serves a user only what the user can read on the PFS: for a dataset the
  // user cannot read, its nodes are of no use to the user's jobs, and not listed.
  std::string shared;
  std::string unreadable;
  if (std::regex_search(test->text, m, kShared)) {
    shared = m[1].str();
    if (::access(dataset.c_str(), R_OK | X_OK) != 0) {
      unreadable = std::strerror(errno);
      shared.clear();
    }
  }

  Result<Ran> nodes = RunCommand({"sinfo", "--noheader", "--Node", "--format=%N %T %b"});
  if (!nodes.ok()) return Fail(nodes.status().message());
  if (launch::ExitCodeOf(nodes->status) != 0) {
    return Fail("cannot ask Slurm for the nodes' features: sinfo says: " + LastLine(nodes->text));
  }
  struct Holding {
    std::string node, state;
    bool mine = false, shared = false;
  };
  std::vector<Holding> holding;
  std::set<std::string> seen;
  size_t pos = 0;
  while (pos < nodes->text.size()) {
    size_t nl = nodes->text.find('\n', pos);
    if (nl == std::string::npos) nl = nodes->text.size();
    const std::string line = nodes->text.substr(pos, nl - pos);
    pos = nl + 1;
    const size_t a = line.find(' '), b = line.find(' ', a == std::string::npos ? a : a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string node = line.substr(0, a), state = line.substr(a + 1, b - a - 1);
    const std::string features = "," + line.substr(b + 1) + ",";
    Holding h{node, state, features.find("," + mark + ",") != std::string::npos,
              !shared.empty() && features.find("," + shared + ",") != std::string::npos};
    if (!h.mine && !h.shared) continue;
    if (seen.insert(node).second) holding.push_back(std::move(h));  // once per partition
  }
  const std::string marks =
      "your mark " + mark + (shared.empty() ? "" : ", the shared copy's " + shared);
  if (!unreadable.empty()) {
    std::printf(
        "%s is shared on this cluster, but you cannot read it (%s): a shared copy serves you "
        "only what you can read on the PFS, so its nodes are not listed\n",
        shown.c_str(), unreadable.c_str());
  }
  if (holding.empty()) {
    std::printf(
        "no node holds your kept copy of %s (mark %s)%s: a job with --nopfs=%s that the site's "
        "keep policy lets keep its copy (--nopfs-keep, docs/user.md) marks the nodes it ran on "
        "once it ends%s\n",
        shown.c_str(), mark.c_str(),
        shared.empty() ? "" : (", nor its shared copy (mark " + shared + ")").c_str(),
        shown.c_str(),
        shared.empty() ? ""
                       : "; a node's shared copy is marked once it holds half of what the site "
                         "lets it hold");
    return 1;
  }
  std::printf("copies of %s are on %zu node%s (%s):\n", shown.c_str(), holding.size(),
              holding.size() == 1 ? "" : "s", marks.c_str());
  // What made each node carry the user's mark: a kept copy, a running job's tiers or both. This
  // node's kept area and sibling registry tell; of another node, only whether a job of the user
  // runs there (squeue): without one, the mark is a kept copy's.
  const std::string here = ThisNode(f);
  std::optional<std::map<std::string, std::vector<std::string>>> running;
  bool asked = false;
  for (const Holding& h : holding) {
    const std::string node = Printable(h.node, 100);
    std::vector<std::string> what;
    if (h.mine && h.node == here) {
      const std::vector<std::string> ssd = SsdPaths(f);
      const std::string copy = LocalCopy(ssd, dataset);
      if (!copy.empty()) what.push_back(copy);
      const std::vector<std::string> jobs = LocalRunning(ssd, dataset);
      if (!jobs.empty()) {
        what.push_back("the tiers of your running " + JobList(jobs) + " (until " +
                       (jobs.size() == 1 ? "it ends" : "they end") + ")");
      }
      if (what.empty()) {
        what.push_back(
            "your mark, but no kept copy or running job of yours on the dataset here now (the "
            "mark goes within a minute)");
      }
    } else if (h.mine) {
      if (!asked) {
        running = RunningJobsByNode();
        asked = true;
      }
      const std::vector<std::string>* jobs = nullptr;
      if (running) {
        const auto it = running->find(h.node);
        if (it != running->end()) jobs = &it->second;
      }
      if (running && jobs == nullptr) {
        what.push_back("your kept copy (size and last use: `nopfs cache ls` on " + node + ")");
      } else {
        what.push_back("your kept copy, or the tiers of " +
                       (jobs != nullptr ? "your " + JobList(*jobs) + " running there"
                                        : std::string("a job of yours running there (squeue "
                                                      "did not say)")) +
                       ", or both (`nopfs where` on " + node + " tells)");
      }
    }
    if (h.shared) what.push_back("the shared copy (every user's)");
    std::string text;
    for (const std::string& w : what)
      text += (text.empty() ? "" : "; ") + w;
    std::printf("  %s (%s): %s\n", node.c_str(), Printable(h.state, 40).c_str(), text.c_str());
  }
  // When a job on one of them could start: a test job that requires the marks (Slurm's test
  // jobs do not weigh a --prefer), as job_submit.lua adds them to a job's --prefer; only marks
  // some node carries (Slurm refuses a constraint naming a feature no node has).
  std::string constraint;
  for (const bool mine : {true, false}) {
    const bool carried = std::any_of(holding.begin(), holding.end(),
                                     [&](const Holding& h) { return mine ? h.mine : h.shared; });
    if (carried) constraint += (constraint.empty() ? "" : "|") + (mine ? mark : shared);
  }
  Result<Ran> start = RunCommand({"sbatch", "--test-only", "--job-name=nopfs-where", "--nodes=1",
                                  "--ntasks=1", "--constraint=" + constraint, "--wrap=true"});
  if (start.ok() && std::regex_search(start->text, m, kStart)) {
    std::printf("a 1-node job on them could start on %s at %s\n",
                Printable(m[2].str(), 200).c_str(), Printable(m[1].str(), 40).c_str());
  }
  return 0;
}

}  // namespace

void RegisterWhere(CLI::App* app, int* exit_code) {
  auto f = std::make_shared<WhereFlags>();
  CLI::App* sub = app->add_subcommand(
      "where",
      "The nodes your next job on DATASET prefers, as placement marks them in Slurm: your kept "
      "copy, your running job's tiers (the node it runs on tells them apart), and a shared "
      "dataset's copy (asks slurmctld with sbatch --test-only, which submits nothing)");
  sub->add_option("dataset", f->dataset, "The dataset, as after --nopfs=")->required();
  sub->add_option("--config", f->config,
                  "The node config, for what this node holds (your kept copy's size and last "
                  "use, your running jobs on the dataset)")
      ->capture_default_str();
  sub->add_option("--node", f->node,
                  "This host's node name in Slurm (default: $SLURMD_NODENAME, else the short "
                  "host name)");
  sub->callback([f, exit_code] { *exit_code = RunWhere(*f); });
}

}  // namespace nopfs::cli
