// Root's own record of every user's kept datasets under one SSD path: when root first saw each
// one and when a job of its user last used it. The lifetime and the eviction order (kept/space.h)
// are taken from it, never from the times in a MANIFEST, which is the user's file and says
// whatever the user writes in it.
//
// Where: <ssd path>/.nopfs-root/kept, in a directory of root's (the uid that runs this code),
// mode 0700, that no user can enter. A `.nopfs-root` that is anything else (a user's directory
// made first in a sticky scratch directory, a link, a file) is removed, never followed, and made
// anew. The file is written whole (temporary file, fsync, rename, fsync of the directory); while
// a RootRecord is open it holds flock(LOCK_EX) on the directory, so that the prologs, epilogs and
// `nopfs gc` of one node take turns.
//
// Format: text, one line per dataset, "<uid> <key> <first seen> <last used>" (unix seconds), keys
// being 16 hex digits (kept/area.h IsKeptKey); a line that does not parse is dropped.
//
// Thread safety: use a RootRecord from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "common/status.h"
#include "common/unique_fd.h"

namespace nopfs::kept {

inline constexpr char kRootRecordDir[] = ".nopfs-root";
inline constexpr uint64_t kMaxRootRecordBytes = 64ull << 20;

struct RootTimes {
  int64_t first_seen = 0;  // unix seconds
  int64_t last_used = 0;
};

class RootRecord {
 public:
  // Opens (making it if needed) the record of `ssd_path` and locks it, waiting up to `timeout`.
  // *note says when a `.nopfs-root` that was not root's had to be removed first.
  static Result<RootRecord> Open(const std::string& ssd_path, std::chrono::milliseconds timeout,
                                 std::string* note);
  RootRecord(RootRecord&&) noexcept = default;
  RootRecord& operator=(RootRecord&&) noexcept = default;

  using Key = std::pair<uint32_t, std::string>;  // uid, kept key
  std::map<Key, RootTimes>& times() { return times_; }
  // Writes the record if it changed since Open or the last Save.
  Status Save();
  void Touch() { dirty_ = true; }

 private:
  RootRecord(UniqueFd dir, std::string shown) : dir_(std::move(dir)), shown_(std::move(shown)) {}
  UniqueFd dir_;  // <ssd path>/.nopfs-root, flock()ed
  std::string shown_;
  std::map<Key, RootTimes> times_;
  bool dirty_ = false;
};

std::string FormatRootRecord(const std::map<RootRecord::Key, RootTimes>& times);
std::map<RootRecord::Key, RootTimes> ParseRootRecord(const std::string& text);

}  // namespace nopfs::kept
