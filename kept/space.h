// The kept datasets of every user on a node, and the rules that bound them: the policy's quota
// and lifetime per user, the node's SSD capacity, incomplete entries (kept/area.h). Used by
// the prolog (nopfs-job, as root, before admitting a job), the epilog, `nopfs gc` (root) and
// `nopfs cache` (the user, on the user's own kept area).
//
// A user's kept area is reached through a descriptor of <ssd path>/nopfs-<uid> opened without
// following a link and checked to be a directory of that uid, then through /proc/self/fd/N, so a
// user who swaps the directory for a link (in a sticky scratch directory) never moves root's
// listing or removal elsewhere; ListKept and RemoveKept never follow a link below it.
//
// What is removed, and why (the `why` of each Removal):
//   incomplete   an entry that is not a key with a valid MANIFEST; a .tmp.* entry only when no
//                live nopfsd writes or adopts it (KeptEntryInUse: its lock file's flock)
//   expired      a complete dataset whose last use is more than the user's lifetime ago
//   over quota   the user's least recently used datasets while the user's kept bytes exceed the
//                quota (a quota of 0: everything the user kept)
//   space        the least recently used datasets of any user while the node's kept bytes
//                exceed the room a new job leaves (MakeRoom)
//
// Thread safety: a KeptNode is used from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "kept/area.h"

namespace nopfs::kept {

struct KeptEntry {
  uint32_t uid = 0;
  size_t area = 0;   // which of KeptNode's areas (one per user and SSD path)
  KeptDataset data;  // data.dir is the path as shown (<ssd path>/nopfs-<uid>/kept/<name>)
  // A complete dataset (its name is a key and its MANIFEST is valid).
  bool Complete() const { return data.complete; }
  // A keep or an adoption that may be under way (.tmp.*).
  bool Pending() const { return data.key.rfind(".tmp.", 0) == 0; }
};

struct KeepLimits {
  uint64_t quota = 0;    // the user's kept bytes on this node; 0: nothing may be kept
  int64_t lifetime = 0;  // seconds after the last use; 0: no limit
};

struct Removal {
  KeptEntry entry;
  std::string why;  // "incomplete", "expired", "over quota", "space", "asked"
  Status status;    // of RemoveKept
};

class KeptNode {
 public:
  // Lists <path>/nopfs-<uid>/kept of every user (uid: every directory nopfs-<number> owned by
  // that uid; anything else is skipped) under each SSD path, or only of `only_uid`. A path or a
  // user directory that cannot be read is noted in errors(), not fatal.
  static KeptNode Scan(const std::vector<std::string>& ssd_paths,
                       std::optional<uint32_t> only_uid = std::nullopt);
  KeptNode(KeptNode&&) noexcept;
  KeptNode& operator=(KeptNode&&) noexcept;
  KeptNode(const KeptNode&) = delete;
  KeptNode& operator=(const KeptNode&) = delete;
  ~KeptNode();

  const std::vector<KeptEntry>& entries() const { return entries_; }
  const std::vector<std::string>& errors() const { return errors_; }
  std::vector<uint32_t> Users() const;
  uint64_t Bytes() const;                // every entry
  uint64_t BytesOf(uint32_t uid) const;  // the user's entries

  // Removes one entry (by data.key and area) and forgets it.
  Removal Remove(const KeptEntry& e, std::string why);

  // Applies incomplete, expired and over-quota removal to every user with entries. `limits` gives a
  // user's quota and lifetime (the policy's keep hook); `now` is in unix seconds.
  std::vector<Removal> Sweep(const std::function<KeepLimits(uint32_t uid)>& limits, int64_t now);
  // Removes the least recently used complete datasets of any user, except those `keep` holds,
  // while Bytes() exceeds `room`.
  std::vector<Removal> MakeRoom(uint64_t room,
                                const std::function<bool(const KeptEntry&)>& keep = nullptr);

 private:
  struct Area;
  KeptNode();
  std::vector<std::unique_ptr<Area>> areas_;
  std::vector<KeptEntry> entries_;
  std::vector<std::string> errors_;
};

// "uid 1000 0123456789abcdef (/pfs/d, 2.1 GB, expired); ..." ("" for none).
std::string DescribeRemovals(const std::vector<Removal>& removals);

// "40s", "10m", "3h", "2d": an age in seconds, as `nopfs cache ls` shows it.
std::string FormatAge(int64_t seconds);

}  // namespace nopfs::kept
