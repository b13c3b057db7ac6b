#include "cli/cmd_simulate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "cli/simulate_placement.h"
#include "cli/sizes.h"
#include "common/json.h"
#include "common/units.h"
#include "lua/config.h"
#include "policy/partition.h"
#include "policy/simulate.h"
#include "policy/startup.h"

namespace nopfs::cli {
namespace {

// A cluster setup of the seeds (NoPFS paper, §6.1 and §7): Lassen nodes with four ranks (one per
// GPU), each rank with a 5 GiB staging buffer and 8 staging threads, 25 GiB of RAM with 4
// prefetch threads and 300 GiB of SSD with 2; r_0(8) = 111 GB/s, r_1(4) = 85 GB/s, r_2(2) =
// 4 GB/s; the PFS curve t(1..8) the paper's simulation used; beta = 200 MB/s; c = 64 MB/s per
// rank; a per-GPU batch of 120. Writes are not given in the paper: taken equal to the reads.
// The paper's bandwidths are decimal (GB = 10^9 bytes): written here as numbers of MiB/s.
constexpr std::string_view kLassenConfig = R"(
local GB, MB = 1e9 / 2^20, 1e6 / 2^20
staging = { capacity = "20G", threads = 8, write = { {8, 111 * GB} } }
classes = {
  ram { capacity = "100G", threads = 16, read = { {4, 85 * GB} }, write = { {4, 85 * GB} } },
  ssd { path = "/l/ssd", capacity = "1200G", threads = 8, read = { {2, 4 * GB} },
        write = { {2, 4 * GB} } },
}
pfs = { {1, 330 * MB}, {2, 730 * MB}, {4, 1540 * MB}, {8, 2870 * MB} }
network = 24 * GB
preprocess = 200 * MB
)";

struct Preset {
  std::string_view name;
  uint64_t samples;
  double dataset_bytes;  // total, for the mean size
  uint32_t epochs;       // as the paper's evaluation ran it
  std::string_view what;
};
// ImageNet-1k: 1,281,167 images, 135 GB, 10 epochs measured; ImageNet-22k: 14,197,103 images,
// 1.3 TB, 3 epochs measured (§7).
constexpr Preset kPresets[] = {
    {"imagenet1k-lassen", 1'281'167, 135e9, 10, "ImageNet-1k on Lassen (NoPFS paper)"},
    {"imagenet22k-lassen", 14'197'103, 1.3e12, 3, "ImageNet-22k on Lassen (NoPFS paper)"},
};
constexpr uint64_t kPresetRankBatch = 120;
constexpr double kPresetComputeBytes = 64e6;

struct SimFlags {
  std::string preset;
  std::string config;
  uint32_t nodes = 1;
  uint32_t ranks_per_node = 1;
  uint32_t epochs = 3;
  uint64_t batch = 0;  // global; 0: 32 per rank (120 under a preset)
  uint64_t samples = 0;
  std::string sizes = "imagenet";
  uint64_t seed = 0;
  std::string scheme = "strided";
  bool drop_last = false;
  std::string compute_rate = "1000";
  std::string policies;
  uint32_t loader_workers = 4;
  uint32_t loader_prefetch = 2;
  uint32_t node = 0;
  bool no_barrier = false;
  bool no_window = false;
  bool warm_tiers = false;
  bool fetch_and_cache = true;
  bool fill_once_on_read = false;
  uint32_t pfs_readers = 0;
  std::string format = "table";
  unsigned threads = 0;
  // The start-up model (policy/startup.h).
  bool startup = false;
  uint64_t classes = 1000;
  uint32_t scan_threads = 8;
  double metadata_latency_ms = 1.0;
  double link_start_ms = policy::StartupModel{}.link_start * 1e3;
  double link_per_peer_ms = policy::StartupModel{}.link_per_peer * 1e3;
  double catalog_us_per_sample = policy::StartupModel{}.catalog_per_sample * 1e6;
  // The placement simulation (cli/simulate_placement.h).
  PlacementFlags placement;
  // Which flags were given (presets fill the others).
  bool given_nodes = false, given_rpn = false, given_epochs = false, given_samples = false,
       given_rate = false;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "nopfs simulate: %s\n", s.message().c_str());
  return 2;
}

std::string Num(double v);

// --startup: the start-up model's prediction for the job's nodes (docs/simulate.md, "Start-up").
int PrintStartup(const SimFlags& f, uint64_t files, const policy::SystemModel& model) {
  policy::StartupModel m;
  m.files = files;
  m.classes = f.classes;
  m.nodes = f.nodes;
  m.scan_threads = f.scan_threads;
  m.metadata_latency = f.metadata_latency_ms / 1e3;
  m.network_bandwidth = model.network_bandwidth;
  // The model's own check names its fields; these name the options.
  if (!(f.link_start_ms >= 0) || !std::isfinite(f.link_start_ms)) {
    return Fail(Status::InvalidArgument(
        "--link-start-ms " + Num(f.link_start_ms) +
        " is not a time: write the milliseconds a daemon takes to start its peer link, >= 0 "
        "(e.g. 450)"));
  }
  if (!(f.link_per_peer_ms >= 0) || !std::isfinite(f.link_per_peer_ms)) {
    return Fail(Status::InvalidArgument(
        "--link-per-peer-ms " + Num(f.link_per_peer_ms) +
        " is not a time: write the milliseconds one more node costs a daemon's link start, >= 0 "
        "(e.g. 2)"));
  }
  if (!(f.catalog_us_per_sample >= 0) || !std::isfinite(f.catalog_us_per_sample)) {
    return Fail(Status::InvalidArgument(
        "--catalog-us-per-sample " + Num(f.catalog_us_per_sample) +
        " is not a time: write the microseconds of one node's CPU per sample to build the catalog "
        "after the walk, >= 0 (e.g. 0.8)"));
  }
  m.catalog_per_sample = f.catalog_us_per_sample / 1e6;
  m.link_start = f.link_start_ms / 1e3;
  m.link_per_peer = f.link_per_peer_ms / 1e3;
  if (Status s = m.Validate(); !s.ok()) return Fail(s);
  const policy::StartupPrediction shared = policy::PredictSharedScan(m);
  const policy::StartupPrediction lone = policy::PredictLoneScans(m);
  const double n = static_cast<double>(files);
  std::printf(
      "start-up: %llu files in %llu classes, %u nodes x %u scan threads, %.2f ms per metadata "
      "operation, network %s/s, peer link %.0f ms + %.2f ms per other node, catalog %.2f us per "
      "sample\n",
      static_cast<unsigned long long>(files), static_cast<unsigned long long>(m.classes), m.nodes,
      m.scan_threads, f.metadata_latency_ms, FormatBytes(m.network_bandwidth).c_str(),
      f.link_start_ms, f.link_per_peer_ms, f.catalog_us_per_sample);
  std::printf(
      "one scan per job: link %.3f s + root %.3f s + walk %.3f s + exchange %.3f s + catalog "
      "%.3f s = %.3f s; %llu metadata operations (%.3f per file)\n",
      shared.link_seconds, shared.root_seconds, shared.walk_seconds, shared.exchange_seconds,
      shared.catalog_seconds, shared.total_seconds,
      static_cast<unsigned long long>(shared.metadata_ops),
      static_cast<double>(shared.metadata_ops) / n);
  std::printf("every node alone: %.3f s; %llu metadata operations (%.3f per file)\n",
              lone.total_seconds, static_cast<unsigned long long>(lone.metadata_ops),
              static_cast<double>(lone.metadata_ops) / n);
  return 0;
}

Result<std::vector<policy::Bytes>> MakeSizes(const std::string& spec, uint64_t samples,
                                             double preset_mean, uint64_t seed) {
  const auto need_samples = [&]() -> Status {
    if (samples == 0) {
      return Status::InvalidArgument("--sizes " + spec +
                                     " needs --samples F (or a --preset, or --sizes file:PATH)");
    }
    return Status::Ok();
  };
  if (spec.rfind("file:", 0) == 0) {
    Result<std::vector<policy::Bytes>> read = ReadSizesFile(spec.substr(5));
    if (!read.ok()) return read.status();
    if (samples != 0 && samples != read->size()) {
      return Status::InvalidArgument("--samples " + std::to_string(samples) + " disagrees with " +
                                     std::to_string(read->size()) + " sizes in " + spec.substr(5) +
                                     ": leave --samples out or make them agree");
    }
    return read;
  }
  if (spec == "imagenet") {
    NOPFS_RETURN_IF_ERROR(need_samples());
    const double mean = preset_mean > 0 ? preset_mean : 110e3;
    return SyntheticSizes(samples, static_cast<policy::Bytes>(mean), seed);
  }
  for (std::string_view kind : {"fixed:", "lognormal:"}) {
    if (spec.rfind(kind, 0) != 0) continue;
    NOPFS_RETURN_IF_ERROR(need_samples());
    Result<uint64_t> size = ParseSize(spec.substr(kind.size()));
    if (!size.ok()) return size.status().WithContext("--sizes");
    if (*size == 0) return Status::InvalidArgument("--sizes " + spec + ": a size must be > 0");
    if (kind == "fixed:") return std::vector<policy::Bytes>(samples, *size);
    return SyntheticSizes(samples, *size, seed);
  }
  return Status::InvalidArgument("--sizes \"" + spec +
                                 "\" is not a size spec: write imagenet (log-normal around the "
                                 "preset's mean or 107 KiB), fixed:SIZE, lognormal:MEAN or "
                                 "file:PATH (one size in bytes per line)");
}

// --compute-rate: samples/s per rank (a bare number), or a bandwidth per rank ("64M/s").
Result<double> ComputeBytes(const std::string& text, double mean_size) {
  if (text.find('/') != std::string::npos) {
    Result<double> bw = ParseBandwidth(text);
    if (!bw.ok()) return bw.status().WithContext("--compute-rate");
    if (!(*bw > 0)) return Status::InvalidArgument("--compute-rate must be > 0");
    return *bw;
  }
  size_t used = 0;
  double rate = 0;
  try {
    rate = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(rate > 0) || !std::isfinite(rate)) {
    return Status::InvalidArgument("--compute-rate \"" + text +
                                   "\" is not a rate: write samples/s per rank (e.g. 1000) or "
                                   "a bandwidth per rank (e.g. 64M/s)");
  }
  return rate * mean_size;
}

Result<std::vector<policy::SimPolicy>> ParsePolicies(const std::string& list) {
  if (list.empty()) {
    return std::vector<policy::SimPolicy>(policy::kAllSimPolicies.begin(),
                                          policy::kAllSimPolicies.end());
  }
  std::vector<policy::SimPolicy> out;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    Result<policy::SimPolicy> p = policy::ParseSimPolicy(list.substr(at, comma - at));
    if (!p.ok()) return p.status().WithContext("--policies");
    if (std::find(out.begin(), out.end(), *p) == out.end()) out.push_back(*p);
    at = comma + 1;
  }
  return out;
}

// The mean of epochs 2..E (epoch 1 if there is only one): the steady state after the caches
// are filled.
double LaterEpochs(const policy::PolicyResult& r) {
  if (r.epoch_seconds.size() <= 1) return r.epoch_seconds.empty() ? 0 : r.epoch_seconds[0];
  return std::accumulate(r.epoch_seconds.begin() + 1, r.epoch_seconds.end(), 0.0) /
         static_cast<double>(r.epoch_seconds.size() - 1);
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

// The values as Num() prints them, separated by `sep`.
std::string Joined(const std::vector<double>& values, const char* sep) {
  std::string out;
  for (double v : values) {
    if (!out.empty()) out += sep;
    out += Num(v);
  }
  return out;
}

// What a simulation gives its printers.
struct SimReport {
  const SimFlags& flags;
  const policy::SimOptions& options;  // options.job: the simulated job
  const std::string& config;          // the node config's source
  const std::vector<policy::PolicyResult>& results;
  const policy::PolicyResult* bound;  // the no-I/O bound, when it was simulated (for the ratios)
  double total;                       // the dataset's bytes
  double mean;                        // the mean sample's bytes
  double took;                        // seconds the simulation took
};

// One `key=value` line per policy (--format kv).
void PrintKv(const SimReport& rep) {
  const SimFlags& f = rep.flags;
  const policy::SimOptions& o = rep.options;
  const policy::JobSpec& job = o.job;
  const policy::PolicyResult* bound = rep.bound;
  const double total = rep.total;
  for (const policy::PolicyResult& r : rep.results) {
    const std::string epochs = Joined(r.epoch_seconds, ",");
    std::printf(
        "policy=%s nodes=%u ranks_per_node=%u samples=%llu dataset_bytes=%llu epochs=%u "
        "batch=%llu compute_bytes_per_s=%s total_s=%s epoch1_s=%s later_epoch_s=%s "
        "vs_no_io=%s stall_s=%s compute_s=%s stall_median_s=%s stall_p99_s=%s steps=%llu "
        "job_pfs_bytes=%llu node_pfs_bytes=%llu pfs_datasets=%s pfs_readers=%u "
        "local_reads=%llu peer_reads=%llu pfs_reads=%llu epoch_s=%s\n",
        std::string(policy::SimPolicyName(r.policy)).c_str(), f.nodes, f.ranks_per_node,
        static_cast<unsigned long long>(job.samples), static_cast<unsigned long long>(total),
        job.epochs, static_cast<unsigned long long>(job.batch), Num(o.model.compute_rate).c_str(),
        Num(r.total_seconds).c_str(), Num(r.epoch_seconds[0]).c_str(), Num(LaterEpochs(r)).c_str(),
        Num(bound != nullptr ? r.total_seconds / bound->total_seconds : 0).c_str(),
        Num(r.stall_seconds).c_str(), Num(r.compute_seconds).c_str(),
        Num(r.stall_median_seconds).c_str(), Num(r.stall_p99_seconds).c_str(),
        static_cast<unsigned long long>(r.steps), static_cast<unsigned long long>(r.job_pfs_bytes),
        static_cast<unsigned long long>(r.node_pfs_bytes),
        Num(static_cast<double>(r.job_pfs_bytes) / total).c_str(), r.pfs_readers,
        static_cast<unsigned long long>(r.reads[0]), static_cast<unsigned long long>(r.reads[1]),
        static_cast<unsigned long long>(r.reads[2]), epochs.c_str());
  }
}

// A figure as the other formats print it (six significant digits), as a JSON number.
double Figure(double v) {
  return std::strtod(Num(v).c_str(), nullptr);
}

// One JSON object (--format json), indented.
void PrintJson(const SimReport& rep) {
  const SimFlags& f = rep.flags;
  const policy::SimOptions& o = rep.options;
  const policy::JobSpec& job = o.job;
  Json doc;
  doc["nodes"] = f.nodes;
  doc["ranks_per_node"] = f.ranks_per_node;
  doc["samples"] = job.samples;
  doc["dataset_bytes"] = static_cast<uint64_t>(rep.total);
  doc["epochs"] = job.epochs;
  doc["batch"] = job.batch;
  doc["compute_bytes_per_s"] = Figure(o.model.compute_rate);
  doc["node"] = f.node;
  doc["config"] = JsonBytes(rep.config);
  Json& policies = doc["policies"] = Json::array();
  for (const policy::PolicyResult& r : rep.results) {
    Json epochs = Json::array();
    for (double e : r.epoch_seconds)
      epochs.push_back(Figure(e));
    policies.push_back({{"policy", std::string(policy::SimPolicyName(r.policy))},
                        {"total_s", Figure(r.total_seconds)},
                        {"epoch_s", std::move(epochs)},
                        {"stall_s", Figure(r.stall_seconds)},
                        {"compute_s", Figure(r.compute_seconds)},
                        {"stall_median_s", Figure(r.stall_median_seconds)},
                        {"stall_p99_s", Figure(r.stall_p99_seconds)},
                        {"steps", r.steps},
                        {"job_pfs_bytes", r.job_pfs_bytes},
                        {"node_pfs_bytes", r.node_pfs_bytes},
                        {"pfs_readers", r.pfs_readers},
                        {"local_reads", r.reads[0]},
                        {"peer_reads", r.reads[1]},
                        {"pfs_reads", r.reads[2]}});
  }
  std::printf("%s\n", DumpJson(doc, 2).c_str());
}

// The table (--format table, the default).
void PrintTable(const SimReport& rep) {
  const SimFlags& f = rep.flags;
  const policy::SimOptions& o = rep.options;
  const policy::JobSpec& job = o.job;
  const policy::PolicyResult* bound = rep.bound;
  const double dataset = rep.total;
  const double mean = rep.mean;
  const double took = rep.took;
  std::printf(
      "nopfs simulate: %u nodes x %u ranks, %llu samples (%s, mean %s), %u epochs, "
      "batch %llu (%llu steps per epoch)\n",
      f.nodes, f.ranks_per_node, static_cast<unsigned long long>(job.samples),
      FormatBytes(dataset).c_str(), FormatBytes(mean).c_str(), job.epochs,
      static_cast<unsigned long long>(job.batch),
      static_cast<unsigned long long>(policy::StepsPerEpoch(job)));
  std::printf("config: %s; compute %s/s per rank (%.0f samples/s)\n", rep.config.c_str(),
              FormatBytes(o.model.compute_rate).c_str(), o.model.compute_rate / mean);
  std::printf("node %u simulated, the other %u alike (symmetry); job PFS bytes = %u x the node's\n",
              f.node, f.nodes - 1, f.nodes);
  std::printf("%-11s %10s %10s %11s %8s %11s %11s %12s %9s %8s\n", "policy", "epoch1_s", "later_s",
              "total_s", "x_no_io", "stall_med", "stall_p99", "pfs_bytes", "datasets", "readers");
  for (const policy::PolicyResult& r : rep.results) {
    std::printf(
        "%-11s %10.2f %10.2f %11.2f %8.2f %10.1fms %10.1fms %12s %9.2f %8u\n",
        std::string(policy::SimPolicyName(r.policy)).c_str(), r.epoch_seconds[0], LaterEpochs(r),
        r.total_seconds,
        bound != nullptr && bound->total_seconds > 0 ? r.total_seconds / bound->total_seconds : 0.0,
        1e3 * r.stall_median_seconds, 1e3 * r.stall_p99_seconds,
        FormatBytes(static_cast<double>(r.job_pfs_bytes)).c_str(),
        static_cast<double>(r.job_pfs_bytes) / dataset, r.pfs_readers);
  }
  std::printf("simulated in %.2f s\n", took);
}

int RunSimulate(SimFlags& f) {
  // A preset fills what the flags leave out.
  const Preset* preset = nullptr;
  if (!f.preset.empty()) {
    for (const Preset& p : kPresets) {
      if (f.preset == p.name) preset = &p;
    }
    if (preset == nullptr) {
      std::string names;
      for (const Preset& p : kPresets)
        names += std::string(names.empty() ? "" : ", ") + std::string(p.name);
      return Fail(Status::InvalidArgument("--preset \"" + f.preset +
                                          "\" is not a preset: write one of " + names));
    }
    if (!f.given_nodes) f.nodes = 16;
    if (!f.given_rpn) f.ranks_per_node = 4;
    if (!f.given_epochs) f.epochs = preset->epochs;
    if (!f.given_samples) f.samples = preset->samples;
  }
  if (f.nodes == 0 || f.ranks_per_node == 0) {
    return Fail(Status::InvalidArgument("--nodes and --ranks-per-node must be at least 1"));
  }
  const double preset_mean =
      preset != nullptr ? preset->dataset_bytes / static_cast<double>(preset->samples) : 0;
  Result<std::vector<policy::Bytes>> sizes = MakeSizes(f.sizes, f.samples, preset_mean, f.seed);
  if (!sizes.ok()) return Fail(sizes.status());
  if (sizes->empty()) return Fail(Status::InvalidArgument("the dataset has no sample"));

  policy::SimOptions o;
  policy::JobSpec& job = o.job;
  job.seed = f.seed;
  job.samples = sizes->size();
  job.epochs = f.epochs;
  job.ranks_per_node = f.ranks_per_node;
  job.ranks = f.nodes * f.ranks_per_node;
  job.batch =
      f.batch != 0 ? f.batch : (preset != nullptr ? kPresetRankBatch : uint64_t{32}) * job.ranks;
  job.drop_last = f.drop_last;
  Result<policy::Scheme> scheme = policy::ParseScheme(f.scheme);
  if (!scheme.ok()) return Fail(scheme.status());
  job.scheme = *scheme;
  if (Status s = job.Validate(); !s.ok()) return Fail(s);

  Result<lua::NodeConfig> config =
      !f.config.empty() ? lua::LoadNodeConfig(f.config)
      : preset != nullptr
          ? lua::LoadNodeConfigFromString(kLassenConfig, std::string(f.preset) + " (built in)")
          : Result<lua::NodeConfig>(lua::DefaultNodeConfig(lua::HostMemoryBytes()));
  if (!config.ok()) return Fail(config.status());
  o.model = config->model();

  const policy::Bytes total = std::accumulate(sizes->begin(), sizes->end(), policy::Bytes{0});
  const double mean = static_cast<double>(total) / static_cast<double>(sizes->size());
  if (preset != nullptr && !f.given_rate) f.compute_rate = Num(kPresetComputeBytes) + "B/s";
  Result<double> c = ComputeBytes(f.compute_rate, mean);
  if (!c.ok()) return Fail(c.status());
  o.model.compute_rate = *c;
  o.node = f.node;
  o.loader_workers = f.loader_workers;
  o.loader_prefetch = f.loader_prefetch;
  o.step_barrier = !f.no_barrier;
  o.staging_window = !f.no_window;
  o.warm_tiers = f.warm_tiers;
  o.fetch_and_cache = f.fetch_and_cache;
  o.fill_once_on_read = f.fill_once_on_read;
  o.pfs_readers = f.pfs_readers;
  o.threads = f.threads;
  if (Status s = o.Validate(); !s.ok()) return Fail(s);
  Result<std::vector<policy::SimPolicy>> policies = ParsePolicies(f.policies);
  if (!policies.ok()) return Fail(policies.status());
  if (f.format != "table" && f.format != "kv" && f.format != "json") {
    return Fail(Status::InvalidArgument("--format \"" + f.format +
                                        "\" is not a format: write table, kv or json"));
  }

  if (f.startup) return PrintStartup(f, sizes->size(), o.model);
  if (f.placement.placement) {
    // --nodes is each sweep job's; one node unless given (a preset's 16 is the epochs' job).
    return RunPlacement(f.placement, PlacementJob{.nodes = f.given_nodes ? f.nodes : 1,
                                                  .epochs = f.epochs,
                                                  .seed = f.seed,
                                                  .dataset_bytes = total,
                                                  .model = &o.model,
                                                  .format = f.format});
  }

  const auto t0 = std::chrono::steady_clock::now();
  Result<std::vector<policy::PolicyResult>> results = policy::Simulate(o, *sizes, *policies);
  if (!results.ok()) return Fail(results.status());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  SimReport rep{f, o, config->source(), *results, nullptr, static_cast<double>(total), mean, took};
  // The no-I/O bound, when it was simulated, for the ratios.
  for (const policy::PolicyResult& r : *results) {
    if (r.policy == policy::SimPolicy::kNoIo) rep.bound = &r;
  }
  if (f.format == "kv") {
    PrintKv(rep);
  } else if (f.format == "json") {
    PrintJson(rep);
  } else {
    PrintTable(rep);
  }
  return 0;
}

}  // namespace

void RegisterSimulate(CLI::App* app, int* exit_code) {
  auto flags = std::make_shared<SimFlags>();
  SimFlags& f = *flags;
  CLI::App* sub = app->add_subcommand(
      "simulate",
      "Simulate a job's epochs, stalls and PFS bytes under nopfs and the simpler policies");
  sub->add_option("--preset", f.preset,
                  "A cluster setup of the seeds: imagenet1k-lassen, imagenet22k-lassen (flags "
                  "given override it)");
  sub->add_option("--config", f.config,
                  "The node config (Lua); default: the preset's, or a RAM tier of 1/8 of this "
                  "host's memory")
      ->check(CLI::ExistingFile);
  sub->add_option("--nodes", f.nodes, "N, nodes of the job")->capture_default_str();
  sub->add_option("--ranks-per-node", f.ranks_per_node, "L, training ranks per node")
      ->capture_default_str();
  sub->add_option("--epochs", f.epochs, "E, epochs")->capture_default_str();
  sub->add_option("--batch", f.batch,
                  "B, the global batch (all ranks together); default 32 per rank, 120 under a "
                  "preset");
  sub->add_option("--samples", f.samples, "F, samples in the dataset");
  sub->add_option("--sizes", f.sizes,
                  "Sample sizes: imagenet, fixed:SIZE, lognormal:MEAN or file:PATH")
      ->capture_default_str();
  sub->add_option("--seed", f.seed, "Shuffle seed")->capture_default_str();
  sub->add_option("--scheme", f.scheme, "Partition among ranks: uniform or strided")
      ->capture_default_str();
  sub->add_flag("--drop-last", f.drop_last, "Drop each epoch's trailing partial batch");
  sub->add_option("--compute-rate", f.compute_rate,
                  "c per rank: samples/s (e.g. 1000) or a bandwidth (e.g. 64M/s)")
      ->capture_default_str();
  sub->add_option(
      "--policies", f.policies,
      "Comma-separated: no-io, frequency, staging, fill-once, dataloader (default: all)");
  sub->add_option("--loader-workers", f.loader_workers,
                  "W, DataLoader workers per rank (0: load in the main process)")
      ->capture_default_str();
  sub->add_option("--loader-prefetch", f.loader_prefetch, "DataLoader prefetch_factor")
      ->capture_default_str();
  sub->add_option("--node", f.node, "The node simulated")->capture_default_str();
  sub->add_flag("--no-barrier", f.no_barrier,
                "The node's ranks do not wait for each other at every step");
  sub->add_flag("--no-window", f.no_window, "Staging may run ahead without bound");
  sub->add_flag("--warm-tiers", f.warm_tiers, "Tiers are full when the job starts");
  sub->add_flag("--fetch-and-cache,!--no-fetch-and-cache", f.fetch_and_cache,
                "A staged PFS read of a sample planned for a tier also caches it (as nopfsd "
                "does; the default)");
  sub->add_flag("--fill-once-on-read", f.fill_once_on_read,
                "fill-once: tiers filled by the first staged read (MinIO), not by prefetchers");
  sub->add_option("--pfs-readers", f.pfs_readers,
                  "gamma, concurrent PFS readers of the nopfs policies (0: derived)")
      ->capture_default_str();
  sub->add_option("--format", f.format, "table, kv (one key=value line per policy) or json")
      ->capture_default_str();
  sub->add_option("--threads", f.threads, "Worker threads (0: all cores)")->capture_default_str();
  sub->add_flag("--startup", f.startup,
                "Predict the start-up instead (one scan per job): the catalog's time on every "
                "node and the PFS metadata operations");
  sub->add_option("--classes", f.classes, "--startup: class directories of the dataset")
      ->capture_default_str();
  sub->add_option("--scan-threads", f.scan_threads, "--startup: scan threads per node")
      ->capture_default_str();
  sub->add_option("--metadata-latency-ms", f.metadata_latency_ms,
                  "--startup: milliseconds per PFS metadata operation")
      ->capture_default_str();
  sub->add_option("--link-start-ms", f.link_start_ms,
                  "--startup: milliseconds a daemon takes to start its peer link (libfabric's "
                  "load, its endpoint, its first send)")
      ->capture_default_str();
  sub->add_option("--link-per-peer-ms", f.link_per_peer_ms,
                  "--startup: milliseconds each other node adds to a daemon's link start (the "
                  "handshakes both ways)")
      ->capture_default_str();
  sub->add_option("--catalog-us-per-sample", f.catalog_us_per_sample,
                  "--startup: microseconds of one node's CPU per sample to build the catalog "
                  "after the walk (decode the parts, sort by class, index)")
      ->capture_default_str();
  AddPlacementOptions(sub, &f.placement);
  sub->callback([flags, sub, exit_code] {
    SimFlags& g = *flags;
    g.given_nodes = sub->get_option("--nodes")->count() != 0;
    g.given_rpn = sub->get_option("--ranks-per-node")->count() != 0;
    g.given_epochs = sub->get_option("--epochs")->count() != 0;
    g.given_samples = sub->get_option("--samples")->count() != 0;
    g.given_rate = sub->get_option("--compute-rate")->count() != 0;
    *exit_code = RunSimulate(g);
  });
}

}  // namespace nopfs::cli
