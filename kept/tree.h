// A tree a user made, measured and taken apart by root without trusting its shape: iteratively,
// one directory descriptor open at a time, never following a symbolic link, at any depth.
//
// The walk goes down by openat(O_NOFOLLOW | O_DIRECTORY) from the directory it is in and back up
// by openat(".."), checking that ".." is the directory it came from (device and inode): a
// directory moved elsewhere while it is walked ends the walk with an error, never a walk of
// another tree. Where it was in a directory is its readdir position (telldir, the d_off every
// Linux file system keeps stable for NFS), so memory grows only with the depth (one small record
// per level, the child's name too when removing), never with a directory's size, and no depth is
// too deep. A directory on another file system (a mount point) is counted as itself only and
// never entered.
//
// Bytes are st_blocks * 512 of every inode met (directories, links and files alike, a link never
// followed); a file with several links inside the tree counts once (the first kMaxLinkedInodes
// such inodes are remembered, the rest count at every link: never less than the truth).
//
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace nopfs::kept {

inline constexpr uint64_t kMaxLinkedInodes = uint64_t{1} << 20;

struct TreeUsage {
  uint64_t bytes = 0;   // st_blocks * 512 of everything below and including the entry
  uint64_t inodes = 0;  // inodes counted
  Status status;        // ok, or why the walk stopped early (bytes then count what was seen)
};

// The disk use of `name` in the directory `dir_fd` (a file, a link or a whole tree). A missing
// entry is zero bytes. `shown` names the entry in errors.
TreeUsage UsageAt(int dir_fd, const std::string& name, const std::string& shown);

// Removes `name` in the directory `dir_fd` and everything below it, as above. A missing entry is
// ok. A directory that keeps refilling while it is emptied, or that was moved away meanwhile, is
// an error that names it (what was removed stays removed).
Status RemoveTreeAt(int dir_fd, const std::string& name, const std::string& shown);

}  // namespace nopfs::kept
