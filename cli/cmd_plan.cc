#include "cli/cmd_plan.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cli/sizes.h"
#include "common/units.h"
#include "launch/job_flags.h"
#include "lua/config.h"
#include "policy/plan.h"
#include "policy/predict.h"

namespace nopfs::cli {

using launch::AddJobFlags;
using launch::FinishJobFlags;
using launch::JobFlags;

namespace {

struct PlanFlags {
  JobFlags job;
  uint32_t node = 0;
  std::string synthetic;
  std::string sizes_file;
  std::string config;
  double compute_rate = 1000;  // samples/s per rank
  unsigned threads = 0;
};

double Percent(double part, double whole) {
  return whole > 0 ? 100.0 * part / whole : 0.0;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "nopfs plan: %s\n", s.message().c_str());
  return 2;
}

int RunPlan(PlanFlags& f) {
  // The dataset: its sizes tell F.
  std::vector<policy::Bytes> sizes;
  std::string dataset_desc;
  if (!f.synthetic.empty() == !f.sizes_file.empty()) {
    return Fail(Status::InvalidArgument(
        "give the dataset's sizes with exactly one of --synthetic F:SIZE or --sizes FILE"));
  }
  if (!f.synthetic.empty()) {
    Result<SyntheticSpec> spec = ParseSyntheticSpec(f.synthetic);
    if (!spec.ok()) return Fail(spec.status());
    sizes = SyntheticSizes(spec->samples, spec->mean, f.job.job.seed);
    dataset_desc = "synthetic, mean " + FormatBytes(static_cast<double>(spec->mean));
  } else {
    Result<std::vector<policy::Bytes>> read = ReadSizesFile(f.sizes_file);
    if (!read.ok()) return Fail(read.status());
    sizes = std::move(*read);
    dataset_desc = f.sizes_file;
  }
  if (f.job.job.samples != 0 && f.job.job.samples != sizes.size()) {
    return Fail(Status::InvalidArgument(
        "--samples " + std::to_string(f.job.job.samples) + " disagrees with the dataset's " +
        std::to_string(sizes.size()) + " samples: leave --samples out or make them agree"));
  }
  f.job.job.samples = sizes.size();
  if (Status s = FinishJobFlags(&f.job); !s.ok()) return Fail(s);
  const policy::JobSpec& job = f.job.job;
  if (f.node >= job.nodes()) {
    return Fail(Status::InvalidArgument(
        "--node " + std::to_string(f.node) + " is out of range: the job has " +
        std::to_string(job.nodes()) + " nodes (0 to " + std::to_string(job.nodes() - 1) + ")"));
  }
  if (!(f.compute_rate > 0)) {
    return Fail(Status::InvalidArgument(
        "--compute-rate must be a positive number of samples/s per rank, e.g. 1000"));
  }

  // The node's configuration: its classes and the model's bandwidths.
  Result<lua::NodeConfig> config =
      f.config.empty() ? Result<lua::NodeConfig>(lua::DefaultNodeConfig(lua::HostMemoryBytes()))
                       : lua::LoadNodeConfig(f.config);
  if (!config.ok()) return Fail(config.status());
  policy::SystemModel model = config->model();
  std::vector<policy::Bytes> capacities;
  for (const policy::StorageClass& c : model.classes)
    capacities.push_back(c.capacity);

  const policy::Bytes total_bytes = std::accumulate(sizes.begin(), sizes.end(), policy::Bytes{0});
  const double mean_size = static_cast<double>(total_bytes) / static_cast<double>(sizes.size());
  model.compute_rate = f.compute_rate * mean_size;

  const auto t0 = std::chrono::steady_clock::now();
  const policy::NodePlan plan = policy::MakeNodePlan(job, f.node, sizes, capacities, f.threads);
  const auto t1 = std::chrono::steady_clock::now();
  // Every rank of the job stages with p_0 threads, and the ones that miss all read the PFS.
  const uint32_t pfs_readers = job.ranks * std::max<uint32_t>(1, model.staging.threads);
  const policy::NodePrediction pred = policy::PredictNode(job, plan, sizes, model, pfs_readers);
  const auto t2 = std::chrono::steady_clock::now();

  std::printf(
      "nopfs plan: node %u of %u (ranks %u-%u), seed %llu, %u epochs, batch %llu, %s%s\n", f.node,
      job.nodes(), job.first_rank(f.node), job.first_rank(f.node) + job.ranks_on_node(f.node) - 1,
      static_cast<unsigned long long>(job.seed), job.epochs,
      static_cast<unsigned long long>(job.batch),
      std::string(policy::SchemeName(job.scheme)).c_str(), job.drop_last ? ", drop_last" : "");
  std::printf("dataset: %llu samples, %s (%s)\n", static_cast<unsigned long long>(sizes.size()),
              FormatBytes(static_cast<double>(total_bytes)).c_str(), dataset_desc.c_str());
  std::printf("node reads: %llu accesses of %llu distinct samples (%s)\n",
              static_cast<unsigned long long>(plan.accesses),
              static_cast<unsigned long long>(plan.distinct),
              FormatBytes(static_cast<double>(plan.distinct_bytes)).c_str());
  std::printf("%-8s %12s %12s %12s %8s\n", "class", "samples", "bytes", "capacity", "reads");
  for (size_t j = 0; j < plan.tiers.size(); ++j) {
    const policy::TierPlan& t = plan.tiers[j];
    std::printf("%-8s %12zu %12s %12s %7.1f%%\n", model.classes[j].name.c_str(),
                t.prefetch_order.size(), FormatBytes(static_cast<double>(t.bytes)).c_str(),
                FormatBytes(static_cast<double>(capacities[j])).c_str(),
                Percent(static_cast<double>(t.accesses), static_cast<double>(plan.accesses)));
  }
  std::printf(
      "%-8s %12llu %12s %12s %7.1f%%\n", "pfs",
      static_cast<unsigned long long>(
          plan.distinct - std::accumulate(plan.tiers.begin(), plan.tiers.end(), uint64_t{0},
                                          [](uint64_t a, const policy::TierPlan& t) {
                                            return a + t.prefetch_order.size();
                                          })),
      "-", "-",
      Percent(static_cast<double>(plan.uncached_accesses), static_cast<double>(plan.accesses)));
  const double reads = static_cast<double>(pred.reads[0] + pred.reads[1] + pred.reads[2]);
  std::printf("sources: local %.1f%%, peer %.1f%%, pfs %.1f%% of the node's reads\n",
              Percent(static_cast<double>(pred.reads[0]), reads),
              Percent(static_cast<double>(pred.reads[1]), reads),
              Percent(static_cast<double>(pred.reads[2]), reads));
  std::printf(
      "model: %.0f samples/s per rank (%s/s): compute %.1f s, predicted stall %.1f s (%.1f%% of "
      "%.1f s)\n",
      f.compute_rate, FormatBytes(model.compute_rate).c_str(), pred.compute_seconds,
      pred.stall_seconds, Percent(pred.stall_seconds, pred.total_seconds), pred.total_seconds);
  std::printf("planned in %.3f s, predicted in %.3f s\n",
              std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count());
  return 0;
}

}  // namespace

void RegisterPlan(CLI::App* app, int* exit_code) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* sub = app->add_subcommand(
      "plan", "Print one node's plan: what each class holds, where reads come from, the stall");
  AddJobFlags(sub, &flags->job, /*samples_required=*/false);
  sub->add_option("--node", flags->node, "The node whose plan to print")->capture_default_str();
  sub->add_option("--synthetic", flags->synthetic,
                  "F:SIZE, a synthetic dataset of F samples with sizes drawn around SIZE "
                  "(e.g. 1281167:110K)");
  sub->add_option("--sizes", flags->sizes_file,
                  "A file with one sample size in bytes per line (sample id = line order)");
  sub->add_option("--config", flags->config,
                  "The node config (Lua); default: a RAM tier of 1/8 of this host's memory")
      ->check(CLI::ExistingFile);
  sub->add_option("--compute-rate", flags->compute_rate,
                  "Samples per second one rank consumes, for the stall prediction")
      ->capture_default_str();
  sub->add_option("--threads", flags->threads, "Planner threads (0: all cores)")
      ->capture_default_str();
  sub->callback([flags, exit_code] { *exit_code = RunPlan(*flags); });
}

}  // namespace nopfs::cli
