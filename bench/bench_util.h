// Small helpers the benchmarks share: the last-level cache's size (a benchmark's data must exceed
// it to measure memory, not cache) and medians and ranges over rounds.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
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
    if (Result<uint64_t> n = ParseSize(text); n.ok())  // sysfs writes "32K", as --mem
      best = std::max(best, *n);
  }
  return best;
}

// MiB of data a benchmark should use by default: twice the last-level cache, at least 512.
inline uint64_t DefaultDatasetMiB() {
  return std::max<uint64_t>(512, 2 * (LastLevelCacheBytes() >> 20));
}

// A --sizes value: sizes separated by commas ("4KiB,128KiB,4MiB"); nullopt if one is not a size
// or is 0.
inline std::optional<std::vector<uint64_t>> ParseSizeList(const std::string& text) {
  std::vector<uint64_t> sizes;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    Result<uint64_t> n = ParseSize(text.substr(at, comma - at));
    if (!n.ok() || *n == 0) return std::nullopt;
    sizes.push_back(*n);
    at = comma + 1;
  }
  return sizes;
}

// Reads argv as "--flag value" pairs and calls on(flag, value) for each, in order. `--help` or
// `-h` prints `usage` and exits 0; a flag without a value, or one `on` does not know (returns
// false), prints what is wrong and `usage` to stderr, prefixed by `program`, and exits 1.
inline void ParseFlags(int argc, char** argv, const char* program, const char* usage,
                       const std::function<bool(const std::string&, const std::string&)>& on) {
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf("%s", usage);
      std::exit(0);
    }
    const char* why = i + 1 == argc ? "needs a value" : nullptr;
    if (why == nullptr && !on(flag, argv[i + 1])) why = "is unknown";
    if (why != nullptr) {
      std::fprintf(stderr, "%s: flag %s %s; %s", program, flag.c_str(), why, usage);
      std::exit(1);
    }
  }
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
