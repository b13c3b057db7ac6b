// Root's finishing of a kept entry (docs/tiers.md, "The kept area"): when a job's nopfsd did not
// keep at exit (killed with SIGKILL, crashed), the epilog makes a kept entry from the keep record
// that nopfsd committed beside its SSD tier's data files as the tier filled (kept/area.h), before
// it removes the tier's directory.
//
// Everything in the user's directory is hostile: the tier's directory, the record and the data
// files are reached by descriptors relative to the user's directory (openat, O_NOFOLLOW, never a
// link followed), must be the user's (regular files with one link), and the record is checked
// structurally (size limits, its checksums, every record's range inside its data file). The
// entry is built in a private kept/.tmp.finish.<tier> (mkdirat, then fchown to the user; the
// data files renamed into it and checked to be the inodes validated; `index` and `MANIFEST`
// written O_EXCL | O_NOFOLLOW, fchown, fsync) and renamed to kept/<key> last. What fails
// validation is removed, never kept; a kill at any point leaves at most an incomplete entry.
// Nothing here trusts the samples' bytes: the next job's nopfsd checks each against its PFS file
// and its xxh3 when it adopts the entry.
//
// Thread safety: reentrant.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace nopfs::kept {

struct FinishRequest {
  // <scratch>/nopfs-<uid>, opened O_DIRECTORY | O_NOFOLLOW by the caller and checked to be the
  // uid's; `user_dir` is its path, for messages.
  int user_dir_fd = -1;
  std::string user_dir;
  uid_t uid = 0;
  std::string tier_name;   // "<job>.<node>": the SSD tier's directory in it
  std::string dataset;     // the MANIFEST's dataset (root's record of the job, not the user's)
  uint64_t max_bytes = 0;  // padded sample bytes kept at most (the policy's grant; 0: no limit)
  int64_t now = 0;         // unix seconds: the MANIFEST's created and last_used
  // Tests: returns after this many changes on disk without undoing them, as a kill would (0:
  // never).
  uint32_t abandon_after = 0;
};

struct FinishResult {
  bool found = false;    // the tier's directory holds a keep record
  std::string key;       // the kept entry's key
  std::string dir;       // <user_dir>/kept/<key>
  uint64_t samples = 0;  // kept
  uint64_t dropped = 0;  // samples of the record beyond max_bytes
  uint64_t bytes = 0;    // disk bytes of the entry's data files
};

// Makes <user_dir>/kept/<key> from <user_dir>/<tier_name>/keep and the data files it names
// (moved, not copied; the bytes of the samples not kept punched out), replacing an older entry of
// the key. found=false (ok) when there is no tier directory or no record. Any other error names
// what was wrong; whatever the call made is removed then (the tier's directory is left as it is,
// for the caller to remove).
Result<FinishResult> FinishKept(const FinishRequest& r);

}  // namespace nopfs::kept
