// The asking side of the share protocol (share/wire.h): a job's nopfsd, as the job's user, and
// `nopfs share warm`. For each file it opens <dataset>/<rel> itself (O_RDONLY | O_NOFOLLOW, as the
// catalog's scan does): a file it cannot open is never asked about and answered kDenied with the
// open's errno, so that the caller reads the PFS and fails exactly as it would without a copy.
// The descriptor it could open is the proof it sends. It talks only to a service of root's (or of
// its own uid), as SO_PEERCRED says.
//
// A request waits for the service's answer up to `timeout` (the service may fill its files from
// the PFS first); Cancel ends the requests in flight at once.
//
// Thread safety: every method from any number of threads (a small pool of connections).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "share/wire.h"

namespace nopfs::share {

class ShareClient {
 public:
  // `dataset`: the declared root, as the node config writes it.
  ShareClient(std::string socket_path, std::string dataset, std::chrono::milliseconds timeout);
  ShareClient(const ShareClient&) = delete;
  ShareClient& operator=(const ShareClient&) = delete;

  struct Copy {
    Outcome outcome = Outcome::kDenied;
    UniqueFd fd;  // kOpen and kReady: the copy, read-only
    uint64_t size = 0;
    uint64_t xxh3 = 0;
    int open_errno = 0;  // the proof could not be opened (never asked)
  };
  // One Copy per file (op kOpen or kWarm), in order; batches of at most kMaxBatch files are
  // sent as one request each. An error: the service could not be asked or refused the request
  // (kNotShared: FailedPrecondition; kUnavailable: Unavailable).
  Result<std::vector<Copy>> Ask(Op op, std::span<const std::string> rels);
  // Whether the service answers.
  Status Ping();
  // Ends the requests in flight now and refuses every later one (Unavailable, "share: stopped"):
  // each connection in use is shut down, so that an Ask waiting for the service's answer returns
  // at once instead of after `timeout`. For the job's end, which must not wait for a service that
  // does not answer. Returns how many requests were in flight.
  size_t Cancel();
  bool cancelled() const;

  const std::string& dataset() const { return dataset_; }

  static constexpr size_t kMaxConnections = 8;

 private:
  Result<UniqueFd> Take();
  void Give(UniqueFd fd, bool usable);
  Status AskBatch(int fd, Op op, std::span<const std::string> rels, std::span<Copy> out);

  const std::string socket_path_;
  const std::string dataset_;
  const std::chrono::milliseconds timeout_;
  mutable Mutex mu_;
  CondVar cv_;
  std::vector<UniqueFd> idle_ GUARDED_BY(mu_);
  size_t open_ GUARDED_BY(mu_) = 0;
  std::vector<int> busy_ GUARDED_BY(mu_);  // connections in use (open until Give drops them)
  bool cancelled_ GUARDED_BY(mu_) = false;
};

}  // namespace nopfs::share
