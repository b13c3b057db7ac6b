// Closed-form and simulated access-frequency statistics (ALGORITHM.md §3).
#pragma once

#include <cstdint>

#include "policy/job.h"

namespace nopfs::policy {

// P(X > threshold) for X ~ Binomial(n, p), computed in log space (stable for n in the thousands).
double BinomialTailAbove(uint32_t n, double p, double threshold);

// F * P(X > (1+delta) * mu), X ~ Binomial(E, 1/N), mu = E/N: the expected number of samples one
// rank reads more than (1+delta)*mu times over E epochs. The paper's example (N=16, E=90,
// F=1,281,167, delta=0.8) gives about 31,635; the thesis's (N=4, E=1000, F=10,000, delta=0.1)
// about 323.
double ExpectedFrequentSamples(uint64_t samples, uint32_t epochs, uint32_t ranks, double delta);

// The same quantity measured: replays the job's real shuffle and partition (ranks_per_node = 1)
// and counts the samples that rank `rank` reads more than (1+delta)*E/N times.
uint64_t MeasuredFrequentSamples(const JobSpec& job, uint32_t rank, double delta,
                                 unsigned threads = 0);

}  // namespace nopfs::policy
