// The wire encoding of the peer directory's three exchange rounds, and the owner's side of the
// protocol (service/directory.h; docs/fabric.md, "Directory"). BuildDirectory is written on top of
// these; the directory benchmark uses them to produce, on demand, what the other simulated nodes
// would send, so that it runs the real code for the node it measures.
//
// Every buffer starts with a 4-byte header: 'N' 'D', the format version (1) and the round
// (1 publish, 2 query, 3 answer), followed by a varint entry count. Samples sent to owner o are
// all congruent to o modulo the node count, so ids travel as q = sample / nodes, ascending and
// delta-encoded as LEB128 varints (the first absolute):
//   publish: count, then per holding: varint delta-q, varint class, varint position
//   query:   count, then per needed sample: varint delta-q
//   answer:  count (= the query's count), then per queried sample, in query order: varint
//            holder+1 (0: nobody else holds it), and if held: varint class, varint position
// Decoding is strict: a wrong header, a truncated or oversized varint, an id that is not owned by
// the receiver or not strictly ascending, a class above 65535, a holder outside the job, a count
// larger than the bytes that follow could encode, or trailing bytes are errors (kCorruption).
// Decoders never allocate more than a small multiple of the buffer's size.
//
// Thread safety: free functions on values; an OwnerTable is built once and then only read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "service/directory.h"

namespace nopfs::service::dir::wire {

inline constexpr uint8_t kVersion = 1;
enum class Round : uint8_t { kPublish = 1, kQuery = 2, kAnswer = 3 };

// Round 1. `held` holds only samples owned by `owner` (sample % nodes == owner), sorted by sample,
// each once; otherwise std::invalid_argument (a broken invariant of the caller).
std::vector<std::byte> EncodePublish(std::span<const Holding> held, uint32_t owner, uint32_t nodes);
// Appends the decoded holdings to `out` (ascending by sample).
Status DecodePublish(std::span<const std::byte> buf, uint32_t owner, uint32_t nodes,
                     std::vector<Holding>* out);

// Round 2. `ids` as for EncodePublish: owned by `owner`, strictly ascending.
std::vector<std::byte> EncodeQuery(std::span<const uint32_t> ids, uint32_t owner, uint32_t nodes);
Status DecodeQuery(std::span<const std::byte> buf, uint32_t owner, uint32_t nodes,
                   std::vector<uint32_t>* out);

// One answer per queried sample: the holder, or node == kNoHolder.
inline constexpr uint32_t kNoHolder = 0xFFFFFFFFu;
// Round 3. `answers[i]` answers the i-th queried sample; `answers[i].sample` is not sent.
std::vector<std::byte> EncodeAnswer(std::span<const Location> answers);
// Decodes an answer to the query `queried` (the ids this node sent that owner): appends one
// Location per queried sample that has a holder. A holder equal to `self` or >= nodes, or a count
// different from queried.size(), is an error.
Status DecodeAnswer(std::span<const std::byte> buf, std::span<const uint32_t> queried,
                    uint32_t self, uint32_t nodes, std::vector<Location>* out);

// The holder chosen among `holders` (sorted by node, none equal to the requester, not empty) for
// the `rank`-th requester (0-based, in ascending node order) of `sample`:
// holders[(rank + sample / nodes) % holders.size()]. The requests for a popular sample are spread
// evenly (the holders' loads differ by at most one) and the choice depends only on the published
// holdings and the queries, so every run gives the same answer.
size_t ChooseHolder(uint64_t rank, uint32_t sample, uint32_t nodes, size_t holders);

// An owner's entries: every holding of the samples it owns, by sample then node.
class OwnerTable {
 public:
  OwnerTable(uint32_t owner, uint32_t nodes) : owner_(owner), nodes_(nodes) {}
  // Adds what node `from` published (round 1's in[from]).
  Status AddPublished(uint32_t from, std::span<const std::byte> buf);
  // Sorts the entries; call once after every AddPublished and before Answer.
  void Seal();
  // Round 3's out[requester] for round 2's in[requester]. Called for requesters in ascending
  // order (each at most once; a smaller requester than the last is std::invalid_argument), so
  // that a requester's rank among a sample's requesters is known (ChooseHolder).
  Result<std::vector<std::byte>> Answer(uint32_t requester, std::span<const std::byte> query);
  uint64_t entries() const { return entries_.size(); }
  uint64_t memory_bytes() const {
    return entries_.capacity() * sizeof(Entry) + served_.capacity() * sizeof(uint32_t);
  }

 private:
  struct Entry {
    uint32_t sample;
    uint32_t node;
    uint32_t position;
    uint16_t cls;
  };
  uint32_t owner_;
  uint32_t nodes_;
  std::vector<Entry> entries_;
  std::vector<Holding> scratch_;
  std::vector<uint32_t> served_;  // per entry that starts a sample's run: requests answered so far
  int64_t last_requester_ = -1;
};

}  // namespace nopfs::service::dir::wire
