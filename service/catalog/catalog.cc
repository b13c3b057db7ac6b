// Catalog: open, reuse or scan (see catalog.h and docs/catalog.md). The cache protocol is in
// catalog_cache.cc, the RocksDB load and store in catalog_store.cc, the per-job checksums in
// catalog_checksums.cc.
#include "service/catalog/catalog.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <utility>

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>
#include <spdlog/spdlog.h>

#include "common/phases.h"
#include "service/catalog/catalog_cache.h"
#include "service/catalog/catalog_codec.h"
#include "service/catalog/catalog_scan.h"
#include "service/catalog/catalog_share.h"
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
  if (nodes < 1 || node >= nodes) {
    return Status::InvalidArgument("catalog: node " + std::to_string(node) + " of " +
                                   std::to_string(nodes) + " nodes; write node < nodes");
  }
  return Status::Ok();
}

namespace {

// What Open found, before it becomes the Catalog.
struct Opened {
  store::Contents contents;
  uint64_t fingerprint = 0;
  bool reused = false;
  std::string reason;       // why not reused
  std::string db_path;      // the DB this node reads or wrote ("" = none)
  std::string store_error;  // why the scanned catalog was not stored ("" = it was, or reused)
  Phases phases;            // where Open's time went (Catalog::open_phases)
  // With defer_store: writes the catalog DB at `entry` (Catalog::StorePending).
  std::function<Status()> deferred_store;
  std::string deferred_entry;
};

// Why the cached catalog was not used, as nopfsd logs it: a damaged entry must not be rebuilt
// silently.
std::string RescanReason(const Result<std::string>& user_dir, const Status& fresh,
                         const std::string& entry) {
  if (!user_dir.ok()) return "catalog cache not used: " + user_dir.status().message();
  if (fresh.code() == StatusCode::kCorruption) {
    return "the cached catalog " + entry + " is corrupt (" + fresh.message() + ")";
  }
  return fresh.message();
}

// Writes the catalog DB at `entry` through a temporary directory in tmp_parent; on failure removes
// it and logs that the next job scans `dataset` again.
Status WriteStore(const std::string& tmp_parent, const std::string& entry,
                  const std::string& dataset, const codec::CatalogMeta& meta,
                  const scan::ScanResult& scanned, rocksdb::Env* db_env) {
  const std::string tmp =
      tmp_parent + "/.tmp-" + fs::path(entry).filename().string() + "-" + cache::UniqueSuffix();
  Status w =
      ::mkdir(tmp.c_str(), 0700) == 0 ? Status::Ok() : Status::FromErrno(errno, "creating " + tmp);
  if (w.ok()) w = store::WriteCatalogDb(tmp, meta, scanned, db_env);
  if (w.ok()) w = cache::Install(tmp, entry);
  if (!w.ok()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    spdlog::warn("the catalog of {} is not stored, the next job scans it again: {}", dataset,
                 w.message());
  }
  return w;
}

// Takes a finished scan as the catalog: fills out->contents and fingerprint, and writes the
// catalog DB at s.entry (through a temporary directory in tmp_parent), or with defer_store leaves
// that to out->deferred_store.
Status StoreScan(const CatalogOptions& options, const store::LoadRequest& s,
                 const std::string& tmp_parent, int64_t scan_start, scan::ScanResult scanned,
                 Opened* out) {
  if (scanned.samples.size() > policy::kMaxSamples) {
    return Status::InvalidArgument("dataset " + s.real + " has " +
                                   std::to_string(scanned.samples.size()) + " samples; at most " +
                                   std::to_string(policy::kMaxSamples) + " are supported");
  }
  const size_t n = scanned.samples.size();
  store::Contents& contents = out->contents;
  contents = store::Contents();
  contents.root = scanned.root;
  contents.classes = scanned.class_names;
  contents.Reserve(n);
  size_t path_bytes = 0;
  for (const scan::Sample& smp : scanned.samples)
    path_bytes += smp.relative_path.size();
  contents.arena.reserve(path_bytes);
  for (const scan::Sample& smp : scanned.samples) {
    contents.Add(smp.relative_path, smp.offset, smp.length, smp.label);
  }
  out->fingerprint = store::ComputeFingerprint(contents);
  out->phases.Mark("index");

  codec::CatalogMeta meta;
  meta.kind = s.kind;
  meta.reusable = true;
  for (const auto& st : scanned.stamps) {
    if (st.stamp.mtime_ns >= scan_start - options.racy_window_ns) meta.reusable = false;
  }
  meta.samples = n;
  meta.classes = static_cast<uint32_t>(scanned.class_names.size());
  meta.stamps = scanned.stamps.size();
  meta.fingerprint = out->fingerprint;
  meta.dataset = s.real;
  meta.root = scanned.root;

  // The job has its catalog now; storing it only saves the next job a scan.
  if (options.defer_store) {
    out->deferred_entry = s.entry;
    out->deferred_store = [tmp_parent, entry = s.entry, real = s.real, meta = std::move(meta),
                           scanned = std::make_shared<scan::ScanResult>(std::move(scanned)),
                           db_env = options.db_env] {
      return WriteStore(tmp_parent, entry, real, meta, *scanned, db_env);
    };
    return Status::Ok();
  }
  Status w = WriteStore(tmp_parent, s.entry, s.real, meta, scanned, options.db_env);
  out->phases.Mark("store");
  if (!w.ok()) {
    out->store_error = w.message();
    return Status::Ok();
  }
  out->db_path = s.entry;
  return Status::Ok();
}

// This node alone: reuses the catalog at s.entry if fresh, else scans the whole dataset.
Status OpenAlone(const CatalogOptions& options, Env* env, const store::LoadRequest& s,
                 const Result<std::string>& user_dir, const std::string& tmp_parent, Opened* out) {
  Status fresh = store::LoadIfFresh(s, env, &out->contents, &out->fingerprint);
  out->phases.Mark("cache");
  if (fresh.ok()) {
    out->reused = true;
    out->db_path = s.entry;
    return Status::Ok();
  }
  out->reason = RescanReason(user_dir, fresh, s.entry);
  const int64_t scan_start = NowNs();
  Result<scan::ScanResult> scanned = s.kind == codec::DatasetKind::kImageFolder
                                         ? scan::ScanImageFolder(s.real, env, options.scan_threads)
                                         : scan::ScanManifest(s.real, env, options.scan_threads);
  out->phases.Mark("scan");
  if (!scanned.ok()) return scanned.status();
  return StoreScan(options, s, tmp_parent, scan_start, std::move(*scanned), out);
}

// What this node's relative paths are relative to: the ImageFolder root, or the manifest's
// directory (as the scan sets ScanResult::root).
std::string OwnRoot(const store::LoadRequest& s) {
  if (s.kind == codec::DatasetKind::kImageFolder) return s.real;
  return fs::path(s.real).parent_path().string();
}

// One scan shared by the job's nodes (catalog_share.h). An error with *fatal set is the dataset's
// (this node would meet it alone too); any other error means: scan alone.
Status OpenShared(const CatalogOptions& options, Env* env, const store::LoadRequest& s,
                  const Result<std::string>& user_dir, const std::string& tmp_parent, Opened* out,
                  bool* fatal) {
  uint64_t round = 1;
  const int64_t scan_start = NowNs();
  share::Lead lead;
  std::vector<std::byte> mine;
  Status own_error;  // node 0's dataset error, after telling the others
  if (options.node == 0) {
    Status fresh = store::LoadIfFresh(s, env, &lead.contents, &out->fingerprint);
    out->phases.Mark("cache");
    if (fresh.ok()) {
      lead.kind = share::LeadKind::kHit;
    } else {
      lead.contents = store::Contents();
      lead.reason = RescanReason(user_dir, fresh, s.entry);
      if (s.kind == codec::DatasetKind::kImageFolder) {
        lead.kind = share::LeadKind::kMiss;
        Result<scan::RootListing> listing =
            scan::ListImageFolderRoot(s.real, env, options.scan_threads);
        if (listing.ok()) {
          lead.listing = std::move(*listing);
        } else {
          own_error = listing.status();
        }
      } else {
        lead.kind = share::LeadKind::kScanned;
        Result<scan::ScanResult> scanned = scan::ScanManifest(s.real, env, options.scan_threads);
        if (scanned.ok()) {
          lead.scanned = std::move(*scanned);
        } else {
          own_error = scanned.status();
        }
      }
    }
    // A failed listing or scan sends nothing the others can decode: they scan alone (and meet
    // the same error, or not if the dataset was fixed meanwhile).
    if (own_error.ok()) mine = share::EncodeLead(lead);
    out->phases.Mark("scan");
  }
  Result<std::vector<std::vector<std::byte>>> got =
      share::AllGather(options.exchange, options.nodes, &round, std::move(mine));
  out->phases.Mark("exchange");
  Status lead_status;  // why this node has no lead it can use
  if (!own_error.ok()) {
    lead_status = own_error;
  } else if (!got.ok()) {
    lead_status = got.status().WithContext("catalog from node 0");
  } else if (options.node != 0) {
    Result<share::Lead> decoded = share::DecodeLead((*got)[0]);
    if (decoded.ok()) {
      lead = std::move(*decoded);
    } else {
      lead_status = decoded.status().WithContext("catalog from node 0");
    }
  }
  if (lead_status.ok() && lead.kind == share::LeadKind::kScanned && s.kind != lead.scanned.kind) {
    lead_status = Status::InvalidArgument("node 0 parsed a manifest, this node sees a directory");
  }
  if (lead_status.ok() && lead.kind == share::LeadKind::kMiss &&
      s.kind != codec::DatasetKind::kImageFolder) {
    lead_status = Status::InvalidArgument("node 0 listed a directory, this node sees a manifest");
  }

  // The second round, which every node runs whatever happened in the first, so that no node waits
  // for a round that another skipped (a node that started late may hold node 0's lead while node
  // 0 gave up on it): after a miss, each node's part of the walk (the classes whose label % nodes
  // is its index); an empty buffer says "no part from me" and makes the others scan alone.
  Result<scan::ClassesPart> part = Status::FailedPrecondition("no share of the walk");
  if (lead_status.ok() && lead.kind == share::LeadKind::kMiss) {
    const std::vector<uint32_t> labels =
        share::ClassesOf(options.node, options.nodes, lead.listing.class_names.size());
    part = scan::WalkClasses(s.real, lead.listing, labels, env, options.scan_threads);
  }
  out->phases.Mark("scan");
  got = share::AllGather(options.exchange, options.nodes, &round,
                         part.ok() ? share::EncodePart(*part) : std::vector<std::byte>());
  out->phases.Mark("exchange");
  if (!own_error.ok()) {
    *fatal = true;  // the dataset's error: alone, this node would meet it again
    return own_error;
  }
  if (!lead_status.ok()) return lead_status;

  out->reason = options.node == 0 ? lead.reason : "node 0: " + lead.reason;
  switch (lead.kind) {
    case share::LeadKind::kHit:
      out->contents = std::move(lead.contents);
      if (options.node == 0) {
        out->db_path = s.entry;
      } else {
        // Relative paths from node 0, the root as this node sees the dataset.
        out->contents.root = OwnRoot(s);
        out->fingerprint = store::ComputeFingerprint(out->contents);
      }
      out->reused = true;
      return Status::Ok();
    case share::LeadKind::kScanned:
      lead.scanned.root = OwnRoot(s);
      *fatal = true;  // from here on, errors are this node's own
      return StoreScan(options, s, tmp_parent, scan_start, std::move(lead.scanned), out);
    case share::LeadKind::kMiss:
      break;
  }
  if (!part.ok()) {
    *fatal = true;
    return part.status();
  }
  if (!got.ok()) return got.status().WithContext("scan parts");
  // The other nodes' parts, decoded on the scan threads.
  std::vector<scan::ClassesPart> parts(options.nodes);
  std::vector<Status> errors(options.nodes);
  scan::ParallelFor(options.nodes, options.scan_threads, [&](uint64_t k) {
    if (k == options.node) {
      parts[k] = std::move(*part);
      return;
    }
    Result<scan::ClassesPart> p = share::DecodePart((*got)[k]);
    if (p.ok()) {
      parts[k] = std::move(*p);
    } else {
      errors[k] = p.status().WithContext("scan part of node " + std::to_string(k));
    }
    (*got)[k] = std::vector<std::byte>();
  });
  for (const Status& e : errors)
    NOPFS_RETURN_IF_ERROR(e);
  Result<scan::ScanResult> scanned = scan::AssembleImageFolder(
      s.real, std::move(lead.listing), std::move(parts), options.scan_threads);
  out->phases.Mark("assemble");
  // Not fatal: a sample whose label is no class is a malformed part (a peer's), so this node
  // scans alone; a dataset without files it then finds alone too.
  if (!scanned.ok()) return scanned.status();
  *fatal = true;
  return StoreScan(options, s, tmp_parent, scan_start, std::move(*scanned), out);
}

}  // namespace

Result<std::unique_ptr<Catalog>> Catalog::Open(const CatalogOptions& options, Env* env) {
  Phases setup;
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
  setup.Mark("setup");

  std::unique_ptr<Catalog> cat(new Catalog());
  cat->env_ = env;
  Opened opened;
  opened.phases = std::move(setup);
  bool done = false;
  if (options.nodes > 1 && options.exchange) {
    bool fatal = false;
    Status shared = OpenShared(options, env, s, user_dir, tmp_parent, &opened, &fatal);
    if (shared.ok()) {
      cat->share_note_ = "shared by " + std::to_string(options.nodes) + " nodes";
      done = true;
    } else if (fatal) {
      return shared;
    } else {
      cat->share_note_ = "alone: " + shared.message();
      Phases phases = std::move(opened.phases);
      opened = Opened();
      opened.phases = std::move(phases);
    }
  }
  if (!done) NOPFS_RETURN_IF_ERROR(OpenAlone(options, env, s, user_dir, tmp_parent, &opened));
  cat->db_path_ = std::move(opened.db_path);
  cat->reused_ = opened.reused;
  cat->rescan_reason_ = std::move(opened.reason);
  cat->store_error_ = std::move(opened.store_error);
  cat->fingerprint_ = opened.fingerprint;
  store::Contents& contents = opened.contents;
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
  opened.phases.Mark("checksums");
  cat->open_phases_ = opened.phases.ToString();
  if (opened.deferred_store) {
    Catalog* c = cat.get();
    cat->pending_store_ = [c, store = std::move(opened.deferred_store),
                           entry = std::move(opened.deferred_entry)] {
      const Status w = store();
      if (w.ok()) {
        c->db_path_ = entry;
      } else {
        c->store_error_ = w.message();
      }
    };
  }
  return cat;
}

void Catalog::StorePending() {
  if (!pending_store_) return;
  const auto t0 = std::chrono::steady_clock::now();
  std::function<void()> store = std::move(pending_store_);
  pending_store_ = nullptr;
  store();
  pending_store_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
