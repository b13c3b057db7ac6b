#include "cli/simulate_placement.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "common/json.h"
#include "common/units.h"
#include "lua/admit.h"
#include "policy/placement_sim.h"

namespace nopfs::cli {
namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "nopfs simulate: %s\n", s.message().c_str());
  return 2;
}

// A comma-separated list of whole numbers, e.g. "64,128,1024".
Result<std::vector<uint32_t>> ParseList(std::string_view option, const std::string& text,
                                        std::string_view example) {
  std::vector<uint32_t> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    char* end = nullptr;
    const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || item[0] == '-' || v > UINT32_MAX) {
      return Status::InvalidArgument(std::string(option) + " \"" + text +
                                     "\" is not a list of whole numbers: write e.g. " +
                                     std::string(example));
    }
    out.push_back(static_cast<uint32_t>(v));
    at = comma + 1;
  }
  return out;
}

// A size option, or `fallback` when it was not given.
Result<policy::Bytes> SizeOr(std::string_view option, const std::string& text,
                             policy::Bytes fallback) {
  if (text.empty()) return fallback;
  Result<uint64_t> v = ParseSize(text);
  if (!v.ok()) return v.status().WithContext(std::string(option));
  return *v;
}

Status CheckShare(std::string_view option, double v, std::string_view what) {
  if (v >= 0 && v < 1) return Status::Ok();
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return Status::InvalidArgument(std::string(option) + " " + buf + " is not " + std::string(what) +
                                 ": write a number in [0, 1) (e.g. 0.1)");
}

Status CheckHours(std::string_view option, double v) {
  if (v > 0 && std::isfinite(v)) return Status::Ok();
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return Status::InvalidArgument(std::string(option) + " " + buf +
                                 " is not a duration: write the mean in hours, > 0 (e.g. 2)");
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

double Figure(double v) {
  return std::strtod(Num(v).c_str(), nullptr);
}

struct Row {
  uint32_t cluster = 0;
  policy::PlacementResult r;
};

void PrintTable(const policy::PlacementSimOptions& o, const std::vector<Row>& rows,
                const std::string& lifetime, const std::string& max_nodes, double took) {
  std::printf(
      "nopfs simulate --placement: a sweep of %u jobs of %u node%s (%s at once, %.1f h mean, "
      "%.0f %% of the starts requeued) on a dataset of %s; per node %s of SSD, a keep quota of "
      "%s per user (lifetime %s), epilog %.0f s; other users' jobs offer %.0f %% of the nodes "
      "(1..%s nodes, %.1f h mean, SSD %s, keep %s); %u runs from seed %llu\n",
      o.sweep_jobs, o.job_nodes, o.job_nodes == 1 ? "" : "s",
      o.sweep_concurrency == 0 ? "all" : ("at most " + std::to_string(o.sweep_concurrency)).c_str(),
      o.job_seconds / 3600, 100 * o.requeue_probability,
      FormatBytes(static_cast<double>(o.dataset_bytes)).c_str(),
      FormatBytes(static_cast<double>(o.ssd_bytes)).c_str(),
      FormatBytes(static_cast<double>(o.keep_quota)).c_str(), lifetime.c_str(), o.epilog_seconds,
      100 * o.background_load, max_nodes.c_str(), o.background_seconds / 3600,
      FormatBytes(static_cast<double>(o.background_ssd_bytes)).c_str(),
      FormatBytes(static_cast<double>(o.background_keep_bytes)).c_str(), o.runs,
      static_cast<unsigned long long>(o.seed));
  std::printf(
      "per run: the sweep's starts, the share that landed warm, its first epochs' PFS "
      "bytes and the share saved against reading the dataset at every start; per start: "
      "its queue wait\n");
  std::printf("%8s %-9s %7s %6s %12s %7s %10s %10s %9s %12s\n", "cluster", "placement", "starts",
              "warm", "pfs_bytes", "saved", "wait_mean", "wait_p95", "sweep_h", "others_wait");
  for (const Row& row : rows) {
    const policy::PlacementResult& r = row.r;
    const double runs = r.runs;
    std::printf("%8u %-9s %7.1f %5.1f%% %12s %6.1f%% %8.1fmin %8.1fmin %9.1f %10.1fmin\n",
                row.cluster, std::string(policy::PlacementName(r.placement)).c_str(),
                static_cast<double>(r.starts) / runs,
                r.starts > 0
                    ? 100.0 * static_cast<double>(r.warm_starts) / static_cast<double>(r.starts)
                    : 0.0,
                FormatBytes(r.first_epoch_pfs_bytes / runs).c_str(), 100 * r.SavedShare(),
                r.wait_mean_seconds / 60, r.wait_p95_seconds / 60, r.sweep_mean_seconds / 3600,
                r.background_wait_mean_seconds / 60);
  }
  std::printf("simulated in %.2f s\n", took);
}

void PrintKv(const std::vector<Row>& rows) {
  for (const Row& row : rows) {
    const policy::PlacementResult& r = row.r;
    const double runs = r.runs;
    std::printf(
        "cluster_nodes=%u placement=%s runs=%u starts=%llu requeues=%llu warm_starts=%llu "
        "first_epoch_pfs_bytes=%s cold_bytes=%s saved_share=%s wait_mean_s=%s wait_p95_s=%s "
        "sweep_s=%s background_wait_mean_s=%s\n",
        row.cluster, std::string(policy::PlacementName(r.placement)).c_str(), r.runs,
        static_cast<unsigned long long>(r.starts), static_cast<unsigned long long>(r.requeues),
        static_cast<unsigned long long>(r.warm_starts), Num(r.first_epoch_pfs_bytes / runs).c_str(),
        Num(r.cold_bytes / runs).c_str(), Num(r.SavedShare()).c_str(),
        Num(r.wait_mean_seconds).c_str(), Num(r.wait_p95_seconds).c_str(),
        Num(r.sweep_mean_seconds).c_str(), Num(r.background_wait_mean_seconds).c_str());
  }
}

void PrintJson(const policy::PlacementSimOptions& o, const std::vector<Row>& rows) {
  Json doc;
  doc["sweep_jobs"] = o.sweep_jobs;
  doc["job_nodes"] = o.job_nodes;
  doc["dataset_bytes"] = o.dataset_bytes;
  doc["ssd_bytes"] = o.ssd_bytes;
  doc["keep_quota"] = o.keep_quota;
  doc["runs"] = o.runs;
  doc["seed"] = o.seed;
  Json& results = doc["results"] = Json::array();
  for (const Row& row : rows) {
    const policy::PlacementResult& r = row.r;
    const double runs = r.runs;
    results.push_back({{"cluster_nodes", row.cluster},
                       {"placement", std::string(policy::PlacementName(r.placement))},
                       {"starts", r.starts},
                       {"requeues", r.requeues},
                       {"warm_starts", r.warm_starts},
                       {"first_epoch_pfs_bytes", Figure(r.first_epoch_pfs_bytes / runs)},
                       {"cold_bytes", Figure(r.cold_bytes / runs)},
                       {"saved_share", Figure(r.SavedShare())},
                       {"wait_mean_s", Figure(r.wait_mean_seconds)},
                       {"wait_p95_s", Figure(r.wait_p95_seconds)},
                       {"sweep_s", Figure(r.sweep_mean_seconds)},
                       {"background_wait_mean_s", Figure(r.background_wait_mean_seconds)}});
  }
  std::printf("%s\n", DumpJson(doc, 2).c_str());
}

}  // namespace

void AddPlacementOptions(CLI::App* sub, PlacementFlags* f) {
  sub->add_flag("--placement", f->placement,
                "Simulate data-aware placement instead: a sweep of jobs on one dataset among "
                "other users' jobs on a cluster, with placement off, prefer and require");
  sub->add_option("--cluster-nodes", f->cluster_nodes,
                  "--placement: nodes of the cluster, one size or a comma-separated list "
                  "(e.g. 64,256,1024)")
      ->capture_default_str();
  sub->add_option("--placements", f->placements,
                  "--placement: comma-separated subset of off, prefer, require (default: all)");
  sub->add_option("--sweep-jobs", f->sweep_jobs, "--placement: jobs of the user's sweep")
      ->capture_default_str();
  sub->add_option("--sweep-concurrency", f->sweep_concurrency,
                  "--placement: at most this many of them running at once (an array's %N; 0: no "
                  "limit)")
      ->capture_default_str();
  sub->add_option("--job-hours", f->job_hours, "--placement: mean duration of a sweep job, hours")
      ->capture_default_str();
  sub->add_option("--job-sigma", f->job_sigma,
                  "--placement: sigma of the sweep jobs' log-normal durations (0: all alike)")
      ->capture_default_str();
  sub->add_option("--requeue", f->requeue,
                  "--placement: share of the sweep's starts requeued at a random moment")
      ->capture_default_str();
  sub->add_option("--ssd", f->ssd,
                  "--placement: SSD of every node (default: the node config's SSD classes)");
  sub->add_option("--job-ssd", f->job_ssd,
                  "--placement: a sweep job's SSD grant per node (default: what its tier holds)");
  sub->add_option("--keep-quota", f->keep_quota,
                  "--placement: a user's kept bytes per node (the policy's keep quota; default a "
                  "tenth of --ssd; 0: nothing kept)");
  sub->add_option("--keep-lifetime", f->keep_lifetime,
                  "--placement: how long a kept copy lives after its last use (90s, 12h, 7d; 0: "
                  "no limit)")
      ->capture_default_str();
  sub->add_option("--epilog-seconds", f->epilog_seconds,
                  "--placement: seconds a node spends in its epilog after a job (keeping, "
                  "marking) before it is free")
      ->capture_default_str();
  sub->add_option("--warm-nodes", f->warm_nodes,
                  "--placement: nodes (0-based, comma-separated) that hold the user's kept copy "
                  "at the start");
  sub->add_option("--background-load", f->background_load,
                  "--placement: share of the cluster's node-hours other users' jobs offer, [0, 1)")
      ->capture_default_str();
  sub->add_option("--background-max-nodes", f->background_max_nodes,
                  "--placement: other users' jobs take 1, 2, 4, ... up to this many nodes "
                  "(default 16, or the cluster's nodes if fewer)");
  sub->add_option("--background-hours", f->background_hours,
                  "--placement: mean duration of other users' jobs, hours")
      ->capture_default_str();
  sub->add_option("--background-sigma", f->background_sigma,
                  "--placement: sigma of their log-normal durations")
      ->capture_default_str();
  sub->add_option("--background-ssd", f->background_ssd,
                  "--placement: SSD grant per node of other users' jobs (default a quarter of "
                  "--ssd)");
  sub->add_option("--background-keep", f->background_keep,
                  "--placement: bytes each of their jobs keeps per node (default the keep quota)");
  sub->add_option("--background-users", f->background_users,
                  "--placement: other users (each keeps one dataset per node)")
      ->capture_default_str();
  sub->add_option("--background-ahead", f->background_ahead,
                  "--placement: share of other users' jobs ranked ahead of the sweep whatever "
                  "their submission (fair share, a QOS), [0, 1]")
      ->capture_default_str();
  sub->add_option("--runs", f->runs,
                  "--placement: independent runs (seeds --seed, --seed + 1, ...) summed")
      ->capture_default_str();
}

int RunPlacement(const PlacementFlags& f, const PlacementJob& job) {
  Result<std::vector<uint32_t>> clusters =
      ParseList("--cluster-nodes", f.cluster_nodes, "256 or 64,256,1024");
  if (!clusters.ok()) return Fail(clusters.status());
  std::vector<policy::Placement> placements;
  if (f.placements.empty()) {
    placements.assign(policy::kAllPlacements.begin(), policy::kAllPlacements.end());
  } else {
    size_t at = 0;
    while (at <= f.placements.size()) {
      const size_t comma = std::min(f.placements.find(',', at), f.placements.size());
      Result<policy::Placement> p = policy::ParsePlacement(f.placements.substr(at, comma - at));
      if (!p.ok()) return Fail(p.status().WithContext("--placements"));
      if (std::find(placements.begin(), placements.end(), *p) == placements.end()) {
        placements.push_back(*p);
      }
      at = comma + 1;
    }
  }

  policy::PlacementSimOptions o;
  o.job_nodes = job.nodes;
  o.epochs = job.epochs;
  o.seed = job.seed;
  o.dataset_bytes = job.dataset_bytes;
  o.sweep_jobs = f.sweep_jobs;
  o.sweep_concurrency = f.sweep_concurrency;
  if (Status s = CheckHours("--job-hours", f.job_hours); !s.ok()) return Fail(s);
  if (Status s = CheckHours("--background-hours", f.background_hours); !s.ok()) return Fail(s);
  o.job_seconds = f.job_hours * 3600;
  o.background_seconds = f.background_hours * 3600;
  o.job_sigma = f.job_sigma;
  o.background_sigma = f.background_sigma;
  if (Status s = CheckShare("--requeue", f.requeue, "a share of the starts"); !s.ok()) {
    return Fail(s);
  }
  if (Status s = CheckShare("--background-load", f.background_load,
                            "the share of the cluster other users' jobs take");
      !s.ok()) {
    return Fail(s);
  }
  o.requeue_probability = f.requeue;
  o.background_load = f.background_load;
  o.epilog_seconds = f.epilog_seconds;
  o.background_users = f.background_users;
  o.background_ahead = f.background_ahead;
  o.runs = f.runs;

  policy::Bytes config_ssd = 0;
  for (const policy::StorageClass& c : job.model->classes) {
    if (c.kind == policy::ClassKind::kSsd) config_ssd += c.capacity;
  }
  Result<policy::Bytes> ssd = SizeOr("--ssd", f.ssd, config_ssd);
  if (!ssd.ok()) return Fail(ssd.status());
  if (*ssd == 0) {
    return Fail(Status::InvalidArgument(
        "--placement needs every node's SSD, where kept copies live: the node config has no SSD "
        "class; write --ssd SIZE (e.g. --ssd 1.2T) or give a --config or --preset with one"));
  }
  o.ssd_bytes = *ssd;
  Result<policy::Bytes> job_ssd = SizeOr("--job-ssd", f.job_ssd, 0);
  Result<policy::Bytes> quota = SizeOr("--keep-quota", f.keep_quota, *ssd / 10);
  Result<policy::Bytes> bg_ssd = SizeOr("--background-ssd", f.background_ssd, *ssd / 4);
  for (const Result<policy::Bytes>* r : {&job_ssd, &quota, &bg_ssd}) {
    if (!r->ok()) return Fail(r->status());
  }
  o.job_ssd_bytes = *job_ssd;
  o.keep_quota = *quota;
  o.background_ssd_bytes = *bg_ssd;
  Result<policy::Bytes> bg_keep = SizeOr("--background-keep", f.background_keep, *quota);
  if (!bg_keep.ok()) return Fail(bg_keep.status());
  o.background_keep_bytes = *bg_keep;
  Result<int64_t> lifetime = lua::ParseLifetime(f.keep_lifetime);
  if (!lifetime.ok()) return Fail(lifetime.status().WithContext("--keep-lifetime"));
  o.keep_lifetime = static_cast<double>(*lifetime);
  if (!f.warm_nodes.empty()) {
    Result<std::vector<uint32_t>> warm = ParseList("--warm-nodes", f.warm_nodes, "2 or 0,5,9");
    if (!warm.ok()) return Fail(warm.status());
    o.warm_nodes = *warm;
  }

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Row> rows;
  for (uint32_t n : *clusters) {
    o.cluster_nodes = n;
    o.background_max_nodes =
        f.background_max_nodes != 0 ? f.background_max_nodes : std::min<uint32_t>(16, n);
    Result<std::vector<policy::PlacementResult>> r = policy::SimulatePlacement(o, placements);
    if (!r.ok()) return Fail(r.status().WithContext("--cluster-nodes " + std::to_string(n)));
    for (const policy::PlacementResult& pr : *r)
      rows.push_back(Row{n, pr});
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (job.format == "kv") {
    PrintKv(rows);
  } else if (job.format == "json") {
    PrintJson(o, rows);
  } else {
    PrintTable(o, rows, *lifetime == 0 ? std::string("none") : f.keep_lifetime,
               f.background_max_nodes != 0 ? std::to_string(f.background_max_nodes)
                                           : std::string("min(16, N)"),
               took);
  }
  return 0;
}

}  // namespace nopfs::cli
