// The RocksDB encoding of the dataset catalog: every key and value the catalog writes, in one
// place. docs/catalog.md describes the same bytes in prose; change both together and bump
// kCatalogFormat.
//
// Two databases:
//   the catalog DB (immutable once built; may be shared through the admin's cache directory)
//     "M"                 -> CatalogMeta
//     "C" + be32(label)   -> class name (raw bytes)
//     "S" + be32(id)      -> SampleValue
//     "T" + absolute path -> Stamp
//   the checksum DB (private to one job's work_dir; written while the job runs)
//     "M"                 -> ChecksumMeta
//     "X" + be32(id)      -> le64(xxh3 of the sample's bytes)
// Integers in values are little-endian fixed width; ids in keys are big-endian so that RocksDB's
// bytewise order is id order.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "policy/job.h"

namespace nopfs::service::codec {

inline constexpr uint32_t kCatalogFormat = 1;
inline constexpr std::string_view kMetaKey = "M";
inline constexpr char kClassPrefix = 'C';
inline constexpr char kSamplePrefix = 'S';
inline constexpr char kStampPrefix = 'T';
inline constexpr char kChecksumPrefix = 'X';

enum class DatasetKind : uint8_t { kImageFolder = 1, kManifest = 2 };

struct CatalogMeta {
  uint32_t format = kCatalogFormat;
  DatasetKind kind = DatasetKind::kImageFolder;
  bool reusable = false;     // every stamp was older than the racy window when it was taken
  uint64_t samples = 0;      // F
  uint32_t classes = 0;      // number of "C" entries
  uint64_t stamps = 0;       // number of "T" entries
  uint64_t fingerprint = 0;  // xxh3 over every sample entry (see Fingerprint in catalog.cc)
  std::string dataset;       // the dataset's absolute real path (directory or manifest file)
  std::string root;          // absolute directory that relative paths are relative to
};

struct SampleValue {
  uint64_t offset = 0;
  uint64_t length = 0;
  int64_t label = -1;
  std::string_view relative_path;  // points into the decoded buffer
};

struct Stamp {
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  uint64_t device = 0;
  uint64_t size = 0;
  bool operator==(const Stamp&) const = default;
};

struct ChecksumMeta {
  uint32_t format = kCatalogFormat;
  uint64_t fingerprint = 0;  // the catalog's fingerprint the checksums belong to
};

std::string EncodeCatalogMeta(const CatalogMeta& m);
Result<CatalogMeta> DecodeCatalogMeta(std::string_view v);

std::string ClassKey(uint32_t label);
std::string SampleKey(policy::SampleId id);
std::string StampKey(std::string_view absolute_path);
std::string ChecksumKey(policy::SampleId id);
// The id of an "S" or "X" key; Corruption for anything else.
Result<policy::SampleId> DecodeIdKey(std::string_view key, char prefix);
// The label of a "C" key.
Result<uint32_t> DecodeClassKey(std::string_view key);

std::string EncodeSampleValue(uint64_t offset, uint64_t length, int64_t label,
                              std::string_view relative_path);
Result<SampleValue> DecodeSampleValue(std::string_view v);

std::string EncodeStamp(const Stamp& s);
Result<Stamp> DecodeStamp(std::string_view v);

std::string EncodeChecksumMeta(const ChecksumMeta& m);
Result<ChecksumMeta> DecodeChecksumMeta(std::string_view v);
std::string EncodeChecksum(uint64_t xxh3);
Result<uint64_t> DecodeChecksum(std::string_view v);

}  // namespace nopfs::service::codec
