// The performance model of docs/algorithm.md §4: bandwidth tables, storage classes, the PFS curve
// t(gamma), per-sample fetch times, source selection and the readiness heuristic.
//
// Units: bytes and bytes per second (double) everywhere in code; configs may write MB/s, and the
// config loader converts. Threads and readers are counts.
//
// Thread safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "policy/job.h"

namespace nopfs::policy {

// A measured curve y(x) (x: threads or readers; y: bytes/s), interpolated piecewise-linearly
// between points and clamped to the first and last point outside them.
class BandwidthTable {
 public:
  BandwidthTable() = default;
  explicit BandwidthTable(std::vector<std::pair<double, double>> points);
  // A flat curve: `bytes_per_second` for any x.
  static BandwidthTable Constant(double bytes_per_second);

  // Points sorted by strictly increasing x >= 0, y > 0 and finite, at least one point; the
  // message names the point ("point 2 (4, 0): ...").
  Status Validate() const;
  // y at x; 0 for an empty table.
  double At(double x) const;
  const std::vector<std::pair<double, double>>& points() const { return points_; }
  bool empty() const { return points_.empty(); }

 private:
  std::vector<std::pair<double, double>> points_;
};

enum class ClassKind { kRam, kSsd };

// Storage class j of the model: class 0 is the staging buffer, classes 1..J the cache tiers,
// fastest first.
struct StorageClass {
  std::string name;  // "ram", "ssd", ...: shown in plans and status
  ClassKind kind = ClassKind::kRam;
  std::string path;      // directory for kSsd; empty for kRam
  Bytes capacity = 0;    // d_j
  uint32_t threads = 1;  // p_j prefetch threads
  BandwidthTable read;   // r_j(p): aggregate read bytes/s with p threads
  BandwidthTable write;  // w_j(p): aggregate write bytes/s with p threads
};

struct SystemModel {
  double compute_rate = 0;       // c, bytes/s the consumer processes (0: infinitely fast)
  double preprocess_rate = 0;    // beta, bytes/s of preprocessing (0: none, i.e. infinite)
  double network_bandwidth = 0;  // b_c, bytes/s between nodes (0: no network, peers never chosen)
  BandwidthTable pfs;            // t(gamma): aggregate PFS read bytes/s with gamma readers
  StorageClass staging;          // class 0
  std::vector<StorageClass> classes;  // classes 1..J, fastest first

  // Rates finite and >= 0; pfs valid; staging: threads >= 1, capacity > 0, write valid (read may
  // be empty); every class: a non-empty unique name, threads >= 1, read and write valid, a path
  // for kSsd and none for kRam; at most 127 classes. The message names the class and the field
  // ("class 2 (\"ssd\"): write: point 1 (...): ...").
  Status Validate() const;
};

enum class SourceKind : uint8_t { kLocal = 0, kPeer = 1, kPfs = 2 };
const char* SourceKindName(SourceKind k);

// Seconds to fetch `size` bytes from each source (docs/algorithm.md §4):
//   PFS: s / (t(gamma)/gamma); peer class j: s / min(b_c, r_j(p_j)/p_j); local: s / (r_j(p_j)/p_j).
// gamma = 0 counts as 1. 0 bytes take 0 s; a zero rate (no network, an empty table) takes +inf.
double PfsSeconds(const SystemModel& m, Bytes size, uint32_t gamma);
double LocalSeconds(const StorageClass& c, Bytes size);
double PeerSeconds(const SystemModel& m, const StorageClass& c, Bytes size);
// Seconds to write a fetched sample into the staging buffer: max(s/beta, s/(w_0(p_0)/p_0)).
double StagingWriteSeconds(const SystemModel& m, Bytes size);

struct SourceChoice {
  SourceKind kind = SourceKind::kPfs;
  int klass = -1;  // index into SystemModel::classes for kLocal/kPeer, -1 for the PFS
  double seconds = 0;
};

// The fastest applicable source: the local class (local_class >= 0 if this node holds the
// sample), a peer's class (peer_class >= 0 if some peer holds it and is presumed ready), or the
// PFS with gamma concurrent readers. Ties prefer local, then peer, then the PFS. A class index
// outside m.classes throws std::out_of_range.
SourceChoice ChooseSource(const SystemModel& m, Bytes size, int local_class, int peer_class,
                          uint32_t gamma);

// docs/algorithm.md §7: a peer is presumed to hold the entry at `peer_position` (0-based) of its
// class list once this node's own progress in the same class has passed peer_position + margin, or
// once the peer has reported that class done. own_progress counts the entries of this node's list
// of that class already prefetched (entries 0 .. own_progress-1), so the rule is peer_class_done ||
// own_progress > peer_position + margin. The seeds use margin = 20.
inline constexpr uint64_t kDefaultReadinessMargin = 20;
bool PeerPresumedReady(uint64_t own_progress, uint64_t peer_position, bool peer_class_done,
                       uint64_t margin = kDefaultReadinessMargin);

}  // namespace nopfs::policy
