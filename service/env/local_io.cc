#include "service/env/local_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

namespace nopfs::service {
namespace {

class PosixLocalIo final : public LocalIo {
 public:
  ssize_t Pread(int fd, void* dst, size_t n, off_t offset) override {
    return ::pread(fd, dst, n, offset);
  }
  ssize_t Pwrite(int fd, const void* src, size_t n, off_t offset) override {
    return ::pwrite(fd, src, n, offset);
  }
  int Fallocate(int fd, off_t offset, off_t length) override {
    return ::posix_fallocate(fd, offset, length);
  }
};

}  // namespace

LocalIo* LocalIo::Default() {
  static PosixLocalIo* const io = new PosixLocalIo();
  return io;
}

void FaultInjectionLocalIo::FailWrites(int err, uint64_t after_bytes) {
  write_budget_.store(after_bytes, std::memory_order_relaxed);
  write_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::FailReads(int err) {
  read_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::FailFallocate(int err) {
  fallocate_error_.store(err, std::memory_order_release);
}

void FaultInjectionLocalIo::ShortReads(bool on, size_t unit) {
  short_unit_.store(on ? std::max<size_t>(unit, 1) : 0, std::memory_order_release);
}

void FaultInjectionLocalIo::FlipReads(bool on) {
  flip_.store(on, std::memory_order_release);
}

void FaultInjectionLocalIo::SetDelay(std::chrono::nanoseconds delay) {
  delay_ns_.store(delay.count(), std::memory_order_relaxed);
}

void FaultInjectionLocalIo::ClearFaults() {
  write_error_.store(0);
  read_error_.store(0);
  fallocate_error_.store(0);
  short_unit_.store(0);
  flip_.store(false);
  delay_ns_.store(0);
}

void FaultInjectionLocalIo::Delay() const {
  const int64_t ns = delay_ns_.load(std::memory_order_relaxed);
  if (ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}

ssize_t FaultInjectionLocalIo::Fail(int err) {
  failed_.fetch_add(1, std::memory_order_relaxed);
  errno = err;
  return -1;
}

ssize_t FaultInjectionLocalIo::Pread(int fd, void* dst, size_t n, off_t offset) {
  Delay();
  if (const int err = read_error_.load(std::memory_order_acquire); err != 0) return Fail(err);
  size_t ask = n;
  if (const size_t unit = short_unit_.load(std::memory_order_acquire); unit != 0 && n > unit) {
    ask = std::max(unit, n / 2 / unit * unit);
    short_reads_.fetch_add(1, std::memory_order_relaxed);
  }
  const ssize_t r = base_->Pread(fd, dst, ask, offset);
  if (r > 0 && flip_.load(std::memory_order_acquire)) {
    static_cast<unsigned char*>(dst)[r / 2] ^= 0x10;
    flipped_.fetch_add(1, std::memory_order_relaxed);
  }
  return r;
}

ssize_t FaultInjectionLocalIo::Pwrite(int fd, const void* src, size_t n, off_t offset) {
  Delay();
  if (const int err = write_error_.load(std::memory_order_acquire); err != 0) {
    uint64_t budget = write_budget_.load(std::memory_order_relaxed);
    for (;;) {
      if (budget == 0) return Fail(err);
      const uint64_t take = std::min<uint64_t>(budget, n);
      if (write_budget_.compare_exchange_weak(budget, budget - take)) {
        return base_->Pwrite(fd, src, static_cast<size_t>(take), offset);
      }
    }
  }
  return base_->Pwrite(fd, src, n, offset);
}

int FaultInjectionLocalIo::Fallocate(int fd, off_t offset, off_t length) {
  if (const int err = fallocate_error_.load(std::memory_order_acquire); err != 0) {
    failed_.fetch_add(1, std::memory_order_relaxed);
    return err;
  }
  return base_->Fallocate(fd, offset, length);
}

}  // namespace nopfs::service
