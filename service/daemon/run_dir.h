// RunDir: the job's run directory on one node, where nopfsd keeps its socket, its log, its pid
// file and its readiness marker (the names: launch/run_files.h). The directory is private to the
// job's user (mode 0700); the socket inside is how local clients find the service.
//
// Thread safety: functions are reentrant.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/status.h"
#include "launch/run_files.h"
#include "service/env/local_io.h"

namespace nopfs::service {

using launch::kFailedName;
using launch::kLogName;
using launch::kPidName;
using launch::kReadyName;
using launch::kSocketName;
// The plan line (report::RenderPlanLine) nopfsd writes once it serves; the SPANK plugin prints it
// into the job's output. Removed when nopfsd stops.
inline constexpr const char* kPlanName = "plan";

// Creates `dir` (and missing parents, 0755 as usual) with mode 0700, or accepts an existing
// directory that is owned by this process's uid, is not a symlink and has no group/other access.
// Anything else is PermissionDenied with the reason: a run directory that someone else could read
// or replace would hand them the job's data.
Status PrepareRunDir(const std::string& dir);

// Removes what a previous nopfsd in `dir` left (socket, pid, ready and failed markers) after
// checking that the pid in nopfsd.pid is not a live nopfsd; a live one is FailedPrecondition
// (two daemons for one job). The log is kept (renamed to nopfsd.log.1) for the admin. The
// removals and the rename go through `io` (nullptr: LocalIo::Default()).
Status ClearStaleState(const std::string& dir, LocalIo* io = nullptr);

// Writes `text` to dir/name, mode 0600, through `io` (nullptr: LocalIo::Default()): to the
// temporary file dir/.name.tmp, written whole (short writes are continued) and closed, then
// renamed to dir/name. A reader sees the whole text or no file (or the file's previous
// text): never a part. A failure removes the temporary file and names dir/name and the call that
// failed ("writing /run/ready: No space left on device").
Status WriteFileAtomically(const std::string& dir, const std::string& name, const std::string& text,
                           LocalIo* io = nullptr);

// The pid in dir/nopfsd.pid, or 0 when there is none.
pid_t ReadPid(const std::string& dir);

}  // namespace nopfs::service
