// The catalog's RocksDB encoding (see catalog_codec.h and docs/catalog.md).
#include "service/catalog_codec.h"

#include <cstring>

namespace nopfs::service::codec {
namespace {

void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLe(std::string_view in, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[pos + static_cast<size_t>(i)]))
         << (8 * i);
  }
  return v;
}

void PutBe32(std::string& out, uint32_t v) {
  for (int i = 3; i >= 0; --i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetBe32(std::string_view in, size_t pos) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i)
    v = (v << 8) | static_cast<unsigned char>(in[pos + i]);
  return v;
}

void PutString(std::string& out, std::string_view s) {
  PutLe(out, s.size(), 4);
  out.append(s);
}

// Reads a length-prefixed string at `pos`, advancing it; false if it does not fit.
bool GetString(std::string_view in, size_t& pos, std::string& out) {
  if (in.size() - pos < 4) return false;
  const uint64_t n = GetLe(in, pos, 4);
  pos += 4;
  if (in.size() - pos < n) return false;
  out.assign(in.substr(pos, n));
  pos += n;
  return true;
}

Status Bad(std::string_view what, std::string_view v) {
  return Status::Corruption("catalog database: malformed " + std::string(what) + " (" +
                            std::to_string(v.size()) + " bytes)");
}

std::string IdKey(char prefix, uint32_t id) {
  std::string k(1, prefix);
  PutBe32(k, id);
  return k;
}

}  // namespace

// Layout: le32 format, u8 kind, u8 reusable, le64 samples, le32 classes, le64 stamps,
// le64 fingerprint, le32 len + dataset, le32 len + root.
std::string EncodeCatalogMeta(const CatalogMeta& m) {
  std::string v;
  PutLe(v, m.format, 4);
  v.push_back(static_cast<char>(m.kind));
  v.push_back(m.reusable ? 1 : 0);
  PutLe(v, m.samples, 8);
  PutLe(v, m.classes, 4);
  PutLe(v, m.stamps, 8);
  PutLe(v, m.fingerprint, 8);
  PutString(v, m.dataset);
  PutString(v, m.root);
  return v;
}

Result<CatalogMeta> DecodeCatalogMeta(std::string_view v) {
  constexpr size_t kFixed = 4 + 1 + 1 + 8 + 4 + 8 + 8;
  if (v.size() < kFixed) return Bad("meta record", v);
  CatalogMeta m;
  m.format = static_cast<uint32_t>(GetLe(v, 0, 4));
  if (m.format != kCatalogFormat) {
    return Status::FailedPrecondition("catalog database has format " + std::to_string(m.format) +
                                      ", this nopfsd reads format " +
                                      std::to_string(kCatalogFormat));
  }
  const auto kind = static_cast<uint8_t>(v[4]);
  if (kind != static_cast<uint8_t>(DatasetKind::kImageFolder) &&
      kind != static_cast<uint8_t>(DatasetKind::kManifest)) {
    return Bad("meta record (kind)", v);
  }
  m.kind = static_cast<DatasetKind>(kind);
  // One encoding per record: the flag is 0 or 1 (any other byte is damage, not "true").
  if (v[5] != 0 && v[5] != 1) return Bad("meta record (reusable flag)", v);
  m.reusable = v[5] == 1;
  m.samples = GetLe(v, 6, 8);
  m.classes = static_cast<uint32_t>(GetLe(v, 14, 4));
  m.stamps = GetLe(v, 18, 8);
  m.fingerprint = GetLe(v, 26, 8);
  size_t pos = kFixed;
  if (!GetString(v, pos, m.dataset) || !GetString(v, pos, m.root) || pos != v.size()) {
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
  if (key.size() != 5 || key[0] != prefix) return Bad("id key", key);
  return GetBe32(key, 1);
}

Result<uint32_t> DecodeClassKey(std::string_view key) {
  if (key.size() != 5 || key[0] != kClassPrefix) return Bad("class key", key);
  return GetBe32(key, 1);
}

// Layout: le64 offset, le64 length, le64 label (two's complement; -1 = none), then the relative
// path's bytes to the end of the value.
std::string EncodeSampleValue(uint64_t offset, uint64_t length, int64_t label,
                              std::string_view relative_path) {
  std::string v;
  v.reserve(24 + relative_path.size());
  PutLe(v, offset, 8);
  PutLe(v, length, 8);
  PutLe(v, static_cast<uint64_t>(label), 8);
  v.append(relative_path);
  return v;
}

Result<SampleValue> DecodeSampleValue(std::string_view v) {
  if (v.size() < 25) return Bad("sample record", v);
  SampleValue s;
  s.offset = GetLe(v, 0, 8);
  s.length = GetLe(v, 8, 8);
  s.label = static_cast<int64_t>(GetLe(v, 16, 8));
  s.relative_path = v.substr(24);
  if (s.label < -1) return Bad("sample record (label)", v);
  return s;
}

// Layout: le64 mtime_ns (two's complement), le64 inode, le64 device, le64 size.
std::string EncodeStamp(const Stamp& s) {
  std::string v;
  PutLe(v, static_cast<uint64_t>(s.mtime_ns), 8);
  PutLe(v, s.inode, 8);
  PutLe(v, s.device, 8);
  PutLe(v, s.size, 8);
  return v;
}

Result<Stamp> DecodeStamp(std::string_view v) {
  if (v.size() != 32) return Bad("stamp record", v);
  Stamp s;
  s.mtime_ns = static_cast<int64_t>(GetLe(v, 0, 8));
  s.inode = GetLe(v, 8, 8);
  s.device = GetLe(v, 16, 8);
  s.size = GetLe(v, 24, 8);
  return s;
}

// Layout: le32 format, le64 fingerprint.
std::string EncodeChecksumMeta(const ChecksumMeta& m) {
  std::string v;
  PutLe(v, m.format, 4);
  PutLe(v, m.fingerprint, 8);
  return v;
}

Result<ChecksumMeta> DecodeChecksumMeta(std::string_view v) {
  if (v.size() != 12) return Bad("checksum meta record", v);
  ChecksumMeta m;
  m.format = static_cast<uint32_t>(GetLe(v, 0, 4));
  m.fingerprint = GetLe(v, 4, 8);
  return m;
}

std::string EncodeChecksum(uint64_t xxh3) {
  std::string v;
  PutLe(v, xxh3, 8);
  return v;
}

Result<uint64_t> DecodeChecksum(std::string_view v) {
  if (v.size() != 8) return Bad("checksum record", v);
  return GetLe(v, 0, 8);
}

}  // namespace nopfs::service::codec
