// Fuzz target: the share protocol's decoders (share/wire.h). Any user of the node may send a
// request to the node's share service (root); the service's replies reach a job's nopfsd.
// The first input byte: its low bit chooses the decoder (even: DecodeRequest, odd: DecodeReply),
// the rest the number of descriptors said to come with it (0..127) and, for a reply, the request's
// operation; the remaining bytes are the message.
// Properties: no read outside the input; every refusal has a message; an accepted message
// re-encodes to exactly the input (one encoding per value); an accepted request names at most 250
// files, as many as its descriptors, each path relative and without '.', '..' or empty components;
// an accepted reply carries exactly one descriptor per ready answer of an open.
#include "fuzz/fuzz_check.h"
#include "share/wire.h"

namespace share = nopfs::share;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t sel = data[0];
  const size_t fds = (sel >> 1) & 0x7f;
  const std::span<const std::byte> msg = nopfs::fuzz::AsBytes(data + 1, size - 1);
  if ((sel & 1) == 0) {
    nopfs::Result<share::Request> r = share::DecodeRequest(msg, fds);
    if (!r.ok()) {
      NOPFS_FUZZ_CHECK(!r.status().message().empty());
      return 0;
    }
    NOPFS_FUZZ_CHECK(r->files.size() <= share::kMaxBatch && r->files.size() == fds);
    for (const std::string& f : r->files)
      NOPFS_FUZZ_CHECK(share::CheckRelativePath(f).ok());
    const std::vector<std::byte> again = share::EncodeRequest(*r);
    NOPFS_FUZZ_CHECK(again.size() == msg.size() &&
                     std::equal(again.begin(), again.end(), msg.begin()));
    return 0;
  }
  const share::Op op = (sel & 0x80) != 0 ? share::Op::kOpen : share::Op::kWarm;
  nopfs::Result<share::Reply> r = share::DecodeReply(msg, fds & 0x3f, op);
  if (!r.ok()) {
    NOPFS_FUZZ_CHECK(!r.status().message().empty());
    return 0;
  }
  size_t ready = 0;
  for (const share::FileAnswer& a : r->files)
    ready += a.outcome == share::Outcome::kReady ? 1 : 0;
  NOPFS_FUZZ_CHECK(r->files.size() <= share::kMaxBatch);
  NOPFS_FUZZ_CHECK((op == share::Op::kOpen ? ready : 0) == (fds & 0x3f));
  const std::vector<std::byte> again = share::EncodeReply(*r);
  NOPFS_FUZZ_CHECK(again.size() == msg.size() &&
                   std::equal(again.begin(), again.end(), msg.begin()));
  return 0;
}
