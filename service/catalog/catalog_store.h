// The catalog DB in RocksDB: loading a stored catalog when every stamp it recorded still matches
// the dataset, and writing a freshly scanned one; the catalog's in-memory form both fill; and
// RocksDB's status in nopfs terms. Internal to the catalog (service/catalog/); the records are
// catalog_codec.h's.
//
// Thread safety: the functions are reentrant; a Contents is owned by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "service/catalog/catalog_codec.h"
#include "service/catalog/catalog_contents.h"
#include "service/catalog/catalog_scan.h"
#include "service/env/env.h"

namespace rocksdb {
class Env;
class Status;
}  // namespace rocksdb

namespace nopfs::service::store {

// RocksDB's status in nopfs terms, in one place; `context` starts the message.
Status FromRocks(const rocksdb::Status& s, std::string_view context);

// What the stored catalog must describe to be reused.
struct LoadRequest {
  std::string entry;  // the catalog DB's directory
  std::string real;   // the dataset's absolute real path
  codec::DatasetKind kind = codec::DatasetKind::kImageFolder;
  uint32_t scan_threads = 8;       // threads that stat the stamps
  rocksdb::Env* db_env = nullptr;  // RocksDB's file access (nullptr: its default)
};

// Loads the catalog DB at req.entry into `c` if it describes req.real and every stamp still
// matches (re-stat'ed through `env`); otherwise returns why not (the caller scans): NotFound
// without a DB, FailedPrecondition for a changed dataset, Corruption for a damaged DB.
Status LoadIfFresh(const LoadRequest& req, Env* env, Contents* c, uint64_t* fingerprint);

// Writes a new catalog DB into the empty directory `dir` through `db_env` (nullptr: RocksDB's
// default); the meta record goes last.
Status WriteCatalogDb(const std::string& dir, const codec::CatalogMeta& meta,
                      const scan::ScanResult& scanned, rocksdb::Env* db_env);

}  // namespace nopfs::service::store
