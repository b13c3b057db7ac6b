// DbFaultFs: a RocksDB FileSystem for tests that puts faults between the catalog's DBs and the
// disk: writes that fail (a full disk: IOStatus::NoSpace, or EIO) after a number of bytes, reads
// that fail, and reads that return the bytes with one bit flipped. A fault applies to every file
// whose path contains its fragment (e.g. a directory), so a test aims at one DB. Use it through
// CatalogOptions::db_env = DbFaultFs::NewEnv(fs).get().
//
// Thread safety: safe from many threads (RocksDB's among them); every field is under mu_.
#pragma once

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/io_status.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "common/mutex.h"

namespace nopfs::service::testing {

class DbFaultFs : public rocksdb::FileSystemWrapper {
 public:
  DbFaultFs() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "NopfsDbFaultFs"; }

  // An Env whose file system is `fs` (RocksDB's default Env otherwise).
  static std::unique_ptr<rocksdb::Env> NewEnv(const std::shared_ptr<DbFaultFs>& fs) {
    return rocksdb::NewCompositeEnv(fs);
  }

  // Writes (appends, syncs) to files whose path contains `fragment` fail with `error` once
  // `after_bytes` bytes have been written to them since this call; opening such a file for
  // writing fails too when `after_bytes` is 0.
  void FailWrites(const std::string& fragment, rocksdb::IOStatus error, uint64_t after_bytes = 0) {
    MutexLock lock(&mu_);
    write_fragment_ = fragment;
    write_error_ = std::move(error);
    write_budget_ = after_bytes;
  }
  // Random-access reads (SST blocks) of files whose path contains `fragment` fail with `error`.
  void FailReads(const std::string& fragment, rocksdb::IOStatus error) {
    MutexLock lock(&mu_);
    read_fragment_ = fragment;
    read_error_ = std::move(error);
  }
  // Random-access reads of files whose path contains `fragment` return one bit flipped (in the
  // middle byte of what was read).
  void FlipReads(const std::string& fragment) {
    MutexLock lock(&mu_);
    flip_fragment_ = fragment;
  }
  void Clear() {
    MutexLock lock(&mu_);
    write_fragment_.reset();
    read_fragment_.reset();
    flip_fragment_.reset();
  }
  uint64_t failed_writes() const {
    MutexLock lock(&mu_);
    return failed_writes_;
  }
  uint64_t flipped_reads() const {
    MutexLock lock(&mu_);
    return flipped_reads_;
  }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    if (std::optional<rocksdb::IOStatus> e = WriteFault(f, 0)) return *e;
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, r, dbg);
    if (s.ok()) *r = std::make_unique<Writable>(std::move(*r), this, f);
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override {
    if (std::optional<rocksdb::IOStatus> e = WriteFault(f, 0)) return *e;
    rocksdb::IOStatus s = target()->ReopenWritableFile(f, o, r, dbg);
    if (s.ok()) *r = std::make_unique<Writable>(std::move(*r), this, f);
    return s;
  }
  rocksdb::IOStatus NewRandomAccessFile(const std::string& f, const rocksdb::FileOptions& o,
                                        std::unique_ptr<rocksdb::FSRandomAccessFile>* r,
                                        rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewRandomAccessFile(f, o, r, dbg);
    if (s.ok()) *r = std::make_unique<RandomAccess>(std::move(*r), this, f);
    return s;
  }

 private:
  class Writable : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    Writable(std::unique_ptr<rocksdb::FSWritableFile> t, DbFaultFs* fs, std::string path)
        : FSWritableFileOwnerWrapper(std::move(t)), fs_(fs), path_(std::move(path)) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
      if (std::optional<rocksdb::IOStatus> e = fs_->WriteFault(path_, data.size())) return *e;
      return FSWritableFileOwnerWrapper::Append(data, o, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& v,
                             rocksdb::IODebugContext* dbg) override {
      if (std::optional<rocksdb::IOStatus> e = fs_->WriteFault(path_, data.size())) return *e;
      return FSWritableFileOwnerWrapper::Append(data, o, v, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                       const rocksdb::IOOptions& o,
                                       rocksdb::IODebugContext* dbg) override {
      if (std::optional<rocksdb::IOStatus> e = fs_->WriteFault(path_, data.size())) return *e;
      return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, o, dbg);
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      if (std::optional<rocksdb::IOStatus> e = fs_->WriteFault(path_, 0)) return *e;
      return FSWritableFileOwnerWrapper::Sync(o, dbg);
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      if (std::optional<rocksdb::IOStatus> e = fs_->WriteFault(path_, 0)) return *e;
      return FSWritableFileOwnerWrapper::Fsync(o, dbg);
    }

   private:
    DbFaultFs* fs_;
    std::string path_;
  };

  class RandomAccess : public rocksdb::FSRandomAccessFileOwnerWrapper {
   public:
    RandomAccess(std::unique_ptr<rocksdb::FSRandomAccessFile> t, DbFaultFs* fs, std::string path)
        : FSRandomAccessFileOwnerWrapper(std::move(t)), fs_(fs), path_(std::move(path)) {}
    rocksdb::IOStatus Read(uint64_t offset, size_t n, const rocksdb::IOOptions& o,
                           rocksdb::Slice* result, char* scratch,
                           rocksdb::IODebugContext* dbg) const override {
      bool flip = false;
      if (std::optional<rocksdb::IOStatus> e = fs_->ReadFault(path_, &flip)) return *e;
      rocksdb::IOStatus s =
          FSRandomAccessFileOwnerWrapper::Read(offset, n, o, result, scratch, dbg);
      if (s.ok() && flip && result->size() > 0) {
        if (result->data() != scratch) std::memcpy(scratch, result->data(), result->size());
        scratch[result->size() / 2] ^= 0x10;
        *result = rocksdb::Slice(scratch, result->size());
      }
      return s;
    }

   private:
    DbFaultFs* fs_;
    std::string path_;
  };

  // The write error for `path` (after counting `bytes` against the budget), if any.
  std::optional<rocksdb::IOStatus> WriteFault(const std::string& path, uint64_t bytes) {
    MutexLock lock(&mu_);
    if (!write_fragment_ || path.find(*write_fragment_) == std::string::npos) return std::nullopt;
    if (bytes > 0 && write_budget_ >= bytes) {
      write_budget_ -= bytes;
      return std::nullopt;
    }
    if (bytes == 0 && write_budget_ > 0) return std::nullopt;
    write_budget_ = 0;
    ++failed_writes_;
    return write_error_;
  }
  std::optional<rocksdb::IOStatus> ReadFault(const std::string& path, bool* flip) {
    MutexLock lock(&mu_);
    if (read_fragment_ && path.find(*read_fragment_) != std::string::npos) return read_error_;
    *flip = flip_fragment_ && path.find(*flip_fragment_) != std::string::npos;
    if (*flip) ++flipped_reads_;
    return std::nullopt;
  }

  mutable Mutex mu_;
  std::optional<std::string> write_fragment_ GUARDED_BY(mu_);
  std::optional<std::string> read_fragment_ GUARDED_BY(mu_);
  std::optional<std::string> flip_fragment_ GUARDED_BY(mu_);
  rocksdb::IOStatus write_error_ GUARDED_BY(mu_);
  rocksdb::IOStatus read_error_ GUARDED_BY(mu_);
  uint64_t write_budget_ GUARDED_BY(mu_) = 0;
  uint64_t failed_writes_ GUARDED_BY(mu_) = 0;
  uint64_t flipped_reads_ GUARDED_BY(mu_) = 0;
};

}  // namespace nopfs::service::testing
