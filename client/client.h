// The nopfs client library: what a training process links to read its rank's samples from the
// node's nopfsd, in exact stream order and without copying.
//
//   auto client = nopfs::client::Client::Connect();      // $NOPFS_SOCKET
//   auto stream = (*client)->Open(rank);                  // or Open(rank, epoch, step) to resume
//   while (auto s = (*stream)->Next()) {                  // Result<std::optional<Sample>>
//     if (!s->has_value()) break;                         // end of stream
//     use((*s)->data, (*s)->size);                        // points into shared memory
//     (*stream)->Release(**s);                            // gives the space back (any order)
//   }
//
// Errors: a sample the service could not read arrives as a non-ok Status from Next() whose message
// names the sample id and its path; the stream goes on with the next sample.
//
// Lifetime: a Stream keeps its connection open (it may outlive its Client). When the process dies
// the kernel closes the socket and the service releases everything the process held. When the
// service dies (killed, crashed), Next() delivers what it had published and then fails with
// Unavailable ("nopfsd is gone ...") within 50 ms: it watches the socket for the hang-up.
//
// fork(): a Client or Stream must not be used across fork(). Their methods detect the use from a
// child (a different pid) and fail with FailedPrecondition without touching the socket; destroying
// them in a child unmaps memory but sends nothing. Connect in the child instead (Python DataLoader
// workers connect in their worker_init).
//
// Batches: NextBatch(n) takes n samples in one call and ReleaseBatch() gives them back in one;
// FillBatch(n, buffer) copies n samples into one buffer (the Python extension's batch path).
//
// Thread safety: Client and Stream are safe to call from several threads; Next(), NextBatch() and
// FillBatch() calls are serialized, Release() may run concurrently with a waiting Next(). Close()
// (or destruction) must not race with a Next() or Release() on the same stream.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "protocol/status_report.h"

namespace nopfs::ring {
class RingReader;
struct View;
}  // namespace nopfs::ring

namespace nopfs::client {

inline constexpr std::chrono::milliseconds kDefaultNextTimeout{std::chrono::minutes(5)};
inline constexpr std::chrono::milliseconds kRequestTimeout{std::chrono::seconds(30)};

// One sample, valid until Release() (or the Stream's destruction).
struct Sample {
  uint64_t seq = 0;  // position in this stream, from 0 at Open()
  uint32_t sample_id = 0;
  int64_t label = 0;
  uint32_t epoch = 0;
  uint64_t step = 0;
  uint64_t position = 0;  // index in the rank's stream within the epoch
  const std::byte* data = nullptr;
  uint64_t size = 0;
};

// Where FillBatch() put one sample in the caller's buffer, and what it is.
struct BatchEntry {
  uint32_t sample_id = 0;
  int64_t label = 0;
  uint32_t epoch = 0;
  uint64_t step = 0;
  uint64_t position = 0;
  uint64_t offset = 0;  // in the buffer
  uint64_t size = 0;
};

// Per-stream statistics. A stall is the time one Next() (or batch) call waited.
struct SampleInfo {
  std::string path;  // absolute path of the file on the PFS
  uint64_t offset = 0;
  uint64_t length = 0;
  int64_t label = -1;
};

struct Stats {
  uint64_t samples = 0;
  uint64_t bytes = 0;
  uint64_t next_calls = 0;
  uint64_t stall_ns_total = 0;
  uint64_t stall_ns_median = 0;  // power-of-two upper bound (log2 histogram)
  uint64_t stall_ns_p99 = 0;
};

// What the service said about itself in HELLO_OK.
struct ServiceInfo {
  uint16_t version = 0;
  std::string job_id;
  uint32_t ranks = 0;
  uint32_t first_rank = 0;
  uint32_t local_ranks = 0;
};

struct ConnectOptions {
  // "" -> $NOPFS_SOCKET.
  std::string socket_path;
  // The uid the service must run as (checked with SO_PEERCRED); unset -> getuid(). Only tests
  // should set it.
  std::optional<uint32_t> expected_server_uid;
  std::chrono::milliseconds timeout = kRequestTimeout;
};

// Where a stream starts and which share of the rank's stream it holds (wire::StreamShare).
struct OpenOptions {
  uint32_t epoch = 0;  // start epoch
  uint64_t step = 0;   // start step within `epoch`
  // Deliver only batches worker, worker + workers, ... of each epoch (batches of `batch`
  // entries counted from where the stream enters the epoch): what DataLoader worker `worker` of
  // `workers` reads. workers == 1 means the whole stream.
  uint32_t worker = 0;
  uint32_t workers = 1;
  uint64_t batch = 1;
  // End the stream after this many epochs from `epoch` (0: at the end of the job).
  uint32_t epochs = 0;
  // Let the service hand out samples that sit in its RAM tier in place (zero copy: the client
  // maps the tier read-only) instead of copying them into the ring. Views stay valid until
  // Release either way.
  bool zero_copy = true;
  // How Stream::CopyOut() and FillBatch() copy a sample that sits in the RAM tier: false, from
  // the process's mapping of the tier (each page faults in once, later copies run at memcpy's
  // speed: for a process that reads samples again, epoch after epoch); true, by pread() from
  // the tier's file, never touching the mapping (for a process that reads each sample once, a
  // DataLoader worker that lives one pass: a fresh mapping's first touch of a page costs a
  // fault, 3-4 us on a virtual machine, twice a 64 KiB copy).
  bool read_once = false;
  // A DataLoader worker's share of the rank that process `owner_pid` reads (0: this process's
  // own stream). nopfsd refuses a stream of a rank whose epochs overlap a stream of that rank
  // opened for another process (docs/wire.md, "One process per rank").
  uint32_t owner_pid = 0;
};

class Connection;

class Stream {
 public:
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // The next sample (std::nullopt at end of stream). TimedOut after `timeout` without one.
  Result<std::optional<Sample>> Next(std::chrono::milliseconds timeout = kDefaultNextTimeout);
  // Gives the sample's space back to the service. Any order.
  Status Release(const Sample& sample);
  // Takes up to `n` samples in stream order in one call (one pass over the ring for all of them,
  // ring::RingReader::NextBatch), appended to `out`; each stays valid until released. Fewer than
  // n at the end of the stream, before a sample that failed (the next call reports it), when
  // `timeout` passes after the first, and when the ring cannot hold more at once (its slots, or
  // an arena that the samples taken fill: release them and ask again). Returns how many it
  // appended; 0 at end of stream. The first sample's failure is the call's, as Next()'s.
  Result<size_t> NextBatch(size_t n, std::vector<Sample>* out,
                           std::chrono::milliseconds timeout = kDefaultNextTimeout);
  // Releases samples at once (one update of the ring for all). All or nothing.
  Status ReleaseBatch(std::span<const Sample> samples);
  // Copies the next `n` samples back to back into `dst` in stream order and gives their space
  // back at once; `entries` receives one BatchEntry per sample (where it is in `dst`, its id,
  // label, ...). Any n: a batch larger than the ring is taken in several passes. Returns how
  // many it copied: fewer than n only at the end of the stream (0: ended), when the next sample
  // does not fit what is left of `dst` (it is the first of the next call), or when `timeout`
  // passes after the first. A sample larger
  // than all of `dst` fails with InvalidArgument naming its size (it stays first in line: call
  // again with a larger buffer). A failure after some samples were copied returns those and is
  // reported by the next call.
  Result<size_t> FillBatch(size_t n, std::span<std::byte> dst, std::vector<BatchEntry>* entries,
                           std::chrono::milliseconds timeout = kDefaultNextTimeout);
  // Copies the bytes of `s`, a sample of this stream not yet released, to `dst` (s.size bytes),
  // as OpenOptions::read_once says (FillBatch() copies this way; a caller copying held samples
  // should too).
  void CopyOut(const Sample& s, std::byte* dst) const;
  // Copies `size` bytes of `s` from byte `offset` on (offset + size <= s.size) the same way: a
  // caller that needs only part of a sample (a decode that stops at the end of the image the
  // sample holds) reads only that part.
  void CopyOut(const Sample& s, uint64_t offset, uint64_t size, std::byte* dst) const;
  // OpenOptions::read_once: whether a caller that reads each sample once should copy it
  // (CopyOut) rather than read it in place.
  bool read_once() const { return read_once_; }
  Stats stats() const;
  uint64_t id() const { return id_; }
  // Whether the service has gone away (its socket hung up: it exited, was killed or restarted)
  // since the stream was opened. What it staged before may still be read; a caller about to
  // start a new pass on the stream opens a new one instead.
  bool ServiceGone() const;
  // Tells the service the stream is done (also done by the destructor). Samples not released
  // become invalid.
  Status Close();

 private:
  friend class Client;
  Stream(std::shared_ptr<Connection> conn, uint64_t id, std::unique_ptr<ring::RingReader> reader,
         bool read_once);
  Status CheckPid() const;
  // Up to n samples: the carried ones first, then the ring's.
  Result<size_t> TakeLocked(size_t n, std::vector<Sample>* out, std::chrono::milliseconds timeout)
      REQUIRES(take_mu_);

  std::shared_ptr<Connection> conn_;
  uint64_t id_ = 0;
  std::unique_ptr<ring::RingReader> reader_;
  bool read_once_ = false;  // OpenOptions::read_once
  pid_t pid_ = 0;
  // CheckPid: the process's fork count when the stream was made (when forks are counted).
  bool forks_counted_ = false;
  uint64_t forks_ = 0;
  std::atomic<bool> closed_{false};
  // Samples taken from the ring but not yet handed out (FillBatch's sample that did not fit, and
  // those after it), and a failure to report before them: what the next call returns first.
  Mutex take_mu_;  // serializes Next/NextBatch/FillBatch
  std::deque<Sample> carried_ GUARDED_BY(take_mu_);
  Status carried_error_ GUARDED_BY(take_mu_) = Status::Ok();
  std::vector<ring::View> views_ GUARDED_BY(take_mu_);  // NextBatch's scratch
};

class Client {
 public:
  // Connects to the service at `socket_path` ("" -> $NOPFS_SOCKET), checks that the service runs
  // as our uid, and says HELLO.
  static Result<std::unique_ptr<Client>> Connect(std::string socket_path = "");
  static Result<std::unique_ptr<Client>> Connect(const ConnectOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Opens `rank`'s stream at (epoch, step).
  Result<std::unique_ptr<Stream>> Open(uint32_t rank, uint32_t epoch = 0, uint64_t step = 0);
  // Opens a share of `rank`'s stream (OpenOptions). With the default share (one worker, no epoch
  // limit) it sends the base OPEN_STREAM, which every version-1 service understands.
  Result<std::unique_ptr<Stream>> Open(uint32_t rank, const OpenOptions& options);
  // The service's status text (what `nopfs status` prints).
  Result<std::string> StatusText();
  // The service's structured status (docs/wire.md, "Structured status").
  Result<report::StatusReport> Report();
  // Where sample `sample_id` lives on the PFS (path, byte range, label).
  Result<SampleInfo> Describe(uint32_t sample_id);
  const ServiceInfo& info() const { return info_; }

 private:
  Client() = default;
  std::shared_ptr<Connection> conn_;
  ServiceInfo info_;
};

}  // namespace nopfs::client
