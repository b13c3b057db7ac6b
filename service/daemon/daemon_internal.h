// What the files of the Daemon class share and nothing else uses: the period of the metrics file
// and two small helpers. Private to service/daemon/.
#pragma once

#include <chrono>

#include "protocol/ring.h"

namespace nopfs::service::daemon_internal {

// How often the metrics file is rewritten.
inline constexpr std::chrono::seconds kMetricsPeriod(5);

// Adds b's counters and histogram to a (median and p99 are recomputed from the sum).
inline void Merge(ring::RingStats* a, const ring::RingStats& b) {
  a->samples += b.samples;
  a->bytes += b.bytes;
  a->next_calls += b.next_calls;
  a->stall_ns_total += b.stall_ns_total;
  for (size_t i = 0; i < a->histogram.size(); ++i)
    a->histogram[i] += b.histogram[i];
  ring::SummarizeStalls(a);
}

inline double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace nopfs::service::daemon_internal
