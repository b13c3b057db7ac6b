#include "policy/model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

namespace nopfs::policy {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

std::string Fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A rate field that may be 0 (with the meaning `zero`) but not negative, NaN or infinite.
Status CheckRate(const char* field, double v, const char* zero) {
  if (!std::isfinite(v) || v < 0) {
    return Status::InvalidArgument(std::string(field) + " is " + Fmt(v) +
                                   ": write a finite number of bytes/s, or 0 for " + zero);
  }
  return Status::Ok();
}

// Seconds to move `size` bytes at `rate` bytes/s; an exhausted (zero) rate costs forever.
double Transfer(Bytes size, double rate) {
  if (size == 0) return 0;
  if (!(rate > 0)) return kInfinity;
  return static_cast<double>(size) / rate;
}

// r(p)/p: what one of the class's p threads reads per second.
double PerThreadRead(const StorageClass& c) {
  const double p = std::max<uint32_t>(c.threads, 1);
  return c.read.At(p) / p;
}

Status ValidateClass(const StorageClass& c, bool staging) {
  if (!staging && c.name.empty()) return Status::InvalidArgument("name is empty: name the class");
  if (c.threads == 0) {
    return Status::InvalidArgument("threads is 0: a class needs at least 1 prefetch thread");
  }
  if (staging && c.capacity == 0) {
    return Status::InvalidArgument(
        "capacity is 0: the staging buffer needs room for at least one sample");
  }
  if (c.kind == ClassKind::kSsd && c.path.empty()) {
    return Status::InvalidArgument("path is empty: an SSD class needs a directory");
  }
  if (c.kind == ClassKind::kRam && !c.path.empty()) {
    return Status::InvalidArgument("path \"" + c.path +
                                   "\" is set on a RAM class: leave it empty or use kind ssd");
  }
  // The staging buffer is only written by the model (samples are read from it by the consumer,
  // whose speed is the compute rate), so its read curve is optional.
  if (!(staging && c.read.empty())) {
    NOPFS_RETURN_IF_ERROR(c.read.Validate().WithContext("read"));
  }
  NOPFS_RETURN_IF_ERROR(c.write.Validate().WithContext("write"));
  return Status::Ok();
}

}  // namespace

BandwidthTable::BandwidthTable(std::vector<std::pair<double, double>> points)
    : points_(std::move(points)) {}

BandwidthTable BandwidthTable::Constant(double bytes_per_second) {
  return BandwidthTable({{1.0, bytes_per_second}});
}

Status BandwidthTable::Validate() const {
  if (points_.empty()) {
    return Status::InvalidArgument("the table has no point: give at least one (x, bytes/s) pair");
  }
  for (size_t i = 0; i < points_.size(); ++i) {
    const auto [x, y] = points_[i];
    const std::string where =
        "point " + std::to_string(i + 1) + " (" + Fmt(x) + ", " + Fmt(y) + ")";
    if (!std::isfinite(x) || x < 0) {
      return Status::InvalidArgument(where + ": x must be a finite count >= 0");
    }
    if (!std::isfinite(y) || y <= 0) {
      return Status::InvalidArgument(where + ": the bandwidth must be a finite number > 0 bytes/s");
    }
    if (i > 0 && !(x > points_[i - 1].first)) {
      return Status::InvalidArgument(where + ": x must be larger than the previous point's (" +
                                     Fmt(points_[i - 1].first) + "); list points by increasing x");
    }
  }
  return Status::Ok();
}

double BandwidthTable::At(double x) const {
  if (points_.empty()) return 0;
  if (!(x > points_.front().first)) return points_.front().second;  // also NaN
  if (x >= points_.back().first) return points_.back().second;
  // The first point with a larger x; the one before it is <= x.
  const auto hi =
      std::upper_bound(points_.begin(), points_.end(), x,
                       [](double v, const std::pair<double, double>& p) { return v < p.first; });
  const auto lo = hi - 1;
  const double t = (x - lo->first) / (hi->first - lo->first);
  return lo->second + t * (hi->second - lo->second);
}

Status SystemModel::Validate() const {
  NOPFS_RETURN_IF_ERROR(CheckRate("compute_rate", compute_rate, "an infinitely fast consumer"));
  NOPFS_RETURN_IF_ERROR(CheckRate("preprocess_rate", preprocess_rate, "no preprocessing"));
  NOPFS_RETURN_IF_ERROR(CheckRate("network_bandwidth", network_bandwidth, "no reads from peers"));
  NOPFS_RETURN_IF_ERROR(pfs.Validate().WithContext("pfs"));
  NOPFS_RETURN_IF_ERROR(ValidateClass(staging, /*staging=*/true).WithContext("staging"));
  std::set<std::string> names;
  for (size_t j = 0; j < classes.size(); ++j) {
    const StorageClass& c = classes[j];
    const std::string where = "class " + std::to_string(j + 1) + " (\"" + c.name + "\")";
    NOPFS_RETURN_IF_ERROR(ValidateClass(c, /*staging=*/false).WithContext(where));
    if (!names.insert(c.name).second) {
      return Status::InvalidArgument(where + ": the name is used by an earlier class: rename one");
    }
  }
  if (classes.size() > 127) {
    return Status::InvalidArgument("there are " + std::to_string(classes.size()) +
                                   " classes: at most 127 are supported");
  }
  return Status::Ok();
}

const char* SourceKindName(SourceKind k) {
  switch (k) {
    case SourceKind::kLocal:
      return "local";
    case SourceKind::kPeer:
      return "peer";
    case SourceKind::kPfs:
      return "pfs";
  }
  return "unknown";
}

double PfsSeconds(const SystemModel& m, Bytes size, uint32_t gamma) {
  const double readers = std::max<uint32_t>(gamma, 1);
  return Transfer(size, m.pfs.At(readers) / readers);
}

double LocalSeconds(const StorageClass& c, Bytes size) {
  return Transfer(size, PerThreadRead(c));
}

double PeerSeconds(const SystemModel& m, const StorageClass& c, Bytes size) {
  return Transfer(size, std::min(m.network_bandwidth, PerThreadRead(c)));
}

double StagingWriteSeconds(const SystemModel& m, Bytes size) {
  const double p = std::max<uint32_t>(m.staging.threads, 1);
  const double write = Transfer(size, m.staging.write.At(p) / p);
  const double prep = m.preprocess_rate > 0 ? static_cast<double>(size) / m.preprocess_rate : 0;
  return std::max(prep, write);
}

SourceChoice ChooseSource(const SystemModel& m, Bytes size, int local_class, int peer_class,
                          uint32_t gamma) {
  const auto cls = [&](int j) -> const StorageClass& {
    if (j < 0 || static_cast<size_t>(j) >= m.classes.size()) {
      throw std::out_of_range("ChooseSource: class " + std::to_string(j) + " of " +
                              std::to_string(m.classes.size()));
    }
    return m.classes[static_cast<size_t>(j)];
  };
  // Candidates in tie-break order; a later one wins only when strictly faster.
  SourceChoice best{SourceKind::kPfs, -1, kInfinity};
  bool have = false;
  if (local_class >= 0) {
    best = {SourceKind::kLocal, local_class, LocalSeconds(cls(local_class), size)};
    have = true;
  }
  if (peer_class >= 0) {
    const double s = PeerSeconds(m, cls(peer_class), size);
    if (!have || s < best.seconds) best = {SourceKind::kPeer, peer_class, s};
    have = true;
  }
  const double s = PfsSeconds(m, size, gamma);
  if (!have || s < best.seconds) best = {SourceKind::kPfs, -1, s};
  return best;
}

bool PeerPresumedReady(uint64_t own_progress, uint64_t peer_position, bool peer_class_done,
                       uint64_t margin) {
  if (peer_class_done) return true;
  return own_progress > margin && own_progress - margin > peer_position;
}

}  // namespace nopfs::policy
