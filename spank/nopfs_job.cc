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
//   nopfs-job share-serve --config=PATH --dir=DIR --node=NAME
//
// share-serve: the node's share service for the datasets the node config declares shared
// (launcher_share.cc), started by a prolog that needs it.
#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>

#include "common/version.h"
#include "spank/launcher.h"

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
}  // namespace nopfs::spank::launcher

int main(int argc, char** argv) {
  using namespace nopfs::spank::launcher;
  ::umask(022);
  if (argc == 2 && std::string_view(argv[1]) == "--version") {
    std::printf("nopfs-job (nopfs) %s\n", nopfs::kVersion);
    return 0;
  }
  if (argc >= 2 && std::string_view(argv[1]) == "share-serve") return ShareServe(argc, argv);
  nopfs::Result<Job> job = ParseCommandLine(argc, argv);
  if (!job.ok()) {
    std::printf("nopfs: %s: %s\n", argc > 1 ? argv[1] : "nopfs-job",
                job.status().message().c_str());
    return 1;
  }
  const int rc = job->mode == "prolog" ? Prolog(*job, argv[0]) : Epilog(*job);
  std::fflush(stdout);
  return rc;
}
