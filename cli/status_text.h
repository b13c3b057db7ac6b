// The figures in nopfsd's status text (docs/status.md lists its lines) that `nopfs run` and the
// tests read back: bytes and samples served per source, and the clients' stall.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nopfs::cli {

struct ServedLine {
  std::string source;  // a class name ("ram", "ssd"), "peer" or "pfs"
  uint64_t samples = 0;
  uint64_t bytes = 0;
};

struct StatusFigures {
  std::vector<ServedLine> served;  // in the order the service lists them
  uint64_t stall_reads = 0;
  double stall_total = 0;  // seconds
  double stall_median = 0;
  double stall_p99 = 0;
  uint64_t pfs_bytes = 0;  // every byte read from the PFS, prefetch included
  bool has_stall = false;
};

// Reads the "served X:", "stall:" and "pfs read:" lines; other lines are ignored.
StatusFigures ParseStatusText(const std::string& text);

// The table `nopfs run` prints at the end.
std::string FormatRunSummary(const StatusFigures& f);

// "12 us", "1.20 ms", "0.123 s".
std::string FormatSeconds(double s);

}  // namespace nopfs::cli
