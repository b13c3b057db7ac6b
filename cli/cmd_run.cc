#include "cli/cmd_run.h"

#include <cstdio>
#include <memory>
#include <string>

#include "cli/run_job.h"

namespace nopfs::cli {
namespace run {

std::atomic<int> g_signal{0};
void OnSignal(int sig) {
  g_signal.store(sig);
}

std::string CheckJobId(const std::string& id) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), v);
  if (!id.empty() && ec == std::errc() && end == id.data() + id.size() && v != 0 && id[0] != '0') {
    return std::string();
  }
  // The value as given, cut short and with anything unprintable shown as '?'.
  std::string shown;
  for (size_t i = 0; i < id.size() && i < 64; ++i)
    shown += std::isprint(static_cast<unsigned char>(id[i])) ? id[i] : '?';
  return "\"" + shown + (id.size() > 64 ? "..." : "") +
         "\" is not a job id: write a Slurm job id, a decimal number from 1 to " +
         std::to_string(UINT64_MAX) + " without leading zeros (e.g. --job-id 4242)";
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "nopfs run: %s\n", msg.c_str());
  return 2;
}

std::string DaemonPath() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path beside = self.parent_path() / "nopfsd";
    if (access(beside.c_str(), X_OK) == 0) return beside.string();
  }
  if (access(NOPFS_INSTALLED_NOPFSD, X_OK) == 0) return NOPFS_INSTALLED_NOPFSD;
  return "nopfsd";
}

std::string LogTail(const std::string& run_dir) {
  std::ifstream in(run_dir + "/" + launch::kLogName);
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

Result<uint16_t> FreePorts(uint32_t count) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return Status::FromErrno(errno, "socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    const bool got = ::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                     ::getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    ::close(probe);
    if (!got) continue;
    const uint32_t base = ntohs(a.sin_port);
    if (base + count > 65535) continue;
    bool free = true;
    for (uint32_t p = base; p < base + count && free; ++p) {
      const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in b{};
      b.sin_family = AF_INET;
      b.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      b.sin_port = htons(static_cast<uint16_t>(p));
      free = s >= 0 && ::bind(s, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0;
      if (s >= 0) ::close(s);
    }
    if (free) return static_cast<uint16_t>(base);
  }
  return Status::Unavailable("no free range of " + std::to_string(count) + " local ports");
}

Status WriteSecret(const std::string& path) {
  std::array<unsigned char, 32> key{};
  if (::getrandom(key.data(), key.size(), 0) != static_cast<ssize_t>(key.size())) {
    return Status::FromErrno(errno, "getrandom");
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Status::FromErrno(errno, "create " + path);
  const bool ok = ::write(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size());
  ::close(fd);
  return ok ? Status::Ok() : Status::FromErrno(errno, "write " + path);
}

std::vector<std::string> SplitList(const std::string& list) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(list);
  while (std::getline(in, item, ','))
    out.push_back(item);
  return out;
}

}  // namespace run

namespace {

using launch::AddJobFlags;
using launch::FinishJobFlags;
using run::CheckJobId;
using run::JobRun;
using run::RunFlags;

int RunJob(RunFlags& f, bool ranks_per_node_given, bool ranks_given) {
  JobRun run(f);
  return run.Run(ranks_per_node_given, ranks_given);
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
  sub->add_option("--nodes", f->nodes,
                  "Start all N nodes of the job on this machine, each with its own nopfsd, and "
                  "let them read from each other over loopback (libfabric)")
      ->check(CLI::Range(1u, 64u));
  sub->add_option("--hosts", f->hosts,
                  "With --nodes N: the address each node listens on, A0,A1,... (default "
                  "127.0.0.1 for all)");
  sub->add_option("--netns", f->netns,
                  "Run node n's nopfsd and ranks in the n-th network namespace, NS0,NS1,... (names "
                  "in /run/netns or paths; needs root and --user)");
  sub->add_option(
      "--user", f->user,
      "As root: run the daemons and ranks as USER (groups cleared), and finish as USER");
  sub->add_option("--config", f->config, "Node config (Lua); default: a RAM tier of 1/8 of memory")
      ->check(CLI::ExistingFile);
  sub->add_option("--run-dir", f->run_dir,
                  "Directory for nopfsd's socket and log (default: $TMPDIR/nopfs-run-UID-PID, "
                  "removed afterwards)");
  sub->add_flag("--keep-run-dir", f->keep_run_dir, "Keep the run directory (and the log)");
  sub->add_flag("--keep", f->keep,
                "Keep the SSD tier's samples on this machine for the next run on the dataset "
                "(nopfs cache ls shows them)");
  sub->add_option("--keep-max-bytes", f->keep_max_bytes,
                  "With --keep: keep at most this much (a size as Slurm's --mem: 40G, 512M; 0: no "
                  "limit)")
      ->transform(CLI::Validator(
          [](std::string& value) -> std::string {
            Result<uint64_t> bytes = ParseSize(value);
            if (!bytes.ok()) return bytes.status().message();
            value = std::to_string(*bytes);
            return std::string();
          },
          "SIZE"))
      ->needs("--keep");
  sub->add_option("--share-running", f->share_running,
                  "yes: read samples through this user's other running jobs on the dataset, "
                  "and serve them, so that the PFS is read once; no: read alone")
      ->capture_default_str();
  sub->add_option("--job-id", f->job_id,
                  "The job id nopfsd runs under, as a Slurm job id (a number; default: local). "
                  "Two runs at once on one machine need two ids: it names their shared memory "
                  "and SSD directories")
      ->check(CLI::Validator(CheckJobId, "ID"));
  sub->add_option("--start-timeout", f->start_timeout, "Seconds to wait for nopfsd to be ready")
      ->capture_default_str();
  sub->add_option("--stop-timeout", f->stop_timeout, "Seconds to wait for nopfsd to stop")
      ->capture_default_str();
  sub->add_flag("-q,--quiet", f->quiet, "Print only the summary");
  sub->add_option("command", f->command, "The command each rank runs (after --)")
      ->required()
      ->expected(-1);
  sub->callback([f, exit_code, sub] {
    *exit_code = RunJob(*f, sub->count("--ranks-per-node") > 0, sub->count("--ranks") > 0);
  });
}

}  // namespace nopfs::cli
