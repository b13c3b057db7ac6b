// nopfsd's side of the kept area (kept/area.h; docs/tiers.md, "The kept area"): adopting a
// kept dataset at start (KeptCopy, a source of verified samples for the SampleReader, whose data
// files an SSD tier of the same layout takes over in place), committing a keep record beside the
// SSD tier as it fills (KeepCommitter, from which root's epilog finishes a kept entry when nopfsd
// is killed: kept/finish.h) and keeping the SSD tier's ready samples at exit (KeepSsdTier).
//
// A kept sample is trusted only when its PFS file is still what it was when it was kept (size,
// mtime, ctime and inode, by one stat during this job: CheckAhead's, or Fetch's own when the check
// has not reached the file yet) and its bytes hash to the xxh3 recorded then (and to the job's own
// checksum of the sample when one is known); otherwise it is rejected, counted, and the sample is
// read from its normal source. A sample is kept only when its file's ctime is older than
// the job's start, so the bytes the tier holds are the file's bytes at the stat.
//
// Thread safety: KeptCopy::Fetch, Release and the counters are safe from any number of threads
// (and alongside CheckAhead's threads);
// KeepSsdTier runs alone (the tier's writers stopped); KeepCommitter's calls are made from one
// thread (its own, once started), alongside the tier's writers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "kept/area.h"
#include "policy/job.h"
#include "service/catalog/catalog.h"
#include "service/env/env.h"
#include "service/env/local_io.h"
#include "service/tiers/ssd_tier.h"

namespace nopfs::service {

// Where this daemon's kept dataset lives.
struct KeptPlace {
  std::string kept_dir;  // <scratch>/nopfs-<uid>/kept
  std::string key;       // kept::KeptKey of the dataset
  std::string dataset;   // the canonical dataset path (recorded in the MANIFEST)
  std::string tag;       // "<job>.<node>": names this daemon's private .tmp.* entries
};

// Removes what no live nopfsd uses and nobody may trust: .tmp.* entries whose lock is free, and
// key directories without a valid MANIFEST. Returns how many entries it removed (one it cannot
// remove is logged and skipped).
Result<uint64_t> CleanKeptArea(const std::string& kept_dir);

// How a job takes the kept copy it finds.
enum class AdoptMode {
  // A job that keeps (--keep): the copy becomes its own (a private .tmp.adopt.* entry), Release
  // frees the disk of the samples its tiers hold, a tier of the same layout takes its data files
  // over, and what the job keeps at exit replaces it; the copy is removed when the job is done.
  kTake,
  // A job that keeps nothing: the copy is read where it is, under its lock (no other job takes
  // it meanwhile; root counts it as in use), and nothing of it is written but its MANIFEST's
  // last use when the job is done: it stays kept, as it was, for the next job.
  kBorrow,
};

class KeptCopy {
 public:
  // Takes <kept>/<key> as `mode` says (kTake: renamed to a private, locked .tmp.adopt.* entry;
  // kBorrow: locked where it is) and reads its MANIFEST and index. NotFound when nothing is kept
  // for the key (or another job holds it); any other error (the entry is removed) means it was
  // unusable. The entry's files are read (and Release punches them) through `io` (nullptr:
  // LocalIo::Default()), which must outlive the copy.
  static Result<std::unique_ptr<KeptCopy>> Adopt(const KeptPlace& place, Catalog& catalog, Env* env,
                                                 LocalIo* io = nullptr,
                                                 AdoptMode mode = AdoptMode::kTake);
  ~KeptCopy();  // Remove()
  KeptCopy(const KeptCopy&) = delete;
  KeptCopy& operator=(const KeptCopy&) = delete;

  // Fills dst (exactly the sample's size) with the kept bytes and returns their xxh3, after the
  // checks above. NotFound: not kept (or rejected before); FailedPrecondition or Corruption:
  // rejected now (counted once).
  Result<uint64_t> Fetch(policy::SampleId sample, std::span<std::byte> dst);

  // Stats the files of the kept samples in the background, with `threads` threads, in `order`
  // (the job's first accesses; kept samples not in it come last), one stat per file: a sample
  // whose file is unchanged is marked checked and Fetch takes it without a stat of its own, one
  // whose file changed is rejected. Called once, before or while Fetch runs.
  void CheckAhead(std::span<const policy::SampleId> order, unsigned threads);
  // Waits until CheckAhead's threads are done (they stop early on Remove or PutBack).
  void WaitChecks();
  // Stops CheckAhead's threads and waits for them (before the in-place tier is kept or destroyed).
  void StopChecks();
  // Files CheckAhead stat-ed so far.
  uint64_t checked_files() const { return checked_files_.load(std::memory_order_relaxed); }

  // The kept data files an SSD tier with `layout` can take over as its own data files
  // (SsdTierOptions::adopt_data), with no copy: [layout's file] the path of the kept data file of
  // the same index when it has the layout's size and every kept sample in it that the catalog has
  // sits exactly at that sample's extent in `layout`; "" otherwise.
  std::vector<std::string> InPlaceFiles(const TierLayout& layout) const;
  // The tier that took over some of the files InPlaceFiles named (SsdTier::adopted); must outlive
  // the copy's checks (Remove, or destruction, stops them). CheckAhead then marks each sample of
  // those files ready in the tier, with the kept xxh3 as its checksum, once its file is found
  // unchanged (the tier checks every read against it); Release leaves those files alone. Called
  // before CheckAhead.
  void SetInPlaceTier(SsdTier* tier);
  // Samples CheckAhead marked ready in the in-place tier.
  uint64_t in_place_samples() const { return in_place_samples_.load(std::memory_order_relaxed); }

  // Frees the disk of the adopted samples among `samples` (each one must be ready in a tier of
  // this job: it is never fetched from here again): their bytes are punched out of the data
  // files. Returns the samples released (none for a borrowed copy, which is never written).
  uint64_t Release(std::span<const policy::SampleId> samples);

  uint64_t kept_samples() const { return matched_; }  // kept samples the catalog still has
  uint64_t adopted_samples() const { return adopted_samples_.load(std::memory_order_relaxed); }
  uint64_t adopted_bytes() const { return adopted_bytes_.load(std::memory_order_relaxed); }
  // Kept samples dropped: not in the catalog any more, file changed, bytes differ.
  uint64_t rejected_samples() const { return rejected_.load(std::memory_order_relaxed); }
  // Adopted samples whose disk Release freed, and the bytes punched out.
  uint64_t released_samples() const { return released_samples_.load(std::memory_order_relaxed); }
  uint64_t released_bytes() const { return released_bytes_.load(std::memory_order_relaxed); }
  int64_t created() const { return created_; }
  const std::string& dir() const { return dir_; }
  bool borrowed() const { return borrowed_; }
  // Closes and removes the private entry; a borrowed copy stays kept, its MANIFEST's last use
  // set to now (unless the key now holds another entry, which is left alone). Idempotent.
  void Remove();
  // Gives the copy back under its key (nopfsd failed to start; adoption only reads it), with the
  // data files the in-place tier took over, or removes it when the key is taken meanwhile; a
  // borrowed copy is only unlocked, as it was. Idempotent.
  void PutBack();

 private:
  KeptCopy(Catalog& catalog, Env* env, LocalIo* io) : catalog_(catalog), env_(env), io_(io) {}
  void Reject(uint32_t record, policy::SampleId sample, const std::string& why);
  // Whether `st` is the stat the record was kept with.
  static bool Unchanged(const kept::KeptSample& rec, const FileStat& st);
  // Record r (sample id) of an in-place file, its file unchanged: adopted, ready in the tier.
  void MarkInPlace(uint32_t r, policy::SampleId id);
  // Closes a borrowed copy; with `used`, its MANIFEST's last use is set to now first.
  void GiveBack(bool used);
  // Closes the copy and removes its entry (a borrowed one too: it was found unusable).
  void Discard();

  Catalog& catalog_;
  Env* env_;
  LocalIo* const io_;
  std::string kept_dir_, key_, name_, dir_;
  UniqueFd lock_fd_;
  bool borrowed_ = false;
  UniqueFd dir_fd_;              // a borrowed copy's directory (its MANIFEST is rewritten there)
  kept::KeptManifest manifest_;  // a borrowed copy's, as read
  int64_t created_ = 0;
  std::vector<UniqueFd> data_fds_;         // [data file], none: absent
  std::vector<kept::KeptSample> records_;  // from the index
  std::vector<uint32_t> record_of_;        // [sample]: index into records_, or kNone
  // What became of a record this job.
  enum RecordState : uint8_t {
    kUntried = 0,
    kAdopted = 1,   // fetched and served from the copy
    kRejected = 2,  // its file changed, its bytes differ, or the catalog no longer has it
    kMatched = 3,   // only while Adopt maps the index to the catalog
    kReleased = 4,  // adopted, and its bytes punched out once a tier held it
    kInPlace = 5,   // adopted in place: marked ready in the tier that took its data file over
  };
  std::unique_ptr<std::atomic<uint8_t>[]> state_;  // [record]: a RecordState
  std::unique_ptr<std::atomic<bool>[]> checked_;   // [record]: its file found unchanged this job
  uint64_t matched_ = 0;
  std::atomic<uint64_t> adopted_samples_{0}, adopted_bytes_{0}, rejected_{0};
  std::atomic<uint64_t> released_samples_{0}, released_bytes_{0}, checked_files_{0};
  std::atomic<bool> stop_checks_{false}, punch_refused_{false};
  std::atomic<uint64_t> in_place_samples_{0};
  SsdTier* in_place_tier_ = nullptr;
  std::vector<bool> in_place_;  // [data file]: taken over by in_place_tier_
  std::vector<std::thread> checkers_;
};

struct KeepOptions {
  KeptPlace place;
  uint64_t max_bytes = 0;  // disk bytes at most (0: no limit)
  int64_t created = 0;     // the MANIFEST's created (unix seconds); 0: now
  // A sample whose file's ctime is at or after this (ns since the epoch) is not kept: the file
  // may have changed after the tier read it.
  int64_t unchanged_before_ns = 0;
  unsigned stat_threads = 8;
  // Files not stat-ed by then are not kept (the epilog's grace bounds the whole stop).
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // The kept area's directories and files are made, moved and punched through this (tests
  // inject faults); nullptr: LocalIo::Default().
  LocalIo* io = nullptr;
};

struct KeepResult {
  std::string dir;       // <kept>/<key>
  uint64_t samples = 0;  // kept
  uint64_t bytes = 0;    // disk bytes of the kept directory
  uint64_t skipped = 0;  // ready samples not kept (changed file, budget, deadline)
};

// Moves the tier's data files into <kept>/.tmp.keep.*, punches out every byte not holding a kept
// sample, writes the index and the MANIFEST (last), then renames the entry to <kept>/<key>
// (replacing an older one). The tier's writers must be stopped; the tier is then only destroyed.
// A failure or crash at any point leaves at most an incomplete entry.
Result<KeepResult> KeepSsdTier(const KeepOptions& options, SsdTier& tier, const Catalog& catalog,
                               Env* env);

struct KeepCommitOptions {
  KeptPlace place;         // the record's key and dataset
  uint64_t max_bytes = 0;  // padded sample bytes at most (0: no limit), in slot order
  // As KeepOptions: a sample whose file's ctime is at or after this is not recorded.
  int64_t unchanged_before_ns = 0;
  // The thread commits when at least this many recorded samples are new and at least a quarter
  // of those committed before (so the record's total write cost stays within a few times its
  // final size); when some are new, none became ready since its last look (the fill paused) and
  // the last commit is `quiet` old; and at once when woken (Wake: the tier's prefetch is done).
  uint64_t min_new_samples = 256;
  std::chrono::milliseconds quiet{5000};
  std::chrono::milliseconds interval{1000};  // how often the thread looks at the tier
  unsigned stat_threads = 8;                 // the new samples' files are stat-ed in parallel
  // The record's size at most (root reads it whole): a sample whose index entry would not fit
  // is not recorded. Tests make it smaller.
  uint64_t max_record_bytes = kept::kMaxKeepRecordBytes;
};

// Keeps a record (kept/area.h, kKeepRecordName in the tier's directory) of the tier's ready
// samples whose files are unchanged since before the job's start, committed durably (temporary
// file, fsync, rename, fsync of the directory) in batches as the tier fills: at every instant the
// tier's directory holds either no record or a whole one, naming only samples that were ready
// (with their fill-time xxh3) when it was written. Each file is stat-ed once.
class KeepCommitter {
 public:
  KeepCommitter(KeepCommitOptions options, SsdTier& tier, const Catalog& catalog, Env* env);
  ~KeepCommitter();  // Stop()
  KeepCommitter(const KeepCommitter&) = delete;
  KeepCommitter& operator=(const KeepCommitter&) = delete;

  // Records the samples that became ready since the last call and writes the record when
  // `force` (and anything changed) or the batch rule above says so. Returns whether it wrote.
  Result<bool> Commit(bool force);
  void Start();    // a thread that calls Commit every interval
  void Wake();     // the thread commits whatever is new now (Commit(true))
  void Stop();     // joins it; idempotent
  void Discard();  // removes the record (after a keep at exit, or when nothing may be kept)

  uint64_t commits() const { return commits_.load(std::memory_order_relaxed); }
  uint64_t committed_samples() const { return committed_.load(std::memory_order_relaxed); }
  uint64_t committed_bytes() const { return written_bytes_.load(std::memory_order_relaxed); }
  // Wall time spent in commits (stats, encoding, writes, fsyncs), ns.
  uint64_t commit_ns() const { return commit_ns_.load(std::memory_order_relaxed); }

 private:
  // [slot]: what the committer knows of it.
  enum Mark : uint8_t { kUnseen = 0, kRecorded = 1, kRefused = 2 };
  Status Write();
  void Run();

  const KeepCommitOptions o_;
  SsdTier& tier_;
  const Catalog& catalog_;
  Env* const env_;
  std::vector<uint8_t> mark_;      // [slot]
  std::vector<FileStat> stat_of_;  // [slot]: its file's stat, when recorded
  std::unordered_map<std::string, std::optional<FileStat>> stats_;  // by path; none: failed
  uint64_t budget_used_ = 0;                                        // padded bytes recorded
  uint64_t index_used_ = 0;   // index bytes of the samples recorded (kept::KeptIndexEntryBytes)
  bool record_full_ = false;  // a sample was refused for the record's size (logged once)
  uint64_t recorded_ = 0, written_recorded_ = 0;
  uint64_t last_ready_seen_ = 0;
  std::atomic<uint64_t> commits_{0}, committed_{0}, written_bytes_{0}, commit_ns_{0};
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  bool wake_ GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point last_write_{};
  std::thread thread_;
};

}  // namespace nopfs::service
