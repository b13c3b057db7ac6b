// The sources a SampleReader reads from beside this node's tiers and the PFS, all given to it when
// it is made (ReaderSources; each may be absent). For a sample it does not hold ready, the reader
// asks them in this order (docs/algorithm.md §4 and §7): the job's other nodes, when the
// performance model prefers them to the PFS; the kept copy an earlier job left
// (service/reader/kept.h); the node's shared copy of a dataset the node config declares shared
// (share/client.h); the oldest running sibling job of the user on the same dataset
// (service/reader/sibling.h); then the PFS. The prefetchers' fills ask the kept copy, then the
// shared copy, then the sample's filler among the peers, then the sibling, then the PFS.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "common/status.h"
#include "policy/job.h"

namespace nopfs::service {

// The job's other nodes (service/peers/peers.h, PeerService). Until the peer directory is built
// the source knows no peer: Lookup answers -1, the fetches NotFound, and Push does nothing.
// Thread safety: every method from any thread.
class PeerSource {
 public:
  virtual ~PeerSource() = default;
  // Whether some peer holds `sample` and is presumed ready (docs/algorithm.md §7): the peer's
  // class index, or -1. For a sample this node holds but has not filled yet, the peer is its
  // filler (the holder that reads it from the PFS).
  virtual int Lookup(policy::SampleId sample) const = 0;
  // A staging read from the peer that holds `sample`: fills dst and returns the bytes' xxh3, or an
  // error (NotFound: not available there now, a readiness guess that missed).
  virtual Result<uint64_t> Fetch(policy::SampleId sample, std::span<std::byte> dst) = 0;
  // A prefetch's copy from the sample's filler: Unavailable when the filler does not have it yet
  // (the prefetcher may try again later), NotFound when this node reads the sample itself.
  virtual Result<uint64_t> FetchCopy(policy::SampleId sample, std::span<std::byte> dst) = 0;
  // Offers a sample just read from the PFS to the peer that holds it (or fills it for the job);
  // best effort, never blocks.
  virtual void Push(policy::SampleId sample, std::span<const std::byte> bytes, uint64_t xxh3) = 0;
};

// A kept copy's fetch (KeptCopy::Fetch): fills dst with verified bytes and returns their xxh3;
// NotFound when it does not have the sample, another error when it rejected it.
using KeptFetchFn = std::function<Result<uint64_t>(policy::SampleId, std::span<std::byte> dst)>;

// The node's shared copy (share/client.h, asked as the job's user with a proof per file): fills
// dst with the sample's bytes and returns their xxh3; NotFound when the copy does not serve it
// (the user cannot open the file, it is not stored, or the service is not there): the reader then
// reads the PFS, and fails as the PFS does.
using SharedFetchFn = std::function<Result<uint64_t>(policy::SampleId, std::span<std::byte> dst)>;

// A sibling's fetch (SiblingReader::Fetch): fills dst with bytes checked against the xxh3 the
// sibling sent and returns it; any error: the reader reads the PFS instead; nullopt: no sibling
// to ask now (the PFS is read, nothing is counted).
using SiblingFetchFn =
    std::function<std::optional<Result<uint64_t>>(policy::SampleId, std::span<std::byte> dst)>;

struct ReaderSources {
  PeerSource* peers = nullptr;  // the job's peers (must outlive the reader); null: no peers
  KeptFetchFn kept;             // empty: no kept copy
  SharedFetchFn shared;         // empty: the dataset is not shared on this node
  SiblingFetchFn sibling;       // empty: no sibling
};

}  // namespace nopfs::service
