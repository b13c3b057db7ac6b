#include "cli/status_text.h"

#include <cinttypes>
#include <cstdio>
#include <sstream>

#include "common/units.h"

namespace nopfs::cli {

StatusFigures ParseStatusText(const std::string& text) {
  StatusFigures f;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("served ", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      ServedLine s;
      s.source = line.substr(7, colon - 7);
      if (std::sscanf(line.c_str() + colon + 1, " %" SCNu64 " samples, %" SCNu64 " bytes",
                      &s.samples, &s.bytes) == 2) {
        f.served.push_back(s);
      }
    } else if (line.rfind("stall:", 0) == 0) {
      f.has_stall = std::sscanf(line.c_str(),
                                "stall: %" SCNu64 " reads, total %lf s, median %lf s, p99 %lf s",
                                &f.stall_reads, &f.stall_total, &f.stall_median, &f.stall_p99) == 4;
    } else if (line.rfind("pfs read:", 0) == 0) {
      (void)std::sscanf(line.c_str(), "pfs read: %" SCNu64 " bytes", &f.pfs_bytes);
    }
  }
  return f;
}

std::string FormatSeconds(double s) {
  char buf[64];
  if (s < 1e-6) {
    std::snprintf(buf, sizeof buf, "%.0f ns", s * 1e9);
  } else if (s < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  } else if (s < 1) {
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  }
  return buf;
}

std::string FormatRunSummary(const StatusFigures& f) {
  std::string out = "source       samples        bytes\n";
  char buf[256];
  for (const ServedLine& s : f.served) {
    std::snprintf(buf, sizeof buf, "%-8s %11" PRIu64 " %12s\n", s.source.c_str(), s.samples,
                  FormatBytes(static_cast<double>(s.bytes)).c_str());
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "pfs read in all (prefetch included): %s\n",
                FormatBytes(static_cast<double>(f.pfs_bytes)).c_str());
  out += buf;
  if (f.has_stall) {
    std::snprintf(buf, sizeof buf, "stall: total %s, median %s, p99 %s over %" PRIu64 " reads\n",
                  FormatSeconds(f.stall_total).c_str(), FormatSeconds(f.stall_median).c_str(),
                  FormatSeconds(f.stall_p99).c_str(), f.stall_reads);
    out += buf;
  }
  return out;
}

}  // namespace nopfs::cli
