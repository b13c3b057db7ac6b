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
// <key> is the kept area's key (kept::KeptKey: the canonical dataset path and the scan format);
// the entry also records the catalog's fingerprint, which must equal the asker's. An entry whose
// process is gone, or whose socket does not answer, is stale: ignored and removed.
//
// The order: every job orders the entries of one key and fingerprint the same way, by the time
// the entry records (taken just before it was written), then by the entry's name (LiveBefore). A
// job reads through the first entry of that order that answers, and only through one that comes
// before its own entry; a job not registered (yet) comes after every entry. Entries never change,
// so two jobs never read through each other, and two jobs that register at the same instant agree
// on which of the two is first. The first job to register reads the PFS; every later one reads
// through it. A job without such a sibling looks again (SiblingReader), so that a sibling that
// registered after this job's start is found. A sibling's own reads for
// another job never ask a sibling (the service answers READ_SAMPLE from its own tiers, peers, kept
// copy or the PFS): a read goes through one sibling at most.
//
// Security: only the user can list or write the directory; the asker connects only to a service
// that runs as its own uid (SO_PEERCRED), and the service accepts only its job's uid. A sibling
// serves only the samples of the catalog whose fingerprint matches.
//
// Thread safety: the functions are reentrant; SiblingSource's and SiblingReader's methods are
// safe from any number of threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
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
  int64_t started_ns = 0;    // when it registered (real time; the order's first key)
  uint64_t fingerprint = 0;  // its catalog's
  std::string socket;        // its local socket (absolute path)
};
std::string EncodeLiveEntry(const LiveEntry& e);
// The order among the entries of one key (see the top): the earlier start, then the name.
bool LiveBefore(const LiveEntry& a, const LiveEntry& b);
// InvalidArgument naming what is wrong (at most kMaxLiveEntryBytes, every field present once).
Result<LiveEntry> ParseLiveEntry(std::string_view text);

// Writes <live>/<key>.<entry.job>, creating <live> (0700) when missing; returns the entry's path.
Result<std::string> RegisterLive(const std::string& user_dir, const std::string& key,
                                 const LiveEntry& entry);
// Removes an entry RegisterLive wrote (a missing one is fine), and <live> when it is then empty.
void UnregisterLive(const std::string& path);
// Removes <live>/<name> (a stale entry) without following a link.
void RemoveLive(const std::string& user_dir, const std::string& name);
// The entries of `key` whose fingerprint is `fingerprint`, in LiveBefore's order. Entries of
// processes that are gone are removed; unreadable or malformed ones are skipped. A missing <live>
// is an empty list; a <live> of another owner, or readable by others, is PermissionDenied.
Result<std::vector<LiveEntry>> FindLive(const std::string& user_dir, const std::string& key,
                                        uint64_t fingerprint);

// A connection pool to a sibling's nopfsd.
class SiblingSource {
 public:
  // Connects to `entry`'s socket, checks that the service runs as this process's uid, and says
  // HELLO. `timeout` bounds each message.
  static Result<std::shared_ptr<SiblingSource>> Connect(const LiveEntry& entry,
                                                        uint64_t fingerprint,
                                                        std::chrono::milliseconds timeout);
  // The same in two steps: Make does no I/O, Open dials the first connection (Abandon from
  // another thread ends it at once).
  static std::shared_ptr<SiblingSource> Make(const LiveEntry& entry, uint64_t fingerprint,
                                             std::chrono::milliseconds timeout);
  Status Open();
  SiblingSource(const SiblingSource&) = delete;
  SiblingSource& operator=(const SiblingSource&) = delete;

  // Fills dst (the sample's exact size) with the sibling's bytes, checked against the xxh3 it
  // sent, and returns that xxh3. Any failure is an error; once the sibling's connection broke
  // (it ended), every later call fails at once with Unavailable.
  Result<uint64_t> Fetch(uint32_t sample, std::span<std::byte> dst);
  bool gone() const { return gone_.load(std::memory_order_relaxed); }
  // Ends every read and dial in flight at once (their sockets are shut down: they fail with
  // Unavailable), and every later one: the job is stopping.
  void Abandon();
  const LiveEntry& entry() const { return entry_; }

  // Connections open at once, at most (the sibling's server bounds connections).
  static constexpr size_t kMaxConnections = 4;

 private:
  SiblingSource(LiveEntry entry, uint64_t fingerprint, std::chrono::milliseconds timeout)
      : entry_(std::move(entry)), fingerprint_(fingerprint), timeout_(timeout) {}
  // A new connection, said HELLO to; counted in busy_ until Release.
  Result<UniqueFd> Dial();
  Result<uint64_t> FetchOn(int fd, uint32_t sample, std::span<std::byte> dst);
  // Gives back a connection Dial made or Fetch took: kept idle when `usable`, else closed.
  void Release(UniqueFd fd, bool usable) REQUIRES(mu_);

  const LiveEntry entry_;
  const uint64_t fingerprint_;
  const std::chrono::milliseconds timeout_;
  std::atomic<bool> gone_{false};
  Mutex mu_;
  CondVar cv_;
  std::vector<UniqueFd> idle_ GUARDED_BY(mu_);
  size_t open_ GUARDED_BY(mu_) = 0;     // idle and in use
  std::set<int> busy_ GUARDED_BY(mu_);  // connections being dialed or read on (Abandon's)
  bool abandoned_ GUARDED_BY(mu_) = false;
  uint32_t next_request_ GUARDED_BY(mu_) = 1;
};

// The sibling a job reads through (see the order at the top): found in the registry, looked for
// again while the job has none (at most every `look_every`, when a sample is about to be read from
// the PFS), replaced when it ends. Logs what it finds, and each refusal once.
class SiblingReader {
 public:
  struct Options {
    std::string user_dir;  // <scratch>/nopfs-<uid>: the registry is its live/
    std::string key;       // the kept area's key of the dataset
    LiveEntry self;        // this job's entry: job and fingerprint are used
    std::string same_job;  // "<job id>.": entries of this job's other nodes are peers
    std::chrono::milliseconds timeout{10000};  // a sibling's answer, at most
    std::chrono::milliseconds look_every{250};
  };
  explicit SiblingReader(Options options);
  ~SiblingReader() { Stop(); }
  SiblingReader(const SiblingReader&) = delete;
  SiblingReader& operator=(const SiblingReader&) = delete;

  // The sibling's bytes of `sample` (SiblingSource::Fetch), its error, or nullopt when the job
  // has no sibling to read through now (none found, or stopped).
  std::optional<Result<uint64_t>> Fetch(uint32_t sample, std::span<std::byte> dst);
  // Call with the entry's time before the entry is written (RegisterLive): from then on only
  // entries before it are read through, and the next Fetch looks at once.
  void Registering(int64_t started_ns);
  // Ends the reads in flight at once and every later one (nullopt).
  void Stop();
  // The job read through now ("" when none), and whether one was ever read through.
  std::string through() const;
  bool ever() const;

 private:
  std::shared_ptr<SiblingSource> Current();
  std::shared_ptr<SiblingSource> Look();

  const Options o_;
  mutable Mutex mu_;
  LiveEntry self_ GUARDED_BY(mu_);  // o_.self, named; started_ns: INT64_MAX until Registering
  std::shared_ptr<SiblingSource> current_ GUARDED_BY(mu_);
  std::shared_ptr<SiblingSource> connecting_ GUARDED_BY(mu_);
  bool looking_ GUARDED_BY(mu_) = false;
  CondVar looked_cv_;  // a look ended (with mu_)
  bool stopped_ GUARDED_BY(mu_) = false;
  bool ever_ GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point next_look_ GUARDED_BY(mu_){};
  std::set<std::string> refused_ GUARDED_BY(mu_);  // entries not used, each logged once
};

}  // namespace nopfs::service
