// The start-up model (see startup.h and docs/simulate.md, "Start-up").
#include "policy/startup.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace nopfs::policy {
namespace {

// Bytes of one sample in the second round (catalog_share.cc: the path, three varints) and of one
// stamp (path, four le64).
double SampleBytes(const StartupModel& m) {
  return 4 + m.path_bytes + 3 * 3;
}
double StampBytes(const StartupModel& m) {
  return 4 + 24 + m.path_bytes / 2 + 32;
}

// Seconds for `ops` metadata operations on `threads` threads.
double MetadataSeconds(const StartupModel& m, double ops, uint32_t threads) {
  return std::ceil(ops / threads) * m.metadata_latency;
}

// Node 0's root listing: the root's stat and listing, then one stat per class directory.
double RootSeconds(const StartupModel& m) {
  return 2 * m.metadata_latency +
         MetadataSeconds(m, static_cast<double>(m.classes), m.scan_threads);
}

// A walk of `classes` classes: per class a stat and a listing of its directory, then a stat per
// file.
double WalkSeconds(const StartupModel& m, uint64_t classes) {
  const double per_class = static_cast<double>(m.files) / static_cast<double>(m.classes) + 2;
  return MetadataSeconds(m, per_class * static_cast<double>(classes), m.scan_threads);
}

}  // namespace

Status StartupModel::Validate() const {
  if (files == 0) return Status::InvalidArgument("startup: files must be >= 1");
  if (classes == 0 || classes > files) {
    return Status::InvalidArgument("startup: classes must be 1..files (" + std::to_string(files) +
                                   "), got " + std::to_string(classes));
  }
  if (nodes == 0) return Status::InvalidArgument("startup: nodes must be >= 1");
  if (scan_threads == 0) return Status::InvalidArgument("startup: scan threads must be >= 1");
  if (!(metadata_latency >= 0) || !(network_bandwidth >= 0) || !(round_latency >= 0) ||
      !(path_bytes >= 0)) {
    return Status::InvalidArgument("startup: latencies, bandwidth and path length must be >= 0");
  }
  if (!(link_start >= 0) || !std::isfinite(link_start)) {
    return Status::InvalidArgument("startup: link start must be >= 0 seconds, got " +
                                   std::to_string(link_start));
  }
  if (!(catalog_per_sample >= 0) || !std::isfinite(catalog_per_sample)) {
    return Status::InvalidArgument("startup: catalog per sample must be >= 0 seconds, got " +
                                   std::to_string(catalog_per_sample));
  }
  if (!(link_per_peer >= 0) || !std::isfinite(link_per_peer)) {
    return Status::InvalidArgument("startup: link per peer must be >= 0 seconds, got " +
                                   std::to_string(link_per_peer));
  }
  return Status::Ok();
}

StartupPrediction PredictLoneScans(const StartupModel& m) {
  StartupPrediction p;
  p.root_seconds = RootSeconds(m);
  p.walk_seconds = WalkSeconds(m, m.classes);
  p.catalog_seconds = static_cast<double>(m.files) * m.catalog_per_sample;
  p.total_seconds = p.root_seconds + p.walk_seconds + p.catalog_seconds;
  p.metadata_ops = static_cast<uint64_t>(m.nodes) * (2 + m.classes + m.files + 2 * m.classes);
  return p;
}

StartupPrediction PredictSharedScan(const StartupModel& m) {
  if (m.nodes == 1 || m.network_bandwidth <= 0) return PredictLoneScans(m);
  StartupPrediction p;
  p.root_seconds = RootSeconds(m);
  // Classes go round-robin: the busiest node walks ceil(classes / nodes) of them.
  p.walk_seconds = WalkSeconds(m, (m.classes + m.nodes - 1) / m.nodes);
  const double catalog = static_cast<double>(m.files) * SampleBytes(m) +
                         static_cast<double>(m.classes) * StampBytes(m);
  const double lead = static_cast<double>(m.classes) * (4 + m.path_bytes / 2) + 64;
  p.catalog_bytes = static_cast<uint64_t>(catalog);
  // Node 0 sends the lead to every other node; then each node sends its part to every other and
  // receives the rest of the catalog (full duplex, so the larger of the two directions counts).
  p.exchange_seconds = 2 * m.round_latency +
                       lead * static_cast<double>(m.nodes - 1) / m.network_bandwidth +
                       catalog / m.network_bandwidth;
  // Every daemon starts its link and handshakes with every other node before it scans.
  p.link_seconds = m.link_start + static_cast<double>(m.nodes - 1) * m.link_per_peer;
  p.catalog_seconds = static_cast<double>(m.files) * m.catalog_per_sample;
  p.total_seconds =
      p.link_seconds + p.root_seconds + p.walk_seconds + p.exchange_seconds + p.catalog_seconds;
  p.metadata_ops = 2 + m.classes + m.files + 2 * m.classes + (m.nodes - 1);
  return p;
}

}  // namespace nopfs::policy
