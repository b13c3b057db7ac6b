// User dirs: the per-user directories that nopfsd keeps below directories every user shares, made
// and checked by root in the prolog, so that no other user can take one first.
//
//   <ssd class path>/nopfs-<uid>/    the SSD tier's jobs (service/tiers/ssd_tier.h)
//   <catalog_cache>/<uid>/           the user's cached dataset catalogs (service/catalog/catalog.h)
//
// The parents are the admin's: owned by root and writable by no one else (mode 0755 or 0711), or,
// tolerated, root-owned and sticky (1777). Each per-user directory ends as a real directory (not a
// symbolic link) owned by uid:gid, mode 0700. Something else in its place (another user's
// directory made in a sticky parent, a file, a link) is renamed aside to
// `.squatted.<name>.<time>.<pid>.<n>` in the same parent, never followed or opened, and a fresh
// directory is made. An empty directory of root's under the name is another prolog's of the same
// user, caught between its mkdirat and its fchown: it is given to the user too, so that two
// prologs at once end with the same directory. Every `.squatted.*` entry of the parent (moved
// aside now, by an earlier prolog, or planted by a user in a sticky parent) is then removed as a
// hostile tree: by directory descriptors, never following a link (job_files.h RemoveBelowAt).
// Every step works on descriptors (openat, mkdirat, fstatat with AT_SYMLINK_NOFOLLOW, fchown,
// fchmod), so no path is followed twice.
//
// Thread safety: reentrant.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"
#include "lua/config.h"

namespace nopfs::spank {

// Makes <parent>/<name> as above. On success *note says what was done when it was more than a
// check ("made", "moved aside ...", "removed <parent>/.squatted...", each part after "; "; user
// names made printable); empty otherwise. An error names the path and what to do.
Status PrepareUserDir(const std::string& parent, const std::string& name, uid_t uid, gid_t gid,
                      std::string* note);

// PrepareUserDir for every SSD class of `config` and for its catalog cache. Never fails: returns
// one line per directory that was made, repaired or could not be prepared (nopfsd then reports
// the SSD directory or runs without the catalog cache).
std::vector<std::string> PrepareUserDirs(const lua::NodeConfig& config, uid_t uid, gid_t gid);

}  // namespace nopfs::spank
