// The kept area: the SSD tier's samples that nopfsd keeps on a node's local scratch when it stops
// (`--keep`), so that the next job on the same dataset starts warm (docs/tiers.md, "The kept
// area"). nopfsd writes and adopts kept datasets; the prolog, `nopfs gc` and `nopfs cache` (which
// may run as root inside the user's directory) list and remove them with ListKept and RemoveKept.
//
// Layout, inside the per-user directory (spank/user_dirs.h, service/tiers/ssd_tier.h):
//   <scratch>/nopfs-<uid>/kept/            0700, the user's kept datasets on this node
//   <scratch>/nopfs-<uid>/kept/<key>/      one kept dataset; key = 16 lowercase hex digits
//       data.0, data.1, ...                the samples' bytes (the SSD tier's data files, with the
//                                          slots that were not kept punched out)
//       index                              one record per kept sample (EncodeKeptIndex)
//       MANIFEST                           written last (temporary file, fsync, rename, fsync of
//                                          the directory): without a valid MANIFEST the directory
//                                          is incomplete, never trusted, only removed
//   <scratch>/nopfs-<uid>/kept/.tmp.*      being written or being adopted by a live nopfsd
//
// MANIFEST (at most kMaxManifestBytes; every integer little-endian, strings le32-length-prefixed,
// common/coding.h):
//   "NOPFSKPT" u32 version(=1) str key str dataset i64 created i64 last_used u64 samples
//   u64 index_bytes u64 index_xxh3 u32 data_files, then u64 xxh3 of every byte before it.
// index (at most kMaxIndexBytes):
//   "NOPFSKIX" u32 version(=1) u64 count, count × { str relative_path u64 offset u64 length
//   u64 xxh3 u64 file_size i64 mtime_ns i64 ctime_ns u64 inode u32 data_file u64 data_offset },
//   then u64 xxh3 of every byte before it.
//
// The keep record, beside a live SSD tier's data files (EncodeKeepRecord):
//   <scratch>/nopfs-<uid>/<job>.<node>/keep     written by nopfsd as its tier fills (temporary
//                                               file .tmp.keep, fsync, rename, fsync of the
//                                               directory): a MANIFEST and an index for data.N
//   "NOPFSKRC" u32 version(=1) str manifest str index, then u64 xxh3 of every byte before it.
// Root finishes a kept entry from it when nopfsd did not keep (kept/finish.h) in a private
//   <scratch>/nopfs-<uid>/kept/.tmp.finish.<job>.<node>    (no lock file: in use for 60 s)
// and renames it to kept/<key>.
//
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace nopfs::kept {

inline constexpr uint32_t kKeptVersion = 1;
inline constexpr uint64_t kMaxManifestBytes = 64 * 1024;
inline constexpr uint64_t kMaxIndexBytes = uint64_t{1} << 30;
inline constexpr uint32_t kMaxKeptDataFiles = 4096;

std::string KeptAreaDir(const std::string& user_dir);  // <user_dir>/kept

struct KeptDataset {
  std::string key, dir;  // dir = <kept>/<key>
  std::string dataset;   // the dataset root it holds (from MANIFEST)
  uint64_t bytes = 0;    // disk bytes of everything in it, whatever its shape (kept/tree.h)
  uint64_t samples = 0;
  int64_t created = 0, last_used = 0;  // unix seconds (MANIFEST fields)
  bool complete = false;               // a valid MANIFEST is present
};

// Every entry of <kept> (complete or not; .tmp.* as incomplete), sorted by name. Never follows a
// symlink; a MANIFEST is parsed with size limits (root reads it: hostile input) with
// common/coding.h. A missing <kept> is an empty list.
Result<std::vector<KeptDataset>> ListKept(const std::string& kept_dir);

// Removes <kept>/<key> (or a .tmp.* entry) and everything below it, at any depth, on descriptors
// (RemoveTreeAt, kept/tree.h: never follows a link, never leaves the tree); safe as root inside a
// user's directory. A missing entry is ok.
Status RemoveKept(const std::string& kept_dir, const std::string& name);
// The same inside the directory `kept_fd` (`shown`: its path, for messages).
Status RemoveKeptAt(int kept_fd, const std::string& shown, const std::string& name);

// A .tmp.* entry is in use while a live nopfsd holds the flock of its `lock` file (LockKeptEntry),
// and for kKeptLockGraceSeconds after its last change when it has no lock file yet.
inline constexpr int64_t kKeptLockGraceSeconds = 60;
// Takes the flock (LOCK_EX) of <dir>/lock, making the file if it is missing in a way that never
// shows it unlocked (common/lock_file.h); returns the descriptor, which holds the lock until
// closed. Unavailable when another process holds it.
Result<int> LockKeptEntry(const std::string& dir);
// Whether a live nopfsd writes or adopts <kept>/<name> (see above); never follows a symlink.
bool KeptEntryInUse(const std::string& kept_dir, const std::string& name);
// Whether <dir>/<name>/lock is held with flock by a live process (no grace, no link followed).
bool KeptLockHeld(const std::string& dir, const std::string& name);

// The key of a dataset: 16 lowercase hex digits of the xxh3 of the canonical dataset root and the
// scan options that change which samples it has (not the seed, epochs, nodes or ranks).
std::string KeptKey(std::string_view canonical_dataset, std::string_view scan_options);
// The scan options of a job's key (the catalog's scan; no options today), for the kept area and
// the sibling registry (service/reader/sibling.h) alike.
inline constexpr char kKeptScanOptions[] = "catalog/1";
// Whether `name` has the form of a key.
bool IsKeptKey(std::string_view name);

struct KeptManifest {
  std::string key;
  std::string dataset;
  int64_t created = 0, last_used = 0;  // unix seconds
  uint64_t samples = 0;
  uint64_t index_bytes = 0, index_xxh3 = 0;
  uint32_t data_files = 0;
};
std::string EncodeKeptManifest(const KeptManifest& m);
// Corruption naming what is wrong (truncated, bad magic or version, checksum mismatch, ...).
Result<KeptManifest> ParseKeptManifest(std::string_view bytes);

// One kept sample: the catalog entry it came from, the PFS file's stat when it was kept, and
// where its bytes are.
struct KeptSample {
  std::string relative_path;
  uint64_t offset = 0, length = 0;  // the sample's bytes in its file
  uint64_t xxh3 = 0;                // of those bytes
  uint64_t file_size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  uint64_t inode = 0;
  uint32_t data_file = 0;    // data.<data_file>
  uint64_t data_offset = 0;  // where the bytes start in it
};
std::string EncodeKeptIndex(const std::vector<KeptSample>& samples);
Result<std::vector<KeptSample>> ParseKeptIndex(std::string_view bytes);

// The keep record: what a live nopfsd with --keep commits beside its SSD tier's data files as the
// tier fills (<scratch>/nopfs-<uid>/<job>.<node>/keep, kKeepRecordName), so that a kept entry
// can be made from the tier's directory at any instant, by nopfsd at exit or by root's epilog
// when nopfsd was killed (kept/finish.h). A MANIFEST and an index, sealed together: its
// manifest's data_files counts the tier's data files, data.<n> of the tier's directory.
inline constexpr char kKeepRecordName[] = "keep";
// The most a keep record may hold. Root reads it whole to finish a kept entry (kept/finish.h),
// so it is bounded by what a real one needs, not by the index's own limit: 256 MiB holds the
// index of about 2.3 million samples with 40-byte relative paths (KeptIndexEntryBytes), more
// than ImageNet's 1.28 million training images. nopfsd records no sample past it
// (KeepCommitter); a larger record is refused unread.
inline constexpr uint64_t kMaxKeepRecordBytes = uint64_t{256} << 20;
// What the record holds besides its index's entries: its header and seal, the MANIFEST at its
// largest, and the index's header and seal.
inline constexpr uint64_t kKeepRecordOverheadBytes = 8 + 4 + 4 + kMaxManifestBytes + 4 + 8 + 28;
// The bytes one sample takes in an index (EncodeKeptIndex), by the length of its relative path.
inline constexpr uint64_t KeptIndexEntryBytes(uint64_t path_bytes) {
  return 4 + path_bytes + 7 * 8 + 4 + 8;
}
struct KeepRecord {
  KeptManifest manifest;
  std::vector<KeptSample> samples;
};
std::string EncodeKeepRecord(const KeptManifest& manifest, std::string_view index);
// Corruption naming what is wrong; the manifest's index size and xxh3 are checked against the
// index it carries.
Result<KeepRecord> ParseKeepRecord(std::string_view bytes);

// Writes `bytes` to <dir>/<name> durably: a temporary file, fsync, rename, fsync of `dir`.
Status WriteFileDurably(const std::string& dir, const std::string& name, std::string_view bytes);

}  // namespace nopfs::kept
