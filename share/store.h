// One shared dataset's copy on a node, kept by the share service (root): the copies of the
// dataset's files, each filled by this process from the PFS and checksummed by it, and the
// manifest that says which file of the PFS, in which state, each copy is.
//
//   <store dir>/                 the dataset's directory (server.h names it): this process's
//                                own, mode 0700; nothing in it is any user's
//   <store dir>/MANIFEST         per copy: the PFS path relative to the root, the file's identity
//                                when it was read (dev, ino, size, mtime, ctime), its xxh3, the
//                                copy's name and when it was last used; rewritten whole (temporary
//                                name, rename) by Save
//   <store dir>/<16 hex digits>  one copy, mode 0400, named by a counter (never by the PFS name)
//
// A copy is served only for a proof whose identity equals the manifest's (FileId): a file changed
// on the PFS (any write, chmod or rename changes its ctime) is never served stale; it is filled
// again as a new copy, under a new name, and the old one removed once the new one is made (a proof
// that is not the file at that path removes nothing). A copy is never edited in place.
// Copies are evicted least recently used first when a fill would pass the quota. Each copy's
// bytes are hashed again the first time this process serves it, so a copy damaged on disk (or
// left half-written by a crash) is filled again rather than served.
//
// Thread safety: every method from any thread.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "common/mutex.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "share/wire.h"

namespace nopfs::share {

// A file's identity and state as fstat says them; equal ids are the same bytes.
struct FileId {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  bool operator==(const FileId&) const = default;
};
FileId IdOf(const struct stat& st);

struct StoreOptions {
  std::string root;    // the declared dataset directory, absolute
  std::string dir;     // the store directory; made (0700) when missing
  uint64_t quota = 0;  // bytes of copies, at most
};

// What the manifest of the store directory `dir` names, read without opening the store (which
// would change it): for placement's reconcile (root, spank/placement.h) beside a running service.
// `dir` and its manifest must be this euid's, reached without a link, and `dir` writable by no one
// else; a directory without a manifest holds nothing. A manifest that does not check (a torn
// write, another format) is an error: its copies are not counted.
struct StoredCopy {
  uint64_t files = 0;
  uint64_t bytes = 0;
};
Result<StoredCopy> ReadStoredCopy(const std::string& dir);

class Store {
 public:
  // Opens (making it when missing) the store directory, which must be a directory of this
  // process's euid that nobody else may read or write; loads the manifest, drops the entries
  // whose copy is missing or of another size, removes every file the manifest does not name,
  // and evicts down to the quota. A manifest of another root (the dataset's directory was
  // replaced) is dropped whole.
  static Result<std::unique_ptr<Store>> Open(StoreOptions options);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  struct Answer {
    Outcome outcome = Outcome::kDenied;
    UniqueFd fd;  // kReady with want_fd: the copy, read-only
    uint64_t size = 0;
    uint64_t xxh3 = 0;
  };
  // The copy of <root>/<rel> for an asker who proved with a descriptor whose identity is
  // `proof`. The copy is served when its entry's identity equals the proof; otherwise the file
  // is filled: reached from the root one component at a time without following a link, taken
  // only when it is the proof's very file (dev and ino) in the proof's state, read by this
  // process, hashed, written under a new name. kDenied: the path does not lead to the proof's
  // file; kBusy: another request fills it now; kNotStored: larger than the quota, or it could
  // not be read or changed while it was read. `rel` must pass CheckRelativePath.
  Answer Serve(const std::string& rel, const FileId& proof, bool want_fd);

  // Writes the manifest if it changed since the last Save.
  Status Save();

  struct Stats {
    uint64_t files = 0;         // copies now
    uint64_t bytes = 0;         // their bytes
    uint64_t filled = 0;        // copies filled by this process
    uint64_t filled_bytes = 0;  // bytes it read from the PFS for them
    uint64_t served = 0;        // copies handed out (kReady)
    uint64_t served_bytes = 0;  // their sizes
    uint64_t evicted = 0;       // copies removed for the quota
    uint64_t replaced = 0;      // copies removed because the file changed on the PFS
    uint64_t corrupt = 0;       // copies whose bytes no longer matched their xxh3
  };
  Stats stats() const;
  const std::string& root() const { return o_.root; }

 private:
  struct Entry {
    FileId id;
    uint64_t xxh3 = 0;
    uint64_t name = 0;  // the copy's file name, as 16 hex digits
    uint64_t last_used = 0;
    bool verified = false;  // hashed again by this process since it started
  };
  Store(StoreOptions o, UniqueFd dir) : o_(std::move(o)), dir_(std::move(dir)) {}
  Status Load();
  // Reads <root>/<rel> (the proof's file) into a new copy; its entry on success.
  Result<Entry> Fill(const std::string& rel, const FileId& proof, Outcome* why);
  void DropLocked(std::map<std::string, Entry>::iterator it) REQUIRES(mu_);
  void EvictLocked(uint64_t need) REQUIRES(mu_);
  UniqueFd OpenCopy(uint64_t name) const;

  const StoreOptions o_;
  const UniqueFd dir_;
  uint64_t root_dev_ = 0;  // the root's identity, written once by Open
  uint64_t root_ino_ = 0;
  mutable Mutex mu_;
  std::map<std::string, Entry> entries_ GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, std::string>> lru_ GUARDED_BY(mu_);  // (last_used, rel)
  std::set<std::string> filling_ GUARDED_BY(mu_);
  uint64_t used_ GUARDED_BY(mu_) = 0;
  uint64_t next_name_ GUARDED_BY(mu_) = 1;
  uint64_t clock_ GUARDED_BY(mu_) = 0;  // last_used values, increasing
  bool dirty_ GUARDED_BY(mu_) = false;
  Stats stats_ GUARDED_BY(mu_);
  Mutex save_mu_;  // one Save at a time
};

}  // namespace nopfs::share
