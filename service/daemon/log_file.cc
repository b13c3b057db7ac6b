#include "service/daemon/log_file.h"

#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace nopfs::service {

Result<std::shared_ptr<LogFileSink>> LogFileSink::Open(
    const std::string& path, LocalIo* io, Warn warn,
    std::chrono::steady_clock::duration warn_period) {
  if (io == nullptr) io = LocalIo::Default();
  const int fd = io->Open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, 0600);
  if (fd < 0) return Status::FromErrno(errno, "opening the log " + path);
  if (!warn) {
    warn = [](const std::string& text) { std::fprintf(stderr, "nopfsd: %s\n", text.c_str()); };
  }
  return std::shared_ptr<LogFileSink>(new LogFileSink(path, io, fd, std::move(warn), warn_period));
}

LogFileSink::LogFileSink(std::string path, LocalIo* io, int fd, Warn warn,
                         std::chrono::steady_clock::duration warn_period)
    : path_(std::move(path)), io_(io), fd_(fd), warn_(std::move(warn)), warn_period_(warn_period) {}

LogFileSink::~LogFileSink() {
  io_->Close(fd_);
}

int LogFileSink::WriteAll(const char* text, size_t n, bool* partial) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = io_->Write(fd_, text + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *partial = done > 0;
      return w < 0 ? errno : EIO;
    }
    done += static_cast<size_t>(w);
  }
  return 0;
}

void LogFileSink::sink_it_(const spdlog::details::log_msg& msg) {
  spdlog::memory_buf_t line;
  formatter_->format(msg, line);
  std::string text;
  if (lost_unreported_ > 0) {
    // The first line after a loss: a torn line is ended, and the loss is told.
    if (torn_) text.push_back('\n');
    text.append("[nopfsd: ");
    text.append(std::to_string(lost_unreported_));
    text.append(" log lines lost: ");
    text.append(std::strerror(last_error_));
    text.append("]\n");
  }
  text.append(line.data(), line.size());
  bool partial = false;
  const int err = WriteAll(text.data(), text.size(), &partial);
  if (err == 0) {
    lost_unreported_ = 0;
    torn_ = false;
    warned_ = false;
    return;
  }
  lost_.fetch_add(1, std::memory_order_relaxed);
  ++lost_unreported_;
  last_error_ = err;
  torn_ = torn_ || partial;
  const auto now = std::chrono::steady_clock::now();
  if (!warned_ || now - last_warn_ >= warn_period_) {
    warned_ = true;
    last_warn_ = now;
    warn_("cannot write the log " + path_ + ": " + std::strerror(err) + " (" +
          std::to_string(lost_unreported_) +
          " lines lost so far; the job goes on, and the log says how many once it can)");
  }
}

}  // namespace nopfs::service
