#include "policy/predict.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "policy/epoch_shape.h"
#include "policy/parallel.h"
#include "policy/partition.h"
#include "policy/sampler.h"

namespace nopfs::policy {
namespace {

// One local rank's position in the recurrence.
struct RankClock {
  double avail = 0;    // avail_i(f): when the staging threads have the latest entry ready
  double ready = 0;    // t_{i,f-1} + s_{f-1}/c: when the consumer wants the next entry
  double stall = 0;    // sum of max(0, avail - ready)
  double compute = 0;  // sum of s/c
};

// Seconds per byte, looked up once: every term of the model is linear in the sample's size, so
// the tables are interpolated per class, not per read.
struct Costs {
  double compute = 0;  // 1/c (0: infinitely fast consumer)
  double pfs = 0;      // (fetch from the PFS + staging write) / p_0
  // Per class j: the source a sample cached in j is read from (the faster per byte of class j
  // and the PFS, ties to the class, as ChooseSource decides) and its cost like `pfs`.
  std::vector<SourceKind> kind;
  std::vector<double> cached;
};

}  // namespace

NodePrediction PredictNode(const JobSpec& job, const NodePlan& plan, std::span<const Bytes> sizes,
                           const SystemModel& model, uint32_t pfs_readers, unsigned threads) {
  if (Status s = job.Validate(); !s.ok()) {
    throw std::invalid_argument("PredictNode: invalid job: " + s.message());
  }
  if (plan.node >= job.nodes()) {
    throw std::out_of_range("PredictNode: node " + std::to_string(plan.node) + " of " +
                            std::to_string(job.nodes()));
  }
  if (sizes.size() != job.samples || plan.location.size() != job.samples) {
    throw std::invalid_argument("PredictNode: sizes (" + std::to_string(sizes.size()) +
                                ") and plan locations (" + std::to_string(plan.location.size()) +
                                ") must both have F = " + std::to_string(job.samples) + " entries");
  }
  for (int8_t loc : plan.location) {
    if (loc >= 0 && static_cast<size_t>(loc) >= model.classes.size()) {
      throw std::invalid_argument("PredictNode: the plan uses class " + std::to_string(loc) +
                                  " but the model has " + std::to_string(model.classes.size()));
    }
  }

  // avail_i(f) advances by read/p_0 per entry, read = fetch + write.
  Costs costs;
  const double p0 = std::max<uint32_t>(model.staging.threads, 1);
  const double write = StagingWriteSeconds(model, 1);
  const double pfs_fetch = PfsSeconds(model, 1, pfs_readers);
  costs.compute = model.compute_rate > 0 ? 1.0 / model.compute_rate : 0;
  costs.pfs = (pfs_fetch + write) / p0;
  for (const StorageClass& c : model.classes) {
    const double local_fetch = LocalSeconds(c, 1);
    const bool local = !(pfs_fetch < local_fetch);
    costs.kind.push_back(local ? SourceKind::kLocal : SourceKind::kPfs);
    costs.cached.push_back(((local ? local_fetch : pfs_fetch) + write) / p0);
  }

  const internal::EpochShape shape(job);
  const uint32_t first_rank = job.first_rank(plan.node);
  const uint32_t local_ranks = job.ranks_on_node(plan.node);
  const uint64_t epoch_length = NodeEpochLength(job, plan.node);

  NodePrediction out;
  std::vector<RankClock> clocks(local_ranks);
  // One entry of the node's stream through the recurrence of its rank.
  const auto consume = [&](uint32_t l, SampleId k) {
    const Bytes s = sizes[k];
    const double bytes = static_cast<double>(s);
    const int8_t loc = plan.location[k];
    const size_t j = static_cast<size_t>(loc);
    const SourceKind kind = loc >= 0 ? costs.kind[j] : SourceKind::kPfs;
    // (A zero-byte sample costs nothing, even where a rate is zero and its cost infinite.)
    const double per_byte = loc >= 0 ? costs.cached[j] : costs.pfs;
    const double staged = s == 0 ? 0 : bytes * per_byte;
    RankClock& c = clocks[l];
    c.avail += staged;
    if (c.avail > c.ready) {
      c.stall += c.avail - c.ready;
      c.ready = c.avail;
    }
    const double work = bytes * costs.compute;
    c.ready += work;
    c.compute += work;
    out.reads[static_cast<size_t>(kind)] += 1;
    out.bytes[static_cast<size_t>(kind)] += s;
  };

  // Epochs are generated W at a time in parallel and consumed in order on this thread (the
  // recurrence runs through the epochs).
  const unsigned workers =
      internal::EpochWorkers(threads, job.epochs, (job.samples + epoch_length) * sizeof(SampleId));
  std::vector<std::vector<SampleId>> perms(workers, std::vector<SampleId>(job.samples));
  std::vector<std::vector<SampleId>> streams(workers, std::vector<SampleId>(epoch_length));
  for (uint64_t round = 0; round < job.epochs; round += workers) {
    const unsigned n = static_cast<unsigned>(std::min<uint64_t>(workers, job.epochs - round));
    internal::RunWorkers(n, [&](unsigned w) {
      EpochPermutation(job.seed, static_cast<uint32_t>(round + w), perms[w]);
      const SampleId* p = perms[w].data();
      SampleId* dst = streams[w].data();
      shape.ForEachNodeEntry(first_rank, local_ranks,
                             [&](uint32_t, uint64_t position) { *dst++ = p[position]; });
    });
    for (unsigned w = 0; w < n; ++w) {
      const SampleId* src = streams[w].data();
      shape.ForEachNodeEntry(first_rank, local_ranks,
                             [&](uint32_t l, uint64_t) { consume(l, *src++); });
    }
  }

  for (const RankClock& c : clocks) {
    out.compute_seconds = std::max(out.compute_seconds, c.compute);
    out.stall_seconds = std::max(out.stall_seconds, c.stall);
    out.total_seconds = std::max(out.total_seconds, c.ready);
  }
  return out;
}

}  // namespace nopfs::policy
