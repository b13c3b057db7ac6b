// Sample sizes for `nopfs plan` and friends: read from a sizes file, or synthetic.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "policy/job.h"

namespace nopfs::cli {

// Sizes drawn around `mean` bytes with an ImageNet-like spread (log-normal, sigma 0.6), from a
// SplitMix64 stream seeded with `seed`: the same on every machine. Every size is at least 1 byte.
std::vector<policy::Bytes> SyntheticSizes(uint64_t samples, policy::Bytes mean, uint64_t seed);

// Parses "F:SIZE" (e.g. "1281167:110K"); SIZE takes the units of nopfs::ParseSize() (as
// Slurm's --mem: a bare number is MiB).
struct SyntheticSpec {
  uint64_t samples = 0;
  policy::Bytes mean = 0;
};
Result<SyntheticSpec> ParseSyntheticSpec(std::string_view text);

// A sizes file: one size per line, a bare number in bytes (a listing such as `find -printf
// '%s\n'`), or with a unit (110K) (sample id = line order); blank lines and lines
// starting with '#' are skipped. Errors name the file and line.
Result<std::vector<policy::Bytes>> ReadSizesFile(const std::string& path);

}  // namespace nopfs::cli
