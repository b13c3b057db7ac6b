#include "policy/frequency.h"

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "policy/epoch_shape.h"
#include "policy/parallel.h"
#include "policy/partition.h"
#include "policy/sampler.h"

namespace nopfs::policy {
namespace {

// Records one access of sample k at stream position pos. Counts are summed and first accesses
// take the minimum, so the result does not depend on which worker handles which epoch, nor in
// which order: that is what makes CountNodeAccesses identical for every thread count.
template <bool kShared>
inline void Record(NodeAccessCounts* out, SampleId k, uint64_t pos) {
  if constexpr (kShared) {
    std::atomic_ref<uint32_t>(out->count[k]).fetch_add(1, std::memory_order_relaxed);
    std::atomic_ref<uint64_t> first(out->first_access[k]);
    uint64_t seen = first.load(std::memory_order_relaxed);
    while (pos < seen && !first.compare_exchange_weak(seen, pos, std::memory_order_relaxed)) {
    }
  } else {
    ++out->count[k];
    if (pos < out->first_access[k]) out->first_access[k] = pos;
  }
}

// Counts epochs first, first + stride, ... into *out, with `perm` as the permutation buffer.
template <bool kShared>
void CountEpochs(const JobSpec& job, const internal::EpochShape& shape, uint32_t node,
                 uint64_t epoch_length, uint32_t first, uint32_t stride,
                 std::vector<SampleId>* perm, NodeAccessCounts* out) {
  const uint64_t first_rank = job.first_rank(node);
  const uint64_t local_ranks = job.ranks_on_node(node);
  for (uint64_t e = first; e < job.epochs; e += stride) {
    EpochPermutation(job.seed, static_cast<uint32_t>(e), *perm);
    const SampleId* p = perm->data();
    uint64_t pos = e * epoch_length;
    shape.ForEachNodeEntry(first_rank, local_ranks, [&](uint32_t, uint64_t position) {
      Record<kShared>(out, p[position], pos++);
    });
  }
}

}  // namespace

NodeAccessCounts CountNodeAccesses(const JobSpec& job, uint32_t node, unsigned threads) {
  if (Status s = job.Validate(); !s.ok()) {
    throw std::invalid_argument("CountNodeAccesses: invalid job: " + s.message());
  }
  if (node >= job.nodes()) {
    throw std::out_of_range("CountNodeAccesses: node " + std::to_string(node) + " of " +
                            std::to_string(job.nodes()));
  }
  const internal::EpochShape shape(job);
  const uint64_t epoch_length = NodeEpochLength(job, node);

  NodeAccessCounts out;
  out.node = node;
  out.count.assign(job.samples, 0);
  out.first_access.assign(job.samples, kNeverAccessed);
  out.accesses = epoch_length * job.epochs;

  const unsigned workers =
      internal::EpochWorkers(threads, job.epochs, job.samples * sizeof(SampleId));
  // Buffers are allocated here, not in the workers, so that running out of memory is an
  // exception in the caller rather than std::terminate in a thread.
  std::vector<std::vector<SampleId>> perms(workers, std::vector<SampleId>(job.samples));
  if (workers == 1) {
    CountEpochs<false>(job, shape, node, epoch_length, 0, 1, &perms[0], &out);
  } else {
    internal::RunWorkers(workers, [&](unsigned w) {
      CountEpochs<true>(job, shape, node, epoch_length, w, workers, &perms[w], &out);
    });
  }
  for (uint32_t c : out.count)
    out.distinct += c != 0 ? 1 : 0;
  return out;
}

}  // namespace nopfs::policy
