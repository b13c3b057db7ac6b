// The Catalog's per-job checksum store: a private RocksDB under work_dir, kept across jobs with
// the same work_dir while the catalog's fingerprint is unchanged (see catalog.h and
// docs/catalog.md).
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>

#include "service/catalog/catalog.h"
#include "service/catalog/catalog_cache.h"
#include "service/catalog/catalog_codec.h"
#include "service/catalog/catalog_store.h"

namespace nopfs::service {
namespace {

using policy::SampleId;
using store::FromRocks;

constexpr uint64_t kChecksumBatch = 4096;

}  // namespace

void Catalog::OpenChecksumDb(const std::string& work_dir, rocksdb::Env* db_env) {
  checksum_db_path_ = work_dir + "/checksums";
  rocksdb::Options opts;
  opts.create_if_missing = true;
  opts.info_log_level = rocksdb::InfoLogLevel::HEADER_LEVEL;
  if (db_env != nullptr) opts.env = db_env;
  rocksdb::DB* raw = nullptr;
  const Status opened = FromRocks(
      rocksdb::DB::Open(opts, checksum_db_path_, &raw),
      "opening checksum DB " + checksum_db_path_ + " (one Catalog per work_dir at a time)");
  MutexLock lock(&mu_);
  pending_ = std::make_unique<rocksdb::WriteBatch>();
  if (!opened.ok()) {
    StopPersistingLocked(opened);
    return;
  }
  checksum_db_.reset(raw);
  if (Status loaded = LoadChecksums(); !loaded.ok()) StopPersistingLocked(loaded);
}

Status Catalog::LoadChecksums() {
  std::string v;
  const rocksdb::Status got = checksum_db_->Get({}, std::string(codec::kMetaKey), &v);
  bool keep = false;
  if (got.ok()) {
    Result<codec::ChecksumMeta> m = codec::DecodeChecksumMeta(v);
    keep = m.ok() && m->format == codec::kCatalogFormat && m->fingerprint == fingerprint_;
  } else if (!got.IsNotFound()) {
    return FromRocks(got, "reading checksum DB " + checksum_db_path_);
  }
  rocksdb::WriteBatch batch;
  std::unique_ptr<rocksdb::Iterator> it(checksum_db_->NewIterator({}));
  const std::string prefix(1, codec::kChecksumPrefix);
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    Result<SampleId> id = codec::DecodeIdKey(it->key().ToStringView(), codec::kChecksumPrefix);
    Result<uint64_t> sum = codec::DecodeChecksum(it->value().ToStringView());
    if (keep && id.ok() && sum.ok() && *id < size()) {
      checksum_value_[*id].store(*sum, std::memory_order_relaxed);
      checksum_state_[*id].store(2, std::memory_order_release);
    } else {
      // Checksums of another catalog (the dataset changed) or unreadable records: forget them.
      NOPFS_RETURN_IF_ERROR(FromRocks(batch.Delete(it->key()), "batch"));
    }
  }
  NOPFS_RETURN_IF_ERROR(FromRocks(it->status(), "reading checksum DB " + checksum_db_path_));
  it.reset();
  if (!keep) {
    NOPFS_RETURN_IF_ERROR(
        FromRocks(batch.Put(std::string(codec::kMetaKey),
                            codec::EncodeChecksumMeta({codec::kCatalogFormat, fingerprint_})),
                  "batch"));
  }
  return FromRocks(checksum_db_->Write({}, &batch), "writing checksum DB " + checksum_db_path_);
}

void Catalog::StopPersistingLocked(const Status& error) {
  spdlog::warn(
      "{}; this job keeps its sample checksums in memory only (a later job with the "
      "same work directory records them again)",
      error.message());
  checksum_db_.reset();
  pending_->Clear();
  pending_count_ = 0;
}

bool Catalog::checksums_persisted() const {
  MutexLock lock(&mu_);
  return checksum_db_ != nullptr;
}

Catalog::~Catalog() {
  MutexLock lock(&mu_);
  if (checksum_db_ != nullptr) (void)FlushLocked();
}

std::optional<uint64_t> Catalog::checksum(SampleId id) const {
  if (id >= size() || checksum_state_[id].load(std::memory_order_acquire) != 2) return std::nullopt;
  return checksum_value_[id].load(std::memory_order_relaxed);
}

Status Catalog::RecordChecksum(SampleId id, uint64_t xxh3) {
  if (id >= size()) {
    return Status::InvalidArgument("sample " + std::to_string(id) + " is out of range (" +
                                   std::to_string(size()) + " samples)");
  }
  uint8_t expected = 0;
  if (checksum_state_[id].compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    checksum_value_[id].store(xxh3, std::memory_order_relaxed);
    checksum_state_[id].store(2, std::memory_order_release);
    MutexLock lock(&mu_);
    if (checksum_db_ == nullptr) return Status::Ok();  // in memory only (logged when it stopped)
    NOPFS_RETURN_IF_ERROR(
        FromRocks(pending_->Put(codec::ChecksumKey(id), codec::EncodeChecksum(xxh3)), "batch"));
    // A failed write is logged once and ends persistence; the checksum itself is recorded.
    if (++pending_count_ >= kChecksumBatch) (void)FlushLocked();
    return Status::Ok();
  }
  // Another thread records or recorded this sample: wait for its value and compare.
  while (checksum_state_[id].load(std::memory_order_acquire) != 2)
    std::this_thread::yield();
  const uint64_t known = checksum_value_[id].load(std::memory_order_relaxed);
  if (known == xxh3) return Status::Ok();
  return Status::Corruption("sample " + std::to_string(id) + " (" + path(id) + "): checksum " +
                            cache::Hex16(xxh3) + " differs from the recorded " +
                            cache::Hex16(known) +
                            "; the file changed or a read returned wrong bytes");
}

Status Catalog::Flush() {
  MutexLock lock(&mu_);
  return FlushLocked();
}

Status Catalog::FlushLocked() {
  if (pending_count_ == 0 || checksum_db_ == nullptr) return Status::Ok();
  const Status written = FromRocks(checksum_db_->Write({}, pending_.get()),
                                   "writing checksum DB " + checksum_db_path_);
  if (!written.ok()) {
    StopPersistingLocked(written);
    return written;
  }
  pending_->Clear();
  pending_count_ = 0;
  return Status::Ok();
}

}  // namespace nopfs::service
