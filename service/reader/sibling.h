// Sibling jobs: concurrent jobs of one user on one node and dataset (a packed job array, a sweep)
// read the PFS once. A running nopfsd registers itself in the user's private area; a nopfsd that
// starts later on the same dataset finds it there and asks it for the samples its own tiers,
// peers and kept copy do not have (READ_SAMPLE, docs/wire.md "Sibling reads"), before the PFS.
// The first nopfsd reads a sample it does not hold from the PFS itself (and stages it when its
// plan holds it), so that while both run the PFS is read by one daemon only.
//
// The registry, inside the per-user directory (spank/user_dirs.h, service/tiers/ssd_tier.h):
//   <scratch>/nopfs-<uid>/live/                 0700, owned by the user; opened without following
//                                               a link, refused when its owner or mode differ
//   <scratch>/nopfs-<uid>/live/<key>.<job>.<node>  one running nopfsd: a small text file, written
//                                               under a temporary name and renamed, removed at
//                                               exit (EncodeLiveEntry)
// <key> is the kept area's key (launch::KeptKey: the canonical dataset path and the scan format);
// the entry also records the catalog's fingerprint, which must equal the asker's. An entry whose
// process is gone, or whose socket does not answer, is stale: ignored and removed.
//
// Security: only the user can list or write the directory; the asker connects only to a service
// that runs as its own uid (SO_PEERCRED), and the service accepts only its job's uid. A sibling
// serves only the samples of the catalog whose fingerprint matches.
//
// Thread safety: the functions are reentrant; SiblingSource::Fetch is safe from any number of
// threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace nopfs::service {

inline constexpr char kLiveName[] = "live";
inline constexpr uint64_t kMaxLiveEntryBytes = 4096;

std::string LiveDir(const std::string& user_dir);  // <user_dir>/live

// One running nopfsd, as its registry entry says.
struct LiveEntry {
  std::string name;          // the entry's file name (set by FindLive)
  std::string job;           // <job id>.<node>
  uint32_t pid = 0;          // nopfsd's pid
  int64_t started_ns = 0;    // when it registered (real time)
  uint64_t fingerprint = 0;  // its catalog's
  std::string socket;        // its local socket (absolute path)
};
std::string EncodeLiveEntry(const LiveEntry& e);
// InvalidArgument naming what is wrong (at most kMaxLiveEntryBytes, every field present once).
Result<LiveEntry> ParseLiveEntry(std::string_view text);

// Writes <live>/<key>.<entry.job>, creating <live> (0700) when missing; returns the entry's path.
Result<std::string> RegisterLive(const std::string& user_dir, const std::string& key,
                                 const LiveEntry& entry);
// Removes an entry RegisterLive wrote (a missing one is fine), and <live> when it is then empty.
void UnregisterLive(const std::string& path);
// Removes <live>/<name> (a stale entry) without following a link.
void RemoveLive(const std::string& user_dir, const std::string& name);
// The entries of `key` whose fingerprint is `fingerprint`, oldest first. Entries of processes
// that are gone are removed; unreadable or malformed ones are skipped. A missing <live> is an
// empty list; a <live> of another owner, or readable by others, is PermissionDenied.
Result<std::vector<LiveEntry>> FindLive(const std::string& user_dir, const std::string& key,
                                        uint64_t fingerprint);

// A connection pool to a sibling's nopfsd.
class SiblingSource {
 public:
  // Connects to `entry`'s socket, checks that the service runs as this process's uid, and says
  // HELLO. `timeout` bounds each message.
  static Result<std::unique_ptr<SiblingSource>> Connect(const LiveEntry& entry,
                                                        uint64_t fingerprint,
                                                        std::chrono::milliseconds timeout);
  SiblingSource(const SiblingSource&) = delete;
  SiblingSource& operator=(const SiblingSource&) = delete;

  // Fills dst (the sample's exact size) with the sibling's bytes, checked against the xxh3 it
  // sent, and returns that xxh3. Any failure is an error; once the sibling's connection broke
  // (it ended), every later call fails at once with Unavailable.
  Result<uint64_t> Fetch(uint32_t sample, std::span<std::byte> dst);
  bool gone() const { return gone_.load(std::memory_order_relaxed); }
  const LiveEntry& entry() const { return entry_; }

  // Connections open at once, at most (the sibling's server bounds connections).
  static constexpr size_t kMaxConnections = 4;

 private:
  SiblingSource(LiveEntry entry, uint64_t fingerprint, std::chrono::milliseconds timeout)
      : entry_(std::move(entry)), fingerprint_(fingerprint), timeout_(timeout) {}
  Result<UniqueFd> Dial() const;
  Result<uint64_t> FetchOn(int fd, uint32_t sample, std::span<std::byte> dst);

  const LiveEntry entry_;
  const uint64_t fingerprint_;
  const std::chrono::milliseconds timeout_;
  std::atomic<bool> gone_{false};
  Mutex mu_;
  CondVar cv_;
  std::vector<UniqueFd> idle_ GUARDED_BY(mu_);
  size_t open_ GUARDED_BY(mu_) = 0;  // idle and in use
  uint32_t next_request_ GUARDED_BY(mu_) = 1;
};

}  // namespace nopfs::service
