// Metrics: nopfsd's status in the Prometheus text exposition format, written for node_exporter's
// textfile collector (docs/admin.md, "Metrics"). The file is `<dir>/nopfs_<job>.prom`, replaced
// atomically (written to a hidden temporary file of a fresh random name, made with O_EXCL, in the
// same directory, then renamed), so the collector never reads half a file; the epilog removes it.
//
// Every series carries the labels job, user and node; the names and their meaning are in
// docs/admin.md. The stall is a Prometheus histogram (_bucket, _sum, _count) in seconds.
//
// Thread safety: RenderMetrics is reentrant; a MetricsWriter is used from one thread at a time.
#pragma once

#include <string>

#include "common/status.h"
#include "launch/run_files.h"
#include "protocol/status_report.h"
#include "service/env/local_io.h"

namespace nopfs::service {

struct MetricsLabels {
  std::string job;   // the Slurm job id ("local" for `nopfs run`)
  std::string user;  // the job's user name
  std::string node;  // the host name
};

// The exposition text of one report.
std::string RenderMetrics(const report::StatusReport& r, const MetricsLabels& labels);

// The file's name: launch::MetricsFileName (the epilog removes it by that name).
using launch::MetricsFileName;

class MetricsWriter {
 public:
  // The file's I/O goes through `io` (nullptr: LocalIo::Default()), which must outlive this.
  MetricsWriter(std::string dir, MetricsLabels labels, LocalIo* io = nullptr);
  // Renders `r` and replaces the file; a failure leaves the previous file whole and no temporary
  // file. An error names the path (never the temporary name, so that the same fault gives the
  // same message) and what failed.
  Status Write(const report::StatusReport& r);
  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  MetricsLabels labels_;
  std::string path_;
  LocalIo* io_;
};

}  // namespace nopfs::service
