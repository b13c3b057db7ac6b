#include "policy/simulate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <string>

#include "policy/epoch_shape.h"
#include "policy/frequency.h"
#include "policy/parallel.h"
#include "policy/partition.h"
#include "policy/plan.h"
#include "policy/sampler.h"

namespace nopfs::policy {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// What every policy of one run shares.
struct Context {
  const SimOptions* options = nullptr;
  std::span<const Bytes> sizes;
  uint32_t nodes = 1;
  uint32_t local_ranks = 1;
  uint64_t window = 0;  // staging window in entries per rank (0: unbounded)
  // Peers: [F], the global step (epoch * T + step) at which a node other than the simulated one
  // first reads each sample (kNoStep: not yet); empty when peers are not modelled.
  std::vector<uint32_t> first_other;
};

constexpr uint32_t kNoStep = UINT32_MAX;

// One local rank's clocks.
struct RankState {
  double avail = 0;          // when staging has the latest entry ready (avail_i(f))
  double ready = 0;          // when the consumer wants the next entry (t_{i,f-1} + s/c)
  double compute = 0;        // sum of s/c
  double stall = 0;          // total wait for data
  double step_stall = 0;     // wait for data in the current step
  uint64_t consumed = 0;     // entries consumed so far
  std::vector<double> ring;  // consumption end of the last `window` entries (by index % window)
  // DataLoader: when the epoch began, when each worker is free, when each batch was taken.
  double epoch_start = 0;
  std::vector<double> worker_free;
  std::vector<double> batch_begin;
};

// Per-byte costs of one policy, looked up once (every term of the model is linear in s).
struct Costs {
  double compute = 0;                // 1/c
  double pfs_stage = 0;              // (PFS fetch + staging write) / p_0
  double pfs_fetch = 0;              // PFS fetch alone, 1/(t(gamma)/gamma)
  std::vector<double> cached_stage;  // class j: (min(local, PFS) fetch + staging write) / p_0
  std::vector<SourceKind> cached_kind;
  std::vector<double> tier_write;  // class j: 1/(w_j(p_j)/p_j)
  std::vector<double> peer_stage;  // class j of a peer: (peer fetch + staging write) / p_0
  double loader_fetch = 0;         // DataLoader: PFS fetch + preprocessing, per byte
};

// Seconds per byte at `rate` bytes/s; an exhausted (zero) rate costs forever.
double PerByte(double rate) {
  return rate > 0 ? 1.0 / rate : std::numeric_limits<double>::infinity();
}

class PolicySim {
 public:
  // first_steps[j]: for each entry of class j's prefetch list, the global step of its first
  // access by this node (ascending, as the list is in first-access order); for peers.
  PolicySim(SimPolicy policy, const Context& ctx, std::unique_ptr<NodePlan> plan,
            std::vector<std::vector<uint32_t>> first_steps)
      : policy_(policy),
        ctx_(ctx),
        plan_(std::move(plan)),
        first_steps_(std::move(first_steps)),
        ranks_(ctx.local_ranks) {
    const SimOptions& o = *ctx_.options;
    const SystemModel& m = o.model;
    const uint32_t p0 = std::max<uint32_t>(m.staging.threads, 1);
    uint32_t prefetch_threads = 0;
    if (Prefetches()) {
      for (size_t j = 0; j < m.classes.size(); ++j) {
        if (!plan_->tiers[j].prefetch_order.empty()) prefetch_threads += m.classes[j].threads;
      }
    }
    switch (policy_) {
      case SimPolicy::kNoIo:
        readers_ = 0;
        break;
      case SimPolicy::kDataLoader:
        readers_ = ctx_.nodes * ctx_.local_ranks * std::max<uint32_t>(o.loader_workers, 1);
        break;
      default:
        readers_ = o.pfs_readers != 0 ? o.pfs_readers
                                      : ctx_.nodes * (ctx_.local_ranks * p0 + prefetch_threads);
        break;
    }
    costs_ = MakeCosts(readers_);
    // Once the prefetchers are done, only the staging threads read the PFS.
    const uint32_t after =
        o.pfs_readers != 0 || policy_ == SimPolicy::kDataLoader || policy_ == SimPolicy::kNoIo
            ? readers_
            : ctx_.nodes * ctx_.local_ranks * p0;
    filled_costs_ = MakeCosts(after);
    if (plan_ != nullptr) PrepareFills();
    for (RankState& r : ranks_) {
      r.ring.assign(ctx_.window, 0);
      r.worker_free.assign(std::max<uint32_t>(o.loader_workers, 1), 0);
    }
  }

  void BeginStep(uint32_t global_step) { step_ = global_step; }

  void BeginEpoch() {
    for (RankState& r : ranks_) {
      r.epoch_start = r.ready;
      std::fill(r.worker_free.begin(), r.worker_free.end(), r.ready);
      r.batch_begin.clear();
    }
  }

  // Rank l consumes its batch of step h (of the epoch).
  void Batch(uint32_t l, std::span<const SampleId> samples) {
    RankState& r = ranks_[l];
    if (policy_ == SimPolicy::kDataLoader) {
      LoaderBatch(r, samples);
      return;
    }
    for (SampleId k : samples) {
      const Bytes s = ctx_.sizes[k];
      const double bytes = static_cast<double>(s);
      if (policy_ != SimPolicy::kNoIo) Stage(r, k, bytes);
      Consume(r, bytes);
    }
  }

  // The end of a step: the node's ranks meet (if asked) and the step's stall is recorded.
  void EndStep() {
    double latest = 0;
    double worst = 0;
    for (RankState& r : ranks_) {
      latest = std::max(latest, r.ready);
      worst = std::max(worst, r.step_stall);
      r.step_stall = 0;
    }
    if (ctx_.options->step_barrier) {
      for (RankState& r : ranks_)
        r.ready = latest;
    }
    step_stalls_.push_back(worst);
  }

  void EndEpoch() {
    double end = 0;
    for (const RankState& r : ranks_)
      end = std::max(end, r.ready);
    result_.epoch_seconds.push_back(end - epoch_end_);
    epoch_end_ = end;
  }

  PolicyResult Finish() {
    PolicyResult& out = result_;
    out.policy = policy_;
    out.total_seconds = epoch_end_;
    for (const RankState& r : ranks_) {
      out.compute_seconds = std::max(out.compute_seconds, r.compute);
      out.stall_seconds = std::max(out.stall_seconds, r.stall);
    }
    out.steps = step_stalls_.size();
    if (!step_stalls_.empty()) {
      std::sort(step_stalls_.begin(), step_stalls_.end());
      const auto rank = [&](double q) {
        const double n = static_cast<double>(step_stalls_.size());
        const size_t i = static_cast<size_t>(std::ceil(q * n));
        return step_stalls_[std::max<size_t>(i, 1) - 1];
      };
      out.stall_median_seconds = rank(0.5);
      out.stall_p99_seconds = rank(0.99);
    }
    // Prefetchers read from the PFS what they filled before the node finished.
    if (Prefetches()) AdvancePrefetchers(out.total_seconds);
    out.pfs_readers = readers_;
    out.node_pfs_bytes = pfs_bytes_;
    out.job_pfs_bytes = pfs_bytes_ * ctx_.nodes;
    return std::move(out);
  }

 private:
  Costs MakeCosts(uint32_t readers) const {
    const SystemModel& m = ctx_.options->model;
    const double p0 = std::max<uint32_t>(m.staging.threads, 1);
    Costs c;
    c.compute = 1.0 / m.compute_rate;
    c.pfs_fetch = PfsSeconds(m, 1, readers);
    c.pfs_stage = (c.pfs_fetch + StagingWriteSeconds(m, 1)) / p0;
    const double prep = m.preprocess_rate > 0 ? 1.0 / m.preprocess_rate : 0;
    c.loader_fetch = c.pfs_fetch + prep;
    for (const StorageClass& k : m.classes) {
      const double local = LocalSeconds(k, 1);
      const bool use_local = !(c.pfs_fetch < local);
      c.cached_kind.push_back(use_local ? SourceKind::kLocal : SourceKind::kPfs);
      c.cached_stage.push_back(((use_local ? local : c.pfs_fetch) + StagingWriteSeconds(m, 1)) /
                               p0);
      const double pj = std::max<uint32_t>(k.threads, 1);
      c.tier_write.push_back(PerByte(k.write.At(pj) / pj));
      c.peer_stage.push_back((PeerSeconds(m, k, 1) + StagingWriteSeconds(m, 1)) / p0);
    }
    return c;
  }

  // Whether prefetchers fill the tiers (not under warm tiers, nor fill-once on read).
  bool Prefetches() const {
    const SimOptions& o = *ctx_.options;
    return plan_ != nullptr && !o.warm_tiers &&
           !(policy_ == SimPolicy::kFillOnce && o.fill_once_on_read);
  }
  // Whether a staged PFS read of a sample planned for a tier also writes it there.
  bool StagingCaches() const {
    const SimOptions& o = *ctx_.options;
    return plan_ != nullptr && !o.warm_tiers &&
           (o.fetch_and_cache || (policy_ == SimPolicy::kFillOnce && o.fill_once_on_read));
  }

  // fill_[k]: when a cached sample is in its tier (kNever until someone fills it). Warm tiers
  // are full at 0; otherwise prefetchers and/or staging fill them as the run goes.
  void PrepareFills() {
    const SimOptions& o = *ctx_.options;
    fill_.assign(ctx_.sizes.size(), kNever);
    if (o.warm_tiers) {
      for (const TierPlan& t : plan_->tiers) {
        for (SampleId k : t.prefetch_order)
          fill_[k] = 0;
      }
    }
    // For peers: the share of the node's distinct bytes the plan keeps, and the cumulative share
    // of each class in what it keeps.
    Bytes kept = 0;
    for (const TierPlan& t : plan_->tiers)
      kept += t.bytes;
    coverage_ = plan_->distinct_bytes != 0
                    ? static_cast<double>(kept) / static_cast<double>(plan_->distinct_bytes)
                    : 0;
    double cumulative = 0;
    for (const TierPlan& t : plan_->tiers) {
      cumulative += kept != 0 ? static_cast<double>(t.bytes) / static_cast<double>(kept) : 0;
      class_share_.push_back(cumulative);
    }
    prefetch_.resize(plan_->tiers.size());
    for (size_t j = 0; j < plan_->tiers.size(); ++j) {
      const double pj = std::max<uint32_t>(o.model.classes[j].threads, 1);
      prefetch_[j].per_byte = (costs_.pfs_fetch + costs_.tier_write[j]) / pj;
    }
  }

  // Runs each class's prefetcher (fluid: its p_j threads advance one clock through the prefetch
  // list) over every entry it completes by `until`. An entry someone already filled or claimed
  // is skipped at no cost, as SlotTable::TryBeginFill makes nopfsd's prefetchers do.
  void AdvancePrefetchers(double until) {
    for (size_t j = 0; j < prefetch_.size(); ++j) {
      Prefetch& p = prefetch_[j];
      const std::vector<SampleId>& list = plan_->tiers[j].prefetch_order;
      while (p.next < list.size()) {
        const SampleId k = list[p.next];
        if (fill_[k] != kNever) {
          ++p.next;
          continue;
        }
        const Bytes s = ctx_.sizes[k];
        const double done = p.clock + (s == 0 ? 0 : static_cast<double>(s) * p.per_byte);
        if (done > until) break;
        p.clock = done;
        fill_[k] = done;
        pfs_bytes_ += s;
        ++p.next;
      }
    }
    if (!filled_) {
      filled_ = std::all_of(prefetch_.begin(), prefetch_.end(), [&](const Prefetch& p) {
        return p.next ==
               plan_->tiers[static_cast<size_t>(&p - prefetch_.data())].prefetch_order.size();
      });
      if (filled_) costs_ = filled_costs_;
    }
  }

  // The class of a peer holding sample k and presumed ready at `start`, or -1 (peers are
  // described in simulate.h). A peer is known only once it has read k (first_other). By
  // symmetry it keeps k with the probability that this node's plan keeps what it reads
  // (coverage), in a class drawn by this plan's bytes per class (a fixed hash of k). Its copy is
  // ready: under warm tiers, at once; where staging reads fill tiers (fetch-and-cache, fill-once
  // on read), since it read k; otherwise once its prefetcher has reached k, which is
  // docs/algorithm.md §7's rule: this node's own progress in that class (the peer's, by symmetry)
  // passes k's position in the peer's list plus the margin. That position is estimated by symmetry
  // too: the entries of this node's list first read before the step at which the peer first read k.
  int PeerClass(SampleId k, double start) {
    if (ctx_.first_other.empty() || plan_ == nullptr || coverage_ <= 0) return -1;
    const uint32_t peer_step = ctx_.first_other[k];
    if (peer_step >= step_) return -1;
    SplitMix64 rng(uint64_t{k} * 0x9E3779B97F4A7C15ULL ^ 0x7065657273ULL);
    const double u = static_cast<double>(rng.Next() >> 11) * 0x1.0p-53;
    if (u >= coverage_) return -1;
    const double v = static_cast<double>(rng.Next() >> 11) * 0x1.0p-53;
    size_t j = 0;
    while (j + 1 < class_share_.size() && !(v < class_share_[j]))
      ++j;
    if (ctx_.options->warm_tiers || StagingCaches()) return static_cast<int>(j);
    AdvancePrefetchers(start);
    const std::vector<uint32_t>& steps = first_steps_[j];
    const uint64_t position = static_cast<uint64_t>(
        std::lower_bound(steps.begin(), steps.end(), peer_step) - steps.begin());
    const uint64_t own = prefetch_[j].next;
    return PeerPresumedReady(own, position, own == steps.size()) ? static_cast<int>(j) : -1;
  }

  // Staging fetches entry k into the rank's ring: it starts once the previous entry is staged
  // (fluid p_0 threads) and, with a window, once the entry `window` back has been consumed.
  void Stage(RankState& r, SampleId k, double bytes) {
    double start = r.avail;
    if (ctx_.window != 0 && r.consumed >= ctx_.window) {
      start = std::max(start, r.ring[r.consumed % ctx_.window]);
    }
    const int8_t loc = plan_ != nullptr ? plan_->location[k] : kNotCached;
    if (loc >= 0 && Prefetches()) AdvancePrefetchers(start);
    double per_byte = costs_.pfs_stage;
    SourceKind kind = SourceKind::kPfs;
    bool fills = false;
    const size_t j = static_cast<size_t>(loc);
    if (loc >= 0 && fill_[k] <= start) {
      per_byte = costs_.cached_stage[j];
      kind = costs_.cached_kind[j];
    } else {
      // A peer that holds it, if faster than the PFS (ties to the peer, as ChooseSource).
      const int peer = PeerClass(k, start);
      if (peer >= 0 && !(per_byte < costs_.peer_stage[static_cast<size_t>(peer)])) {
        per_byte = costs_.peer_stage[static_cast<size_t>(peer)];
        kind = SourceKind::kPeer;
      }
      if (loc >= 0 && StagingCaches() && fill_[k] == kNever) {
        // The read writes the sample into its tier too (and claims it from the prefetchers).
        per_byte +=
            costs_.tier_write[j] / std::max<uint32_t>(ctx_.options->model.staging.threads, 1);
        fills = true;
      }
    }
    // (A zero-byte sample costs nothing, even where a rate is zero and its cost infinite.)
    r.avail = start + (bytes == 0 ? 0 : bytes * per_byte);
    if (fills) fill_[k] = r.avail;
    result_.reads[static_cast<size_t>(kind)] += 1;
    if (kind == SourceKind::kPfs) pfs_bytes_ += static_cast<Bytes>(bytes);
    // The consumer waits for it.
    if (r.avail > r.ready) {
      r.stall += r.avail - r.ready;
      r.step_stall += r.avail - r.ready;
      r.ready = r.avail;
    }
  }

  void Consume(RankState& r, double bytes) {
    const double work = bytes * costs_.compute;
    r.ready += work;
    r.compute += work;
    if (ctx_.window != 0) r.ring[r.consumed % ctx_.window] = r.ready;
    ++r.consumed;
  }

  // A DataLoader batch: worker h % W loads it whole once it is free and the batch P*W before it
  // has been taken; the consumer takes it when it is loaded.
  void LoaderBatch(RankState& r, std::span<const SampleId> samples) {
    const SimOptions& o = *ctx_.options;
    double load = 0;
    double work = 0;
    for (SampleId k : samples) {
      const double bytes = static_cast<double>(ctx_.sizes[k]);
      if (bytes > 0) load += bytes * costs_.loader_fetch;
      work += bytes * costs_.compute;
      pfs_bytes_ += ctx_.sizes[k];
    }
    result_.reads[static_cast<size_t>(SourceKind::kPfs)] += samples.size();
    const uint64_t h = r.batch_begin.size();
    double loaded = 0;
    if (o.loader_workers == 0) {
      loaded = r.ready + load;
    } else {
      const uint64_t w = h % o.loader_workers;
      const uint64_t in_flight = uint64_t{o.loader_prefetch} * o.loader_workers;
      const double issue =
          std::max(r.worker_free[w], h >= in_flight ? r.batch_begin[h - in_flight] : r.epoch_start);
      loaded = issue + load;
      r.worker_free[w] = loaded;
    }
    const double begin = std::max(r.ready, loaded);
    r.stall += begin - r.ready;
    r.step_stall += begin - r.ready;
    r.batch_begin.push_back(begin);
    r.ready = begin + work;
    r.compute += work;
  }

  SimPolicy policy_;
  const Context& ctx_;
  std::unique_ptr<NodePlan> plan_;  // frequency and fill-once
  std::vector<std::vector<uint32_t>> first_steps_;
  std::vector<double> fill_;  // [F]: when a cached sample is in its tier
  struct Prefetch {
    double per_byte = 0;  // (PFS fetch + tier write) / p_j
    double clock = 0;     // when the entries before `next` are done
    size_t next = 0;      // the next entry of the prefetch list
  };
  std::vector<Prefetch> prefetch_;  // per class
  std::vector<RankState> ranks_;
  Costs costs_;         // now
  Costs filled_costs_;  // once the prefetchers are done
  bool filled_ = false;
  double coverage_ = 0;              // peers: the share of a node's reads its plan keeps
  std::vector<double> class_share_;  // peers: cumulative share of each class
  uint32_t step_ = 0;                // the global step being simulated
  uint32_t readers_ = 0;
  Bytes pfs_bytes_ = 0;
  double epoch_end_ = 0;
  std::vector<double> step_stalls_;
  PolicyResult result_;
};

}  // namespace

std::string_view SimPolicyName(SimPolicy p) {
  switch (p) {
    case SimPolicy::kNoIo:
      return "no-io";
    case SimPolicy::kFrequency:
      return "frequency";
    case SimPolicy::kStaging:
      return "staging";
    case SimPolicy::kFillOnce:
      return "fill-once";
    case SimPolicy::kDataLoader:
      return "dataloader";
  }
  return "unknown";
}

Result<SimPolicy> ParseSimPolicy(std::string_view name) {
  for (SimPolicy p : kAllSimPolicies) {
    if (name == SimPolicyName(p)) return p;
  }
  return Status::InvalidArgument("policy \"" + std::string(name) +
                                 "\" is not simulated: write no-io, frequency, staging, fill-once "
                                 "or dataloader");
}

Status SimOptions::Validate() const {
  NOPFS_RETURN_IF_ERROR(job.Validate());
  if (node >= job.nodes()) {
    return Status::InvalidArgument("node " + std::to_string(node) +
                                   " is out of range: the job has " + std::to_string(job.nodes()) +
                                   " nodes");
  }
  if (!(model.compute_rate > 0) || !std::isfinite(model.compute_rate)) {
    return Status::InvalidArgument(
        "the compute rate must be a positive number of bytes/s per rank");
  }
  NOPFS_RETURN_IF_ERROR(model.Validate().WithContext("model"));
  if (loader_prefetch == 0) {
    return Status::InvalidArgument("the DataLoader's prefetch factor must be at least 1");
  }
  return Status::Ok();
}

Result<std::vector<PolicyResult>> Simulate(const SimOptions& options, std::span<const Bytes> sizes,
                                           std::span<const SimPolicy> policies) {
  NOPFS_RETURN_IF_ERROR(options.Validate());
  const JobSpec& job = options.job;
  if (sizes.size() != job.samples) {
    return Status::InvalidArgument(std::to_string(sizes.size()) + " sample sizes for a job of " +
                                   std::to_string(job.samples) + " samples");
  }
  Context ctx;
  ctx.options = &options;
  ctx.sizes = sizes;
  ctx.nodes = job.nodes();
  ctx.local_ranks = job.ranks_on_node(options.node);
  if (options.staging_window) {
    const double total = static_cast<double>(std::accumulate(sizes.begin(), sizes.end(), Bytes{0}));
    const double mean = job.samples != 0 ? total / static_cast<double>(job.samples) : 1;
    const double ring = static_cast<double>(options.model.staging.capacity) / ctx.local_ranks;
    ctx.window = std::max<uint64_t>(1, static_cast<uint64_t>(ring / std::max(mean, 1.0)));
  }

  const bool tiered = std::any_of(policies.begin(), policies.end(), [](SimPolicy p) {
    return p == SimPolicy::kFrequency || p == SimPolicy::kFillOnce;
  });

  // Entries of each local rank in each step (the same every epoch).
  const uint64_t steps = StepsPerEpoch(job);
  const uint32_t first = job.first_rank(options.node);
  std::vector<uint64_t> per_step(steps * ctx.local_ranks);
  std::vector<uint64_t> node_step_end(steps);  // entries of the node's epoch up to each step
  for (uint64_t h = 0; h < steps; ++h) {
    uint64_t node = h == 0 ? 0 : node_step_end[h - 1];
    for (uint32_t l = 0; l < ctx.local_ranks; ++l) {
      per_step[h * ctx.local_ranks + l] = RankStepEntries(job, first + l, h).size();
      node += per_step[h * ctx.local_ranks + l];
    }
    node_step_end[h] = node;
  }
  // Peers: which samples other nodes have read, step by step, and the entries of each step
  // across all ranks (the same every epoch).
  const bool peers =
      options.peers && tiered && ctx.nodes > 1 && options.model.network_bandwidth > 0;
  if (uint64_t{job.epochs} * steps >= kNoStep) {
    return Status::InvalidArgument("the job has " + std::to_string(job.epochs * steps) +
                                   " steps: at most " + std::to_string(kNoStep - 1) +
                                   " can be simulated");
  }
  std::vector<uint64_t> all_per_step;
  if (peers) {
    ctx.first_other.assign(job.samples, kNoStep);
    all_per_step.assign(steps, 0);
    for (uint64_t h = 0; h < steps; ++h) {
      for (uint32_t r = 0; r < job.ranks; ++r)
        all_per_step[h] += RankStepEntries(job, r, h).size();
    }
  }

  // The plans the tiered policies need, from one count of the node's accesses.
  std::vector<Bytes> capacities;
  for (const StorageClass& c : options.model.classes)
    capacities.push_back(c.capacity);
  NodeAccessCounts counts;
  if (tiered) counts = CountNodeAccesses(job, options.node, options.threads);
  const uint64_t epoch_length = NodeEpochLength(job, options.node);
  // The global step of a position of the node's concatenated stream.
  const auto step_of = [&](uint64_t position) {
    const uint64_t epoch = position / epoch_length;
    const uint64_t at = position % epoch_length;
    const uint64_t h = static_cast<uint64_t>(
        std::upper_bound(node_step_end.begin(), node_step_end.end(), at) - node_step_end.begin());
    return static_cast<uint32_t>(epoch * steps + h);
  };
  std::vector<std::unique_ptr<PolicySim>> sims;
  for (SimPolicy p : policies) {
    std::unique_ptr<NodePlan> plan;
    std::vector<std::vector<uint32_t>> first_steps;
    if (p == SimPolicy::kFrequency || p == SimPolicy::kFillOnce) {
      plan = std::make_unique<NodePlan>(
          MakeNodePlan(counts, sizes, capacities,
                       p == SimPolicy::kFrequency ? Planner::kFrequency : Planner::kFillOnce));
      if (peers) {
        for (const TierPlan& t : plan->tiers) {
          std::vector<uint32_t>& f = first_steps.emplace_back();
          f.reserve(t.prefetch_order.size());
          for (SampleId k : t.prefetch_order)
            f.push_back(step_of(counts.first_access[k]));
        }
      } else {
        first_steps.resize(plan->tiers.size());
      }
    }
    sims.push_back(std::make_unique<PolicySim>(p, ctx, std::move(plan), std::move(first_steps)));
  }
  counts = NodeAccessCounts();

  // Epochs are generated W at a time in parallel and simulated in order on this thread.
  const internal::EpochShape shape(job);
  const unsigned workers = internal::EpochWorkers(options.threads, job.epochs,
                                                  (job.samples + epoch_length) * sizeof(SampleId));
  std::vector<std::vector<SampleId>> perms(workers, std::vector<SampleId>(job.samples));
  std::vector<std::vector<SampleId>> streams(workers, std::vector<SampleId>(epoch_length));
  for (uint64_t round = 0; round < job.epochs; round += workers) {
    const unsigned n = static_cast<unsigned>(std::min<uint64_t>(workers, job.epochs - round));
    internal::RunWorkers(n, [&](unsigned w) {
      EpochPermutation(job.seed, static_cast<uint32_t>(round + w), perms[w]);
      const SampleId* p = perms[w].data();
      SampleId* dst = streams[w].data();
      shape.ForEachNodeEntry(first, ctx.local_ranks,
                             [&](uint32_t, uint64_t position) { *dst++ = p[position]; });
    });
    for (unsigned w = 0; w < n; ++w) {
      const uint64_t epoch = round + w;
      if (peers) {
        // The first step at which another node reads each sample, this epoch included.
        uint64_t entry = 0;
        uint64_t h = 0;
        uint64_t step_end = all_per_step[0];
        const SampleId* p = perms[w].data();
        shape.ForEachNodeEntry(0, job.ranks, [&](uint32_t rank, uint64_t position) {
          while (entry == step_end && h + 1 < steps)
            step_end += all_per_step[++h];
          ++entry;
          if (job.node_of(rank) == options.node) return;
          uint32_t& f = ctx.first_other[p[position]];
          if (f == kNoStep) f = static_cast<uint32_t>(epoch * steps + h);
        });
      }
      const std::span<const SampleId> stream(streams[w]);
      for (auto& sim : sims) {
        sim->BeginEpoch();
        uint64_t at = 0;
        for (uint64_t h = 0; h < steps; ++h) {
          sim->BeginStep(static_cast<uint32_t>(epoch * steps + h));
          for (uint32_t l = 0; l < ctx.local_ranks; ++l) {
            const uint64_t count = per_step[h * ctx.local_ranks + l];
            sim->Batch(l, stream.subspan(at, count));
            at += count;
          }
          sim->EndStep();
        }
        sim->EndEpoch();
      }
    }
  }

  std::vector<PolicyResult> out;
  for (auto& sim : sims)
    out.push_back(sim->Finish());
  return out;
}

}  // namespace nopfs::policy
