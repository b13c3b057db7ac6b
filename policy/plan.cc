#include "policy/plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace nopfs::policy {
namespace {

// One sample the node reads, as the ranking sees it. 16 bytes, so that sorting a million of them
// moves little memory.
struct Candidate {
  uint64_t first;  // first access in the node's stream
  uint32_t count;  // a_k(n)
  SampleId id;
};
static_assert(sizeof(Candidate) == 16);

// The plan's ranking: count descending, then first access ascending, then id ascending.
bool RanksBefore(const Candidate& a, const Candidate& b) {
  if (a.count != b.count) return a.count > b.count;
  if (a.first != b.first) return a.first < b.first;
  return a.id < b.id;
}

// A tier's prefetch order: first access ascending, then id.
bool FetchedBefore(const Candidate& a, const Candidate& b) {
  if (a.first != b.first) return a.first < b.first;
  return a.id < b.id;
}

}  // namespace

std::string_view PlannerName(Planner p) {
  switch (p) {
    case Planner::kFrequency:
      return "frequency";
    case Planner::kStaging:
      return "staging";
    case Planner::kFillOnce:
      return "fill-once";
  }
  return "unknown";
}

Result<Planner> ParsePlanner(std::string_view name) {
  for (Planner p : {Planner::kFrequency, Planner::kStaging, Planner::kFillOnce}) {
    if (name == PlannerName(p)) return p;
  }
  return Status::InvalidArgument(
      "planner \"" + std::string(name) +
      "\" is not a planner: write frequency (cache the node's most read samples), staging (no "
      "cache, prefetch-ahead only) or fill-once (keep the first-read samples until full)");
}

NodePlan MakeNodePlan(const NodeAccessCounts& counts, std::span<const Bytes> sizes,
                      std::span<const Bytes> capacities, Planner planner) {
  const uint64_t f = counts.count.size();
  if (counts.first_access.size() != f || sizes.size() != f) {
    throw std::invalid_argument("MakeNodePlan: counts (" + std::to_string(f) +
                                " samples), first accesses (" +
                                std::to_string(counts.first_access.size()) + ") and sizes (" +
                                std::to_string(sizes.size()) + ") disagree");
  }
  if (capacities.size() > 127) {
    throw std::invalid_argument("MakeNodePlan: at most 127 classes, got " +
                                std::to_string(capacities.size()));
  }

  std::vector<Candidate> ranked;
  ranked.reserve(counts.distinct != 0 ? counts.distinct : f / 4);
  for (uint64_t k = 0; k < f; ++k) {
    if (counts.count[k] != 0) {
      ranked.push_back({counts.first_access[k], counts.count[k], static_cast<SampleId>(k)});
    }
  }
  std::sort(ranked.begin(), ranked.end(),
            planner == Planner::kFillOnce ? FetchedBefore : RanksBefore);

  NodePlan plan;
  plan.node = counts.node;
  plan.accesses = counts.accesses;
  plan.distinct = ranked.size();
  plan.location.assign(f, kNotCached);
  plan.tiers.resize(capacities.size());

  const size_t classes = capacities.size();
  std::vector<Bytes> remaining(capacities.begin(), capacities.end());
  std::vector<std::vector<Candidate>> members(classes);
  // The largest remaining capacity: a sample bigger than it fits nowhere, checked in O(1).
  Bytes largest = classes != 0 ? *std::max_element(remaining.begin(), remaining.end()) : 0;
  for (const Candidate& c : ranked) {
    const Bytes size = sizes[c.id];
    plan.distinct_bytes += size;
    // Under staging no sample is placed, not even an empty one: the same accounting, no tiers.
    if (size > largest || planner == Planner::kStaging) {
      plan.uncached_accesses += c.count;
      continue;
    }
    size_t j = 0;
    while (remaining[j] < size)
      ++j;  // terminates: some class has room (size <= largest)
    remaining[j] -= size;
    plan.location[c.id] = static_cast<int8_t>(j);
    members[j].push_back(c);
    plan.tiers[j].bytes += size;
    plan.tiers[j].accesses += c.count;
    if (remaining[j] + size == largest) {
      largest = *std::max_element(remaining.begin(), remaining.end());
    }
  }

  for (size_t j = 0; j < classes; ++j) {
    std::vector<Candidate>& m = members[j];
    std::sort(m.begin(), m.end(), FetchedBefore);
    plan.tiers[j].prefetch_order.reserve(m.size());
    for (const Candidate& c : m)
      plan.tiers[j].prefetch_order.push_back(c.id);
    std::vector<Candidate>().swap(m);
  }
  return plan;
}

NodePlan MakeNodePlan(const JobSpec& job, uint32_t node, std::span<const Bytes> sizes,
                      std::span<const Bytes> capacities, unsigned threads, Planner planner) {
  if (sizes.size() != job.samples) {
    throw std::invalid_argument("MakeNodePlan: " + std::to_string(sizes.size()) +
                                " sizes for a job of " + std::to_string(job.samples) + " samples");
  }
  const NodeAccessCounts counts = CountNodeAccesses(job, node, threads);
  return MakeNodePlan(counts, sizes, capacities, planner);
}

}  // namespace nopfs::policy
