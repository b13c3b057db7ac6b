// LogFileSink: nopfsd's log file (<run dir>/nopfsd.log) as an spdlog sink whose writes go through
// a LocalIo, so that tests can fill or break the disk under it. A log that cannot be written
// never harms the job: the lines are dropped and counted, a warning goes to `warn` (nopfsd's
// stderr: nopfsd.out under Slurm, the terminal under `nopfs run`) at the first failure and then at
// most once per warn_period while it lasts, and the first line written again says how many lines
// were lost and why.
//
// Thread safety: an spdlog sink (base_sink with a mutex): safe from many threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <spdlog/sinks/base_sink.h>

#include "common/status.h"
#include "service/env/local_io.h"

namespace nopfs::service {

class LogFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  using Warn = std::function<void(const std::string&)>;
  // Opens (creates, appends to) `path`, mode 0600, through `io` (nullptr: LocalIo::Default(),
  // which must outlive the sink). An error names the path: a start failure, as nopfsd cannot
  // start without a log. `warn` empty: print to stderr.
  static Result<std::shared_ptr<LogFileSink>> Open(
      const std::string& path, LocalIo* io = nullptr, Warn warn = {},
      std::chrono::steady_clock::duration warn_period = std::chrono::minutes(1));
  ~LogFileSink() override;

  uint64_t lost_lines() const { return lost_.load(std::memory_order_relaxed); }  // dropped so far

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}  // every line is written at once; nothing is buffered

 private:
  LogFileSink(std::string path, LocalIo* io, int fd, Warn warn,
              std::chrono::steady_clock::duration warn_period);
  // Writes all of `text`; 0 or the errno of the failed write.
  int WriteAll(const char* text, size_t n, bool* partial);

  const std::string path_;
  LocalIo* const io_;
  const int fd_;
  const Warn warn_;
  const std::chrono::steady_clock::duration warn_period_;
  std::atomic<uint64_t> lost_{0};  // lines lost in all
  // Under base_sink's mutex:
  uint64_t lost_unreported_ = 0;  // lost since the last line written
  int last_error_ = 0;
  bool torn_ = false;  // the last failed write left part of a line in the file
  std::chrono::steady_clock::time_point last_warn_{};
  bool warned_ = false;
};

}  // namespace nopfs::service
