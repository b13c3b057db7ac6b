// The peer directory: for every sample this node will read and does not hold, which peer holds
// it, in which storage class, and at which position of that peer's prefetch (fill) order
// (docs/algorithm.md §7).
//
// The seeds allgather every node's full cache lists at start, which does not scale (1024 nodes x
// 14 M samples). Here the directory is partitioned by sample id: node `sample % nodes` owns the
// entries of `sample`. Building it is three collective exchanges among the job's nodes, each an
// all-to-all of byte buffers:
//   1. publish: every node sends each owner the holdings (sample, class, position) it owns;
//   2. query:   every node sends each owner the ids of the samples it needs (those of its future
//               stream that it does not hold itself), each id once;
//   3. answer:  every owner answers each query with at most one holder per sample (chosen so that
//               requests for a popular sample spread over its holders), and tells each holder of
//               a sample that several nodes hold which of them fills it from the PFS first (its
//               filler): the others copy it from the filler, so the job reads it from the PFS once.
// The wire encoding of the three rounds is this module's; docs/fabric.md describes it.
//
// Thread safety: BuildDirectory is called once per node from one thread; a built PeerDirectory is
// immutable and safe to read from any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"

namespace nopfs::service::dir {

// A sample this node holds: in class `cls`, filled as the `position`-th entry of that class's
// prefetch order.
struct Holding {
  uint32_t sample = 0;
  uint16_t cls = 0;
  uint32_t position = 0;
};

// Where a sample this node needs can be read from.
struct Location {
  uint32_t sample = 0;
  uint32_t node = 0;  // the holder's node index in the job
  uint16_t cls = 0;
  uint32_t position = 0;
  bool operator==(const Location&) const = default;
};

// A collective all-to-all among the job's `nodes` nodes: out[k] is delivered to node k (out[self]
// to this node itself); the result's in[k] is what node k sent to this node. Every node calls it
// the same number of times in the same order. Implemented over libfabric by fabric/ and in-process
// by tests and the directory benchmark.
using Exchange = std::function<Result<std::vector<std::vector<std::byte>>>(
    std::vector<std::vector<std::byte>> out)>;

// What building cost this node (the benchmark reports these at scale).
struct DirectoryStats {
  uint64_t bytes_sent = 0;      // over all rounds, excluding what a node sends itself
  uint64_t bytes_received = 0;  // idem
  uint64_t owned_entries = 0;   // holdings this node stores as an owner during the build
  uint64_t copies = 0;          // samples this node holds and is to copy from their filler
  uint64_t peak_bytes = 0;      // an estimate of the build's peak heap use
};

class PeerDirectory {
 public:
  PeerDirectory() = default;
  // The holder of `sample`, or nullopt when no other node holds it.
  std::optional<Location> Find(uint32_t sample) const;
  // For a sample this node holds and another holder fills first: that filler (the node to copy it
  // from), or nullopt when this node is to read it from the PFS itself.
  std::optional<Location> FindCopy(uint32_t sample) const;
  size_t size() const { return entries_.size(); }
  size_t copy_count() const { return copies_.size(); }
  // Bytes of the lookup structure.
  uint64_t memory_bytes() const;

 private:
  friend Result<PeerDirectory> BuildDirectory(uint32_t, uint32_t, std::span<const Holding>,
                                              std::span<const uint32_t>, const Exchange&,
                                              DirectoryStats*);
  std::vector<Location> entries_;  // sorted by sample
  std::vector<Location> copies_;   // sorted by sample
};

// Builds this node's directory. `held`: what this node holds (any order). `needs`: the distinct
// samples of this node's future stream that it does not hold (any order). The result answers
// Find() for every sample in `needs` that some other node holds, and FindCopy() for every sample
// in `held` whose filler is another node. An error from `exchange`, or a
// malformed buffer from a peer, is returned as a Status (never a crash).
Result<PeerDirectory> BuildDirectory(uint32_t node, uint32_t nodes, std::span<const Holding> held,
                                     std::span<const uint32_t> needs, const Exchange& exchange,
                                     DirectoryStats* stats = nullptr);

}  // namespace nopfs::service::dir
