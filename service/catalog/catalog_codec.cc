// The catalog's RocksDB encoding (see catalog_codec.h and docs/catalog.md).
#include "service/catalog/catalog_codec.h"

#include "common/coding.h"

namespace nopfs::service::codec {
namespace {

using coding::Reader;
using coding::StringWriter;

Status Bad(std::string_view what, std::string_view v) {
  return Status::Corruption("catalog database: malformed " + std::string(what) + " (" +
                            std::to_string(v.size()) + " bytes)");
}

std::string IdKey(char prefix, uint32_t id) {
  StringWriter k(std::string(1, prefix));
  k.BigEndian32(id);
  return k.Take();
}

// A 5-byte key: `prefix`, then a big-endian id.
Result<uint32_t> DecodeKey(std::string_view key, char prefix, std::string_view what) {
  Reader r(key);
  uint8_t first = 0;
  uint32_t id = 0;
  if (key.size() != 5 || !r.U8(&first) || first != static_cast<uint8_t>(prefix) ||
      !r.BigEndian32(&id)) {
    return Bad(what, key);
  }
  return id;
}

}  // namespace

// Layout: le32 format, u8 kind, u8 reusable, le64 samples, le32 classes, le64 stamps,
// le64 fingerprint, le32 len + dataset, le32 len + root.
std::string EncodeCatalogMeta(const CatalogMeta& m) {
  StringWriter v;
  v.U32(m.format);
  v.U8(static_cast<uint8_t>(m.kind));
  v.U8(m.reusable ? 1 : 0);
  v.U64(m.samples);
  v.U32(m.classes);
  v.U64(m.stamps);
  v.U64(m.fingerprint);
  v.Str(m.dataset);
  v.Str(m.root);
  return v.Take();
}

Result<CatalogMeta> DecodeCatalogMeta(std::string_view v) {
  Reader r(v);
  CatalogMeta m;
  uint8_t kind = 0;
  uint8_t reusable = 0;
  if (!(r.U32(&m.format) && r.U8(&kind) && r.U8(&reusable) && r.U64(&m.samples) &&
        r.U32(&m.classes) && r.U64(&m.stamps) && r.U64(&m.fingerprint))) {
    return Bad("meta record", v);
  }
  if (m.format != kCatalogFormat) {
    return Status::FailedPrecondition("catalog database has format " + std::to_string(m.format) +
                                      ", this nopfsd reads format " +
                                      std::to_string(kCatalogFormat));
  }
  if (kind != static_cast<uint8_t>(DatasetKind::kImageFolder) &&
      kind != static_cast<uint8_t>(DatasetKind::kManifest)) {
    return Bad("meta record (kind)", v);
  }
  m.kind = static_cast<DatasetKind>(kind);
  // One encoding per record: the flag is 0 or 1 (any other byte is damage, not "true").
  if (reusable != 0 && reusable != 1) return Bad("meta record (reusable flag)", v);
  m.reusable = reusable == 1;
  if (!r.Str(&m.dataset) || !r.Str(&m.root) || !r.done()) {
    return Bad("meta record", v);
  }
  return m;
}

std::string ClassKey(uint32_t label) {
  return IdKey(kClassPrefix, label);
}
std::string SampleKey(policy::SampleId id) {
  return IdKey(kSamplePrefix, id);
}
std::string ChecksumKey(policy::SampleId id) {
  return IdKey(kChecksumPrefix, id);
}

std::string StampKey(std::string_view absolute_path) {
  std::string k(1, kStampPrefix);
  k.append(absolute_path);
  return k;
}

Result<policy::SampleId> DecodeIdKey(std::string_view key, char prefix) {
  return DecodeKey(key, prefix, "id key");
}

Result<uint32_t> DecodeClassKey(std::string_view key) {
  return DecodeKey(key, kClassPrefix, "class key");
}

// Layout: le64 offset, le64 length, le64 label (two's complement; -1 = none), then the relative
// path's bytes to the end of the value.
std::string EncodeSampleValue(uint64_t offset, uint64_t length, int64_t label,
                              std::string_view relative_path) {
  StringWriter v;
  v.Reserve(24 + relative_path.size());
  v.U64(offset);
  v.U64(length);
  v.U64(static_cast<uint64_t>(label));
  v.Bytes(relative_path);
  return v.Take();
}

Result<SampleValue> DecodeSampleValue(std::string_view v) {
  if (v.size() < 25) return Bad("sample record", v);
  Reader r(v);
  SampleValue s;
  uint64_t label = 0;
  if (!(r.U64(&s.offset) && r.U64(&s.length) && r.U64(&label))) return Bad("sample record", v);
  s.label = static_cast<int64_t>(label);
  s.relative_path = v.substr(r.pos());
  if (s.label < -1) return Bad("sample record (label)", v);
  return s;
}

// Layout: le64 mtime_ns (two's complement), le64 inode, le64 device, le64 size.
std::string EncodeStamp(const Stamp& s) {
  StringWriter v;
  v.U64(static_cast<uint64_t>(s.mtime_ns));
  v.U64(s.inode);
  v.U64(s.device);
  v.U64(s.size);
  return v.Take();
}

Result<Stamp> DecodeStamp(std::string_view v) {
  Reader r(v);
  Stamp s;
  uint64_t mtime_ns = 0;
  if (v.size() != 32 ||
      !(r.U64(&mtime_ns) && r.U64(&s.inode) && r.U64(&s.device) && r.U64(&s.size))) {
    return Bad("stamp record", v);
  }
  s.mtime_ns = static_cast<int64_t>(mtime_ns);
  return s;
}

// Layout: le32 format, le64 fingerprint.
std::string EncodeChecksumMeta(const ChecksumMeta& m) {
  StringWriter v;
  v.U32(m.format);
  v.U64(m.fingerprint);
  return v.Take();
}

Result<ChecksumMeta> DecodeChecksumMeta(std::string_view v) {
  Reader r(v);
  ChecksumMeta m;
  if (v.size() != 12 || !(r.U32(&m.format) && r.U64(&m.fingerprint))) {
    return Bad("checksum meta record", v);
  }
  return m;
}

std::string EncodeChecksum(uint64_t xxh3) {
  StringWriter v;
  v.U64(xxh3);
  return v.Take();
}

Result<uint64_t> DecodeChecksum(std::string_view v) {
  Reader r(v);
  uint64_t xxh3 = 0;
  if (v.size() != 8 || !r.U64(&xxh3)) return Bad("checksum record", v);
  return xxh3;
}

}  // namespace nopfs::service::codec
