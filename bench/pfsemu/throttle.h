// Throttle: the emulated PFS's bandwidth model, a bandwidth curve t(γ) and a shaper that holds the
// aggregate read rate of all readers to t(γ) for the γ readers active at the moment.
//
// BandwidthCurve maps a number of concurrent readers γ ≥ 1 to an aggregate rate in bytes/s, by
// linear interpolation between the given points and flat beyond the last one (docs/algorithm.md
// §4's t(γ)). Throttle is a virtual-clock shaper: each read reserves `bytes / t(γ)` seconds of the
// one shared pipe, starting no earlier than the previous reservation ended, and the caller waits
// until its reservation ends. So over any interval longer than a read the bytes served stay within
// t(γ)·interval plus a burst of at most `burst_bytes` accumulated while idle.
//
// Thread safety: BandwidthCurve is immutable after Parse and safe to share. Throttle::Reserve may
// be called from any number of threads at once (one internal mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"

namespace nopfs::pfsemu {

class BandwidthCurve {
 public:
  // Parses "1:120,2:170,4:240" (readers:MB/s, MB = 10^6 bytes; readers strictly increasing, rates
  // positive). A single "300" means a flat curve of 300 MB/s.
  static Result<BandwidthCurve> Parse(std::string_view text);

  // Aggregate rate in bytes/s with `readers` concurrent readers (0 is treated as 1).
  double BytesPerSecond(uint64_t readers) const;

  // The curve in the syntax Parse accepts.
  std::string ToString() const;

 private:
  BandwidthCurve() = default;
  std::vector<std::pair<uint64_t, double>> points_;  // (readers, bytes/s), readers increasing
};

class Throttle {
 public:
  using Clock = std::chrono::steady_clock;

  Throttle(BandwidthCurve curve, uint64_t burst_bytes)
      : curve_(std::move(curve)), burst_bytes_(burst_bytes) {}
  Throttle(const Throttle&) = delete;
  Throttle& operator=(const Throttle&) = delete;

  // Reserves the pipe for `bytes` at the rate t(readers); returns the time the read may complete
  // (the caller sleeps until then). `now` is injected so that tests need no real clock.
  Clock::time_point Reserve(uint64_t bytes, uint64_t readers, Clock::time_point now);

  const BandwidthCurve& curve() const { return curve_; }

 private:
  const BandwidthCurve curve_;
  const uint64_t burst_bytes_;
  Mutex mu_;
  Clock::time_point next_free_ GUARDED_BY(mu_){};  // when the pipe's last reservation ends
};

}  // namespace nopfs::pfsemu
