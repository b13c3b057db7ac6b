// Metrics: nopfsd's status in the Prometheus text exposition format, written for node_exporter's
// textfile collector (docs/admin.md, "Metrics"). The file is `<dir>/nopfs_<job>.prom`. Under Slurm
// root made it for the job's user in a directory only root writes, so nopfsd rewrites it in place
// (it may neither create nor rename there): under a write lease (fcntl F_SETLEASE), taken only
// while nobody else has the file open and making every other open(2) wait until it is released,
// so the collector opens either the old text or the new one, never a mix; the epilog removes it.
//
// Every series carries the labels slurm_job_id, slurm_user and slurm_node (never `job`, `instance`
// or `node`, which Prometheus and its service discovery set on every scraped series); the names
// and their meaning are in docs/admin.md. The stall is a Prometheus histogram (_bucket, _sum,
// _count) in seconds; nopfs_build_info carries the version, nopfs_start_time_seconds the start.
//
// Thread safety: RenderMetrics is reentrant; a MetricsWriter is used from one thread at a time.
#pragma once

#include <sys/stat.h>

#include <string>

#include "common/status.h"
#include "launch/run_files.h"
#include "protocol/status_report.h"
#include "service/env/local_io.h"

namespace nopfs::service {

struct MetricsLabels {
  std::string job;        // the Slurm job id ("local" for `nopfs run`)
  std::string user;       // the job's user name
  std::string node;       // the host name
  double start_time = 0;  // when nopfsd started, in unix seconds (nopfs_start_time_seconds)
};

// The exposition text of one report.
std::string RenderMetrics(const report::StatusReport& r, const MetricsLabels& labels);

// The file's name: launch::MetricsFileName (the epilog removes it by that name).
using launch::MetricsFileName;

class MetricsWriter {
 public:
  // The file's I/O goes through `io` (nullptr: LocalIo::Default()), which must outlive this.
  MetricsWriter(std::string dir, MetricsLabels labels, LocalIo* io = nullptr);
  // Ignores SIGIO (a reader's open sends it to break the lease; its default action would end the
  // process) unless the process handles it already.
  //
  // Renders `r` and rewrites the file (O_NOFOLLOW; made if absent only in a directory of this
  // user's that nobody else may write, as `nopfs run`'s, never among other users' files): the
  // space is reserved first (a full disk leaves the previous text whole), then the text written
  // under the lease; a write that fails midway leaves the file empty, never half a text. A reader
  // that keeps the file open for over kLeaseAttempts * kLeaseWaitUs leaves it as it was
  // (Unavailable); another writer of the same file (nodes sharing one metrics directory) is
  // taken turns with, never locked out. Where no lease is granted (NFS), the file is rewritten
  // without one and a warning logged once. An error names the path and what failed, the same words
  // for the same fault.
  Status Write(const report::StatusReport& r);
  const std::string& path() const { return path_; }
  // Removes the file if this writer made it (`nopfs run`'s, which has no epilog); the file root
  // made for a Slurm job is the epilog's to remove. For the end of nopfsd, after the last Write.
  Status RemoveIfMade();

  static constexpr int kLeaseAttempts = 100;
  static constexpr unsigned kLeaseWaitUs = 2000;

 private:
  // Opens the file (made if absent where Write says) and checks it is a regular file of this
  // user's; `busy`: the open failed only because another writer holds the lease.
  Status Open(int* fd, struct stat* st, bool* busy);

  std::string dir_;
  MetricsLabels labels_;
  std::string path_;
  LocalIo* io_;
  bool created_ = false;  // this writer made the file (see RemoveIfMade)
  bool lease_warned_ = false;
};

}  // namespace nopfs::service
