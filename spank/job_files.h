// What nopfs-job does with files and processes as root, kept apart from its command line so
// that it can be unit-tested: safe removal of directories that users own, finding a job's nopfsd
// processes, and stopping them.
//
// Removal never follows a symbolic link: the trusted parent is opened by path, everything below
// it by openat(O_NOFOLLOW), so a user who swaps a directory for a link cannot make root delete
// anything outside the job's own tree.
//
// Thread safety: functions are reentrant.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"

namespace nopfs::spank {

// Removes `parent`/`name` (a directory tree or a file) without following links; ok when absent.
// `parent` itself must be trusted (root-owned path).
Status RemoveBelow(const std::string& parent, const std::string& name);

// Removes `root`/`user_dir`/`name` where `root` is trusted but `user_dir` belongs to user `uid`:
// `user_dir` is opened without following a link and must be a directory owned by `uid`. Then
// removes `user_dir` too when it is left empty. Ok when absent.
Status RemoveBelowUserDir(const std::string& root, const std::string& user_dir, uid_t uid,
                          const std::string& name);

// Writes `text` to `dir`/`name` as a new file owned by uid:gid with `mode`, through a fresh
// temporary file and rename, so that a link planted under that name is replaced, never written
// through.
Status WriteFileAs(const std::string& dir, const std::string& name, const std::string& text,
                   uid_t uid, gid_t gid, mode_t mode = 0644);

// Processes (not zombies) of real uid `uid` whose command line holds "--run-dir" followed by
// `run_dir`: the job's nopfsd on this node.
std::vector<pid_t> FindDaemons(uid_t uid, const std::string& run_dir);

// SIGTERM to each, then SIGKILL to those still alive after `grace`; waits up to a few more
// seconds for them to go. Returns the pids still alive at the end (normally none).
std::vector<pid_t> StopProcesses(const std::vector<pid_t>& pids, std::chrono::milliseconds grace);

// Reads a small text file (at most 64 KiB); "" when it cannot.
std::string ReadText(const std::string& path);

}  // namespace nopfs::spank
