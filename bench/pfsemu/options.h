// Options: every parameter of the emulated PFS, in one place, from a config file and flags.
//
// A config file holds `key = value` lines (`#` starts a comment); flags of the same names
// (`--open-latency-us 2000`) override it. The defaults loosely follow the PFS measured in the HDMLP
// thesis (seeds/000, §"Simulator": t(1) = 66, t(2) = 86, t(3) = 129, t(4) = 146 MB/s of random
// reads), scaled up to a few hundred MB/s so that a 2-core machine still shows the shape: the
// aggregate rises sub-linearly with readers, so each reader's share t(γ)/γ falls.
//
// Thread safety: a plain value; parse once, then read from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace nopfs::pfsemu {

struct Options {
  std::string backing;     // directory served read-only (required)
  std::string mountpoint;  // where it appears (required, must exist)
  // t(γ): aggregate read bandwidth in MB/s (10^6 bytes) by concurrent readers, interpolated.
  std::string bandwidth = "1:120,2:170,4:240,8:300";
  uint64_t open_latency_us = 1000;  // added to every open() of a file, in microseconds
  // Metadata: added to every getattr (a stat, and the lookup of each path component the kernel
  // has not cached: attributes and entries are cached for 1 s) and every readdir (one listing of
  // a directory), in microseconds. A real PFS's metadata server answers in about 1-2 ms under
  // load.
  uint64_t getattr_latency_us = 0;
  uint64_t readdir_latency_us = 0;
  // How long the kernel may cache attributes and directory entries, in milliseconds. All the
  // emulated nodes of a job on one machine share that cache; 0 makes each node's stat reach the
  // file system, as on separate hosts.
  uint64_t attr_cache_ms = 1000;
  uint64_t burst_bytes = 256 * 1024;  // bytes an idle PFS may serve at once before throttling
  uint64_t max_threads = 16;          // FUSE worker threads (bounds the concurrent readers seen)
  std::string stats_out;              // if set, the final counters are written here at unmount
};

// The usage text printed by --help and on a bad argument.
std::string Usage();

// Parses argv (argv[0] is the program): `[--config FILE] [--KEY VALUE]... BACKING MOUNTPOINT`.
// Keys: bandwidth, open-latency-us, getattr-latency-us, readdir-latency-us, attr-cache-ms,
// burst-bytes, max-threads, stats-out. A config file, when
// given, is applied first whatever its position among the flags.
Result<Options> ParseOptions(const std::vector<std::string>& argv);

// Applies one key (config-file spelling with '_' or flag spelling with '-') to `options`.
Status ApplyOption(Options* options, const std::string& key, const std::string& value);

// Reads a config file of `key = value` lines into `options`.
Status LoadConfigFile(Options* options, const std::string& path);

}  // namespace nopfs::pfsemu
