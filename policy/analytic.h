// Closed-form and simulated access-frequency statistics (docs/algorithm.md §3).
//
// Thread safety: pure functions; MeasuredFrequentSamples starts worker threads via
// CountNodeAccesses.
#pragma once

#include <cstdint>

#include "policy/job.h"

namespace nopfs::policy {

// The smallest integer count k with k > threshold: 0 for a negative threshold, floor(threshold)+1
// otherwise, where a threshold within 1e-9 (relative) of an integer counts as that integer
// (1.1 * 250 is 275, not 275.00000000000006). UINT64_MAX for NaN or thresholds past 2^63.
uint64_t SmallestCountAbove(double threshold);

// P(X > threshold) for X ~ Binomial(n, p), i.e. P(X >= SmallestCountAbove(threshold)), summed in
// log space with lgamma (stable for n in the millions). NaN if p is not in [0, 1].
double BinomialTailAbove(uint32_t n, double p, double threshold);

// F * P(X > (1+delta) * mu), X ~ Binomial(E, 1/N), mu = E/N: the expected number of samples one
// rank reads more than (1+delta)*mu times over E epochs. The paper's example (N=16, E=90,
// F=1,281,167, delta=0.8) gives about 31,635; the thesis's (N=4, E=1000, F=10,000, delta=0.1)
// about 323.
double ExpectedFrequentSamples(uint64_t samples, uint32_t epochs, uint32_t ranks, double delta);

// The same quantity measured: replays the job's real shuffle and partition (ranks_per_node = 1)
// and counts the samples that rank `rank` reads more than (1+delta)*E/N times. The analytic value
// assumes each rank reads F/N samples of every epoch; the uniform scheme with B a multiple of N
// (e.g. B = 32*N) and F/B large is that case up to the last batch. Throws like CountNodeAccesses.
uint64_t MeasuredFrequentSamples(const JobSpec& job, uint32_t rank, double delta,
                                 unsigned threads = 0);

}  // namespace nopfs::policy
