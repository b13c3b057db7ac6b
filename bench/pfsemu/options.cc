#include "bench/pfsemu/options.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <fstream>

#include "bench/pfsemu/throttle.h"

namespace nopfs::pfsemu {
namespace {

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

Status ParseU64(const std::string& key, const std::string& value, uint64_t* out) {
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), *out);
  if (ec != std::errc() || end != value.data() + value.size()) {
    return Status::InvalidArgument(key + ": not a non-negative integer: '" + value + "'");
  }
  return Status::Ok();
}

}  // namespace

std::string Usage() {
  return "usage: nopfs_pfsemu [--config FILE] [--bandwidth R:MBPS,...] [--open-latency-us N]\n"
         "                    [--getattr-latency-us N] [--readdir-latency-us N]\n"
         "                    [--attr-cache-ms N]\n"
         "                    [--burst-bytes N] [--max-threads N] [--stats-out FILE]\n"
         "                    BACKING MOUNTPOINT\n"
         "Mounts BACKING read-only at MOUNTPOINT as an emulated parallel file system: reads are\n"
         "throttled to the aggregate bandwidth t(readers), each open, getattr and readdir costs\n"
         "a latency (and is counted), and no page cache serves a read. MOUNTPOINT/.pfsemu_stats "
         "shows the counters; SIGUSR1 prints\n"
         "them to stderr; SIGTERM or SIGINT unmounts.\n";
}

Status ApplyOption(Options* options, const std::string& raw_key, const std::string& value) {
  std::string key = raw_key;
  std::replace(key.begin(), key.end(), '_', '-');
  if (key == "bandwidth") {
    Result<BandwidthCurve> curve = BandwidthCurve::Parse(value);
    if (!curve.ok()) return curve.status();
    options->bandwidth = value;
  } else if (key == "open-latency-us") {
    NOPFS_RETURN_IF_ERROR(ParseU64(key, value, &options->open_latency_us));
  } else if (key == "getattr-latency-us") {
    NOPFS_RETURN_IF_ERROR(ParseU64(key, value, &options->getattr_latency_us));
  } else if (key == "readdir-latency-us") {
    NOPFS_RETURN_IF_ERROR(ParseU64(key, value, &options->readdir_latency_us));
  } else if (key == "attr-cache-ms") {
    NOPFS_RETURN_IF_ERROR(ParseU64(key, value, &options->attr_cache_ms));
  } else if (key == "burst-bytes") {
    NOPFS_RETURN_IF_ERROR(ParseU64(key, value, &options->burst_bytes));
  } else if (key == "max-threads") {
    NOPFS_RETURN_IF_ERROR(ParseU64(key, value, &options->max_threads));
    if (options->max_threads == 0 || options->max_threads > 1024) {
      return Status::InvalidArgument("max-threads: must be in 1..1024");
    }
  } else if (key == "stats-out") {
    options->stats_out = value;
  } else {
    return Status::InvalidArgument(
        "unknown option '" + raw_key +
        "'; the options are bandwidth, open-latency-us, "
        "getattr-latency-us, readdir-latency-us, attr-cache-ms, burst-bytes, "
        "max-threads, stats-out");
  }
  return Status::Ok();
}

Status LoadConfigFile(Options* options, const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::FromErrno(errno, "config " + path);
  std::string line;
  uint64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    line = Trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      return Status::InvalidArgument(path + ":" + std::to_string(lineno) +
                                     ": expected key = value");
    }
    Status s = ApplyOption(options, Trim(line.substr(0, eq)), Trim(line.substr(eq + 1)));
    if (!s.ok()) return s.WithContext(path + ":" + std::to_string(lineno));
  }
  return Status::Ok();
}

Result<Options> ParseOptions(const std::vector<std::string>& argv) {
  Options options;
  std::vector<std::pair<std::string, std::string>> flags;
  std::vector<std::string> positional;
  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) {
      positional.push_back(a);
      continue;
    }
    std::string key = a.substr(2);
    std::string value;
    const size_t eq = key.find('=');
    if (eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argv.size()) {
      value = argv[++i];
    } else {
      return Status::InvalidArgument("--" + key + ": missing value");
    }
    if (key == "config") {
      NOPFS_RETURN_IF_ERROR(LoadConfigFile(&options, value));
    } else {
      flags.emplace_back(key, value);
    }
  }
  for (const auto& [key, value] : flags) {
    NOPFS_RETURN_IF_ERROR(ApplyOption(&options, key, value));
  }
  if (positional.size() != 2) {
    return Status::InvalidArgument("expected BACKING and MOUNTPOINT");
  }
  options.backing = positional[0];
  options.mountpoint = positional[1];
  return options;
}

}  // namespace nopfs::pfsemu
