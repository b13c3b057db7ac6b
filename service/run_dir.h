// RunDir: the job's run directory on one node, where nopfsd keeps its socket, its log, its pid
// file and its readiness marker. The directory is private to the job's user (mode 0700); the
// socket inside is how local clients find the service.
//
//   <run_dir>/nopfsd.sock   the local server (service/local_server.h)
//   <run_dir>/nopfsd.log    spdlog output
//   <run_dir>/nopfsd.pid    the daemon's pid, written at start, removed at clean exit
//   <run_dir>/ready         written once the service accepts clients; holds the pid
//   <run_dir>/failed        written instead of `ready` when start-up fails; holds the reason
//
// Thread safety: functions are reentrant.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/status.h"

namespace nopfs::service {

inline constexpr const char* kSocketName = "nopfsd.sock";
inline constexpr const char* kLogName = "nopfsd.log";
inline constexpr const char* kPidName = "nopfsd.pid";
inline constexpr const char* kReadyName = "ready";
inline constexpr const char* kFailedName = "failed";
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
// (two daemons for one job). The log is kept (renamed to nopfsd.log.1) for the admin.
Status ClearStaleState(const std::string& dir);

// Writes `text` to dir/name atomically (temporary file + rename), mode 0600.
Status WriteFileAtomically(const std::string& dir, const std::string& name,
                           const std::string& text);

// The pid in dir/nopfsd.pid, or 0 when there is none.
pid_t ReadPid(const std::string& dir);

}  // namespace nopfs::service
