// Catalog: open, reuse or scan, persist (see catalog.h and docs/catalog.md).
#include "service/catalog/catalog.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <utility>

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>

#include "common/mutex.h"
#include "service/catalog/catalog_codec.h"
#include "service/catalog/catalog_scan.h"

namespace nopfs::service {
namespace {

namespace fs = std::filesystem;
using policy::SampleId;

constexpr uint64_t kWriteBatchEntries = 16384;
constexpr uint64_t kChecksumBatch = 4096;
// Temporary and replaced cache entries older than this are left over by a crashed job.
constexpr auto kStaleAge = std::chrono::hours(6);

// RocksDB's status in nopfs terms, in one place.
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

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// mkdir -m mode `path` unless it exists as a directory.
Status EnsureDir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) == 0) return Status::Ok();
  if (errno != EEXIST) return Status::FromErrno(errno, "creating directory " + path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, path);
  if (!S_ISDIR(st.st_mode))
    return Status::FailedPrecondition(path + " exists and is not a directory");
  return Status::Ok();
}

// The per-user cache directory: created 0700, must be a real directory owned by `uid` that no one
// else can write to (others could plant a catalog otherwise).
Result<std::string> UserCacheDir(const std::string& cache_dir, uint32_t uid) {
  struct stat st {};
  if (::stat(cache_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::FailedPrecondition("catalog cache directory " + cache_dir +
                                      " does not exist; the admin creates it (root-owned, mode "
                                      "0755: the prolog makes each user's subdirectory), or "
                                      "leave catalog_cache out");
  }
  const std::string dir = cache_dir + "/" + std::to_string(uid);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::FromErrno(errno, "creating catalog cache directory " + dir +
                                        " (in a root-owned cache directory the prolog makes it)");
  }
  if (::lstat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, dir);
  if (!S_ISDIR(st.st_mode) || st.st_uid != uid || (st.st_mode & 0022) != 0) {
    return Status::PermissionDenied(dir + " must be a directory owned by uid " +
                                    std::to_string(uid) +
                                    " and writable by no one else; remove it so nopfsd recreates "
                                    "it");
  }
  return dir;
}

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A name no other process uses: host-unique pid plus a per-process counter and the clock.
std::string UniqueSuffix() {
  static std::atomic<uint64_t> counter{0};
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof host - 1);
  return std::string(host) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1)) + "-" + Hex16(static_cast<uint64_t>(NowNs()));
}

// Removes `.tmp-*` and `.old-*` entries older than kStaleAge from `dir` (left by crashed jobs).
void RemoveStale(const std::string& dir) {
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(".tmp-", 0) != 0 && name.rfind(".old-", 0) != 0) continue;
    std::error_code ec2;
    const auto t = fs::last_write_time(it->path(), ec2);
    if (!ec2 && now - t > kStaleAge) fs::remove_all(it->path(), ec2);
  }
}

// Puts the finished DB `tmp` at `entry`, replacing whatever is there, atomically: readers see
// either the old complete DB or the new complete one (or, without RENAME_EXCHANGE, briefly none).
Status Install(const std::string& tmp, const std::string& entry) {
  const auto failed = [&](const char* what) {
    return Status::FromErrno(errno, std::string(what) + " catalog " + tmp + " as " + entry);
  };
  // Racing jobs may install between our steps; each round either finishes or saw a racer.
  for (int round = 0; round < 8; ++round) {
    if (::rename(tmp.c_str(), entry.c_str()) == 0) return Status::Ok();
    if (errno != EEXIST && errno != ENOTEMPTY) return failed("installing");
    // An entry exists (stale, or just installed by a racing job): swap, then drop the old one.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, entry.c_str(), RENAME_EXCHANGE) == 0) {
      std::error_code ec;
      fs::remove_all(tmp, ec);  // now holds the old DB
      return Status::Ok();
    }
    if (errno == ENOENT) continue;  // the entry vanished meanwhile: plain rename again
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return failed("installing");
    // No RENAME_EXCHANGE on this file system: move the old entry aside first.
    const std::string old = fs::path(entry).parent_path().string() + "/.old-" +
                            fs::path(entry).filename().string() + "-" + UniqueSuffix();
    if (::rename(entry.c_str(), old.c_str()) != 0 && errno != ENOENT) {
      return failed("moving aside the old entry for");
    }
    const bool ok = ::rename(tmp.c_str(), entry.c_str()) == 0;
    const int err = errno;
    std::error_code ec;
    fs::remove_all(old, ec);
    if (ok) return Status::Ok();
    if (err != EEXIST && err != ENOTEMPTY) {
      errno = err;
      return failed("installing");
    }
  }
  return Status::Unavailable("installing catalog " + tmp + " as " + entry +
                             ": other jobs kept replacing the entry; try again");
}

// The catalog's in-memory form, filled by a load or a scan and then moved into the Catalog.
struct Contents {
  std::string root;
  std::vector<std::string> classes;
  std::string arena;
  std::vector<uint64_t> path_end;
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> lengths;
  std::vector<int64_t> labels;

  void Reserve(uint64_t n) {
    path_end.reserve(n);
    offsets.reserve(n);
    lengths.reserve(n);
    labels.reserve(n);
  }
  void Add(std::string_view rel, uint64_t offset, uint64_t length, int64_t label) {
    arena.append(rel);
    path_end.push_back(arena.size());
    offsets.push_back(offset);
    lengths.push_back(length);
    labels.push_back(label);
  }
};

uint64_t ComputeFingerprint(const Contents& c) {
  XXH3_state_t* st = XXH3_createState();
  if (st == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(st);
  auto put = [st](uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i)
      b[i] = static_cast<unsigned char>(v >> (8 * i));
    XXH3_64bits_update(st, b, 8);
  };
  auto put_str = [&](std::string_view s) {
    put(s.size());
    XXH3_64bits_update(st, s.data(), s.size());
  };
  put_str(c.root);
  put(c.classes.size());
  for (const auto& name : c.classes)
    put_str(name);
  put(c.lengths.size());
  uint64_t begin = 0;
  for (size_t i = 0; i < c.lengths.size(); ++i) {
    put_str(std::string_view(c.arena).substr(begin, c.path_end[i] - begin));
    begin = c.path_end[i];
    put(c.offsets[i]);
    put(c.lengths[i]);
    put(static_cast<uint64_t>(c.labels[i]));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace

Status CatalogOptions::Validate() const {
  if (dataset.empty())
    return Status::InvalidArgument("catalog: dataset is empty; name a directory or manifest");
  if (work_dir.empty())
    return Status::InvalidArgument("catalog: work_dir is empty; name the job's private directory");
  if (scan_threads < 1 || scan_threads > 1024) {
    return Status::InvalidArgument("catalog: scan_threads must be 1..1024, got " +
                                   std::to_string(scan_threads));
  }
  if (racy_window_ns < 0) return Status::InvalidArgument("catalog: racy_window_ns must be >= 0");
  return Status::Ok();
}

namespace {

// Everything Open needs between its steps.
struct OpenState {
  const CatalogOptions* options = nullptr;
  Env* env = nullptr;
  std::string real;  // the dataset's absolute real path
  codec::DatasetKind kind = codec::DatasetKind::kImageFolder;
  std::string entry;  // where the catalog DB lives
  std::string tmp_parent;
};

// Loads the catalog DB at `entry` into `c` if it describes `real` and every stamp still
// matches; otherwise returns why not (the caller scans).
Status LoadIfFresh(const OpenState& s, Contents* c, uint64_t* fingerprint) {
  struct stat st {};
  if (::stat(s.entry.c_str(), &st) != 0) return Status::NotFound("no catalog at " + s.entry);
  rocksdb::Options opts;
  opts.create_if_missing = false;
  opts.info_log_level = rocksdb::InfoLogLevel::HEADER_LEVEL;
  rocksdb::DB* raw = nullptr;
  NOPFS_RETURN_IF_ERROR(
      FromRocks(rocksdb::DB::OpenForReadOnly(opts, s.entry, &raw), "opening " + s.entry));
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string v;
  NOPFS_RETURN_IF_ERROR(FromRocks(db->Get({}, std::string(codec::kMetaKey), &v), "meta"));
  Result<codec::CatalogMeta> meta = codec::DecodeCatalogMeta(v);
  if (!meta.ok()) return meta.status();
  if (!meta->reusable)
    return Status::FailedPrecondition("the catalog was built while the dataset was changing");
  if (meta->dataset != s.real || meta->kind != s.kind) {
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
  scan::ParallelFor(stamps.size(), s.options->scan_threads, [&](uint64_t i) {
    if (changed.load(std::memory_order_relaxed)) return;
    Result<FileStat> now = s.env->Stat(stamps[i].first);
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

// Writes a new catalog DB into the empty directory `dir`.
Status WriteCatalogDb(const std::string& dir, const codec::CatalogMeta& meta,
                      const scan::ScanResult& scanned) {
  rocksdb::Options opts;
  opts.create_if_missing = true;
  opts.error_if_exists = true;
  opts.info_log_level = rocksdb::InfoLogLevel::HEADER_LEVEL;
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

}  // namespace

Result<std::unique_ptr<Catalog>> Catalog::Open(const CatalogOptions& options, Env* env) {
  NOPFS_RETURN_IF_ERROR(options.Validate());
  OpenState s;
  s.options = &options;
  s.env = env;
  {
    char* real = ::realpath(options.dataset.c_str(), nullptr);
    if (real == nullptr) return Status::FromErrno(errno, "dataset " + options.dataset);
    s.real = real;
    std::free(real);
  }
  Result<FileStat> dst = env->Stat(s.real);
  if (!dst.ok()) return dst.status().WithContext("dataset");
  if (dst->is_dir) {
    s.kind = codec::DatasetKind::kImageFolder;
  } else if (dst->is_regular) {
    s.kind = codec::DatasetKind::kManifest;
  } else {
    return Status::InvalidArgument("dataset " + s.real +
                                   " is neither a directory (ImageFolder) nor a manifest file");
  }

  NOPFS_RETURN_IF_ERROR(EnsureDir(options.work_dir, 0700));
  Result<std::string> user_dir = std::string();
  if (!options.cache_dir.empty()) {
    // A cache that cannot be used safely is no cache: the job scans, it never fails for it.
    user_dir = UserCacheDir(options.cache_dir, options.uid);
    if (!user_dir.ok()) {
      spdlog::warn("catalog cache not used, scanning instead: {}", user_dir.status().message());
    }
  }
  if (user_dir.ok() && !user_dir->empty()) {
    s.tmp_parent = *user_dir;
    s.entry = *user_dir + "/" + Hex16(XXH3_64bits(s.real.data(), s.real.size()));
  } else {
    s.tmp_parent = options.work_dir;
    s.entry = options.work_dir + "/catalog";
  }
  RemoveStale(s.tmp_parent);

  std::unique_ptr<Catalog> cat(new Catalog());
  cat->env_ = env;
  cat->db_path_ = s.entry;
  Contents contents;
  Status fresh = LoadIfFresh(s, &contents, &cat->fingerprint_);
  if (fresh.ok()) {
    cat->reused_ = true;
  } else {
    // nopfsd logs this reason: a damaged entry must not be rebuilt silently.
    if (!user_dir.ok()) {
      cat->rescan_reason_ = "catalog cache not used: " + user_dir.status().message();
    } else if (fresh.code() == StatusCode::kCorruption) {
      cat->rescan_reason_ =
          "the cached catalog " + s.entry + " is corrupt (" + fresh.message() + ")";
    } else {
      cat->rescan_reason_ = fresh.message();
    }
    contents = Contents();

    const int64_t scan_start = NowNs();
    Result<scan::ScanResult> scanned =
        s.kind == codec::DatasetKind::kImageFolder
            ? scan::ScanImageFolder(s.real, env, options.scan_threads)
            : scan::ScanManifest(s.real, env, options.scan_threads);
    if (!scanned.ok()) return scanned.status();
    if (scanned->samples.size() > policy::kMaxSamples) {
      return Status::InvalidArgument(
          "dataset " + s.real + " has " + std::to_string(scanned->samples.size()) +
          " samples; at most " + std::to_string(policy::kMaxSamples) + " are supported");
    }
    const size_t n = scanned->samples.size();
    contents.root = scanned->root;
    contents.classes = scanned->class_names;
    contents.Reserve(n);
    for (const scan::Sample& smp : scanned->samples) {
      contents.Add(smp.relative_path, smp.offset, smp.length, smp.label);
    }
    cat->fingerprint_ = ComputeFingerprint(contents);

    codec::CatalogMeta meta;
    meta.kind = s.kind;
    meta.reusable = true;
    for (const auto& st : scanned->stamps) {
      if (st.stamp.mtime_ns >= scan_start - options.racy_window_ns) meta.reusable = false;
    }
    meta.samples = n;
    meta.classes = static_cast<uint32_t>(scanned->class_names.size());
    meta.stamps = scanned->stamps.size();
    meta.fingerprint = cat->fingerprint_;
    meta.dataset = s.real;
    meta.root = scanned->root;

    const std::string tmp =
        s.tmp_parent + "/.tmp-" + fs::path(s.entry).filename().string() + "-" + UniqueSuffix();
    if (::mkdir(tmp.c_str(), 0700) != 0) return Status::FromErrno(errno, "creating " + tmp);
    Status w = WriteCatalogDb(tmp, meta, *scanned);
    if (w.ok()) w = Install(tmp, s.entry);
    if (!w.ok()) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      return w;
    }
  }

  cat->root_ = std::move(contents.root);
  cat->class_names_ = std::move(contents.classes);
  cat->arena_ = std::move(contents.arena);
  cat->path_end_ = std::move(contents.path_end);
  cat->offsets_ = std::move(contents.offsets);
  cat->lengths_ = std::move(contents.lengths);
  cat->labels_ = std::move(contents.labels);
  cat->checksum_state_ = std::make_unique<std::atomic<uint8_t>[]>(cat->size());
  cat->checksum_value_ = std::make_unique<std::atomic<uint64_t>[]>(cat->size());
  NOPFS_RETURN_IF_ERROR(cat->OpenChecksumDb(options.work_dir));
  return cat;
}

Status Catalog::OpenChecksumDb(const std::string& work_dir) {
  checksum_db_path_ = work_dir + "/checksums";
  rocksdb::Options opts;
  opts.create_if_missing = true;
  opts.info_log_level = rocksdb::InfoLogLevel::HEADER_LEVEL;
  rocksdb::DB* raw = nullptr;
  NOPFS_RETURN_IF_ERROR(FromRocks(
      rocksdb::DB::Open(opts, checksum_db_path_, &raw),
      "opening checksum DB " + checksum_db_path_ + " (one Catalog per work_dir at a time)"));
  checksum_db_.reset(raw);
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
  NOPFS_RETURN_IF_ERROR(
      FromRocks(checksum_db_->Write({}, &batch), "writing checksum DB " + checksum_db_path_));
  MutexLock lock(&mu_);
  pending_ = std::make_unique<rocksdb::WriteBatch>();
  return Status::Ok();
}

Catalog::~Catalog() {
  if (checksum_db_ != nullptr) {
    MutexLock lock(&mu_);
    (void)FlushLocked();
  }
}

std::string_view Catalog::relative_path(SampleId id) const {
  const uint64_t end = path_end_.at(id);
  const uint64_t begin = id == 0 ? 0 : path_end_[id - 1];
  return std::string_view(arena_).substr(begin, end - begin);
}

std::string Catalog::path(SampleId id) const {
  const std::string_view rel = relative_path(id);
  std::string p;
  p.reserve(root_.size() + 1 + rel.size());
  p.append(root_);
  p.push_back('/');
  p.append(rel);
  return p;
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
    NOPFS_RETURN_IF_ERROR(
        FromRocks(pending_->Put(codec::ChecksumKey(id), codec::EncodeChecksum(xxh3)), "batch"));
    if (++pending_count_ >= kChecksumBatch) return FlushLocked();
    return Status::Ok();
  }
  // Another thread records or recorded this sample: wait for its value and compare.
  while (checksum_state_[id].load(std::memory_order_acquire) != 2)
    std::this_thread::yield();
  const uint64_t known = checksum_value_[id].load(std::memory_order_relaxed);
  if (known == xxh3) return Status::Ok();
  return Status::Corruption("sample " + std::to_string(id) + " (" + path(id) + "): checksum " +
                            Hex16(xxh3) + " differs from the recorded " + Hex16(known) +
                            "; the file changed or a read returned wrong bytes");
}

Status Catalog::Flush() {
  MutexLock lock(&mu_);
  return FlushLocked();
}

Status Catalog::FlushLocked() {
  if (pending_count_ == 0) return Status::Ok();
  NOPFS_RETURN_IF_ERROR(FromRocks(checksum_db_->Write({}, pending_.get()),
                                  "writing checksum DB " + checksum_db_path_));
  pending_->Clear();
  pending_count_ = 0;
  return Status::Ok();
}

Status Catalog::Read(SampleId id, std::span<std::byte> dst) const {
  if (id >= size()) {
    return Status::InvalidArgument("sample " + std::to_string(id) + " is out of range (" +
                                   std::to_string(size()) + " samples)");
  }
  const std::string p = path(id);
  const std::string prefix = "sample " + std::to_string(id) + " (" + p + ")";
  if (dst.size() != lengths_[id]) {
    return Status::InvalidArgument(prefix + ": buffer is " + std::to_string(dst.size()) +
                                   " bytes, the sample is " + std::to_string(lengths_[id]));
  }
  return env_->ReadAt(p, offsets_[id], dst).WithContext(prefix);
}

}  // namespace nopfs::service
