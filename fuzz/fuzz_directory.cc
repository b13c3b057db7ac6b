// Fuzz target: the peer directory's wire format (service/peers/directory_wire.h), the three rounds
// of buffers a node receives from the other nodes of its job, and the owner's side (OwnerTable)
// that answers them.
// The first bytes choose the round and the job (nodes, owner, self, the queried ids); the rest is
// the foreign buffer. Properties:
//   - Decode* never read outside the buffer, and what they accept obeys the format's rules (owned,
//     strictly ascending ids; holders and fillers inside the job and not the receiver).
//   - decode∘encode: re-encoding what was decoded decodes to the same values, and is no longer
//     than the input (the encoder writes the shortest varints).
//   - OwnerTable: after any published buffers, the answer to any query that decodes is an answer
//     the requester accepts (DecodeAnswer with self = requester), one location per queried id.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>

#include "fuzz/fuzz_check.h"
#include "service/peers/directory_wire.h"

namespace dir = nopfs::service::dir;
namespace wire = nopfs::service::dir::wire;

namespace {

std::vector<std::byte> Take(FuzzedDataProvider& in, bool rest) {
  std::vector<uint8_t> b =
      rest ? in.ConsumeRemainingBytes<uint8_t>()
           : in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 256));
  std::vector<std::byte> out(b.size());
  std::transform(b.begin(), b.end(), out.begin(), [](uint8_t c) { return std::byte{c}; });
  return out;
}

void Publish(const std::vector<std::byte>& buf, uint32_t owner, uint32_t nodes) {
  std::vector<dir::Holding> held;
  if (!wire::DecodePublish(buf, owner, nodes, &held).ok()) return;
  for (size_t i = 0; i < held.size(); ++i) {
    NOPFS_FUZZ_CHECK(held[i].sample % nodes == owner);
    NOPFS_FUZZ_CHECK(i == 0 || held[i - 1].sample < held[i].sample);
  }
  const std::vector<std::byte> again = wire::EncodePublish(held, owner, nodes);
  NOPFS_FUZZ_CHECK(again.size() <= buf.size());
  std::vector<dir::Holding> back;
  NOPFS_FUZZ_CHECK(wire::DecodePublish(again, owner, nodes, &back).ok());
  NOPFS_FUZZ_CHECK(back.size() == held.size());
  for (size_t i = 0; i < held.size(); ++i) {
    NOPFS_FUZZ_CHECK(back[i].sample == held[i].sample && back[i].cls == held[i].cls &&
                     back[i].position == held[i].position);
  }
}

void Query(const std::vector<std::byte>& buf, uint32_t owner, uint32_t nodes) {
  std::vector<uint32_t> ids;
  if (!wire::DecodeQuery(buf, owner, nodes, &ids).ok()) return;
  for (size_t i = 0; i < ids.size(); ++i) {
    NOPFS_FUZZ_CHECK(ids[i] % nodes == owner);
    NOPFS_FUZZ_CHECK(i == 0 || ids[i - 1] < ids[i]);
  }
  const std::vector<std::byte> again = wire::EncodeQuery(ids, owner, nodes);
  NOPFS_FUZZ_CHECK(again.size() <= buf.size());
  std::vector<uint32_t> back;
  NOPFS_FUZZ_CHECK(wire::DecodeQuery(again, owner, nodes, &back).ok());
  NOPFS_FUZZ_CHECK(back == ids);
}

// Checks an answer as the requester `self` decodes it; returns whether it decoded.
bool Answer(const std::vector<std::byte>& buf, const std::vector<uint32_t>& queried, uint32_t self,
            uint32_t owner, uint32_t nodes) {
  std::vector<dir::Location> out, copies;
  if (!wire::DecodeAnswer(buf, queried, self, owner, nodes, &out, &copies).ok()) return false;
  std::vector<dir::Location> answers;  // one per queried id, as EncodeAnswer takes them
  size_t next = 0;
  for (uint32_t id : queried) {
    if (next < out.size() && out[next].sample == id) {
      answers.push_back(out[next++]);
    } else {
      answers.push_back({id, wire::kNoHolder, 0, 0});
    }
  }
  NOPFS_FUZZ_CHECK(next == out.size());
  for (const dir::Location& l : out)
    NOPFS_FUZZ_CHECK(l.node < nodes && l.node != self);
  for (size_t i = 0; i < copies.size(); ++i) {
    NOPFS_FUZZ_CHECK(copies[i].sample % nodes == owner);
    NOPFS_FUZZ_CHECK(copies[i].node < nodes && copies[i].node != self);
    NOPFS_FUZZ_CHECK(i == 0 || copies[i - 1].sample < copies[i].sample);
  }
  const std::vector<std::byte> again = wire::EncodeAnswer(answers, copies, owner, nodes);
  NOPFS_FUZZ_CHECK(again.size() <= buf.size());
  std::vector<dir::Location> out2, copies2;
  NOPFS_FUZZ_CHECK(wire::DecodeAnswer(again, queried, self, owner, nodes, &out2, &copies2).ok());
  NOPFS_FUZZ_CHECK(out2 == out && copies2 == copies);
  return true;
}

// The owner's side: every node publishes once, then the requesters query in ascending order.
void Owner(FuzzedDataProvider& in, uint32_t owner, uint32_t nodes) {
  wire::OwnerTable table(owner, nodes);
  for (uint32_t from = 0; from < nodes && in.ConsumeBool(); ++from) {
    (void)table.AddPublished(from, Take(in, false));
  }
  table.Seal();
  for (uint32_t requester = 0; requester < nodes && in.remaining_bytes() > 0; ++requester) {
    const std::vector<std::byte> query = Take(in, false);
    nopfs::Result<std::vector<std::byte>> answer = table.Answer(requester, query);
    if (!answer.ok()) continue;
    std::vector<uint32_t> ids;
    NOPFS_FUZZ_CHECK(wire::DecodeQuery(query, owner, nodes, &ids).ok());
    NOPFS_FUZZ_CHECK(Answer(*answer, ids, requester, owner, nodes));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const auto round = in.ConsumeIntegralInRange<uint8_t>(0, 3);
  const auto nodes = in.ConsumeIntegralInRange<uint32_t>(1, 64);
  const auto owner = in.ConsumeIntegralInRange<uint32_t>(0, nodes - 1);
  const auto self = in.ConsumeIntegralInRange<uint32_t>(0, nodes - 1);
  switch (round) {
    case 0:
      Publish(Take(in, true), owner, nodes);
      break;
    case 1:
      Query(Take(in, true), owner, nodes);
      break;
    case 2: {
      // The ids this node queried: owned by `owner`, ascending (gaps from the input).
      std::vector<uint32_t> queried;
      const auto n = in.ConsumeIntegralInRange<uint32_t>(0, 64);
      uint64_t q = in.ConsumeIntegralInRange<uint32_t>(0, 1000);
      for (uint32_t i = 0; i < n && q * nodes + owner <= 0xFFFFFFFFull; ++i) {
        queried.push_back(static_cast<uint32_t>(q * nodes + owner));
        q += 1 + in.ConsumeIntegralInRange<uint32_t>(0, 7);
      }
      Answer(Take(in, true), queried, self, owner, nodes);
      break;
    }
    default:
      Owner(in, owner, nodes);
  }
  return 0;
}
