// LockFileIn: an exclusive flock(2) on a lock file that is never seen unlocked while it is being
// made, for directories that a cleaner judges by their lock (a free lock = a dead owner).
//
// open(O_CREAT) followed by flock() leaves a moment in which the file exists but is not locked:
// a cleaner that opens and locks it then takes its owner for dead and removes the directory
// being built. Here a missing lock file is made under a temporary name, locked, and only then
// linked to its name, so that the name appears already locked (or not at all).
//
// Thread safety: reentrant.
#pragma once

#include <string>

#include "common/status.h"

namespace nopfs {

// Takes LOCK_EX on <dir>/<name> without waiting, making the file (mode 0600) if it is missing.
// Returns the descriptor that holds the lock (closing it releases the lock), -1 when another
// process holds it, or an error that names the file. Never follows a symlink at <dir>/<name>.
Result<int> LockFileIn(const std::string& dir, const std::string& name);

}  // namespace nopfs
