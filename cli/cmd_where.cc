#include "cli/cmd_where.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/lexical_path.h"
#include "common/printable.h"
#include "common/unique_fd.h"
#include "common/units.h"
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

// Size and last use of the user's copies of `dataset` on this node, or "" when the config does
// not load or holds none.
std::string LocalCopy(const WhereFlags& f, const std::string& dataset) {
  Result<lua::NodeConfig> config = lua::LoadNodeConfig(f.config);
  if (!config.ok()) return "";
  std::vector<std::string> paths;
  for (const policy::StorageClass& c : config->model().classes) {
    if (c.kind == policy::ClassKind::kSsd && !c.path.empty()) paths.push_back(c.path);
  }
  const kept::KeptNode mine = kept::KeptNode::Scan(paths, ::getuid());
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
  return FormatBytes(static_cast<double>(bytes)) + ", last used " +
         kept::FormatAge(static_cast<int64_t>(::time(nullptr)) - last_used) + " ago";
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

  Result<Ran> nodes = RunCommand({"sinfo", "--noheader", "--Node", "--format=%N %T %b"});
  if (!nodes.ok()) return Fail(nodes.status().message());
  if (launch::ExitCodeOf(nodes->status) != 0) {
    return Fail("cannot ask Slurm for the nodes' features: sinfo says: " + LastLine(nodes->text));
  }
  std::vector<std::pair<std::string, std::string>> holding;  // node, state
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
    if (features.find("," + mark + ",") == std::string::npos) continue;
    if (seen.insert(node).second) holding.emplace_back(node, state);  // once per partition
  }
  if (holding.empty()) {
    std::printf(
        "no node holds your kept copy of %s (mark %s): a job with --nopfs=%s that the site's "
        "keep policy lets keep its copy (--nopfs-keep, docs/user.md) marks the nodes it ran on "
        "once it ends\n",
        shown.c_str(), mark.c_str(), shown.c_str());
    return 1;
  }
  std::printf("your kept copy of %s (mark %s) is on %zu node%s:\n", shown.c_str(), mark.c_str(),
              holding.size(), holding.size() == 1 ? "" : "s");
  const std::string here = ThisNode(f);
  for (const auto& [node, state] : holding) {
    std::string what = node == here ? LocalCopy(f, dataset) : "";
    if (what.empty()) what = "size and last use: `nopfs cache ls` on " + Printable(node, 100);
    std::printf("  %s (%s): %s\n", Printable(node, 100).c_str(), Printable(state, 40).c_str(),
                what.c_str());
  }
  // When a job on one of them could start: a test job that requires the mark (Slurm's test
  // jobs do not weigh a --prefer).
  Result<Ran> start = RunCommand({"sbatch", "--test-only", "--job-name=nopfs-where", "--nodes=1",
                                  "--ntasks=1", "--constraint=" + mark, "--wrap=true"});
  if (start.ok() && std::regex_search(start->text, m, kStart)) {
    std::printf("a 1-node job on it could start on %s at %s\n", Printable(m[2].str(), 200).c_str(),
                Printable(m[1].str(), 40).c_str());
  }
  return 0;
}

}  // namespace

void RegisterWhere(CLI::App* app, int* exit_code) {
  auto f = std::make_shared<WhereFlags>();
  CLI::App* sub = app->add_subcommand(
      "where",
      "The nodes that hold your kept copy of DATASET, as placement marks them in Slurm (asks "
      "slurmctld with sbatch --test-only, which submits nothing)");
  sub->add_option("dataset", f->dataset, "The dataset, as after --nopfs=")->required();
  sub->add_option("--config", f->config,
                  "The node config, for the size and last use of the copy on this node")
      ->capture_default_str();
  sub->add_option("--node", f->node,
                  "This host's node name in Slurm (default: $SLURMD_NODENAME, else the short "
                  "host name)");
  sub->callback([f, exit_code] { *exit_code = RunWhere(*f); });
}

}  // namespace nopfs::cli
