#include "launch/daemon_args.h"

namespace nopfs::launch {

std::vector<std::string> DaemonArgs::ToArgv() const {
  const DaemonArgs defaults;
  const policy::JobSpec& j = job.job;
  std::vector<std::string> a = {"--run-dir",        run_dir,
                                "--dataset",        dataset,
                                "--seed",           std::to_string(j.seed),
                                "--epochs",         std::to_string(j.epochs),
                                "--ranks",          std::to_string(j.ranks),
                                "--batch",          std::to_string(j.batch),
                                "--scheme",         job.scheme,
                                "--ranks-per-node", std::to_string(j.ranks_per_node),
                                "--node",           std::to_string(node)};
  const auto add = [&a](const char* flag, const std::string& value) {
    a.emplace_back(flag);
    a.push_back(value);
  };
  if (j.drop_last) a.emplace_back("--drop-last");
  if (j.samples != 0) add("--samples", std::to_string(j.samples));
  if (!config.empty()) add("--config", config);
  if (job_id != defaults.job_id) add("--job-id", job_id);
  if (!ram.empty()) add("--ram", ram);
  if (!ssd.empty()) add("--ssd", ssd);
  if (plan_threads != defaults.plan_threads) add("--plan-threads", std::to_string(plan_threads));
  if (!peers.empty()) add("--peers", peers);
  if (!peer_listen.empty()) add("--peer-listen", peer_listen);
  if (!peer_secret_file.empty()) add("--peer-secret-file", peer_secret_file);
  if (peer_provider != defaults.peer_provider) add("--peer-provider", peer_provider);
  if (peer_timeout_ms != defaults.peer_timeout_ms) {
    add("--peer-timeout-ms", std::to_string(peer_timeout_ms));
  }
  if (peer_startup_timeout_ms != defaults.peer_startup_timeout_ms) {
    add("--peer-startup-timeout-ms", std::to_string(peer_startup_timeout_ms));
  }
  if (keep) a.emplace_back("--keep");
  if (keep_max_bytes != 0) add("--keep-max-bytes", std::to_string(keep_max_bytes));
  if (!share_running) add("--share-running", "no");
  if (!shared_socket.empty()) add("--shared-socket", shared_socket);
  if (!shared_dataset.empty()) add("--shared-dataset", shared_dataset);
  if (summary) a.emplace_back("--summary");
  if (ready_fd >= 0) add("--ready-fd", std::to_string(ready_fd));
  if (allow_root) a.emplace_back("--allow-root");
  return a;
}

void AddDaemonFlags(CLI::App* app, DaemonArgs* args) {
  app->add_option("--run-dir", args->run_dir, "The job's run directory (socket, log)")->required();
  app->add_option("--dataset", args->dataset, "ImageFolder directory or manifest file")->required();
  AddJobFlags(app, &args->job, /*samples_required=*/false);
  app->add_option("--node", args->node, "This node's index in the job")->capture_default_str();
  app->add_option("--config", args->config, "Node config (Lua)");
  app->add_option("--job-id", args->job_id,
                  "The job's id (names the shared memory and SSD directory)")
      ->capture_default_str();
  app->add_option("--ram", args->ram,
                  "RAM granted to the job on this node, as Slurm's --mem (default: the config's)");
  app->add_option("--ssd", args->ssd,
                  "SSD granted to the job on this node, as --ram (default: the config's)");
  app->add_option("--plan-threads", args->plan_threads, "Planner threads (0: all cores)");
  app->add_option("--peers", args->peers,
                  "Every node's HOST:PORT for peer reads, in node order (docs/fabric.md)");
  app->add_option("--peer-listen", args->peer_listen,
                  "This node's HOST:PORT (must be its entry of --peers)");
  app->add_option("--peer-secret-file", args->peer_secret_file,
                  "The job's peer secret: 32 bytes, mode 0600 (needed with --peers)");
  app->add_option("--peer-provider", args->peer_provider, "libfabric provider")
      ->capture_default_str();
  app->add_option("--peer-timeout-ms", args->peer_timeout_ms,
                  "A peer silent this long is dead for the rest of the job")
      ->capture_default_str();
  app->add_option("--peer-startup-timeout-ms", args->peer_startup_timeout_ms,
                  "How long after its start nopfsd waits for the other nodes to answer before it "
                  "goes on without them (a node that starts later still joins)")
      ->capture_default_str();
  app->add_flag("--keep", args->keep,
                "Keep the SSD tier's samples at exit for the next job on the same dataset "
                "(docs/tiers.md, \"The kept area\")");
  app->add_option("--keep-max-bytes", args->keep_max_bytes,
                  "Keep at most this many bytes (0: no limit)");
  app->add_option("--share-running", args->share_running,
                  "yes: read samples from, and serve them to, this user's other running jobs on "
                  "this node and dataset, so that the PFS is read once (docs/tiers.md, \"Sibling "
                  "jobs\"); no: each job reads on its own")
      ->capture_default_str();
  app->add_option("--shared-socket", args->shared_socket,
                  "Read the dataset from the node's shared copy through the share service at "
                  "this socket, each file proved by opening it (docs/tiers.md, \"Shared "
                  "datasets\"); the Slurm prolog passes it for a dataset the node config shares");
  app->add_option("--shared-dataset", args->shared_dataset,
                  "The shared dataset's directory as the node config declares it (with "
                  "--shared-socket)");
  app->add_flag("--summary", args->summary,
                "Rewrite the job's status report to <run dir>/summary every few seconds and at "
                "exit, and leave it there (the Slurm epilog's record of the job)");
  app->add_option("--ready-fd", args->ready_fd,
                  "Also say ready/failed on this inherited pipe (the launcher's)");
  app->add_flag("--allow-root", args->allow_root,
                "Run even as root (only for a personal machine: nopfsd is meant to run as the "
                "job's user)");
}

}  // namespace nopfs::launch
