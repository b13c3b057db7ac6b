// Catalog: nopfsd's list of the dataset's samples, built once per dataset and kept in RocksDB.
//
// The dataset is a directory on the PFS, in one of two forms (docs/catalog.md has the details):
//   - an ImageFolder tree: root/<class>/.../<file>; class directories sorted bytewise, label =
//     index; files found recursively; hidden entries skipped; files directly under root ignored;
//   - a manifest file: one sample per line, "relative/path[\tlabel[\toffset\tlength]]", paths
//     relative to the manifest's directory.
// Sample ids 0..F-1 follow the stable order (label, relative path bytewise, offset, length), so
// every node and every later job numbers the samples the same way.
//
// Open scans the dataset in parallel, or reuses a catalog an earlier job built when every stamp
// it recorded (mtime, inode, device, size of the dataset's directories, and of the manifest) is
// unchanged. The catalog DB is immutable once built; it is built in a temporary directory and
// renamed into place, so jobs racing on one cache entry each end with a correct catalog. Checksums
// are per job, in a private RocksDB under work_dir.
//
// The DBs only save work: a catalog DB that cannot be written (a full or failing disk) leaves the
// job with the catalog it scanned, and the next job scans again; a checksum DB that cannot be
// opened or written leaves the job's checksums in memory. Both are logged once, never a failed
// Open or read.
//
// The whole catalog is kept in memory after Open (one string arena for the paths plus per-id
// arrays: about 32 bytes + path length per sample), so lookups never touch RocksDB.
//
// Thread safety: after Open, every method may be called from many threads at once.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "policy/job.h"
#include "service/env/env.h"

namespace rocksdb {
class DB;
class Env;
class WriteBatch;
}  // namespace rocksdb

namespace nopfs::service {

// How long a round of CatalogOptions::exchange waits for the other nodes (nopfsd's exchange): until
// the start-up deadline, and at least `patience`, and at least as long as this node's own work
// since its previous round (for the second round, its share of the walk). The shares are about
// equal, so a node that waits that long for a slower one still costs the job less than the lone
// scan a failed round leads to (all the shares). With a fixed wait, in a long scan (a million
// files on a few nodes) every node that finished its share that much ahead of another would scan
// the whole dataset again alone.
// Thread safety: one thread at a time (nopfsd runs the rounds one after the other).
class RoundDeadlines {
 public:
  using Clock = std::chrono::steady_clock;
  // `start`: when this node's work before its first round began.
  RoundDeadlines(Clock::time_point startup_deadline, Clock::duration patience,
                 Clock::time_point start)
      : startup_deadline_(startup_deadline), patience_(patience), since_(start) {}

  // The deadline of a round this node enters at `now`.
  Clock::time_point Enter(Clock::time_point now) const {
    return std::max({startup_deadline_, now + patience_, now + (now - since_)});
  }
  // This node's round ended at `now`: its own work toward the next one starts.
  void Leave(Clock::time_point now) { since_ = now; }

 private:
  const Clock::time_point startup_deadline_;
  const Clock::duration patience_;
  Clock::time_point since_;
};

struct CatalogOptions {
  // The dataset: an ImageFolder directory or a manifest file (absolute, or relative to the cwd).
  std::string dataset;
  // The admin's catalog cache shared by jobs ("" = no reuse across work directories). Entries
  // live in cache_dir/<uid>/<key>/ (directories created mode 0700).
  std::string cache_dir;
  // The job's private directory: the checksum DB, and the catalog DB when cache_dir is "".
  // Created (mode 0700) if missing.
  std::string work_dir;
  // Threads that list and stat the dataset in parallel (>= 1).
  uint32_t scan_threads = 8;
  // Whose cache subdirectory to use; must own it.
  uint32_t uid = static_cast<uint32_t>(::getuid());
  // A stamp whose mtime is this close to (or after) the scan's start may hide a change made in the
  // same clock tick; a catalog with such a stamp is used by this job but never reused. Nanoseconds.
  int64_t racy_window_ns = 2'000'000'000;
  // One scan per job (docs/catalog.md, "One scan per job"): this node's index among the job's
  // `nodes`, and the collective round among them (sends out[k] to node k, returns in[k] from node
  // k; rounds are numbered from 1). Node 0 consults the cache and every node walks a share of the
  // classes; without an exchange, with one node, or when a round fails, the node scans alone.
  uint32_t node = 0;
  uint32_t nodes = 1;
  std::function<Result<std::vector<std::vector<std::byte>>>(uint64_t round,
                                                            std::vector<std::vector<std::byte>>)>
      exchange;
  // RocksDB's file access for the catalog and checksum DBs (tests inject faults through it);
  // nullptr is RocksDB's default. Must outlive the Catalog.
  rocksdb::Env* db_env = nullptr;
  // Whether a scanned catalog's DB (what saves the next job the scan) is written by Open (false)
  // or by StorePending(), which nopfsd calls once it serves (true): the job needs the catalog in
  // memory only.
  bool defer_store = false;

  // Every field in range; the message names the field.
  Status Validate() const;
};

class Catalog {
 public:
  // Opens (reusing or scanning) the catalog of options.dataset. `env` reads the PFS and must
  // outlive the Catalog. Errors name the file (and for a manifest the line) at fault.
  static Result<std::unique_ptr<Catalog>> Open(const CatalogOptions& options, Env* env);
  // Flushes pending checksums (errors are dropped: call Flush() first to see them).
  ~Catalog();
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  // F, the number of samples.
  uint64_t size() const { return lengths_.size(); }
  // Per-id sample sizes in bytes (the planner's input); same as length(id).
  std::span<const policy::Bytes> sizes() const { return lengths_; }

  // The per-id accessors below take id < size(); a larger id is a broken invariant and throws
  // std::out_of_range. (checksum, RecordChecksum and Read check and return instead.)
  //
  // The sample's path relative to the dataset root (ImageFolder) or the manifest's directory.
  std::string_view relative_path(policy::SampleId id) const;
  // root + "/" + relative path: where Read reads it, and what error messages name.
  std::string path(policy::SampleId id) const;
  // The sample's bytes are [offset, offset + length) of path(id).
  uint64_t offset(policy::SampleId id) const { return offsets_.at(id); }
  uint64_t length(policy::SampleId id) const { return lengths_.at(id); }
  // The class index, or -1 when the manifest gives none.
  int64_t label(policy::SampleId id) const { return labels_.at(id); }
  // ImageFolder: class directory names by label. Manifest: empty (labels are bare integers).
  const std::vector<std::string>& class_names() const { return class_names_; }
  // The absolute directory that relative paths are relative to.
  const std::string& root() const { return root_; }

  // The xxh3 recorded for the sample by this job or an earlier one with the same work_dir and an
  // identical catalog, if any.
  std::optional<uint64_t> checksum(policy::SampleId id) const;
  // Records the xxh3 of the sample's bytes: in memory at once, persisted in batches (Flush() writes
  // the rest). Recording the same value again is ok; a different value is Corruption naming the
  // sample and both values (the first one is kept). InvalidArgument for an id out of range.
  Status RecordChecksum(policy::SampleId id, uint64_t xxh3);
  // Writes pending checksums to the checksum DB. The first write that fails is returned (and
  // logged); the DB is then closed and later checksums stay in memory only.
  Status Flush();

  // Reads the sample's bytes (dst.size() must equal length(id)) through the Env. Every error
  // message starts "sample <id> (<path>): ".
  Status Read(policy::SampleId id, std::span<std::byte> dst) const;

  // Whether Open loaded an earlier catalog (here or, shared, on node 0) instead of scanning.
  bool reused() const { return reused_; }
  // How this node got the catalog, for logs: "alone", "shared by N nodes" (one scan, or node 0's
  // cache hit, shared over the exchange), or "alone: <why the shared scan failed>".
  const std::string& share_note() const { return share_note_; }
  // Why Open scanned instead of reusing ("" when reused), e.g. "<dir> changed": for logs.
  const std::string& rescan_reason() const { return rescan_reason_; }
  // The catalog DB's directory (in the cache, or under work_dir); "" on a node that took node 0's
  // cached catalog over the exchange (it writes none).
  const std::string& db_path() const { return db_path_; }
  // The job-private checksum DB's directory.
  const std::string& checksum_db_path() const { return checksum_db_path_; }
  // Why the scanned catalog was not stored in its DB ("" when it was, or when it was reused).
  const std::string& store_error() const { return store_error_; }
  // Whether checksums are persisted (false once the checksum DB could not be opened or written).
  bool checksums_persisted() const;
  // xxh3 over every sample entry; identical catalogs have identical fingerprints.
  uint64_t fingerprint() const { return fingerprint_; }
  // Writes the catalog DB that Open left to write (CatalogOptions::defer_store); nothing when none
  // is pending. Sets db_path() or store_error() (read them after it returns); a failure is logged
  // and only costs the next job a scan. Safe to call from another thread while the catalog serves.
  void StorePending();
  // How long StorePending wrote, in seconds (0 before, or when nothing was pending).
  double pending_store_seconds() const { return pending_store_seconds_; }

  // Where Open's time went, in seconds, for nopfsd's start-up line (docs/service.md): "setup 0.00,
  // cache 0.00, scan 1.31, index 0.01, store 0.04, checksums 0.01" (shared: also "exchange" and
  // "assemble"; a phase that did not happen is left out).
  const std::string& open_phases() const { return open_phases_; }

 private:
  Catalog() = default;

  // Opens (or makes) the checksum DB; on failure logs it and leaves checksums in memory only.
  void OpenChecksumDb(const std::string& work_dir, rocksdb::Env* db_env);
  Status LoadChecksums() REQUIRES(mu_);
  Status FlushLocked() REQUIRES(mu_);
  // Closes the checksum DB after `error` (logged once); later checksums stay in memory.
  void StopPersistingLocked(const Status& error) REQUIRES(mu_);

  Env* env_ = nullptr;
  std::string root_;
  std::string db_path_;
  std::string checksum_db_path_;
  bool reused_ = false;
  std::string rescan_reason_;
  std::string share_note_ = "alone";
  std::string store_error_;
  std::string open_phases_;
  uint64_t fingerprint_ = 0;
  // The store Open deferred (defer_store): writes the DB, sets db_path_ or store_error_.
  std::function<void()> pending_store_;
  double pending_store_seconds_ = 0;

  // Relative paths back to back; path of id i is arena_[path_end_[i-1], path_end_[i]).
  std::string arena_;
  std::vector<uint64_t> path_end_;
  std::vector<uint64_t> offsets_;
  std::vector<uint64_t> lengths_;
  std::vector<int64_t> labels_;
  std::vector<std::string> class_names_;

  // Checksums: state 0 = none, 1 = being written, 2 = set (value valid).
  std::unique_ptr<std::atomic<uint8_t>[]> checksum_state_;
  std::unique_ptr<std::atomic<uint64_t>[]> checksum_value_;

  mutable Mutex mu_;
  // Set in Open; closed (null) for good after a failed write.
  std::unique_ptr<rocksdb::DB> checksum_db_ GUARDED_BY(mu_);
  std::unique_ptr<rocksdb::WriteBatch> pending_ GUARDED_BY(mu_);
  uint64_t pending_count_ GUARDED_BY(mu_) = 0;
};

}  // namespace nopfs::service
