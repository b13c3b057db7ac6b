#include "policy/analytic.h"

#include <cmath>
#include <limits>

#include "policy/frequency.h"

namespace nopfs::policy {

uint64_t SmallestCountAbove(double threshold) {
  if (std::isnan(threshold)) return UINT64_MAX;
  if (threshold < 0) return 0;
  if (threshold >= 9.2e18) return UINT64_MAX;
  // (1+delta)*mu is usually meant as an exact decimal product (1.1 * 250 = 275) that binary
  // floating point misses by an ulp in either direction; treat a near-integer as that integer.
  const double nearest = std::nearbyint(threshold);
  if (std::fabs(threshold - nearest) <= 1e-9 * std::fmax(1.0, threshold)) {
    return static_cast<uint64_t>(nearest) + 1;
  }
  return static_cast<uint64_t>(std::floor(threshold)) + 1;
}

double BinomialTailAbove(uint32_t n, double p, double threshold) {
  if (!(p >= 0 && p <= 1) || std::isnan(threshold)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  const uint64_t k0 = SmallestCountAbove(threshold);
  if (k0 > n) return 0;
  if (k0 == 0) return 1;
  if (p == 0) return 0;  // X = 0 < k0
  if (p == 1) return 1;  // X = n >= k0
  const double dn = n;
  const double log_p = std::log(p);
  const double log_q = std::log1p(-p);
  const double log_n_fact = std::lgamma(dn + 1);
  const auto log_term = [&](double k) {
    return log_n_fact - std::lgamma(k + 1) - std::lgamma(dn - k + 1) + k * log_p + (dn - k) * log_q;
  };
  // Terms rise up to the mode floor((n+1)p) and fall after it. Sum them scaled by the largest
  // (log-sum-exp), and stop once past the mode they no longer change the sum.
  const double mode = std::floor((dn + 1) * p);
  const double start = static_cast<double>(k0);
  const double peak = log_term(std::fmax(start, std::fmin(mode, dn)));
  double sum = 0;
  for (double k = start; k <= dn; k += 1) {
    const double rel = log_term(k) - peak;
    sum += std::exp(rel);
    if (k > mode && rel < -60) break;
  }
  return std::fmin(1.0, std::exp(peak + std::log(sum)));
}

double ExpectedFrequentSamples(uint64_t samples, uint32_t epochs, uint32_t ranks, double delta) {
  if (ranks == 0) return std::numeric_limits<double>::quiet_NaN();
  const double mu = static_cast<double>(epochs) / ranks;
  return static_cast<double>(samples) * BinomialTailAbove(epochs, 1.0 / ranks, (1 + delta) * mu);
}

uint64_t MeasuredFrequentSamples(const JobSpec& job, uint32_t rank, double delta,
                                 unsigned threads) {
  JobSpec one = job;
  one.ranks_per_node = 1;  // node `rank` is rank `rank` alone
  const NodeAccessCounts counts = CountNodeAccesses(one, rank, threads);
  const uint64_t k0 = SmallestCountAbove((1 + delta) * static_cast<double>(job.epochs) / job.ranks);
  uint64_t frequent = 0;
  for (uint32_t c : counts.count)
    frequent += c >= k0 ? 1 : 0;
  return frequent;
}

}  // namespace nopfs::policy
