#include "policy/job.h"

#include <algorithm>
#include <string>

namespace nopfs::policy {
namespace {

__extension__ typedef unsigned __int128 U128;

std::string Num(uint64_t v) {
  return std::to_string(v);
}

}  // namespace

std::string_view SchemeName(Scheme s) {
  switch (s) {
    case Scheme::kUniform:
      return "uniform";
    case Scheme::kStrided:
      return "strided";
  }
  return "unknown";
}

Result<Scheme> ParseScheme(std::string_view name) {
  if (name == "uniform") return Scheme::kUniform;
  if (name == "strided") return Scheme::kStrided;
  return Status::InvalidArgument("--scheme \"" + std::string(name) +
                                 "\" is not a partition scheme: write uniform (contiguous slices "
                                 "of each batch) or strided (PyTorch DistributedSampler)");
}

uint32_t JobSpec::ranks_on_node(uint32_t node) const {
  const uint32_t first = first_rank(node);
  if (first >= ranks) return 0;
  return std::min(ranks_per_node, ranks - first);
}

Status JobSpec::Validate() const {
  if (samples == 0) {
    return Status::InvalidArgument(
        "--samples must be at least 1: write the number of samples in the dataset");
  }
  if (samples > kMaxSamples) {
    return Status::InvalidArgument("--samples " + Num(samples) + " exceeds the maximum of " +
                                   Num(kMaxSamples) +
                                   " samples per dataset: split the dataset into smaller ones");
  }
  if (epochs == 0) {
    return Status::InvalidArgument("--epochs must be at least 1: write the number of epochs");
  }
  if (ranks == 0) {
    return Status::InvalidArgument(
        "--ranks must be at least 1: write the number of training processes of the job");
  }
  if (batch == 0) {
    return Status::InvalidArgument(
        "--batch must be at least 1: write the global batch size (all ranks together)");
  }
  if (ranks_per_node == 0 || ranks_per_node > ranks) {
    return Status::InvalidArgument("--ranks-per-node " + Num(ranks_per_node) +
                                   " is out of range: write a number from 1 to --ranks (" +
                                   Num(ranks) + ")");
  }
  if (ranks > samples) {
    return Status::InvalidArgument("--ranks " + Num(ranks) + " is more than --samples " +
                                   Num(samples) +
                                   ": some rank would read nothing in every epoch; write at most " +
                                   Num(samples) + " --ranks");
  }
  if (scheme == Scheme::kUniform) {
    // Rank i's slice of a batch of B starts at i*ceil(B/N): the last rank's is empty when
    // (N-1)*ceil(B/N) >= B (always when B < N).
    const uint64_t q = batch / ranks + (batch % ranks != 0 ? 1 : 0);
    if (static_cast<U128>(ranks - 1) * q >= batch) {
      const U128 multiple = static_cast<U128>(q) * ranks;
      return Status::InvalidArgument(
          "--scheme uniform with --batch " + Num(batch) + " and --ranks " + Num(ranks) +
          " leaves rank " + Num(ranks - 1) + " without a sample in every step (each rank takes " +
          Num(q) + " of a batch): write --scheme strided, or a --batch that is a multiple of " +
          "--ranks (" + Num(static_cast<uint64_t>(multiple)) + ")");
    }
  }
  if (drop_last && batch > samples) {
    return Status::InvalidArgument("--drop-last with --batch " + Num(batch) +
                                   " larger than --samples " + Num(samples) +
                                   " leaves no step in an epoch: write a --batch of at most " +
                                   Num(samples) + " or leave out --drop-last");
  }
  // The strided scheme's per-rank list (M entries) and the largest number of times one sample
  // appears in one epoch of the job (padding repeats the head of the permutation).
  uint64_t per_rank = 0;
  uint64_t max_per_epoch = 1;
  if (scheme == Scheme::kStrided) {
    const uint64_t r = rank_batch();
    if (drop_last) {
      const uint64_t share = samples / ranks;  // >= 1: ranks <= samples
      if (share < r) {
        return Status::InvalidArgument(
            "--drop-last with --scheme strided: each rank's share of an epoch (floor(F/N) = " +
            Num(share) + " samples) is smaller than its batch (ceil(B/N) = " + Num(r) +
            "), so no step is left: write a --batch of at most " +
            Num(share * static_cast<uint64_t>(ranks)) + " or leave out --drop-last");
      }
      per_rank = share / r * r;
    } else {
      per_rank = samples / ranks + (samples % ranks != 0 ? 1 : 0);
      const U128 padded = static_cast<U128>(per_rank) * ranks;
      max_per_epoch = static_cast<uint64_t>((padded + samples - 1) / samples);
    }
  } else if (!drop_last && samples % batch != 0) {
    // The padding of the trailing batch (fewer than N <= F entries) reads some samples twice.
    max_per_epoch = 2;
  }
  // Positions in a node's concatenated stream and per-sample counts must fit their types.
  const U128 entries_per_epoch = scheme == Scheme::kStrided
                                     ? static_cast<U128>(per_rank) * ranks
                                     : static_cast<U128>(samples) + ranks;  // padding < N
  if (entries_per_epoch * epochs > (static_cast<U128>(1) << 63)) {
    return Status::InvalidArgument("--epochs " + Num(epochs) +
                                   " makes the job's stream longer than 2^63 entries: write "
                                   "fewer --epochs or fewer --ranks");
  }
  if (static_cast<U128>(max_per_epoch) * epochs > UINT32_MAX) {
    return Status::InvalidArgument(
        "--epochs " + Num(epochs) + " with --ranks " + Num(ranks) + " and --samples " +
        Num(samples) + " reads one sample more than 4294967295 times: write fewer --epochs");
  }
  return Status::Ok();
}

}  // namespace nopfs::policy
