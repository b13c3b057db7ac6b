// Fuzz target: the catalog codec (service/catalog/catalog_codec.h). The catalog database may come
// from the admin's shared cache directory and the checksum database from a job's work directory, so
// every record is decoded as foreign bytes. The first input byte chooses the record (meta, sample,
// stamp, checksum meta, checksum, id key, class key); the rest is its bytes.
// Properties: no decoder reads outside the record; a record a decoder accepts re-encodes to
// exactly the same bytes (one encoding per value); accepted values are in range (label >= -1,
// dataset kind known, format the one this nopfsd reads).
#include <string>

#include "fuzz/fuzz_check.h"
#include "service/catalog/catalog_codec.h"

namespace codec = nopfs::service::codec;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // A view of libFuzzer's exactly sized buffer (no copy, whose spare capacity would hide a read
  // past the record from ASan).
  const std::string_view v(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 8) {
    case 0: {
      auto m = codec::DecodeCatalogMeta(v);
      if (!m.ok()) break;
      NOPFS_FUZZ_CHECK(m->format == codec::kCatalogFormat);
      NOPFS_FUZZ_CHECK(m->kind == codec::DatasetKind::kImageFolder ||
                       m->kind == codec::DatasetKind::kManifest);
      NOPFS_FUZZ_CHECK(codec::EncodeCatalogMeta(*m) == v);
      break;
    }
    case 1: {
      auto s = codec::DecodeSampleValue(v);
      if (!s.ok()) break;
      NOPFS_FUZZ_CHECK(s->label >= -1);
      NOPFS_FUZZ_CHECK(!s->relative_path.empty());
      NOPFS_FUZZ_CHECK(codec::EncodeSampleValue(s->offset, s->length, s->label, s->relative_path) ==
                       v);
      break;
    }
    case 2: {
      auto s = codec::DecodeStamp(v);
      if (s.ok()) NOPFS_FUZZ_CHECK(codec::EncodeStamp(*s) == v);
      break;
    }
    case 3: {
      auto m = codec::DecodeChecksumMeta(v);
      if (m.ok()) NOPFS_FUZZ_CHECK(codec::EncodeChecksumMeta(*m) == v);
      break;
    }
    case 4: {
      auto c = codec::DecodeChecksum(v);
      if (c.ok()) NOPFS_FUZZ_CHECK(codec::EncodeChecksum(*c) == v);
      break;
    }
    case 5:
    case 6: {
      const char prefix = data[0] % 8 == 5 ? codec::kSamplePrefix : codec::kChecksumPrefix;
      auto id = codec::DecodeIdKey(v, prefix);
      if (!id.ok()) break;
      NOPFS_FUZZ_CHECK(
          (prefix == codec::kSamplePrefix ? codec::SampleKey(*id) : codec::ChecksumKey(*id)) == v);
      break;
    }
    default: {
      auto label = codec::DecodeClassKey(v);
      if (label.ok()) NOPFS_FUZZ_CHECK(codec::ClassKey(*label) == v);
    }
  }
  return 0;
}
