// The catalog DB in RocksDB (see catalog_store.h and docs/catalog.md).
#include "service/catalog/catalog_store.h"

#include <sys/stat.h>

#include <atomic>
#include <memory>
#include <utility>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include "common/mutex.h"

namespace nopfs::service::store {
namespace {

using policy::SampleId;

constexpr uint64_t kWriteBatchEntries = 16384;

}  // namespace

Status FromRocks(const rocksdb::Status& s, std::string_view context) {
  if (s.ok()) return Status::Ok();
  std::string msg(context);
  msg += ": ";
  msg += s.ToString();
  if (s.IsNotFound()) return Status::NotFound(std::move(msg));
  if (s.IsCorruption()) return Status::Corruption(std::move(msg));
  if (s.IsInvalidArgument()) return Status::InvalidArgument(std::move(msg));
  if (s.IsNoSpace()) return Status::ResourceExhausted(std::move(msg));
  if (s.IsTimedOut()) return Status::TimedOut(std::move(msg));
  if (s.IsBusy() || s.IsTryAgain()) return Status::Unavailable(std::move(msg));
  return Status::IoError(std::move(msg));
}

Status LoadIfFresh(const LoadRequest& req, Env* env, Contents* c, uint64_t* fingerprint) {
  struct stat st {};
  if (::stat(req.entry.c_str(), &st) != 0) return Status::NotFound("no catalog at " + req.entry);
  rocksdb::Options opts;
  opts.create_if_missing = false;
  opts.info_log_level = rocksdb::InfoLogLevel::HEADER_LEVEL;
  if (req.db_env != nullptr) opts.env = req.db_env;
  rocksdb::DB* raw = nullptr;
  NOPFS_RETURN_IF_ERROR(
      FromRocks(rocksdb::DB::OpenForReadOnly(opts, req.entry, &raw), "opening " + req.entry));
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string v;
  NOPFS_RETURN_IF_ERROR(FromRocks(db->Get({}, std::string(codec::kMetaKey), &v), "meta"));
  Result<codec::CatalogMeta> meta = codec::DecodeCatalogMeta(v);
  if (!meta.ok()) return meta.status();
  if (!meta->reusable)
    return Status::FailedPrecondition("the catalog was built while the dataset was changing");
  if (meta->dataset != req.real || meta->kind != req.kind) {
    return Status::FailedPrecondition("the catalog describes " + meta->dataset);
  }

  // Stamps first: all of them must match before anything else is read.
  std::vector<std::pair<std::string, codec::Stamp>> stamps;
  {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator({}));
    const std::string prefix(1, codec::kStampPrefix);
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      Result<codec::Stamp> stamp = codec::DecodeStamp(it->value().ToStringView());
      if (!stamp.ok()) return stamp.status();
      stamps.emplace_back(it->key().ToString().substr(1), *stamp);
    }
    NOPFS_RETURN_IF_ERROR(FromRocks(it->status(), "reading stamps"));
  }
  if (stamps.size() != meta->stamps) return Status::Corruption("stamp count differs from meta");
  std::atomic<bool> changed{false};
  Mutex mu;
  std::string what;
  scan::ParallelFor(stamps.size(), req.scan_threads, [&](uint64_t i) {
    if (changed.load(std::memory_order_relaxed)) return;
    Result<FileStat> now = env->Stat(stamps[i].first);
    if (!now.ok() || !(scan::ToStamp(*now) == stamps[i].second)) {
      changed.store(true);
      MutexLock lock(&mu);
      what = stamps[i].first;
    }
  });
  if (changed.load()) return Status::FailedPrecondition(what + " changed");

  c->root = meta->root;
  {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator({}));
    const std::string prefix(1, codec::kClassPrefix);
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      Result<uint32_t> label = codec::DecodeClassKey(it->key().ToStringView());
      if (!label.ok()) return label.status();
      if (*label != c->classes.size()) return Status::Corruption("class labels not contiguous");
      c->classes.push_back(it->value().ToString());
    }
    NOPFS_RETURN_IF_ERROR(FromRocks(it->status(), "reading classes"));
  }
  if (c->classes.size() != meta->classes)
    return Status::Corruption("class count differs from meta");
  c->Reserve(meta->samples);
  {
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator({}));
    const std::string prefix(1, codec::kSamplePrefix);
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      Result<SampleId> id = codec::DecodeIdKey(it->key().ToStringView(), codec::kSamplePrefix);
      if (!id.ok()) return id.status();
      if (*id != c->lengths.size()) return Status::Corruption("sample ids not contiguous");
      Result<codec::SampleValue> sv = codec::DecodeSampleValue(it->value().ToStringView());
      if (!sv.ok()) return sv.status();
      c->Add(sv->relative_path, sv->offset, sv->length, sv->label);
    }
    NOPFS_RETURN_IF_ERROR(FromRocks(it->status(), "reading samples"));
  }
  if (c->lengths.size() != meta->samples || c->lengths.empty()) {
    return Status::Corruption("sample count differs from meta");
  }
  *fingerprint = ComputeFingerprint(*c);
  if (*fingerprint != meta->fingerprint) return Status::Corruption("fingerprint differs from meta");
  return Status::Ok();
}

Status WriteCatalogDb(const std::string& dir, const codec::CatalogMeta& meta,
                      const scan::ScanResult& scanned, rocksdb::Env* db_env) {
  rocksdb::Options opts;
  opts.create_if_missing = true;
  opts.error_if_exists = true;
  opts.info_log_level = rocksdb::InfoLogLevel::HEADER_LEVEL;
  if (db_env != nullptr) opts.env = db_env;
  rocksdb::DB* raw = nullptr;
  NOPFS_RETURN_IF_ERROR(
      FromRocks(rocksdb::DB::Open(opts, dir, &raw), "creating catalog DB " + dir));
  std::unique_ptr<rocksdb::DB> db(raw);
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;  // flushed below before the DB is installed
  rocksdb::WriteBatch batch;
  auto maybe_write = [&](bool force) -> Status {
    if (!force && static_cast<uint64_t>(batch.Count()) < kWriteBatchEntries) return Status::Ok();
    NOPFS_RETURN_IF_ERROR(FromRocks(db->Write(wo, &batch), "writing catalog DB " + dir));
    batch.Clear();
    return Status::Ok();
  };
  for (size_t i = 0; i < scanned.class_names.size(); ++i) {
    NOPFS_RETURN_IF_ERROR(FromRocks(
        batch.Put(codec::ClassKey(static_cast<uint32_t>(i)), scanned.class_names[i]), "batch"));
  }
  for (const auto& st : scanned.stamps) {
    NOPFS_RETURN_IF_ERROR(
        FromRocks(batch.Put(codec::StampKey(st.path), codec::EncodeStamp(st.stamp)), "batch"));
    NOPFS_RETURN_IF_ERROR(maybe_write(false));
  }
  for (size_t i = 0; i < scanned.samples.size(); ++i) {
    const scan::Sample& s = scanned.samples[i];
    NOPFS_RETURN_IF_ERROR(
        FromRocks(batch.Put(codec::SampleKey(static_cast<SampleId>(i)),
                            codec::EncodeSampleValue(s.offset, s.length, s.label, s.relative_path)),
                  "batch"));
    NOPFS_RETURN_IF_ERROR(maybe_write(false));
  }
  // The meta record goes last: a DB without it is never loaded.
  NOPFS_RETURN_IF_ERROR(
      FromRocks(batch.Put(std::string(codec::kMetaKey), codec::EncodeCatalogMeta(meta)), "batch"));
  NOPFS_RETURN_IF_ERROR(maybe_write(true));
  rocksdb::FlushOptions fo;
  fo.wait = true;
  NOPFS_RETURN_IF_ERROR(FromRocks(db->Flush(fo), "flushing catalog DB " + dir));
  NOPFS_RETURN_IF_ERROR(FromRocks(db->Close(), "closing catalog DB " + dir));
  return Status::Ok();
}

}  // namespace nopfs::service::store
