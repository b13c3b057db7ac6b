// The job's run directory as the programs that start nopfsd and the job's tasks see it: the names
// of its files, and the two small texts they exchange there.
//
//   <run dir>/nopfsd.sock   nopfsd's local server: how the job's processes find the service
//   <run dir>/nopfsd.log    nopfsd's log
//   <run dir>/nopfsd.pid    nopfsd's pid, written at start and removed at a clean exit
//   <run dir>/nopfsd.out    nopfsd's stdout and stderr when the Slurm launcher starts it
//   <run dir>/ready         written once nopfsd accepts clients (FormatReady)
//   <run dir>/failed        written instead when nopfsd cannot start: the reason
//   <run dir>/refused       written by the Slurm launcher when the admission policy says no
//   <run dir>/layout        written by the Slurm launcher: the job's ranks per node (FormatLayout)
//   <run dir>/peer.secret   the job's peer secret (32 bytes, mode 0600)
//   <run dir>/peers         written by the Slurm launcher when the peer link did not start, or
//                           not every other node answered: why, and what the admin can do
//
// A launcher learns readiness on a pipe it made (nopfsd --ready-fd), never from these files: a
// file in the user's directory is the user's to replace. The tasks read `ready` and `layout` with
// the care their owner demands (spank/job_files.h ReadUserFile); both parsers take only digits.
//
// Thread safety: everything here is reentrant.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace nopfs::launch {

inline constexpr const char* kSocketName = "nopfsd.sock";
inline constexpr const char* kLogName = "nopfsd.log";
inline constexpr const char* kPidName = "nopfsd.pid";
inline constexpr const char* kOutputName = "nopfsd.out";
inline constexpr const char* kReadyName = "ready";
inline constexpr const char* kFailedName = "failed";
inline constexpr const char* kRefusedName = "refused";
inline constexpr const char* kLayoutName = "layout";
inline constexpr const char* kSecretName = "peer.secret";
// nopfsd's last status report (a STATUS_OK message of protocol/wire.h with the structured report),
// rewritten every few seconds and at exit: the epilog reads it for the job's summary.
inline constexpr const char* kSummaryName = "summary";
// The most a summary may take (the epilog reads no more).
inline constexpr uint64_t kMaxSummaryBytes = 1 << 20;
inline constexpr const char* kPeersName = "peers";
// Made by the first task that shows the `peers` line on a node, so that later steps' tasks do not.
inline constexpr const char* kPeersShownName = "peers.shown";
// The prolog's line on placement (whether the job came to its user's kept copy), printed once in
// the batch script's output.
inline constexpr const char* kPlacementName = "placement";

// What nopfsd says when it is ready: "pid=P\nsamples=F\n", and for a job with peers
// "peer_port=N\npeers_joined=0|1\npeers=TEXT\n" besides.
struct ReadyInfo {
  pid_t pid = 0;
  uint64_t samples = 0;       // the catalog's size: the job's F
  uint16_t peer_port = 0;     // the port this node's peer link listens on; 0: none
  bool peers_joined = false;  // every other node answered in the start-up phase
  // One line on the peer link (service::Daemon::peer_note): where it listens and whether the
  // other nodes answered, or why there is none. Text of the user's process: whoever shows it
  // makes it printable (common/units.h Printable).
  std::string peers;
};
std::string FormatReady(const ReadyInfo& info);
// Parses FormatReady's text (unknown keys are ignored). Anything but digits in pid, samples or
// peer_port, or a missing pid or samples, is InvalidArgument; peers is the rest of its line, at
// most 1,000 bytes.
Result<ReadyInfo> ParseReady(std::string_view text);

// The layout file: "ranks_per_node=N", or "error=<message>" for a task layout nopfs refuses.
std::string FormatLayout(uint32_t ranks_per_node);
std::string FormatLayoutError(std::string_view message);
// Returns N; the message of an "error=" file as FailedPrecondition; other text as
// InvalidArgument. N is at most 4,096.
Result<uint32_t> ParseLayout(std::string_view text);

// "nopfs_<job>.prom": the name of the job's metrics file in the node config's metrics_dir
// ('/' in the job id becomes '_'), written by nopfsd and removed by the Slurm epilog.
inline std::string MetricsFileName(std::string job_id) {
  for (char& c : job_id) {
    if (c == '/') c = '_';
  }
  return "nopfs_" + job_id + ".prom";
}

// The ready pipe (nopfsd --ready-fd N): nopfsd writes "ready\n" + FormatReady's text, or
// "failed\n" + the reason, then closes it.
std::string ReadyMessage(const ReadyInfo& info);
std::string FailedMessage(std::string_view reason);

// Reads the ready pipe's read end `fd` until nopfsd closes it, `deadline` passes or `stop()`
// (polled at least every 100 ms; may be empty) says to give up. Returns what nopfsd said:
//   ready                       the ReadyInfo
//   failed                      FailedPrecondition with nopfsd's reason (its last line)
//   closed without a word       Internal ("closed its ready pipe without saying ready": nopfsd
//                               exited early; the caller knows how to learn why)
//   deadline                    TimedOut
//   stop()                      Unavailable
Result<ReadyInfo> WaitReady(int fd, std::chrono::steady_clock::time_point deadline,
                            const std::function<bool()>& stop);

}  // namespace nopfs::launch
