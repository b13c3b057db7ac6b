// nopfsd's command line as a struct: the launchers (`nopfs run`, the Slurm plugin's nopfs-job)
// fill a DaemonArgs and call ToArgv; nopfsd parses the same flags back with AddDaemonFlags. An
// option of nopfsd is added here, once, and every launcher can pass it.
//
// Thread safety: reentrant.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "launch/job_flags.h"

namespace nopfs::launch {

inline constexpr uint32_t kDefaultPeerStartupTimeoutMs = 60000;

struct DaemonArgs {
  std::string run_dir;           // the job's run directory (socket, log)
  std::string dataset;           // ImageFolder directory or manifest file
  JobFlags job;                  // job.job.samples 0: F from the dataset
  uint32_t node = 0;             // this node's index in the job
  std::string config;            // node config (Lua); empty: the default config
  std::string job_id = "local";  // Slurm's job id (names the shared memory and SSD directory)
  std::string ram;               // RAM granted on this node, as a size; empty: the config's
  std::string ssd;               // SSD granted on this node, as a size; empty: the config's
  unsigned plan_threads = 0;     // 0: all cores
  // Peers (docs/fabric.md): every node's HOST:PORT in node order, this node's entry, the job's
  // secret file, the libfabric provider, the silence after which a peer is dead.
  std::string peers;
  std::string peer_listen;
  std::string peer_secret_file;
  std::string peer_provider = "tcp;ofi_rxm";
  uint32_t peer_timeout_ms = 5000;
  // The start-up phase (docs/fabric.md, "Start-up"): how long after its start nopfsd waits for
  // the other nodes' nopfsd to answer before it goes on without them.
  uint32_t peer_startup_timeout_ms = kDefaultPeerStartupTimeoutMs;
  // The kept area (kept/area.h): keep the SSD tier's samples at exit; keep at most this
  // many bytes (0: no limit given).
  bool keep = false;
  uint64_t keep_max_bytes = 0;
  // Serve, and read from, the user's other jobs on this node and dataset (docs/tiers.md,
  // "Sibling jobs"); off with --share-running=no.
  bool share_running = true;
  // The node's shared copy (docs/tiers.md, "Shared datasets"): the share service's socket and
  // the declared dataset it keeps, which must be the job's dataset directory; empty: none.
  std::string shared_socket;
  std::string shared_dataset;
  // Leave the job's summary (run_files.h kSummaryName) in the run directory for the epilog.
  bool summary = false;
  int ready_fd = -1;  // an inherited pipe on which to say ready or failed (run_files.h)
  bool allow_root = false;

  // The arguments after argv[0]: the job flags always, the rest when they differ from the
  // defaults above.
  std::vector<std::string> ToArgv() const;
};

// Registers every flag of DaemonArgs on `app` (nopfsd's parser). After parsing, FinishJobFlags
// checks the job.
void AddDaemonFlags(CLI::App* app, DaemonArgs* args);

}  // namespace nopfs::launch
