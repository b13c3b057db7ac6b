// Fuzz target: the client <-> nopfsd wire format (protocol/wire.h), which nopfsd decodes from any
// process of the job's user and the client decodes from its socket.
// Properties: Decode never reads outside the input (ASan: libFuzzer passes an exactly sized heap
// copy); a message Decode accepts re-encodes to exactly the same bytes (the format has one
// encoding per message); DecodeHeader + DecodePayload agree with Decode; a status carried by an
// ERROR maps back to a valid code.
#include "fuzz/fuzz_check.h"
#include "protocol/wire.h"

using nopfs::fuzz::AsBytes;
namespace wire = nopfs::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> in = AsBytes(data, size);
  nopfs::Result<wire::Message> m = wire::Decode(in);

  // The two-step decode that RecvMessage does must agree with the one-step one.
  nopfs::Result<wire::Header> h = wire::DecodeHeader(in);
  if (h.ok() && size >= wire::kHeaderSize) {
    nopfs::Result<wire::Message> two = wire::DecodePayload(*h, in.subspan(wire::kHeaderSize));
    NOPFS_FUZZ_CHECK(two.ok() == m.ok());
    if (two.ok()) NOPFS_FUZZ_CHECK(*two == *m);
  } else {
    NOPFS_FUZZ_CHECK(!m.ok());
  }
  if (!m.ok()) return 0;

  NOPFS_FUZZ_CHECK(h->payload_length <= wire::kMaxPayload);
  NOPFS_FUZZ_CHECK(wire::TypeOf(m->body) == h->type);
  nopfs::Result<std::vector<std::byte>> again = wire::Encode(*m);
  NOPFS_FUZZ_CHECK(again.ok());
  NOPFS_FUZZ_CHECK(nopfs::fuzz::SameBytes(*again, in));
  if (const auto* e = std::get_if<wire::Error>(&m->body)) {
    const nopfs::Status st = wire::ToStatus(*e);
    NOPFS_FUZZ_CHECK(!st.ok());
    NOPFS_FUZZ_CHECK(wire::FromStatus(st).message == e->message);
  }
  return 0;
}
