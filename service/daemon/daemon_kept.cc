// The kept copy and sibling jobs: the kept copy adopted at start and the SSD tier kept at exit
// (service/reader/kept.h), the running sibling this job reads through, this job's entry in the
// user's registry, and the samples it reads for siblings (service/reader/sibling.h); the node's
// shared copy of a dataset the node config declares shared (share/client.h).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "common/units.h"
#include "kept/area.h"
#include "service/daemon/daemon.h"
#include "service/daemon/daemon_internal.h"
#include "service/env/env.h"

namespace nopfs::service {
namespace {

using daemon_internal::Seconds;

// How long a sibling read may take (the sibling may read the PFS for it) before the PFS is read.
constexpr std::chrono::milliseconds kSiblingTimeout(10000);
// How long the share service may take to answer (it may fill the file from the PFS first). Stop
// does not wait for it: it cancels the requests in flight (share::ShareClient::Cancel).
constexpr std::chrono::milliseconds kSharedTimeout(60000);
// At exit, the dataset files of the kept samples are stat-ed for at most this long (the epilog
// gives nopfsd `grace` seconds, 10 by default, to stop): files not reached are not kept.
constexpr auto kKeepStatBudget = std::chrono::seconds(4);
// Stats wait on the PFS's metadata servers, not on a core: many in flight.
constexpr unsigned kKeepStatThreads = 32;
// At start, the kept samples' files are stat-ed ahead of the reads by this many threads.
// The share service's files asked for ahead of the reads: files per request, at most, and
// requests in flight (share/ahead.h).
constexpr size_t kSharedBatch = 32;
constexpr unsigned kSharedAskThreads = 4;
// A sample whose file is not among those this node reads (asked for alone).
constexpr uint32_t kNoSharedFile = UINT32_MAX;

// Descriptors of the shared copy held ahead of the reads: a quarter of the open files the
// process may have (RLIMIT_NOFILE's soft limit), between 16 and 1024; the batch being asked costs
// as many proofs again while it is asked.
size_t SharedDescriptorsHeld() {
  rlimit rl{};
  const uint64_t soft = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                            ? static_cast<uint64_t>(rl.rlim_cur)
                            : 4096;
  return static_cast<size_t>(std::clamp<uint64_t>(soft / 4, 16, 1024));
}

}  // namespace

SharedFetchFn Daemon::MakeSharedFetch(const policy::NodeAccessCounts& counts) {
  if (options_.shared_socket.empty() || options_.shared_dataset.empty()) return {};
  std::error_code ec1, ec2;
  const std::filesystem::path declared = std::filesystem::canonical(options_.shared_dataset, ec1);
  const std::filesystem::path root = std::filesystem::canonical(catalog_->root(), ec2);
  if (ec1 || ec2 || declared != root) {
    spdlog::warn(
        "shared: the node's shared copy is not used: the job's dataset {} is not the "
        "shared directory {}",
        catalog_->root(), options_.shared_dataset);
    return {};
  }
  auto client = std::make_shared<share::ShareClient>(options_.shared_socket,
                                                     options_.shared_dataset, kSharedTimeout);
  if (Status p = client->Ping(); !p.ok()) {
    spdlog::warn("shared: the node's shared copy is not used: {}", p.message());
    return {};
  }
  shared_ = client;
  // The files this node reads, in the order of their first reads (the prefetchers' and the
  // staging streams' order), asked for ahead of the reads in batches.
  const Catalog* cat = catalog_.get();
  std::vector<policy::SampleId> order;
  for (policy::SampleId k = 0; k < counts.first_access.size(); ++k) {
    if (counts.first_access[k] != policy::kNeverAccessed) order.push_back(k);
  }
  std::sort(order.begin(), order.end(), [&counts](policy::SampleId a, policy::SampleId b) {
    return counts.first_access[a] < counts.first_access[b];
  });
  auto file_of = std::make_shared<std::vector<uint32_t>>(cat->size(), kNoSharedFile);
  std::vector<std::string_view> files;
  std::vector<uint32_t> uses;
  {
    std::unordered_map<std::string_view, uint32_t> index;
    index.reserve(order.size());
    for (policy::SampleId k : order) {
      const auto [it, added] =
          index.try_emplace(cat->relative_path(k), static_cast<uint32_t>(files.size()));
      if (added) {
        files.push_back(it->first);
        uses.push_back(0);
      }
      ++uses[it->second];
      (*file_of)[k] = it->second;
    }
  }
  share::AheadReader::Options ao;
  ao.max_held = SharedDescriptorsHeld();
  // Small batches on several connections: on a cold copy the service fills a request's files one
  // after another and a read waits for its whole batch, so large batches made the first reads
  // wait; 32 files already spare 97 % of the round trips of a warm copy.
  ao.max_batch = std::min<size_t>(kSharedBatch, ao.max_held / 4);
  ao.threads = kSharedAskThreads;
  auto ahead = std::make_shared<share::AheadReader>(*client, std::move(files), std::move(uses), ao);
  ahead->Start();
  shared_ahead_ = ahead;
  spdlog::info(
      "shared: reading {} through the node's shared copy ({}), {} files asked for ahead of the "
      "reads, at most {} descriptors held",
      options_.shared_dataset, options_.shared_socket, file_of->size(), ao.max_held);
  return [this, client, ahead, file_of, cat](policy::SampleId id,
                                             std::span<std::byte> dst) -> Result<uint64_t> {
    const uint32_t f = (*file_of)[id];
    const Status s = f != kNoSharedFile ? ahead->Read(f, cat->offset(id), dst)
                                        : ahead->ReadAlone(std::string(cat->relative_path(id)),
                                                           cat->offset(id), dst);
    if (!s.ok()) {
      if (s.code() != StatusCode::kNotFound && !client->cancelled() &&
          !shared_warned_.exchange(true)) {
        spdlog::warn(
            "shared: the share service did not answer, reading the PFS instead (later failures "
            "are not logged): {}",
            s.message());
      }
      return Status::NotFound("the shared copy is not available");
    }
    return XXH3_64bits(dst.data(), dst.size());
  };
}

void Daemon::AdoptKept() {
  std::error_code ec;
  const std::filesystem::path dataset = std::filesystem::canonical(options_.dataset, ec);
  std::vector<size_t> ssd;
  for (size_t j = 0; j < model_.classes.size(); ++j) {
    if (model_.classes[j].kind == policy::ClassKind::kSsd) ssd.push_back(j);
  }
  if (ssd.empty() || ec) {
    if (options_.keep) {
      spdlog::warn("kept area: nothing will be kept: {}",
                   ssd.empty() ? "the node config has no SSD class" : ec.message());
    }
    return;
  }
  for (size_t j : ssd) {
    KeptClass k;
    k.class_index = j;
    k.place.kept_dir = kept::KeptAreaDir(SsdTier::UserDir(model_.classes[j].path, geteuid()));
    k.place.dataset = dataset.string();
    k.place.tag = options_.job_id + "." + std::to_string(options_.node);
    std::string scan = kept::kKeptScanOptions;
    // Two SSD classes on one path keep under two keys (and private names) in its kept area.
    for (const KeptClass& other : kept_) {
      if (other.place.kept_dir == k.place.kept_dir) {
        scan += "/" + model_.classes[j].name;
        // (Appended in two steps: "." + to_string(j) trips GCC 12's -Wrestrict false positive.)
        k.place.tag += '.';
        k.place.tag += std::to_string(j);
        break;
      }
    }
    k.place.key = kept::KeptKey(k.place.dataset, scan);
    if (Result<uint64_t> n = CleanKeptArea(k.place.kept_dir); !n.ok()) {
      spdlog::warn("kept area: cleaning {}: {}", k.place.kept_dir, n.status().message());
    }
    // A job that keeps nothing reads the copy and leaves it kept (its last use updated).
    Result<std::unique_ptr<KeptCopy>> copy =
        KeptCopy::Adopt(k.place, *catalog_, Env::Default(), options_.local_io,
                        options_.keep ? AdoptMode::kTake : AdoptMode::kBorrow);
    if (copy.ok()) {
      k.copy = std::move(*copy);
    } else if (copy.status().code() != StatusCode::kNotFound) {
      spdlog::warn("kept area: the kept copy of {} in {} is unusable and was removed: {}",
                   k.place.dataset, k.place.kept_dir, copy.status().message());
    }
    kept_.push_back(std::move(k));
  }
}

void Daemon::FindSibling() {
  // The registry is in the user's area of the first SSD class's scratch path, beside its kept
  // area, under the same key. The sibling is looked for when a sample is first about to be read
  // from the PFS, and again while there is none (SiblingReader).
  if (!options_.share_running || kept_.empty()) return;
  const KeptPlace& place = kept_.front().place;
  SiblingReader::Options o;
  o.user_dir = place.kept_dir.substr(0, place.kept_dir.rfind('/'));
  o.key = place.key;
  o.self.job = place.tag;
  o.self.pid = static_cast<uint32_t>(::getpid());
  o.self.fingerprint = catalog_->fingerprint();
  o.same_job = options_.job_id + ".";
  o.timeout = kSiblingTimeout;
  siblings_ = std::make_unique<SiblingReader>(std::move(o));
}

void Daemon::RegisterSibling() {
  // The registry is in the user's area of the first SSD class's scratch path, beside its kept
  // area, under the same key.
  if (!options_.share_running || kept_.empty()) return;
  const KeptPlace& place = kept_.front().place;
  const std::string user_dir = place.kept_dir.substr(0, place.kept_dir.rfind('/'));
  LiveEntry e;
  e.job = place.tag;
  e.pid = static_cast<uint32_t>(::getpid());
  e.fingerprint = catalog_->fingerprint();
  std::error_code ec;
  e.socket = std::filesystem::absolute(options_.run_dir + "/nopfsd.sock", ec).string();
  serving_.store(true);
  // The entry's time orders the siblings (sibling.h): this job reads through entries before it
  // only, from before the entry exists, so that no other job can see it in another order.
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  e.started_ns = int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  if (siblings_) siblings_->Registering(e.started_ns);
  Result<std::string> path = RegisterLive(user_dir, place.key, e);
  if (path.ok()) {
    live_entry_ = *path;
  } else {
    spdlog::warn("sibling: other jobs of this user will not find this one: {}",
                 path.status().message());
  }
}

Result<uint64_t> Daemon::ReadSample(uint64_t fingerprint, uint32_t sample_id,
                                    std::vector<std::byte>* bytes) {
  if (!options_.share_running || !serving_.load()) {
    return Status::FailedPrecondition("nopfsd: this job does not serve sibling reads");
  }
  if (fingerprint != catalog_->fingerprint()) {
    return Status::FailedPrecondition("nopfsd: the dataset's catalog differs here (fingerprint " +
                                      std::to_string(catalog_->fingerprint()) + ")");
  }
  if (sample_id >= catalog_->size()) {
    return Status::InvalidArgument("nopfsd: sample " + std::to_string(sample_id) +
                                   " is not in the dataset (" + std::to_string(catalog_->size()) +
                                   " samples)");
  }
  bytes->resize(catalog_->length(sample_id));
  // Never through a sibling of this job's: a read goes through one sibling at most.
  Result<SourceId> src = reader_->Read(sample_id, *bytes, /*ask_sibling=*/false);
  if (!src.ok()) return src.status();
  sibling_served_.fetch_add(1, std::memory_order_relaxed);
  sibling_served_bytes_.fetch_add(bytes->size(), std::memory_order_relaxed);
  return XXH3_64bits(bytes->data(), bytes->size());
}

void Daemon::StartKeepCommits() {
  if (!options_.keep) return;
  for (KeptClass& k : kept_) {
    SsdTier* tier = k.class_index < tier_refs_.size() ? tier_refs_[k.class_index].ssd : nullptr;
    if (tier == nullptr) continue;
    KeepCommitOptions o;
    o.place = k.place;
    // Each class's record may hold the whole budget: the epilog keeps at most --keep-max-bytes
    // of all classes' records together, in the config's order, as a keep at exit does.
    o.max_bytes = options_.keep_max_bytes;
    o.unchanged_before_ns = start_wall_ns_ - 500'000'000;
    k.committer = std::make_unique<KeepCommitter>(std::move(o), *tier, *catalog_, Env::Default());
    k.committer->Start();
  }
}

void Daemon::KeepAtExit() {
  if (!options_.keep) return;
  for (KeptClass& k : kept_) {
    if (!k.committer || k.committer->commits() == 0) continue;
    spdlog::info(
        "kept area: class {}: {} keep records committed as the tier filled ({} samples in the "
        "last, {} written in {:.3f} s)",
        model_.classes[k.class_index].name, k.committer->commits(),
        k.committer->committed_samples(),
        FormatBytes(static_cast<double>(k.committer->committed_bytes())),
        static_cast<double>(k.committer->commit_ns()) / 1e9);
  }
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t used = 0;  // --keep-max-bytes bounds every class's kept bytes together
  for (KeptClass& k : kept_) {
    const std::string& name = model_.classes[k.class_index].name;
    SsdTier* tier = k.class_index < tier_refs_.size() ? tier_refs_[k.class_index].ssd : nullptr;
    if (tier == nullptr) continue;  // the class holds nothing in this job
    const std::string user_dir = k.place.kept_dir.substr(0, k.place.kept_dir.rfind('/'));
    if (tier->dir().rfind(user_dir + "/", 0) != 0) {
      spdlog::warn("kept area: class {}: nothing kept: its tier is not under {}", name, user_dir);
      continue;
    }
    if (options_.keep_max_bytes != 0 && used >= options_.keep_max_bytes) {
      spdlog::info("kept area: class {}: nothing kept: --keep-max-bytes reached", name);
      continue;
    }
    KeepOptions ko;
    ko.place = k.place;
    ko.max_bytes = options_.keep_max_bytes == 0 ? 0 : options_.keep_max_bytes - used;
    ko.created = k.copy ? k.copy->created() : 0;
    // Half a second of margin for ctime's coarse clock (a write during the job is never trusted).
    ko.unchanged_before_ns = start_wall_ns_ - 500'000'000;
    ko.stat_threads = kKeepStatThreads;
    ko.deadline = t0 + kKeepStatBudget;
    ko.io = options_.local_io;
    Result<KeepResult> r = KeepSsdTier(ko, *tier, *catalog_, Env::Default());
    if (!r.ok()) {
      spdlog::error("kept area: class {}: keeping its SSD tier failed (nothing kept): {}", name,
                    r.status().message());
      continue;
    }
    used += r->bytes;
    kept_bytes_.fetch_add(r->bytes);
    spdlog::info(
        "kept area: kept {} samples ({} on disk) in {} in {:.2f} s; {} ready samples not kept "
        "(class {})",
        r->samples, FormatBytes(static_cast<double>(r->bytes)), r->dir,
        Seconds(std::chrono::steady_clock::now() - t0), r->skipped, name);
  }
}

}  // namespace nopfs::service
