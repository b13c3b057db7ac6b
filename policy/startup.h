// The start-up model: how long the nodes of a job take to start their peer link and build the
// dataset's catalog in one shared scan (docs/catalog.md, "One scan per job"), what it asks of the
// PFS's metadata servers, and the same for every node scanning alone (no peer link). `nopfs
// simulate --startup` prints it (docs/simulate.md, "Start-up").
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace nopfs::policy {

struct StartupModel {
  uint64_t files = 0;    // F, files of an ImageFolder dataset
  uint64_t classes = 1;  // class directories (the unit the nodes divide the walk by)
  uint32_t nodes = 1;
  uint32_t scan_threads = 8;        // per node (CatalogOptions::scan_threads)
  double metadata_latency = 0.001;  // seconds per PFS metadata operation (stat, listing)
  double network_bandwidth = 0;     // bytes/s into and out of each node (0: no peers)
  double round_latency = 0.001;     // seconds per exchange round, on top of the bytes
  double path_bytes = 32;           // mean relative path length, bytes
  // The peer link's start before the scan (nopfsd's `peers` phase: docs/fabric.md, "What the start
  // costs"): seconds per daemon to load libfabric, open its endpoint and make its first send,
  // then seconds per other node of the job for the handshakes both ways and their connection
  // (bench/link_start_bench.cc: one daemon's CPU per peer).
  double link_start = 0.45;
  double link_per_peer = 0.002;
  // One node's CPU per sample to build the catalog once the walk is done: decode the other nodes'
  // parts, lay them out by class and sort each, index the paths (startup_bench's `assemble` and
  // `index` phases on 1,000,000 files: 0.77 s on a node of 2, docs/PERFORMANCE.md). A node
  // scanning alone pays the same but the decoding.
  double catalog_per_sample = 0.8e-6;

  // Every field in range; the message names the field.
  Status Validate() const;
};

struct StartupPrediction {
  double link_seconds = 0;      // the peer link's start: link_start + (nodes - 1) x link_per_peer
  double root_seconds = 0;      // node 0: stat and list the root, stat its entries
  double walk_seconds = 0;      // the slowest node's share of the walk
  double exchange_seconds = 0;  // the two rounds: the lead, then every node's part to every node
  double catalog_seconds = 0;   // building the catalog: files x catalog_per_sample
  double total_seconds = 0;     // link + root + walk + exchange + catalog: on every node
  uint64_t metadata_ops = 0;    // the job's PFS metadata operations
  uint64_t catalog_bytes = 0;   // what each node receives in the second round
};

// One scan per job, after the peer link's start (with nodes == 1 or no network: the node scans
// alone, without a link).
StartupPrediction PredictSharedScan(const StartupModel& m);
// Every node scanning the whole dataset itself, without a peer link.
StartupPrediction PredictLoneScans(const StartupModel& m);

}  // namespace nopfs::policy
