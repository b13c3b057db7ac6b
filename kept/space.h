// The kept datasets of every user on a node, and the rules that bound them: the policy's quota
// and lifetime per user, the node's SSD capacity, incomplete entries (kept/area.h) and whatever
// else a user leaves in <ssd path>/nopfs-<uid>/. Used by the prolog (nopfs-job, as root, before
// admitting a job), the epilog, `nopfs gc` (root) and `nopfs cache` (the user, on the user's own
// kept area).
//
// A user's directory is reached through a descriptor of <ssd path>/nopfs-<uid> opened without
// following a link and checked to be a directory of that uid, then through /proc/self/fd/N, so a
// user who swaps the directory for a link (in a sticky scratch directory) never moves root's
// listing or removal elsewhere. Sizes and removals go through kept/tree.h: every inode at any
// depth, no link followed.
//
// Root's view (ScanOptions::root) is everything in nopfs-<uid>/, each name one of:
//   kept/<name>   a kept dataset, complete or not (kept/area.h)
//   a live job's  <job>.<node> or .tmp.<job>.<node>.* of a job the ledger holds (ScanOptions::
//   directory     live): the job's SSD reservation counts it, so it is neither counted here nor
//                 removed
//   live/<entry>  the sibling registry (service/reader/sibling.h): an entry <key>.<job>.<node>
//                 (or .tmp.<key>.<job>.<node>) of a live job is that job's; any other entry is
//                 a stray (in use for kKeptLockGraceSeconds after its last change: a job
//                 admitted after the epilog read the ledger registers meanwhile). Without
//                 ScanOptions::live (`nopfs gc`, which does not read the ledger), all of live/
//                 is one stray in use.
//   a stray       anything else (a loose file, a renamed job directory, `kept` when it is not a
//                 directory): counted against the user, removed by Sweep
// and the times that count are root's own (kept/record.h): a dataset root has no record of is
// recorded as first seen and last used now. The user's view (`nopfs cache`) lists kept/ only,
// with the MANIFEST's times.
//
// An entry is in use while a live process holds it: a .tmp.* dataset or a stray with a `lock`
// file that someone holds with flock, or without one and changed in the last
// kKeptLockGraceSeconds, or a kept dataset whose `lock` someone holds (a job that keeps nothing
// reads it where it is). It is counted (HeldBytes) and never removed.
//
// What is removed, and why (the `why` of each Removal):
//   incomplete   an entry of kept/ that is not a key with a valid MANIFEST and is not in use
//   stray        a stray not in use
//   expired      a complete dataset whose last use is more than the user's lifetime ago
//   over quota   the user's least recently used datasets while everything the user has counted
//                exceeds the quota (a quota of 0: everything the user kept)
//   space        the least recently used datasets of any user while the node's removable kept
//                bytes exceed the room a new job leaves (MakeRoom)
//
// Thread safety: a KeptNode is used from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "kept/area.h"
#include "kept/record.h"

namespace nopfs::kept {

struct KeptEntry {
  uint32_t uid = 0;
  size_t area = 0;      // which of KeptNode's areas (one per user and SSD path)
  KeptDataset data;     // data.dir is the path as shown (<ssd path>/nopfs-<uid>/kept/<name>; for a
                        // stray <ssd path>/nopfs-<uid>/<name>, data.key being <name>)
  bool stray = false;   // root's view: outside kept/, and not a live job's directory
  std::string under;    // a stray's directory in nopfs-<uid>/: "" or kLiveDir
  bool in_use = false;  // held by a live process: counted, never removed
  // The times the rules use: root's record in root's view, the MANIFEST's in the user's.
  RootTimes times;
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
  std::string why;  // "incomplete", "stray", "expired", "over quota", "space", "asked"
  Status status;    // of RemoveKept
};

struct ScanOptions {
  std::optional<uint32_t> only_uid;  // set: that user's directory only
  // Root's view (above): everything in nopfs-<uid>/ and root's record of times, which Scan
  // opens and locks for the KeptNode's life, waiting kRootRecordTimeout at most while another
  // KeptNode holds it (of any process, this one too: end one before scanning again).
  bool root = false;
  // Root's view: whether datasets root sees for the first time are written to the record (the
  // prolog and the epilog) or only taken as "now" (`nopfs gc`). Records of datasets that are
  // gone are dropped either way.
  bool record_new = true;
  // Root's view: whether <name> in nopfs-<uid>/ is a directory of a job the ledger holds.
  std::function<bool(uint32_t uid, const std::string& name)> live;
  int64_t now = 0;  // unix seconds; 0: time(nullptr)
};

inline constexpr std::chrono::milliseconds kRootRecordTimeout{30000};
// The running jobs' sibling registry in nopfs-<uid>/ (service/reader/sibling.h).
inline constexpr char kLiveDir[] = "live";

// Whether `name` in nopfs-<uid>/ is the SSD directory of job `job_id` on node index `index`:
// <job>.<index>, or .tmp.<job>.<index>.* while the tier is being made (service/tiers/ssd_tier.h).
bool IsJobDir(const std::string& name, uint64_t job_id, uint32_t index);

class KeptNode {
 public:
  // Lists <path>/nopfs-<uid>/ of every user (uid: every directory nopfs-<number> owned by that
  // uid; anything else is skipped) under each SSD path, or only of `only_uid`: kept/ only (the
  // user's view) or everything (root's view). A path, a user directory or root's record that
  // cannot be read is noted in errors(), not fatal (without the record, every dataset of that
  // path counts as used now: nothing expires, nothing is evicted by age first).
  static KeptNode Scan(const std::vector<std::string>& ssd_paths, const ScanOptions& options);
  static KeptNode Scan(const std::vector<std::string>& ssd_paths,
                       std::optional<uint32_t> only_uid = std::nullopt) {
    ScanOptions o;
    o.only_uid = only_uid;
    return Scan(ssd_paths, o);
  }
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
  uint64_t HeldBytes() const;            // the entries in use, which nothing here removes

  // Root's view: a job of `uid` used the datasets `used` picks (the epilog: those of the job's
  // dataset, which it adopted or kept); their last use is now in root's record.
  void MarkUsed(uint32_t uid, const std::function<bool(const KeptEntry&)>& used);

  // Removes one entry (by data.key and area) and forgets it.
  Removal Remove(const KeptEntry& e, std::string why);

  // Applies incomplete, expired and over-quota removal to every user with entries. `limits` gives a
  // user's quota and lifetime (the policy's keep hook); `now` is in unix seconds.
  std::vector<Removal> Sweep(const std::function<KeepLimits(uint32_t uid)>& limits, int64_t now);
  // Removes the least recently used complete datasets of any user, except those `keep` holds,
  // while Bytes() - HeldBytes() exceeds `room`.
  std::vector<Removal> MakeRoom(uint64_t room,
                                const std::function<bool(const KeptEntry&)>& keep = nullptr);

 private:
  struct Area;
  KeptNode();
  void Forget(const KeptEntry& e);
  void ScanLive(size_t area, const ScanOptions& o);
  void SaveRecords();
  std::vector<std::unique_ptr<Area>> areas_;
  std::vector<std::unique_ptr<RootRecord>> records_;  // per SSD path (null: none)
  int64_t now_ = 0;
  std::vector<KeptEntry> entries_;
  std::vector<std::string> errors_;
};

// "uid 1000 0123456789abcdef (/pfs/d, 2.1 GB, expired); ..." ("" for none).
std::string DescribeRemovals(const std::vector<Removal>& removals);

// "40s", "10m", "3h", "2d": an age in seconds, as `nopfs cache ls` shows it.
std::string FormatAge(int64_t seconds);

}  // namespace nopfs::kept
