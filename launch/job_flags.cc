#include "launch/job_flags.h"

namespace nopfs::launch {

void AddJobFlags(CLI::App* app, JobFlags* flags, bool samples_required) {
  policy::JobSpec& j = flags->job;
  app->add_option("--seed", j.seed, "Shuffle seed, the same on every rank")->capture_default_str();
  auto* samples = app->add_option("--samples", j.samples, "F, number of samples in the dataset");
  if (samples_required) samples->required();
  app->add_option("--epochs", j.epochs, "E, number of epochs")->capture_default_str();
  app->add_option("--ranks", j.ranks, "N, number of ranks (training processes)")
      ->capture_default_str();
  app->add_option("--batch", j.batch, "B, global batch size (all ranks together)")
      ->capture_default_str();
  app->add_option("--scheme", flags->scheme,
                  "Partition among ranks: uniform (contiguous slices of each batch) or strided "
                  "(PyTorch DistributedSampler)")
      ->capture_default_str();
  app->add_flag("--drop-last", j.drop_last, "Drop each epoch's trailing partial batch");
  app->add_option("--ranks-per-node", j.ranks_per_node,
                  "L, ranks per node (ranks n*L .. n*L+L-1 run on node n)")
      ->capture_default_str();
}

Status FinishJobFlags(JobFlags* flags) {
  Result<policy::Scheme> scheme = policy::ParseScheme(flags->scheme);
  if (!scheme.ok()) return scheme.status();
  flags->job.scheme = *scheme;
  return flags->job.Validate();
}

}  // namespace nopfs::launch
