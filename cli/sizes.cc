#include "cli/sizes.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <fstream>

#include "common/units.h"
#include "policy/sampler.h"

namespace nopfs::cli {

std::vector<policy::Bytes> SyntheticSizes(uint64_t samples, policy::Bytes mean, uint64_t seed) {
  // Log-normal with sigma 0.6 (ImageNet-1k's JPEG sizes spread roughly so around ~110 KB), scaled
  // so that the mean is `mean`: exp(mu + sigma^2/2) = mean. The normal deviate is the Irwin-Hall
  // sum of 12 uniforms minus 6: portable, no library distribution involved.
  constexpr double kSigma = 0.6;
  const double mu = std::log(static_cast<double>(mean)) - kSigma * kSigma / 2;
  policy::SplitMix64 rng(seed ^ 0x5EED5172E5ULL);
  std::vector<policy::Bytes> sizes(samples);
  for (uint64_t k = 0; k < samples; ++k) {
    double z = -6.0;
    for (int i = 0; i < 12; ++i)
      z += static_cast<double>(rng.Next() >> 11) * 0x1.0p-53;
    const double s = std::exp(mu + kSigma * z);
    sizes[k] = s < 1.0 ? 1 : static_cast<policy::Bytes>(std::llround(s));
  }
  return sizes;
}

Result<SyntheticSpec> ParseSyntheticSpec(std::string_view text) {
  const size_t colon = text.find(':');
  const Status bad = Status::InvalidArgument(
      "--synthetic '" + std::string(text) +
      "' is not F:SIZE: write the sample count and the mean size, e.g. 1281167:110K");
  if (colon == std::string_view::npos || colon == 0) return bad;
  SyntheticSpec spec;
  const std::string_view count = text.substr(0, colon);
  auto [ptr, ec] = std::from_chars(count.data(), count.data() + count.size(), spec.samples);
  if (ec != std::errc() || ptr != count.data() + count.size() || spec.samples == 0 ||
      spec.samples > policy::kMaxSamples) {
    return bad;
  }
  Result<uint64_t> mean = ParseSize(text.substr(colon + 1));
  if (!mean.ok() || *mean == 0) return bad;
  spec.mean = *mean;
  return spec;
}

Result<std::vector<policy::Bytes>> ReadSizesFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::FromErrno(errno, "--sizes " + path);
  std::vector<policy::Bytes> sizes;
  std::string line;
  uint64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    Result<uint64_t> s = ParseSize(line, /*bare_unit=*/1);  // a listing's byte counts
    if (!s.ok()) {
      return Status::InvalidArgument(path + ":" + std::to_string(lineno) + ": " +
                                     s.status().message());
    }
    sizes.push_back(*s);
  }
  if (in.bad()) return Status::IoError(path + ": read failed");
  if (sizes.empty()) {
    return Status::InvalidArgument(path + ": no sizes: write one size in bytes per line");
  }
  return sizes;
}

}  // namespace nopfs::cli
