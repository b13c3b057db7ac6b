// Fuzz target: the shared scan's messages (service/catalog/catalog_share.h). Node 0's lead (a cache
// hit with the whole catalog, the root's listing, or a manifest's scan) and every node's part of
// the walk arrive from the other nodes of the job over the peer link, so they are foreign bytes.
// The first input byte chooses the decoder (lead or part); the rest is the message.
// Properties: no decoder reads outside the message; every refusal has a message; what a decoder
// accepts re-encodes to bytes that decode to the same encoding again (encode ∘ decode is a
// fixed point after one step); a lead's contents are consistent (one path end, offset, length and
// label per sample, path ends ascending within the arena).
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "service/catalog/catalog_share.h"

namespace share = nopfs::service::share;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // A view of libFuzzer's exactly sized buffer, so that ASan sees a read past the message.
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto lead = share::DecodeLead(in);
    if (!lead.ok()) {
      NOPFS_FUZZ_CHECK(!lead.status().message().empty());
      return 0;
    }
    const auto& c = lead->contents;
    NOPFS_FUZZ_CHECK(c.path_end.size() == c.offsets.size());
    NOPFS_FUZZ_CHECK(c.offsets.size() == c.lengths.size());
    NOPFS_FUZZ_CHECK(c.lengths.size() == c.labels.size());
    uint64_t prev = 0;
    for (uint64_t end : c.path_end) {
      NOPFS_FUZZ_CHECK(end >= prev && end <= c.arena.size());
      prev = end;
    }
    const std::vector<std::byte> once = share::EncodeLead(*lead);
    auto again = share::DecodeLead(once);
    NOPFS_FUZZ_CHECK(again.ok());
    NOPFS_FUZZ_CHECK(share::EncodeLead(*again) == once);
  } else {
    auto part = share::DecodePart(in);
    if (!part.ok()) {
      NOPFS_FUZZ_CHECK(!part.status().message().empty());
      return 0;
    }
    const std::vector<std::byte> once = share::EncodePart(*part);
    auto again = share::DecodePart(once);
    NOPFS_FUZZ_CHECK(again.ok());
    NOPFS_FUZZ_CHECK(share::EncodePart(*again) == once);
  }
  return 0;
}
