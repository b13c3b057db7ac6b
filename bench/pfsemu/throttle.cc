#include "bench/pfsemu/throttle.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "common/mutex.h"

namespace nopfs::pfsemu {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

template <typename T>
bool ParseNumber(std::string_view s, T* out) {
  s = Trim(s);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

Result<BandwidthCurve> BandwidthCurve::Parse(std::string_view text) {
  BandwidthCurve curve;
  const std::string bad = "bandwidth curve '" + std::string(text) + "': ";
  if (Trim(text).empty()) return Status::InvalidArgument(bad + "empty");
  bool more = true;
  while (more) {
    const size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    more = comma != std::string_view::npos;
    text = more ? text.substr(comma + 1) : std::string_view();
    uint64_t readers = 1;
    double mbps = 0;
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      if (!ParseNumber(item, &mbps)) return Status::InvalidArgument(bad + "not a number");
    } else if (!ParseNumber(item.substr(0, colon), &readers) ||
               !ParseNumber(item.substr(colon + 1), &mbps)) {
      return Status::InvalidArgument(bad + "expected readers:MB/s");
    }
    if (readers == 0 || !(mbps > 0) || !std::isfinite(mbps)) {
      return Status::InvalidArgument(bad + "readers must be >= 1 and rates > 0");
    }
    if (!curve.points_.empty() && readers <= curve.points_.back().first) {
      return Status::InvalidArgument(bad + "reader counts must increase");
    }
    curve.points_.emplace_back(readers, mbps * 1e6);
  }
  return curve;
}

double BandwidthCurve::BytesPerSecond(uint64_t readers) const {
  readers = std::max<uint64_t>(readers, 1);
  if (readers <= points_.front().first) return points_.front().second;
  for (size_t i = 1; i < points_.size(); ++i) {
    const auto& [r1, b1] = points_[i];
    if (readers <= r1) {
      const auto& [r0, b0] = points_[i - 1];
      const double f = static_cast<double>(readers - r0) / static_cast<double>(r1 - r0);
      return b0 + f * (b1 - b0);
    }
  }
  return points_.back().second;
}

std::string BandwidthCurve::ToString() const {
  std::string out;
  for (const auto& [readers, bps] : points_) {
    if (!out.empty()) out += ',';
    out += std::to_string(readers) + ':' + std::to_string(static_cast<uint64_t>(bps / 1e6));
  }
  return out;
}

Throttle::Clock::time_point Throttle::Reserve(uint64_t bytes, uint64_t readers,
                                              Clock::time_point now) {
  const double rate = curve_.BytesPerSecond(readers);
  const auto duration = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) / rate));
  const auto credit = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(burst_bytes_) / rate));
  MutexLock lock(&mu_);
  // An idle pipe banks at most `burst_bytes` worth of time; beyond that idleness is lost.
  const Clock::time_point start = std::max(next_free_, now - credit);
  next_free_ = start + duration;
  return next_free_;
}

}  // namespace nopfs::pfsemu
