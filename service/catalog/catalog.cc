// Catalog: open, reuse or scan (see catalog.h and docs/catalog.md). The cache protocol is in
// catalog_cache.cc, the RocksDB load and store in catalog_store.cc, the per-job checksums in
// catalog_checksums.cc.
#include "service/catalog/catalog.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <utility>

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>

#include "service/catalog/catalog_cache.h"
#include "service/catalog/catalog_codec.h"
#include "service/catalog/catalog_scan.h"
#include "service/catalog/catalog_store.h"

namespace nopfs::service {
namespace {

namespace fs = std::filesystem;
using policy::SampleId;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
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

Result<std::unique_ptr<Catalog>> Catalog::Open(const CatalogOptions& options, Env* env) {
  NOPFS_RETURN_IF_ERROR(options.Validate());
  store::LoadRequest s;
  s.scan_threads = options.scan_threads;
  s.db_env = options.db_env;
  std::string tmp_parent;
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

  NOPFS_RETURN_IF_ERROR(cache::EnsureDir(options.work_dir, 0700));
  Result<std::string> user_dir = std::string();
  if (!options.cache_dir.empty()) {
    // A cache that cannot be used safely is no cache: the job scans, it never fails for it.
    user_dir = cache::UserCacheDir(options.cache_dir, options.uid);
    if (!user_dir.ok()) {
      spdlog::warn("catalog cache not used, scanning instead: {}", user_dir.status().message());
    }
  }
  if (user_dir.ok() && !user_dir->empty()) {
    tmp_parent = *user_dir;
    s.entry = cache::EntryPath(*user_dir, s.real);
  } else {
    tmp_parent = options.work_dir;
    s.entry = options.work_dir + "/catalog";
  }
  cache::RemoveStale(tmp_parent);

  std::unique_ptr<Catalog> cat(new Catalog());
  cat->env_ = env;
  cat->db_path_ = s.entry;
  store::Contents contents;
  Status fresh = store::LoadIfFresh(s, env, &contents, &cat->fingerprint_);
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
    contents = store::Contents();

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
    cat->fingerprint_ = store::ComputeFingerprint(contents);

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

    // The job has its catalog now; storing it only saves the next job a scan.
    const std::string tmp =
        tmp_parent + "/.tmp-" + fs::path(s.entry).filename().string() + "-" + cache::UniqueSuffix();
    Status w = ::mkdir(tmp.c_str(), 0700) == 0 ? Status::Ok()
                                               : Status::FromErrno(errno, "creating " + tmp);
    if (w.ok()) w = store::WriteCatalogDb(tmp, meta, *scanned, options.db_env);
    if (w.ok()) w = cache::Install(tmp, s.entry);
    if (!w.ok()) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      cat->store_error_ = w.message();
      spdlog::warn("the catalog of {} is not stored, the next job scans it again: {}", s.real,
                   w.message());
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
  cat->OpenChecksumDb(options.work_dir, options.db_env);
  return cat;
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
