// JobSpec: the sampling parameters of one training job, the input of every planner function.
//
// Everything the clairvoyant planner computes (streams, frequencies, plans) is a deterministic
// function of a JobSpec (and, for plans, of sample sizes and capacities), so any node can compute
// any other node's result bit for bit. See docs/algorithm.md for the exact definitions.
//
// Thread safety: a value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace nopfs::policy {

// A sample's id: its index in the catalog's stable (label, relative path) order. 32 bits hold
// datasets of up to 4,294,967,295 samples (ImageNet-22k has 14.2 million); byte sizes and stream
// positions are always 64-bit.
using SampleId = uint32_t;
using Bytes = uint64_t;

inline constexpr uint64_t kMaxSamples = UINT32_MAX;

enum class Scheme {
  // The seeds' partition: step h takes the next B entries of the epoch's permutation; rank i gets
  // the i-th contiguous slice of ceil(b/N) of them (b = that batch's size).
  kUniform,
  // PyTorch DistributedSampler + DataLoader semantics: the permutation is padded (by repeating its
  // head) or truncated (drop_last) to whole per-rank lists; rank i takes positions i, i+N, i+2N...;
  // its steps are batches of ceil(B/N) of its own list.
  kStrided,
};

std::string_view SchemeName(Scheme s);
Result<Scheme> ParseScheme(std::string_view name);

struct JobSpec {
  uint64_t seed = 0;     // the shuffle seed; the same on every rank
  uint64_t samples = 0;  // F, number of samples in the dataset
  uint32_t epochs = 1;   // E
  uint32_t ranks = 1;    // N, training processes in the job
  uint64_t batch = 1;    // B, the global batch size (all ranks together)
  Scheme scheme = Scheme::kUniform;
  bool drop_last = false;  // drop each epoch's trailing partial batch
  // L: ranks n*L .. n*L+L-1 run on node n (the last node may have fewer)
  uint32_t ranks_per_node = 1;

  // Every field in range; the message names the flag and the accepted values.
  Status Validate() const;

  uint32_t nodes() const { return (ranks + ranks_per_node - 1) / ranks_per_node; }
  uint32_t first_rank(uint32_t node) const { return node * ranks_per_node; }
  // Number of ranks on `node` (L, or fewer on the last node).
  uint32_t ranks_on_node(uint32_t node) const;
  uint32_t node_of(uint32_t rank) const { return rank / ranks_per_node; }
  // ceil(B/N): a rank's share of a full batch (ranks >= 1; no overflow for any batch).
  uint64_t rank_batch() const { return batch / ranks + (batch % ranks != 0 ? 1 : 0); }
};

}  // namespace nopfs::policy
