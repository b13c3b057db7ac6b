// The wire encoding of the peer directory's three exchange rounds, and the owner's side of the
// protocol (service/peers/directory.h; docs/fabric.md, "Directory"). BuildDirectory is written on
// top of these; the directory benchmark uses them to produce, on demand, what the other simulated
// nodes would send, so that it runs the real code for the node it measures.
//
// Every buffer starts with a 4-byte header: 'N' 'D', the format version (2) and the round
// (1 publish, 2 query, 3 answer), followed by a varint entry count. Samples sent to owner o are
// all congruent to o modulo the node count, so ids travel as q = sample / nodes, ascending and
// delta-encoded as LEB128 varints (the first absolute):
//   publish: count, then per holding: varint delta-q, varint class, varint position
//   query:   count, then per needed sample: varint delta-q
//   answer:  count (= the query's count), then per queried sample, in query order: varint
//            holder+1 (0: nobody else holds it), and if held: varint class, varint position;
//            then the copies part: count, then per sample the requester holds and another
//            holder fills first (its filler; see OwnerTable): varint delta-q, varint filler+1,
//            varint class, varint position
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
#include "service/peers/directory.h"

namespace nopfs::service::dir::wire {

inline constexpr uint8_t kVersion = 2;
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
// `copies`: for samples the requester holds (owned by `owner`, strictly ascending), the node it
// should copy them from (std::invalid_argument otherwise).
std::vector<std::byte> EncodeAnswer(std::span<const Location> answers,
                                    std::span<const Location> copies, uint32_t owner,
                                    uint32_t nodes);
// Decodes owner `owner`'s answer to the query `queried` (the ids this node sent it): appends one
// Location per queried sample that has a holder to `out`, and the copies part to `copies`. A
// holder equal to `self` or >= nodes, or a count different from queried.size(), is an error.
Status DecodeAnswer(std::span<const std::byte> buf, std::span<const uint32_t> queried,
                    uint32_t self, uint32_t owner, uint32_t nodes, std::vector<Location>* out,
                    std::vector<Location>* copies);

// The holder chosen among `holders` (sorted by node, none equal to the requester, not empty) for
// the `rank`-th requester (0-based, in ascending node order) of `sample`:
// holders[(rank + sample / nodes) % holders.size()]. The requests for a popular sample are spread
// evenly (the holders' loads differ by at most one) and the choice depends only on the published
// holdings and the queries, so every run gives the same answer.
size_t ChooseHolder(uint64_t rank, uint32_t sample, uint32_t nodes, size_t holders);

// An owner's entries: every holding of the samples it owns, by sample then node.
//
// A sample several nodes hold is read from the PFS by one of them, its filler: the holder that
// comes to it first in its fill order (smallest position, then smallest node). Every other holder
// is told, in the copies part of its answer, to fill its copy from the filler instead of the PFS,
// so that a job reads such a sample from the PFS once, not once per holder.
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
    return entries_.capacity() * sizeof(Entry) + served_.capacity() * sizeof(uint32_t) +
           copies_.capacity() * sizeof(Copy);
  }
  // Holdings that are copies of another holder's (the samples' holders less their fillers).
  uint64_t copies() const { return copies_.size(); }

 private:
  struct Entry {
    uint32_t sample;
    uint32_t node;
    uint32_t position;
    uint16_t cls;
  };
  struct Copy {
    uint32_t node;  // the copying holder
    uint32_t sample;
    uint32_t filler;  // index into entries_
  };
  uint32_t owner_;
  uint32_t nodes_;
  std::vector<Entry> entries_;
  std::vector<Copy> copies_;  // by node, then sample
  size_t copies_cursor_ = 0;
  std::vector<Holding> scratch_;
  std::vector<uint32_t> served_;  // per entry that starts a sample's run: requests answered so far
  int64_t last_requester_ = -1;
};

}  // namespace nopfs::service::dir::wire
