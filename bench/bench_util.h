// Small helpers the benchmarks share: the last-level cache's size (a benchmark's data must exceed
// it to measure memory, not cache) and medians and ranges over rounds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "common/units.h"

namespace nopfs::bench {

// The largest cache's size from sysfs (cpu0's highest index), 0 if unknown.
inline uint64_t LastLevelCacheBytes() {
  uint64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string text;
    if (!(in >> text)) break;
    if (Result<uint64_t> n = ParseSize(text.back() == 'K' ? text + "iB" : text); n.ok())
      best = std::max(best, *n);
  }
  return best;
}

// MiB of data a benchmark should use by default: twice the last-level cache, at least 512.
inline uint64_t DefaultDatasetMiB() {
  return std::max<uint64_t>(512, 2 * (LastLevelCacheBytes() >> 20));
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
inline double Min(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
}
inline double Max(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

}  // namespace nopfs::bench
