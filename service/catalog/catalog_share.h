// One dataset scan per job: the messages the nodes of a job exchange to build one catalog, and the
// all-gather that carries them over the job's collective exchange rounds (CatalogOptions::exchange,
// PeerLink::Exchange in nopfsd). Internal to the catalog (service/catalog/catalog.cc);
// docs/catalog.md ("One scan per job") describes the protocol and the bytes.
//
//   1. node 0 consults the catalog cache and sends a Lead to every node: kHit with the cached
//      catalog, kMiss with the listing of the ImageFolder root (the class directories), or
//      kScanned with the whole scan (a manifest, which node 0 parses and stats alone);
//   2. after kMiss, node n walks the classes whose label % nodes == n and every node sends its
//      ClassesPart to every other; each assembles the same scan result from the parts.
// Any failed round (a dead or late peer) makes a node scan alone.
//
// Thread safety: pure functions, except that AllGather calls the exchange.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "service/catalog/catalog_scan.h"
#include "service/catalog/catalog_store.h"

namespace nopfs::service::share {

inline constexpr uint8_t kShareVersion = 1;
// The largest buffer one round carries; longer messages take several rounds.
inline constexpr size_t kChunkBytes = size_t{32} << 20;

// One collective round among the job's nodes: sends out[k] to node k, returns in[k] from node k.
using Exchange = std::function<Result<std::vector<std::vector<std::byte>>>(
    uint64_t round, std::vector<std::vector<std::byte>> out)>;

// Every node's `mine`, in node order (this node's own included), cut in chunks of `chunk_bytes`.
// Takes ceil(longest / chunk_bytes) rounds (at least one), numbered from *round on, which it
// advances; every node must call it at the same point.
Result<std::vector<std::vector<std::byte>>> AllGather(const Exchange& exchange, uint32_t nodes,
                                                      uint64_t* round, std::vector<std::byte> mine,
                                                      size_t chunk_bytes = kChunkBytes);

enum class LeadKind : uint8_t { kHit = 1, kMiss = 2, kScanned = 3 };

struct Lead {
  LeadKind kind = LeadKind::kMiss;
  std::string reason;         // why node 0 did not reuse the cache ("" for kHit)
  store::Contents contents;   // kHit
  scan::RootListing listing;  // kMiss
  scan::ScanResult scanned;   // kScanned
};

std::vector<std::byte> EncodeLead(const Lead& lead);
// InvalidArgument naming what is malformed.
Result<Lead> DecodeLead(std::span<const std::byte> in);

std::vector<std::byte> EncodePart(const scan::ClassesPart& part);
Result<scan::ClassesPart> DecodePart(std::span<const std::byte> in);

// The classes node `node` of `nodes` walks after a kMiss.
std::vector<uint32_t> ClassesOf(uint32_t node, uint32_t nodes, size_t classes);

}  // namespace nopfs::service::share
