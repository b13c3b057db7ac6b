#include "policy/placement_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <string>

namespace nopfs::policy {
namespace {

constexpr uint32_t kUser = 0;  // the sweep's user; other users are 1..background_users
constexpr uint32_t kNotFree = UINT32_MAX;
constexpr double kTwoPi = 6.283185307179586;
// The other users' jobs start this many of their mean durations before the sweep, so that the
// cluster and its SSDs are in their steady state at time 0.
constexpr double kWarmupDurations = 10;
// What a job ranked ahead of the sweep takes off its submission time: more than any run lasts.
constexpr double kAhead = 1e12;

// SplitMix64 (Steele, Lea, Flood 2014): the same sequence on every machine.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A uniform double in (0, 1] from 53 bits.
double ToUnit(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return Mix(state_);
  }
  double Unit() { return ToUnit(Next()); }
  // Uniform in [0, n), n >= 1 (the modulo bias is below 2^-40 for the n used here).
  uint64_t Below(uint64_t n) { return Next() % n; }
  double Exponential(double mean) { return -mean * std::log(Unit()); }

 private:
  uint64_t state_;
};

// Independent streams of keyed draws: the same (seed, stream, a, b) gives the same number
// whatever else the simulation drew before it.
enum Stream : uint64_t { kArrivals = 1, kPicks, kDuration1, kDuration2, kRequeue, kKillAt };
double Keyed(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b) {
  return ToUnit(Mix(Mix(Mix(seed ^ (stream * 0x9e3779b97f4a7c15ULL)) + a) + (b << 32)));
}

// Log-normal with the given mean (not median) and sigma, from two uniforms (Box-Muller).
double LogNormal(double mean, double sigma, double u1, double u2) {
  if (sigma == 0) return mean;
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
  return mean * std::exp(sigma * z - sigma * sigma / 2);
}

struct Copy {
  uint32_t owner = 0;
  Bytes bytes = 0;
  double last_used = 0;
};

struct Node {
  std::vector<Copy> copies;  // kept copies, one per user
};

struct Job {
  bool sweep = false;
  uint32_t task = 0;  // sweep: its index; attempts so far
  uint32_t attempt = 0;
  uint32_t owner = 0;
  uint32_t nodes = 1;
  double submit = 0;
  double rank = 0;  // the priority: lower first, then the lower id (the submission, or earlier)
  double eligible = std::numeric_limits<double>::quiet_NaN();  // sweep: its wait's clock
  double seconds = 0;                                          // what is left to run
  double epoch_seconds = 0;  // its SSD tier fills during its first epoch
  Bytes grant = 0;           // SSD reserved per node
  Bytes tier_bytes = 0;      // what its SSD tier holds per node once filled
  std::vector<uint32_t> pinned;
  // While it runs.
  double start = 0;
  std::vector<uint32_t> on;
  std::vector<Bytes> adopted;
};

enum class EventKind : uint8_t { kSweepSubmit, kArrival, kScripted, kEnd, kKill, kFree };
struct Event {
  double time = 0;
  uint64_t seq = 0;
  EventKind kind = EventKind::kEnd;
  uint32_t id = 0;  // the job (kEnd, kKill, kScripted) or the node (kFree)
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
};

// One run of one placement.
class ClusterRun {
 public:
  ClusterRun(const PlacementSimOptions& o, Placement placement, uint64_t seed)
      : o_(o),
        placement_(placement),
        seed_(seed),
        arrivals_(Mix(seed ^ kArrivals)),
        picks_(Mix(seed ^ kPicks)),
        nodes_(o.cluster_nodes),
        pos_(o.cluster_nodes) {
    for (uint32_t n = 0; n < o.cluster_nodes; ++n) {
      pos_[n] = n;
      free_.push_back(n);
    }
    if (o.background_load > 0) {
      uint32_t levels = 0;
      double mean_nodes = 0;
      for (uint32_t s = 1; s <= o.background_max_nodes; s *= 2) {
        ++levels;
        mean_nodes += s;
      }
      levels_ = levels;
      mean_nodes /= levels;
      arrival_mean_ = o.background_seconds * mean_nodes / (o.background_load * o.cluster_nodes);
    }
  }

  Status Run(PlacementResult* out) {
    // Other users' waits are measured over a span that does not depend on the placement: their
    // jobs submitted during the sweep's nominal length (its jobs' mean durations, one wave of
    // sweep_concurrency after the other), each once it started.
    const uint32_t waves = o_.sweep_concurrency == 0
                               ? 1
                               : (o_.sweep_jobs + o_.sweep_concurrency - 1) / o_.sweep_concurrency;
    window_ = waves * o_.job_seconds;
    double begin = 0;
    if (arrival_mean_ > 0) {
      begin = -kWarmupDurations * o_.background_seconds;
      Push(begin + arrivals_.Exponential(arrival_mean_), EventKind::kArrival, 0);
    }
    for (const ScriptedJob& s : o_.scripted_jobs) {
      Job j;
      j.owner = 1 + static_cast<uint32_t>(jobs_.size() % o_.background_users);
      j.nodes = s.pinned.empty() ? s.nodes : static_cast<uint32_t>(s.pinned.size());
      j.submit = s.submit;
      j.rank = s.submit;
      j.seconds = s.seconds;
      j.grant = o_.background_ssd_bytes;
      j.tier_bytes = std::min(o_.background_keep_bytes, o_.background_ssd_bytes);
      j.pinned = s.pinned;
      jobs_.push_back(std::move(j));
      if (s.submit >= 0 && s.submit < window_) ++in_window_;
      Push(s.submit, EventKind::kScripted, static_cast<uint32_t>(jobs_.size() - 1));
    }
    // The user's copies at the start, last used at time 0 (on empty SSDs: they fit).
    for (uint32_t n : o_.warm_nodes) {
      if (o_.keep_quota == 0) break;
      std::vector<Copy>& copies = nodes_[n].copies;
      if (copies.empty())
        copies.push_back(Copy{kUser, std::min(o_.keep_quota, o_.dataset_bytes), 0});
      NoteMarked(n);
    }
    Push(0, EventKind::kSweepSubmit, 0);
    while (!done_ || now_ < window_ || in_window_ > 0) {
      if (events_.empty()) {
        if (done_) break;
        return Status::Internal("placement simulation: no event left before the sweep ended");
      }
      const Event e = events_.top();
      events_.pop();
      now_ = e.time;
      switch (e.kind) {
        case EventKind::kSweepSubmit:
          SubmitSweep();
          break;
        case EventKind::kArrival:
          Arrive();
          break;
        case EventKind::kScripted:
          Enqueue(e.id);
          break;
        case EventKind::kEnd:
          End(e.id, false);
          break;
        case EventKind::kKill:
          End(e.id, true);
          break;
        case EventKind::kFree:
          Free(e.id);
          break;
      }
      Schedule();
    }
    out->starts += starts_;
    out->requeues += requeues_;
    out->warm_starts += warm_starts_;
    out->first_epoch_pfs_bytes += pfs_bytes_;
    out->cold_bytes += static_cast<double>(starts_) * static_cast<double>(o_.dataset_bytes);
    out->sweep_mean_seconds += sweep_end_;
    return Status::Ok();
  }

  std::vector<double>& waits() { return waits_; }
  std::vector<double>& background_waits() { return background_waits_; }

 private:
  void Push(double time, EventKind kind, uint32_t id) {
    events_.push(Event{time, seq_++, kind, id});
  }

  bool Live(const Copy& c) const {
    return o_.keep_lifetime <= 0 || c.last_used + o_.keep_lifetime > now_;
  }
  bool UserMarked(uint32_t n) const {
    for (const Copy& c : nodes_[n].copies) {
      if (c.owner == kUser && Live(c)) return true;
    }
    return false;
  }
  void NoteMarked(uint32_t n) {
    if (std::find(marked_.begin(), marked_.end(), n) == marked_.end()) marked_.push_back(n);
  }

  void SubmitSweep() {
    const Bytes tier = SweepTierBytes(o_);
    const Bytes grant = o_.job_ssd_bytes != 0 ? o_.job_ssd_bytes : tier;
    for (uint32_t t = 0; t < o_.sweep_jobs; ++t) {
      Job j;
      j.sweep = true;
      j.task = t;
      j.owner = kUser;
      j.nodes = o_.job_nodes;
      j.submit = now_;
      j.rank = now_;
      j.seconds = LogNormal(o_.job_seconds, o_.job_sigma, Keyed(seed_, kDuration1, t, 0),
                            Keyed(seed_, kDuration2, t, 0));
      j.epoch_seconds = j.seconds / o_.epochs;
      j.grant = grant;
      j.tier_bytes = tier;
      jobs_.push_back(std::move(j));
      pending_.push_back(static_cast<uint32_t>(jobs_.size() - 1));
    }
  }

  void Arrive() {
    Job j;
    j.owner = 1 + static_cast<uint32_t>(arrivals_.Below(o_.background_users));
    j.nodes = 1u << arrivals_.Below(levels_);
    j.submit = now_;
    if (now_ >= 0 && now_ < window_) ++in_window_;
    // Fair share or a QOS ranks some of them ahead of the sweep, in their own FIFO order.
    j.rank = arrivals_.Unit() <= o_.background_ahead ? now_ - kAhead : now_;
    const double u1 = arrivals_.Unit();
    j.seconds = LogNormal(o_.background_seconds, o_.background_sigma, u1, arrivals_.Unit());
    j.grant = o_.background_ssd_bytes;
    j.tier_bytes = std::min(o_.background_keep_bytes, o_.background_ssd_bytes);
    jobs_.push_back(std::move(j));
    Enqueue(static_cast<uint32_t>(jobs_.size() - 1));
    Push(now_ + arrivals_.Exponential(arrival_mean_), EventKind::kArrival, 0);
  }

  // Into the pending queue by priority (a requeued job keeps its place).
  void Enqueue(uint32_t id) {
    const auto before = [this](uint32_t a, uint32_t b) {
      return jobs_[a].rank != jobs_[b].rank ? jobs_[a].rank < jobs_[b].rank : a < b;
    };
    pending_.insert(std::upper_bound(pending_.begin(), pending_.end(), id, before), id);
  }

  uint32_t Slots() const {
    if (o_.sweep_concurrency == 0) return UINT32_MAX;
    return running_sweep_ >= o_.sweep_concurrency ? 0 : o_.sweep_concurrency - running_sweep_;
  }

  // Starts, in priority order, every pending job that can start now.
  void Schedule() {
    // The wait's clock of the sweep's next tasks under the throttle.
    uint32_t slots = Slots();
    for (uint32_t id : pending_) {
      if (slots == 0) break;
      Job& j = jobs_[id];
      if (!j.sweep) continue;
      if (std::isnan(j.eligible)) j.eligible = now_;
      --slots;
    }
    size_t kept = 0;
    for (size_t i = 0; i < pending_.size(); ++i) {
      const uint32_t id = pending_[i];
      if (!TryStart(id)) pending_[kept++] = id;
    }
    pending_.resize(kept);
  }

  // n nodes drawn without replacement from `from` (a partial Fisher-Yates on a copy).
  std::vector<uint32_t> Draw(std::vector<uint32_t> from, uint32_t n) {
    for (uint32_t k = 0; k < n; ++k) {
      std::swap(from[k], from[k + picks_.Below(from.size() - k)]);
    }
    from.resize(n);
    return from;
  }

  // n free nodes drawn without replacement: the same partial Fisher-Yates, on free_ itself (no
  // copy of the cluster's free list per job).
  std::vector<uint32_t> DrawFree(uint32_t n) {
    std::vector<uint32_t> out(n);
    for (uint32_t k = 0; k < n; ++k) {
      const uint32_t r = k + static_cast<uint32_t>(picks_.Below(free_.size() - k));
      std::swap(free_[k], free_[r]);
      pos_[free_[k]] = k;
      pos_[free_[r]] = r;
      out[k] = free_[k];
    }
    return out;
  }

  bool TryStart(uint32_t id) {
    Job& j = jobs_[id];
    if (!j.pinned.empty()) {
      for (uint32_t n : j.pinned) {
        if (pos_[n] == kNotFree) return false;
      }
      Start(id, j.pinned);
      return true;
    }
    if (free_.size() < j.nodes) return false;
    if (j.sweep && Slots() == 0) return false;
    if (j.sweep && placement_ != Placement::kOff) {
      std::vector<uint32_t> warm_free;
      uint32_t marked = 0;
      size_t kept = 0;
      for (uint32_t n : marked_) {
        if (!UserMarked(n)) continue;  // its copy went: no longer a candidate
        marked_[kept++] = n;
        ++marked;
        if (pos_[n] != kNotFree) warm_free.push_back(n);
      }
      marked_.resize(kept);
      if (warm_free.size() >= j.nodes) {
        Start(id, Draw(std::move(warm_free), j.nodes));
        return true;
      }
      if (placement_ == Placement::kRequire && marked >= j.nodes) return false;
    }
    Start(id, DrawFree(j.nodes));
    return true;
  }

  void TakeFree(uint32_t n) {
    const uint32_t at = pos_[n];
    const uint32_t last = free_.back();
    free_[at] = last;
    pos_[last] = at;
    free_.pop_back();
    pos_[n] = kNotFree;
  }

  // Evicts the least recently used copies of any user but `keep_owner` until the node's copies
  // and `reserved` fit its SSD; expired copies first.
  void EvictFor(uint32_t n, Bytes reserved, uint32_t keep_owner) {
    std::vector<Copy>& copies = nodes_[n].copies;
    std::erase_if(copies, [this](const Copy& c) { return !Live(c); });
    while (true) {
      Bytes used = reserved;
      for (const Copy& c : copies)
        used += c.bytes;
      if (used <= o_.ssd_bytes) return;
      auto victim = copies.end();
      for (auto it = copies.begin(); it != copies.end(); ++it) {
        if (it->owner == keep_owner) continue;
        if (victim == copies.end() || it->last_used < victim->last_used) victim = it;
      }
      if (victim == copies.end()) return;
      copies.erase(victim);
    }
  }

  void Start(uint32_t id, const std::vector<uint32_t>& on) {
    Job& j = jobs_[id];
    j.start = now_;
    j.on = on;
    j.adopted.assign(on.size(), 0);
    double kept_share = 0;
    bool warm = true;
    for (size_t i = 0; i < on.size(); ++i) {
      const uint32_t n = on[i];
      TakeFree(n);
      Node& node = nodes_[n];
      // The prolog: expired copies go, the job adopts its user's copy, and its grant evicts the
      // least recently used copies of any user until it fits.
      std::erase_if(node.copies, [this](const Copy& c) { return !Live(c); });
      for (auto it = node.copies.begin(); it != node.copies.end(); ++it) {
        if (it->owner != j.owner) continue;
        j.adopted[i] = it->bytes;
        node.copies.erase(it);
        break;
      }
      EvictFor(n, j.grant, j.owner);
      if (j.sweep) {
        kept_share += std::min(
            1.0, static_cast<double>(j.adopted[i]) / static_cast<double>(o_.dataset_bytes));
        warm = warm && j.adopted[i] > 0;
      }
    }
    if (!j.sweep) {
      if (j.submit >= 0 && j.submit < window_) {
        background_waits_.push_back(now_ - j.submit);
        --in_window_;
      }
      Push(now_ + j.seconds, EventKind::kEnd, id);
      return;
    }
    ++running_sweep_;
    ++starts_;
    if (warm) ++warm_starts_;
    pfs_bytes_ +=
        static_cast<double>(o_.dataset_bytes) * (1.0 - kept_share / static_cast<double>(on.size()));
    waits_.push_back(std::isnan(j.eligible) ? 0.0 : now_ - j.eligible);
    if (Keyed(seed_, kRequeue, j.task, j.attempt) < o_.requeue_probability) {
      Push(now_ + Keyed(seed_, kKillAt, j.task, j.attempt) * j.seconds, EventKind::kKill, id);
    } else {
      Push(now_ + j.seconds, EventKind::kEnd, id);
    }
  }

  // The job ends (or is killed to be requeued): each node keeps what its SSD tier held, up to
  // the user's quota, then spends the epilog before it is free.
  void End(uint32_t id, bool killed) {
    Job& j = jobs_[id];
    const double ran = now_ - j.start;
    const double filled = j.epoch_seconds > 0 ? std::min(1.0, ran / j.epoch_seconds) : 1.0;
    for (size_t i = 0; i < j.on.size(); ++i) {
      const uint32_t n = j.on[i];
      const Bytes content =
          std::max(std::min(j.adopted[i], j.tier_bytes),
                   static_cast<Bytes>(filled * static_cast<double>(j.tier_bytes)));
      const Bytes keep = std::min(content, o_.keep_quota);
      if (keep > 0) {
        nodes_[n].copies.push_back(Copy{j.owner, keep, now_});
        if (j.owner == kUser) NoteMarked(n);
      }
      if (o_.epilog_seconds > 0) {
        Push(now_ + o_.epilog_seconds, EventKind::kFree, n);
      } else {
        Free(n);
      }
    }
    if (!j.sweep) return;
    --running_sweep_;
    if (killed) {
      ++requeues_;
      j.seconds -= ran;
      ++j.attempt;
      j.eligible = std::numeric_limits<double>::quiet_NaN();
      Enqueue(id);
      return;
    }
    if (++sweep_done_ == o_.sweep_jobs) {
      sweep_end_ = now_;
      done_ = true;
    }
  }

  void Free(uint32_t n) {
    pos_[n] = static_cast<uint32_t>(free_.size());
    free_.push_back(n);
  }

  const PlacementSimOptions& o_;
  const Placement placement_;
  const uint64_t seed_;
  Rng arrivals_;  // the other users' jobs: the same in every placement
  Rng picks_;     // which free nodes a job gets
  uint32_t levels_ = 1;
  double arrival_mean_ = 0;  // seconds between the other users' arrivals (0: none)
  std::vector<Node> nodes_;
  std::vector<uint32_t> free_;    // free nodes, in no order
  std::vector<uint32_t> pos_;     // each node's index in free_, kNotFree if busy
  std::vector<uint32_t> marked_;  // nodes that may be marked for the user (checked when used)
  std::vector<Job> jobs_;
  std::vector<uint32_t> pending_;  // by priority
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t seq_ = 0;
  double now_ = 0;
  uint32_t running_sweep_ = 0;
  uint32_t sweep_done_ = 0;
  bool done_ = false;
  double sweep_end_ = 0;
  double window_ = 0;       // other users' jobs submitted in [0, window_) count for their waits
  uint64_t in_window_ = 0;  // ... and have not started yet
  uint64_t starts_ = 0, requeues_ = 0, warm_starts_ = 0;
  double pfs_bytes_ = 0;
  std::vector<double> waits_;
  std::vector<double> background_waits_;
};

double Mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double sum = 0;
  for (double x : v)
    sum += x;
  return sum / static_cast<double>(v.size());
}

// Nearest rank.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::max<size_t>(rank, 1) - 1];
}

Status Bad(const std::string& what) {
  return Status::InvalidArgument(what);
}

bool Positive(double v) {
  return v > 0 && std::isfinite(v);
}

}  // namespace

std::string_view PlacementName(Placement p) {
  switch (p) {
    case Placement::kOff:
      return "off";
    case Placement::kPrefer:
      return "prefer";
    case Placement::kRequire:
      return "require";
  }
  return "?";
}

Result<Placement> ParsePlacement(std::string_view name) {
  for (Placement p : kAllPlacements) {
    if (PlacementName(p) == name) return p;
  }
  return Status::InvalidArgument("placement \"" + std::string(name) +
                                 "\" is not one: write off, prefer or require");
}

double PlacementResult::SavedShare() const {
  return cold_bytes > 0 ? 1.0 - first_epoch_pfs_bytes / cold_bytes : 0.0;
}

Bytes SweepTierBytes(const PlacementSimOptions& o) {
  const double reads = static_cast<double>(o.dataset_bytes) *
                       (1.0 - std::pow(1.0 - 1.0 / o.job_nodes, static_cast<double>(o.epochs)));
  const Bytes need = static_cast<Bytes>(std::ceil(reads));
  const Bytes grant = o.job_ssd_bytes != 0 ? o.job_ssd_bytes : o.ssd_bytes;
  return std::min(need, grant);
}

Status PlacementSimOptions::Validate() const {
  const std::string n = std::to_string(cluster_nodes);
  if (cluster_nodes == 0) return Bad("--cluster-nodes must be at least 1");
  if (sweep_jobs == 0) return Bad("--sweep-jobs must be at least 1");
  if (job_nodes == 0 || job_nodes > cluster_nodes) {
    return Bad("--nodes " + std::to_string(job_nodes) + " does not fit a cluster of " + n +
               " nodes: write 1.." + n);
  }
  if (epochs == 0) return Bad("--epochs must be at least 1");
  if (!Positive(job_seconds)) return Bad("--job-hours must be > 0");
  if (!(job_sigma >= 0 && job_sigma <= 4)) return Bad("--job-sigma must be in [0, 4]");
  if (!(requeue_probability >= 0 && requeue_probability < 1)) {
    return Bad("--requeue is a share of the starts: write a number in [0, 1) (e.g. 0.1)");
  }
  if (dataset_bytes == 0) return Bad("the dataset has no bytes");
  if (ssd_bytes == 0) return Bad("--ssd must be > 0: kept copies need an SSD on every node");
  if (job_ssd_bytes > ssd_bytes) return Bad("--job-ssd is larger than --ssd");
  if (background_ssd_bytes > ssd_bytes) return Bad("--background-ssd is larger than --ssd");
  if (!(keep_lifetime >= 0) || !std::isfinite(keep_lifetime)) {
    return Bad("--keep-lifetime must be >= 0");
  }
  if (!(epilog_seconds >= 0) || !std::isfinite(epilog_seconds)) {
    return Bad("--epilog-seconds must be >= 0");
  }
  for (uint32_t w : warm_nodes) {
    if (w >= cluster_nodes) {
      return Bad("warm node " + std::to_string(w) + " is not a node of the cluster: write 0.." +
                 std::to_string(cluster_nodes - 1));
    }
  }
  if (!(background_load >= 0 && background_load < 1)) {
    return Bad(
        "--background-load is the share of the cluster other users' jobs take: write a "
        "number in [0, 1) (e.g. 0.8)");
  }
  if (background_max_nodes == 0 || background_max_nodes > cluster_nodes) {
    return Bad("--background-max-nodes " + std::to_string(background_max_nodes) +
               " does not fit a cluster of " + n + " nodes: write 1.." + n);
  }
  if (!Positive(background_seconds)) return Bad("--background-hours must be > 0");
  if (!(background_sigma >= 0 && background_sigma <= 4)) {
    return Bad("--background-sigma must be in [0, 4]");
  }
  if (background_users == 0) return Bad("--background-users must be at least 1");
  if (!(background_ahead >= 0 && background_ahead <= 1)) {
    return Bad(
        "--background-ahead is the share of other users' jobs ranked ahead of the sweep: "
        "write a number in [0, 1] (e.g. 0.5)");
  }
  for (const ScriptedJob& s : scripted_jobs) {
    if (!std::isfinite(s.submit) || !Positive(s.seconds)) {
      return Bad("a scripted job needs a finite submission time and a duration > 0");
    }
    const uint32_t count = s.pinned.empty() ? s.nodes : static_cast<uint32_t>(s.pinned.size());
    if (count == 0 || count > cluster_nodes) return Bad("a scripted job's nodes: write 1.." + n);
    for (uint32_t p : s.pinned) {
      if (p >= cluster_nodes) return Bad("a scripted job is pinned to a node past the cluster");
    }
  }
  if (runs == 0 || runs > 1'000'000) return Bad("--runs must be 1..1000000");
  return Status::Ok();
}

Result<std::vector<PlacementResult>> SimulatePlacement(const PlacementSimOptions& options,
                                                       std::span<const Placement> placements) {
  NOPFS_RETURN_IF_ERROR(options.Validate());
  std::vector<PlacementResult> out;
  for (Placement p : placements) {
    PlacementResult r;
    r.placement = p;
    r.runs = options.runs;
    std::vector<double> waits;
    std::vector<double> background_waits;
    for (uint32_t run = 0; run < options.runs; ++run) {
      ClusterRun sim(options, p, Mix(options.seed + run));
      NOPFS_RETURN_IF_ERROR(sim.Run(&r));
      waits.insert(waits.end(), sim.waits().begin(), sim.waits().end());
      background_waits.insert(background_waits.end(), sim.background_waits().begin(),
                              sim.background_waits().end());
    }
    r.sweep_mean_seconds /= options.runs;
    r.wait_mean_seconds = Mean(waits);
    r.wait_p95_seconds = Percentile(std::move(waits), 0.95);
    r.background_wait_mean_seconds = Mean(background_waits);
    out.push_back(r);
  }
  return out;
}

}  // namespace nopfs::policy
