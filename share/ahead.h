// A job's reads of the node's shared copy, with the descriptors asked for ahead of the reads: the
// job knows the order of its first reads (its plan), so its nopfsd asks the share service for the
// next files in that order in batches (share/wire.h: up to kMaxBatch files, each with its own
// proof, per request) instead of one request per file at the read. A read then finds its file's
// descriptor here; one round trip (and, when the copy lacks files, one pass of fills by the
// service) serves a whole batch.
//
// The descriptors held are bounded (Options::max_held, the batch being asked included). A file's
// descriptor is closed after the last read the order holds for it; when the bound is reached,
// descriptors of files the reads have passed by (their samples came from another source) are
// closed first, lowest in the order first; the asking waits while every descriptor held is still
// ahead of the reads. A file the asking has not reached yet, or whose descriptor was closed, or
// that the service was filling for another request (kBusy), is asked for alone at its read. A read
// of a file whose batch is being asked waits for that batch's answer.
//
// Every proof is this process's own open of the file as the job's user (ShareClient), made when
// the file is asked for, and every descriptor it gets dies with this object: nothing outlives the
// job that proved it. A file this user cannot open is answered NotFound, as ShareClient does.
//
// Thread safety: Read, ReadAlone and the counters from any number of threads; Start and Stop
// from one thread (the destructor stops).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "share/client.h"

namespace nopfs::share {

class AheadReader {
 public:
  struct Options {
    // Descriptors of copies held at once, at most, counting the files of the batches being asked
    // (each costs a proof while it is asked, then the copy's descriptor).
    size_t max_held = 512;
    // Files per request, at most (at most kMaxBatch). The first requests are smaller (8 files,
    // doubling), so that the first reads do not wait for a large batch.
    size_t max_batch = kMaxBatch;
    // Requests in flight at once (the service answers each connection on its own thread).
    unsigned threads = 2;
  };

  // `files`: paths relative to the dataset's root, in the order of the job's first reads, each
  // once; `uses[i]`: how many reads the order holds for files[i] (its samples; at least 1). The
  // strings `files` views must outlive the reader; `client` too.
  AheadReader(ShareClient& client, std::vector<std::string_view> files, std::vector<uint32_t> uses,
              Options options);
  ~AheadReader();
  AheadReader(const AheadReader&) = delete;
  AheadReader& operator=(const AheadReader&) = delete;

  // Starts asking ahead (Options::threads threads). Without Start every read asks alone.
  void Start();
  // Stops asking ahead and waits for the threads; reads go on, asking alone.
  void Stop();

  // Reads [offset, offset + dst.size()) of files[index]'s copy into dst. NotFound: the copy does
  // not serve that file to this user now (it cannot be opened, is not stored, is being filled, or
  // the copy is shorter); another error: the service could not be asked.
  Status Read(size_t index, uint64_t offset, std::span<std::byte> dst);
  // The same for a file that is not in the order, asked for alone.
  Status ReadAlone(const std::string& rel, uint64_t offset, std::span<std::byte> dst);

  // Files answered in batches ahead of their reads, reads served from a descriptor asked ahead,
  // and files asked for alone at their read.
  uint64_t asked_ahead() const { return asked_ahead_.load(); }
  uint64_t read_ahead() const { return read_ahead_.load(); }
  uint64_t asked_alone() const { return asked_alone_.load(); }
  // Descriptors held now (for tests).
  size_t held() const;

 private:
  enum State : uint8_t {
    kNotAsked = 0,  // not asked yet, or to be asked alone at its read
    kAsking = 1,    // in a batch being asked
    kHeld = 2,      // its copy's descriptor is in held_
    kNoCopy = 3,    // the service (or the proof's open) said no: its reads are NotFound
    kDone = 4,      // its reads are over, or it was asked alone (reads after this ask alone)
  };
  struct Held {
    std::shared_ptr<const UniqueFd> fd;
    uint64_t size = 0;
  };

  void AskLoop();
  // Closes held descriptors the reads have passed by until `room` more fit; whether they do.
  bool MakeRoom(size_t room) REQUIRES(mu_);
  void Release(size_t index) REQUIRES(mu_);
  static Status ReadCopy(const UniqueFd& fd, uint64_t size, uint64_t offset,
                         std::span<std::byte> dst);

  ShareClient& client_;
  const std::vector<std::string_view> files_;
  const Options options_;
  std::vector<std::thread> threads_;

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<uint8_t> state_ GUARDED_BY(mu_);   // State, per file
  std::vector<uint32_t> uses_ GUARDED_BY(mu_);   // reads left, per file
  std::map<size_t, Held> held_ GUARDED_BY(mu_);  // by index in files_
  size_t asking_ GUARDED_BY(mu_) = 0;            // files in batches being asked
  size_t next_ GUARDED_BY(mu_) = 0;              // where the asking goes on
  size_t furthest_ GUARDED_BY(mu_) = 0;          // one past the furthest file read
  size_t batch_ GUARDED_BY(mu_) = 8;             // the next request's size
  bool stop_ GUARDED_BY(mu_) = false;

  std::atomic<uint64_t> asked_ahead_{0};
  std::atomic<uint64_t> read_ahead_{0};
  std::atomic<uint64_t> asked_alone_{0};
};

}  // namespace nopfs::share
