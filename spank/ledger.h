// The node's reservation ledger: which nopfs jobs hold how much of the node's RAM and SSD tiers.
//
// One small file per job, <dir>/<jobid>, written atomically (temporary file, fsync, rename) and
// a lock file <dir>/lock that every reader and writer holds with flock(LOCK_EX) while it looks
// at or changes the ledger. Admission reads all entries, drops stale ones and writes its own
// entry under one lock hold, so two prologs never both take the last free bytes: the sum of the
// entries never exceeds what admission allowed. The directory belongs to root, mode 0700.
//
// An entry's lines are "key=value". A key this version does not know is kept (LedgerEntry::
// unknown), not taken for corruption, so that an older launcher after a downgrade neither drops
// nor loses a newer one's entries: their reservation still counts and their epilog still finds
// them. Users write no line: every value that comes from a job (its dataset) is recorded only
// when it holds no newline, on the line of its own key.
//
// Crash safety: an entry names the process that holds it (the prolog's launcher until it forks
// nopfsd, then nopfsd) by pid and start time, and the boot it was written in, and holds what the
// epilog needs to tear the job down without the node config (ssd_paths). A crash at any
// point leaves either no entry or an entry whose staleness the next prolog can tell (nopfs-job
// decides with IsProcessAlive, the boot id and the job's state in Slurm; see nopfs_job.cc).
//
// Thread safety: a Ledger is one lock hold; use it from one thread. Separate processes
// serialize on the lock.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace nopfs::spank {

struct LedgerEntry {
  uint64_t job_id = 0;
  uint32_t uid = 0;
  uint32_t node_index = 0;  // the job's node index here (names its SSD directory)
  uint64_t ram = 0;         // bytes reserved
  uint64_t ssd = 0;
  std::string boot_id;      // /proc/sys/kernel/random/boot_id when written
  int64_t pid = 0;          // the process that holds the reservation
  uint64_t start_time = 0;  // its start time (/proc/<pid>/stat field 22)
  // The node config's SSD class paths when the job was admitted: the epilog removes the job's
  // SSD directories below these even when the config no longer loads. Zero or more lines
  // "ssd_path=PATH" (a path holding a newline is never recorded); entries written before this
  // field existed have none.
  std::vector<std::string> ssd_paths;
  // The node config's metrics_dir when the job was admitted ("metrics_dir=PATH"; empty: none),
  // so that the epilog removes the job's metrics file without the config.
  std::string metrics_dir;
  // What the job's nopfsd may keep (the policy's grant, kept/node.h KeepPlan), so that the epilog
  // keeps within it from the keep record of a nopfsd that was killed (kept/finish.h): "keep=1",
  // "keep_max_bytes=N" (0: no limit) and "keep_dataset=PATH" (the job's --nopfs=, written to the
  // kept MANIFEST; a path holding a newline is never recorded). Entries without them keep nothing.
  bool keep = false;
  uint64_t keep_max_bytes = 0;
  std::string keep_dataset;
  // The dataset whose tiers the job's nopfsd serves to its user's other jobs on it while it runs
  // (--nopfs-share-running, on by default), for placement's marks (spank/placement.h):
  // "sibling_dataset=PATH" (a path holding a newline is never recorded); empty: none.
  std::string sibling_dataset;
  // Lines "key=value" whose key this version does not know (a newer launcher wrote them, and a
  // downgrade left the entry to this one), kept verbatim and written back after the known ones,
  // so that the entry and what the newer fields record survive a rewrite. A key is lower-case
  // letters, digits and '_' (what FormatEntry writes); a line of another form is corruption.
  std::vector<std::string> unknown;
};

std::string FormatEntry(const LedgerEntry& e);
Result<LedgerEntry> ParseEntry(const std::string& text);

class Ledger {
 public:
  // Creates `dir` (mode 0700) if needed and takes its lock, waiting up to `timeout`.
  static Result<Ledger> Lock(const std::string& dir, std::chrono::milliseconds timeout);
  Ledger(Ledger&& other) noexcept;
  Ledger& operator=(Ledger&&) = delete;
  Ledger(const Ledger&) = delete;
  ~Ledger();

  // Every well-formed entry; malformed files (a link, not a regular file, too large, or not
  // parsing: never written by this code) are removed. An entry that cannot be read (an I/O error)
  // is an error that names it, and is left alone.
  Result<std::vector<LedgerEntry>> Entries() const;
  // Writes (or replaces) the entry of e.job_id atomically.
  Status Put(const LedgerEntry& e) const;
  // Removes the entry of `job_id`; ok when there is none.
  Status Remove(uint64_t job_id) const;

 private:
  Ledger(std::string dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  std::string dir_;
  int fd_ = -1;
};

// This boot's id ("" when the kernel does not say).
std::string BootId();
// The start time of process `pid` in clock ticks since boot, or nullopt when it does not exist.
std::optional<uint64_t> ProcessStartTime(pid_t pid);
// Whether `pid` is a living (not zombie) process that started at `start_time`.
bool IsProcessAlive(pid_t pid, uint64_t start_time);

}  // namespace nopfs::spank
