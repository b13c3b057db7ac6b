// What nopfs-job and the plugin do with files and processes as root (or inside slurmstepd),
// kept apart from their command lines so that it can be unit-tested: reading a file that the
// job's user controls, opening trusted (root-owned) directories, safe removal of directories that
// users own, writing a file into a user's directory, and stopping the job's nopfsd.
//
// Nothing here follows a symbolic link that a user could have planted, blocks on a file a user
// could have made a FIFO, or finds a process by anything its user can rewrite:
// - a user's file is opened with O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, then fstat'ed: it must be a
//   regular file of the expected owner, under a size cap (ReadUserFile);
// - a trusted directory is reached by walking from "/" with openat(O_NOFOLLOW | O_DIRECTORY), each
//   component checked (OpenTrustedDir); removal below it is done with unlinkat on directory fds;
// - a process is named by its pid and start time (as the ledger records them), and signalled
//   through a pidfd opened before its start time is checked, so a reused pid is never hit.
//
// Thread safety: functions are reentrant.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/printable.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace nopfs::spank {

// An owned file descriptor (common/unique_fd.h).
using ::nopfs::UniqueFd;

// Reads `dir_fd`/`name` (or `path`), a file that a user may have replaced by anything: opened
// with O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, so a link fails and a FIFO or device opens
// without blocking; then it must be a regular file owned by `owner`, of at most `max_bytes`.
// NotFound when absent; PermissionDenied (naming what was found) for a link, a FIFO, a directory,
// a device, another owner or a larger file. Never blocks. With `path`, only its last component is
// unchecked territory: the directories above it must be ones the user cannot change.
Result<std::string> ReadUserFile(int dir_fd, const std::string& name, uid_t owner,
                                 size_t max_bytes);
Result<std::string> ReadUserFile(const std::string& path, uid_t owner, size_t max_bytes);

// Opens the directory at the absolute `path` by walking from "/" with
// openat(O_NOFOLLOW | O_DIRECTORY), one component at a time, and checks each: a directory (not a
// link), owned by root or by this process's effective uid, and not writable by group or others,
// except that a directory above the last may be writable when it has the sticky bit (like /tmp,
// where nobody can rename another's entries). With `last_may_be_sticky` the last one may be such
// a directory too (an SSD directory of mode 1777). Nobody else can then rename or replace any
// component, so the result, and the path itself, stay valid. FailedPrecondition with a message
// that names the component and what the admin must change; NotFound when a component is absent.
Result<UniqueFd> OpenTrustedDir(const std::string& path, bool last_may_be_sticky = false);

// The same, creating missing components (mkdirat with `mode`, as this process's user) on the way.
// A component that someone else created first fails the check.
Result<UniqueFd> MakeTrustedDir(const std::string& path, mode_t mode);

// Removes `dir_fd`/`name` (a directory tree or a file) without following links, by unlinkat on
// directory fds; ok when absent. `shown` names it in errors.
Status RemoveBelowAt(int dir_fd, const std::string& name, const std::string& shown);

// Removes `parent`/`name`; `parent` is opened with OpenTrustedDir (a sticky last component
// allowed), so a parent a user could swap is refused, never followed. Ok when absent.
Status RemoveBelow(const std::string& parent, const std::string& name);

// Removes `root`/`user_dir`/`name` where `root` is trusted (OpenTrustedDir, sticky allowed) but
// `user_dir` belongs to user `uid`: `user_dir` is opened without following a link and must be a
// directory owned by `uid`. Then removes `user_dir` too when it is left empty. Ok when absent.
Status RemoveBelowUserDir(const std::string& root, const std::string& user_dir, uid_t uid,
                          const std::string& name);

// Writes `text` to `dir`/`name` as a new file owned by uid:gid with `mode`. `dir` is opened
// without following a link and must be a directory owned by `uid` (or by this process's uid);
// the file is made through a fresh temporary name (O_EXCL | O_NOFOLLOW) and renameat, so that a
// link planted under that name is replaced, never written through.
Status WriteFileAs(const std::string& dir, const std::string& name, const std::string& text,
                   uid_t uid, gid_t gid, mode_t mode = 0644);

// Makes `dir`/`name` a new, empty regular file owned by uid:gid with `mode`, in a directory only
// root may write (the metrics directory, docs/admin.md "Metrics": every file in it is one root
// made for a job). `dir` is made if absent (0755) and checked with MakeTrustedDir: each component
// root's and writable by nobody else, the last one not even sticky, so no user can have put
// anything in it. Whatever is under the name (a file left by a job whose epilog never ran) is
// removed first, never followed; the file is made with O_CREAT | O_EXCL | O_NOFOLLOW and
// fchown'ed and fchmod'ed through its descriptor. Its owner may then rewrite it, never add a name.
Status MakeFileAs(const std::string& dir, const std::string& name, uid_t uid, gid_t gid,
                  mode_t mode = 0644);

// A process as the ledger names it: pid and start time (/proc/<pid>/stat field 22).
struct ProcessId {
  pid_t pid = 0;
  uint64_t start_time = 0;
};

// SIGTERM to each process that is still the one named (pid and start time match, checked after
// its pidfd is opened), then SIGKILL to those still alive after `grace`; waits up to a few more
// seconds for them to go. Returns the pids still alive at the end (normally none). A process
// whose pid now belongs to another start time is gone, and is never signalled.
std::vector<pid_t> StopProcesses(const std::vector<ProcessId>& procs,
                                 std::chrono::milliseconds grace);

// What a user wrote, made fit for one line of slurmd's log: common/printable.h, at most `max`
// bytes of it.
inline std::string Printable(std::string_view text, size_t max = 400) {
  return nopfs::Printable(text, max);
}

}  // namespace nopfs::spank
