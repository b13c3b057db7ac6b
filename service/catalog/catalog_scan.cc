// The dataset scan (see catalog_scan.h and docs/catalog.md).
#include "service/catalog/catalog_scan.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>

#include "common/mutex.h"

namespace nopfs::service::scan {
namespace {

bool Hidden(std::string_view name) {
  return !name.empty() && name[0] == '.';
}

void SortSamples(std::vector<Sample>& s) {
  std::sort(s.begin(), s.end(), [](const Sample& a, const Sample& b) {
    return std::tie(a.label, a.relative_path, a.offset, a.length) <
           std::tie(b.label, b.relative_path, b.offset, b.length);
  });
}

void SortStamps(std::vector<StampEntry>& s) {
  std::sort(s.begin(), s.end(),
            [](const StampEntry& a, const StampEntry& b) { return a.path < b.path; });
}

// A work queue run by a fixed set of threads until it is empty and no task is running; tasks
// may push more tasks. The first error stops the rest. There are two kinds of task: one that
// opens and lists a directory (PushList), and a directory's chunks of names to stat (PushGroup),
// which hold the directory open. At most `max_open` directories are open at once: a listing waits
// while that many are, so a tree of any width needs a bounded number of descriptors. The threads
// stat in different directories at once, since a file system may serialize lookups within one
// directory (the emulated PFS does: 8 threads in one directory of 1,000 files stat one file at a
// time): a thread takes a chunk of a directory nobody stats now; else it lists a new one; only
// else a chunk of a directory another thread stats. So a directory is listed when a thread is
// free to stat it, and its files' lookups follow its own lookup (its open) at once: a PFS client
// that refreshes a directory's attributes for the permission checks of the lookups in it once
// they are older than its attribute lifetime (FUSE with default_permissions, 50 ms in the
// emulated PFS) does so the fewest times.
class TaskPool {
 public:
  explicit TaskPool(uint32_t max_open) : max_open_(max_open) {}

  void PushList(std::function<void()> task) {
    MutexLock lock(&mu_);
    lists_.push_back(std::move(task));
    cv_.SignalAll();
  }
  void PushGroup(std::deque<std::function<void()>> chunks) {
    if (chunks.empty()) return;
    auto group = std::make_shared<Group>();
    group->chunks = std::move(chunks);
    MutexLock lock(&mu_);
    groups_.push_back(std::move(group));
    cv_.SignalAll();
  }
  // A directory a list task opened is closed (or was never opened).
  void ReleaseDir() {
    MutexLock lock(&mu_);
    --open_;
    cv_.SignalAll();
  }

  void Fail(Status s) {
    MutexLock lock(&mu_);
    if (error_.ok()) error_ = std::move(s);
    failed_.store(true, std::memory_order_relaxed);
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }

  Status Run(uint32_t threads) {
    std::vector<std::thread> workers;
    for (uint32_t i = 1; i < threads; ++i)
      workers.emplace_back([this] { Work(); });
    Work();
    for (auto& t : workers)
      t.join();
    MutexLock lock(&mu_);
    return error_;
  }

 private:
  // A directory's chunks of names still to stat, and how many of its chunks threads stat now.
  struct Group {
    std::deque<std::function<void()>> chunks;
    uint32_t running = 0;
  };

  bool CanListLocked() const REQUIRES(mu_) { return !lists_.empty() && open_ < max_open_; }
  bool RunnableLocked() const REQUIRES(mu_) { return CanListLocked() || !groups_.empty(); }
  // The first group nobody stats in, or groups_.end().
  std::deque<std::shared_ptr<Group>>::iterator IdleGroupLocked() REQUIRES(mu_) {
    return std::find_if(groups_.begin(), groups_.end(),
                        [](const std::shared_ptr<Group>& g) { return g->running == 0; });
  }

  void Work() {
    MutexLock lock(&mu_);
    for (;;) {
      while (!RunnableLocked() && active_ != 0)
        cv_.Wait(&mu_);
      if (!RunnableLocked()) {
        // Nothing is running, so no directory is open (the chunks holding one are gone).
        cv_.SignalAll();
        return;
      }
      std::function<void()> task;
      std::shared_ptr<Group> group;  // the chunk's directory
      auto idle = IdleGroupLocked();
      const bool list = idle == groups_.end() && CanListLocked();
      if (list) {
        task = std::move(lists_.front());
        lists_.pop_front();
        ++open_;  // the task's ListDir releases it when the directory is closed
      } else {
        auto it = idle != groups_.end() ? idle : groups_.begin();
        group = *it;
        groups_.erase(it);
        task = std::move(group->chunks.front());
        group->chunks.pop_front();
        ++group->running;
        if (!group->chunks.empty()) groups_.push_back(group);  // its next chunk after the others'
      }
      ++active_;
      lock.Unlock();
      if (!failed()) {
        task();
      } else if (list) {
        ReleaseDir();
      }
      task = nullptr;  // may close a directory (ReleaseDir), so not under mu_
      lock.Lock();
      if (group) --group->running;
      --active_;
      if (active_ == 0) cv_.SignalAll();
    }
  }

  const uint32_t max_open_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> lists_ GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Group>> groups_ GUARDED_BY(mu_);  // those with chunks left
  uint32_t open_ GUARDED_BY(mu_) = 0;  // list tasks taken whose directory is not closed yet
  uint32_t active_ GUARDED_BY(mu_) = 0;
  Status error_ GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};
};

// The directories (device, inode) from a class directory's parent down to the one being walked:
// a directory that is its own ancestor (a symbolic link cycle) is not walked again.
using Ancestors = std::shared_ptr<const std::vector<std::pair<uint64_t, uint64_t>>>;

// The ImageFolder walk: one task opens and lists a directory, then tasks of up to kChunk names
// stat them relative to it. Each directory costs the PFS one lookup (its open) and one listing:
// its stamp comes from the open descriptor, and an entry the listing reports as a directory is
// opened without a stat of its own. Directories reached through symbolic links are walked under
// every path that reaches them (as os.walk(followlinks=True) does), except along a cycle, so the
// result does not depend on which task runs first.
class FolderWalk {
 public:
  FolderWalk(Env* env, TaskPool* pool) : env_(env), pool_(pool) {}

  // A directory, open while its chunks are stat'ed; closing it lets the pool list another.
  struct Held {
    explicit Held(TaskPool* p) : pool(p) {}
    ~Held() {
      dir.reset();
      pool->ReleaseDir();
    }
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    TaskPool* const pool;
    std::unique_ptr<OpenedDir> dir;
  };

  // Queues the walk of `dir`; `may_vanish`: a directory gone by then is not part of the dataset
  // (one the listing of its parent named), rather than an error (a class directory).
  void PushList(std::string dir, std::string rel_prefix, int64_t label, Ancestors ancestors,
                bool may_vanish) {
    pool_->PushList([this, dir = std::move(dir), rel = std::move(rel_prefix), label,
                     anc = std::move(ancestors),
                     may_vanish] { ListDir(dir, rel, label, anc, may_vanish); });
  }

  void ListDir(const std::string& dir, const std::string& rel_prefix, int64_t label,
               const Ancestors& ancestors, bool may_vanish) {
    auto held = std::make_shared<Held>(pool_);
    nopfs::Result<std::unique_ptr<OpenedDir>> opened = env_->OpenDir(dir);
    if (!opened.ok()) {
      if (may_vanish && opened.status().code() == StatusCode::kNotFound) return;
      return pool_->Fail(opened.status().WithContext("scanning the dataset"));
    }
    held->dir = std::move(*opened);
    const FileStat& st = held->dir->stat();
    const std::pair<uint64_t, uint64_t> id{st.device, st.inode};
    if (std::find(ancestors->begin(), ancestors->end(), id) != ancestors->end()) return;
    auto mine = std::make_shared<std::vector<std::pair<uint64_t, uint64_t>>>(*ancestors);
    mine->push_back(id);
    const Ancestors anc(std::move(mine));
    {
      MutexLock lock(&mu_);
      stamps_.push_back({dir, ToStamp(st)});
    }
    std::vector<std::string> to_stat;  // files, and entries whose type the listing did not say
    for (const DirEntry& e : held->dir->entries()) {
      if (Hidden(e.name)) continue;
      switch (e.type) {
        case EntryType::kDirectory:
          PushList(dir + "/" + e.name, rel_prefix + e.name + "/", label, anc, true);
          break;
        case EntryType::kRegular:
        case EntryType::kUnknown:
          to_stat.push_back(e.name);
          break;
        case EntryType::kOther:
          break;  // a socket, FIFO or device: not a sample
      }
    }
    std::deque<std::function<void()>> chunks;
    for (size_t begin = 0; begin < to_stat.size(); begin += kChunk) {
      const size_t end = std::min(to_stat.size(), begin + kChunk);
      std::vector<std::string> chunk(std::make_move_iterator(to_stat.begin() + begin),
                                     std::make_move_iterator(to_stat.begin() + end));
      chunks.push_back([this, held, dir, rel_prefix, label, anc, chunk = std::move(chunk)] {
        StatNames(*held->dir, dir, rel_prefix, label, anc, chunk);
      });
    }
    pool_->PushGroup(std::move(chunks));
  }

  void StatNames(OpenedDir& opened, const std::string& dir, const std::string& rel_prefix,
                 int64_t label, const Ancestors& ancestors, const std::vector<std::string>& names) {
    std::vector<Sample> found;
    const std::vector<nopfs::Result<FileStat>> stats = opened.StatNames(names);
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      const nopfs::Result<FileStat>& st = stats[i];
      if (!st.ok()) {
        // Gone since the listing, or a dangling symbolic link: not part of the dataset.
        if (st.status().code() == StatusCode::kNotFound) continue;
        return pool_->Fail(st.status().WithContext("scanning the dataset"));
      }
      if (st->is_dir) {
        PushList(dir + "/" + name, rel_prefix + name + "/", label, ancestors, true);
      } else if (st->is_regular) {
        found.push_back({rel_prefix + name, 0, st->size, label});
      }
    }
    MutexLock lock(&mu_);
    for (auto& s : found)
      samples_.push_back(std::move(s));
  }

  std::vector<Sample> TakeSamples() {
    MutexLock lock(&mu_);
    return std::move(samples_);
  }
  std::vector<StampEntry> TakeStamps() {
    MutexLock lock(&mu_);
    return std::move(stamps_);
  }

 private:
  static constexpr size_t kChunk = 128;
  Env* const env_;
  TaskPool* const pool_;
  Mutex mu_;
  std::vector<Sample> samples_ GUARDED_BY(mu_);
  std::vector<StampEntry> stamps_ GUARDED_BY(mu_);
};

// One parsed manifest line.
struct Line {
  uint64_t number = 0;
  Sample sample;
  bool whole_file = true;
};

std::vector<std::string_view> SplitTabs(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t tab = s.find('\t', start);
    if (tab == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, tab - start));
    start = tab + 1;
  }
}

bool ParseU64(std::string_view s, uint64_t& out) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

// Why `path` is not an acceptable relative path, or "" if it is.
std::string CheckRelative(std::string_view path) {
  if (path.empty()) return "the path is empty";
  if (path[0] == '/')
    return "absolute paths are not allowed; write the path relative to the "
           "manifest's directory";
  size_t start = 0;
  for (;;) {
    const size_t slash = path.find('/', start);
    const std::string_view part = path.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part == "..")
      return "\"..\" components are not allowed; the samples must lie under the "
             "manifest's directory";
    if (part.empty() || part == ".") {
      return "empty or \".\" path components are not allowed; write a/b, not a//b, ./a or a/";
    }
    if (slash == std::string_view::npos) return "";
    start = slash + 1;
  }
}

nopfs::Result<std::vector<Line>> ParseManifest(const std::string& manifest, std::string_view text) {
  std::vector<Line> lines;
  uint64_t number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = manifest + " line " + std::to_string(number) + ": ";
    const std::vector<std::string_view> f = SplitTabs(line);
    if (f.size() != 1 && f.size() != 2 && f.size() != 4) {
      return Status::InvalidArgument(
          where +
          "expected 1, 2 or 4 tab-separated fields (path, path<TAB>label, or "
          "path<TAB>label<TAB>offset<TAB>length), found " +
          std::to_string(f.size()));
    }
    Line l;
    l.number = number;
    if (const std::string why = CheckRelative(f[0]); !why.empty()) {
      return Status::InvalidArgument(where + "bad path \"" + std::string(f[0]) + "\": " + why);
    }
    l.sample.relative_path = std::string(f[0]);
    if (f.size() >= 2 && f[1] != "-") {
      uint64_t label = 0;
      if (!ParseU64(f[1], label) || label > static_cast<uint64_t>(INT64_MAX)) {
        return Status::InvalidArgument(where + "bad label \"" + std::string(f[1]) +
                                       "\": write an integer >= 0, or - for none");
      }
      l.sample.label = static_cast<int64_t>(label);
    }
    if (f.size() == 4) {
      l.whole_file = false;
      if (!ParseU64(f[2], l.sample.offset)) {
        return Status::InvalidArgument(where + "bad offset \"" + std::string(f[2]) +
                                       "\": write the byte offset as an integer >= 0");
      }
      if (!ParseU64(f[3], l.sample.length) || l.sample.length == 0) {
        return Status::InvalidArgument(where + "bad length \"" + std::string(f[3]) +
                                       "\": write the byte length as an integer >= 1");
      }
      if (l.sample.offset > UINT64_MAX - l.sample.length) {
        return Status::InvalidArgument(where + "offset + length overflows 64 bits");
      }
    }
    lines.push_back(std::move(l));
  }
  return lines;
}

// Directories open at once in a walk, per scan thread: enough that the threads work in many
// directories at once, few enough for any descriptor limit.
constexpr uint32_t kMaxOpenDirsPerThread = 4;

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

codec::Stamp ToStamp(const FileStat& st) {
  return codec::Stamp{st.mtime_ns, st.inode, st.device, st.size};
}

void ParallelFor(uint64_t n, uint32_t threads, const std::function<void(uint64_t)>& fn) {
  std::atomic<uint64_t> next{0};
  auto work = [&] {
    for (uint64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1))
      fn(i);
  };
  const uint64_t extra = std::min<uint64_t>(threads > 0 ? threads - 1 : 0, n > 0 ? n - 1 : 0);
  std::vector<std::thread> workers;
  for (uint64_t i = 0; i < extra; ++i)
    workers.emplace_back(work);
  work();
  for (auto& t : workers)
    t.join();
}

nopfs::Result<RootListing> ListImageFolderRoot(const std::string& root, Env* env,
                                               uint32_t threads) {
  RootListing out;
  nopfs::Result<std::unique_ptr<OpenedDir>> opened = env->OpenDir(root);
  if (!opened.ok()) return opened.status().WithContext("scanning the dataset");
  OpenedDir& dir = **opened;
  out.root_stamp = ToStamp(dir.stat());
  // An entry the listing reports as a directory is a class; one it reports as a file or anything
  // else is not; the rest (symbolic links, or a file system without d_type) are stat'ed.
  std::vector<std::string> unknown;
  for (const DirEntry& e : dir.entries()) {
    if (Hidden(e.name)) continue;
    if (e.type == EntryType::kDirectory) {
      out.class_names.push_back(e.name);
    } else if (e.type == EntryType::kUnknown) {
      unknown.push_back(e.name);
    }
  }
  // Those in chunks, the chunks on `threads` threads.
  constexpr size_t kRootChunk = 64;
  std::vector<nopfs::Result<FileStat>> stats(unknown.size(), Status::Internal("not stat'ed"));
  ParallelFor((unknown.size() + kRootChunk - 1) / kRootChunk, threads, [&](uint64_t c) {
    const size_t begin = c * kRootChunk;
    const size_t end = std::min(unknown.size(), begin + kRootChunk);
    std::vector<std::string> chunk(unknown.begin() + static_cast<std::ptrdiff_t>(begin),
                                   unknown.begin() + static_cast<std::ptrdiff_t>(end));
    std::vector<nopfs::Result<FileStat>> got = dir.StatNames(chunk);
    for (size_t i = begin; i < end; ++i)
      stats[i] = std::move(got[i - begin]);
  });
  for (size_t i = 0; i < unknown.size(); ++i) {
    const nopfs::Result<FileStat>& st = stats[i];
    if (st.ok()) {
      if (st->is_dir) out.class_names.push_back(unknown[i]);
    } else if (st.status().code() != StatusCode::kNotFound) {
      return st.status().WithContext("scanning the dataset");
    }
  }
  std::sort(out.class_names.begin(), out.class_names.end());
  if (out.class_names.empty()) {
    return Status::InvalidArgument(root +
                                   ": no class directories; an ImageFolder dataset holds one "
                                   "directory per class (root/<class>/<files>), or pass a "
                                   "manifest file instead");
  }
  return out;
}

nopfs::Result<ClassesPart> WalkClasses(const std::string& root, const RootListing& listing,
                                       const std::vector<uint32_t>& labels, Env* env,
                                       uint32_t threads) {
  TaskPool pool(kMaxOpenDirsPerThread * std::max<uint32_t>(threads, 1));
  FolderWalk walk(env, &pool);
  const Ancestors top = std::make_shared<const std::vector<std::pair<uint64_t, uint64_t>>>(
      std::vector<std::pair<uint64_t, uint64_t>>{
          {listing.root_stamp.device, listing.root_stamp.inode}});
  for (const uint32_t label : labels) {
    if (label >= listing.class_names.size()) {
      return Status::InvalidArgument("class " + std::to_string(label) + " of " +
                                     std::to_string(listing.class_names.size()));
    }
    walk.PushList(root + "/" + listing.class_names[label], listing.class_names[label] + "/",
                  static_cast<int64_t>(label), top, /*may_vanish=*/false);
  }
  NOPFS_RETURN_IF_ERROR(pool.Run(threads));
  ClassesPart part;
  part.samples = walk.TakeSamples();
  part.stamps = walk.TakeStamps();
  return part;
}

nopfs::Result<ScanResult> AssembleImageFolder(const std::string& root, RootListing listing,
                                              std::vector<ClassesPart> parts, uint32_t threads) {
  ScanResult out;
  out.kind = codec::DatasetKind::kImageFolder;
  out.root = root;
  // The samples in (label, relative path, offset, length) order without sorting them all: moved
  // into one run per class (a counting sort by label), then each class sorted on its own, the
  // classes on up to `threads` threads. A million samples of 100 classes take 0.1 s instead of
  // the 0.8 s of one sort (docs/catalog.md, "One scan per job").
  const size_t classes = listing.class_names.size();
  std::vector<size_t> start(classes + 1, 0);
  for (const ClassesPart& p : parts) {
    for (const Sample& s : p.samples) {
      if (s.label < 0 || static_cast<uint64_t>(s.label) >= classes) {
        return Status::InvalidArgument(root + ": sample " + s.relative_path + " has label " +
                                       std::to_string(s.label) + " of " + std::to_string(classes) +
                                       " classes");
      }
      ++start[static_cast<size_t>(s.label) + 1];
    }
  }
  for (size_t c = 0; c < classes; ++c)
    start[c + 1] += start[c];
  out.samples.resize(start[classes]);
  std::vector<size_t> next(start.begin(), start.end() - 1);
  for (ClassesPart& p : parts) {
    for (Sample& s : p.samples)
      out.samples[next[static_cast<size_t>(s.label)]++] = std::move(s);
    p.samples = std::vector<Sample>();
    for (StampEntry& st : p.stamps)
      out.stamps.push_back(std::move(st));
  }
  out.stamps.push_back({root, listing.root_stamp});
  out.class_names = std::move(listing.class_names);
  if (out.samples.empty()) {
    return Status::InvalidArgument(root + ": the dataset has no files (looked under " +
                                   std::to_string(out.class_names.size()) + " class directories)");
  }
  ParallelFor(classes, threads, [&](uint64_t c) {
    const auto first = out.samples.begin() + static_cast<std::ptrdiff_t>(start[c]);
    const auto last = out.samples.begin() + static_cast<std::ptrdiff_t>(start[c + 1]);
    std::sort(first, last, [](const Sample& a, const Sample& b) {
      return std::tie(a.relative_path, a.offset, a.length) <
             std::tie(b.relative_path, b.offset, b.length);
    });
  });
  SortStamps(out.stamps);
  return out;
}

nopfs::Result<ScanResult> ScanImageFolder(const std::string& root, Env* env, uint32_t threads) {
  nopfs::Result<RootListing> listing = ListImageFolderRoot(root, env, threads);
  if (!listing.ok()) return listing.status();
  std::vector<uint32_t> labels(listing->class_names.size());
  for (size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<uint32_t>(i);
  nopfs::Result<ClassesPart> part = WalkClasses(root, *listing, labels, env, threads);
  if (!part.ok()) return part.status();
  std::vector<ClassesPart> parts;
  parts.push_back(std::move(*part));
  return AssembleImageFolder(root, std::move(*listing), std::move(parts), threads);
}

nopfs::Result<ScanResult> ScanManifest(const std::string& manifest, Env* env, uint32_t threads) {
  ScanResult out;
  out.kind = codec::DatasetKind::kManifest;
  out.root = DirName(manifest);
  nopfs::Result<FileStat> mst = env->Stat(manifest);
  if (!mst.ok()) return mst.status().WithContext("reading the manifest");
  nopfs::Result<std::string> text = env->ReadFile(manifest);
  if (!text.ok()) return text.status().WithContext("reading the manifest");
  nopfs::Result<std::vector<Line>> lines = ParseManifest(manifest, *text);
  if (!lines.ok()) return lines.status();
  if (lines->empty()) {
    return Status::InvalidArgument(manifest +
                                   ": the manifest lists no samples; write one line per "
                                   "sample: path[<TAB>label[<TAB>offset<TAB>length]]");
  }

  // Stat every distinct file once; remember the first line naming it for the messages.
  std::map<std::string, uint64_t> first_line;
  for (const Line& l : *lines)
    first_line.emplace(l.sample.relative_path, l.number);
  std::vector<std::pair<std::string, uint64_t>> files(first_line.begin(), first_line.end());
  // Stamps: the manifest, and every directory that directly holds a listed file, taken before
  // the files are stat'ed so that a file replaced after its stat changes a stamp.
  std::set<std::string> dirs;
  for (const auto& f : files)
    dirs.insert(DirName(out.root + "/" + f.first));
  std::vector<std::string> dir_list(dirs.begin(), dirs.end());
  std::vector<codec::Stamp> dir_stamps(dir_list.size());
  std::vector<Status> dir_errors(dir_list.size());
  ParallelFor(dir_list.size(), threads, [&](uint64_t i) {
    nopfs::Result<FileStat> st = env->Stat(dir_list[i]);
    if (st.ok()) {
      dir_stamps[i] = ToStamp(*st);
    } else if (st.status().code() != StatusCode::kNotFound) {
      dir_errors[i] = st.status().WithContext("scanning the dataset");
    }  // a missing directory: the file's stat below fails and names the line
  });
  for (const Status& e : dir_errors)
    NOPFS_RETURN_IF_ERROR(e);
  out.stamps.push_back({manifest, ToStamp(*mst)});
  for (size_t i = 0; i < dir_list.size(); ++i)
    out.stamps.push_back({dir_list[i], dir_stamps[i]});
  std::vector<FileStat> stats(files.size());
  std::vector<Status> errors(files.size());
  ParallelFor(files.size(), threads, [&](uint64_t i) {
    const std::string path = out.root + "/" + files[i].first;
    const std::string where = manifest + " line " + std::to_string(files[i].second) + ": ";
    nopfs::Result<FileStat> st = env->Stat(path);
    if (!st.ok()) {
      errors[i] = st.status().WithContext(where + "sample file");
    } else if (!st->is_regular) {
      errors[i] = Status::InvalidArgument(where + path + " is not a regular file");
    } else {
      stats[i] = *st;
    }
  });
  for (const Status& e : errors)
    NOPFS_RETURN_IF_ERROR(e);

  std::map<std::string_view, uint64_t> size_of;
  for (size_t i = 0; i < files.size(); ++i)
    size_of.emplace(files[i].first, stats[i].size);
  for (Line& l : *lines) {
    const uint64_t size = size_of.at(l.sample.relative_path);
    if (l.whole_file) {
      l.sample.length = size;
    } else if (l.sample.offset + l.sample.length > size) {
      return Status::InvalidArgument(manifest + " line " + std::to_string(l.number) + ": " +
                                     out.root + "/" + l.sample.relative_path + " is " +
                                     std::to_string(size) + " bytes, the line needs bytes " +
                                     std::to_string(l.sample.offset) + ".." +
                                     std::to_string(l.sample.offset + l.sample.length));
    }
    out.samples.push_back(std::move(l.sample));
  }
  SortSamples(out.samples);
  for (size_t i = 1; i < out.samples.size(); ++i) {
    const Sample& a = out.samples[i - 1];
    const Sample& b = out.samples[i];
    if (std::tie(a.label, a.relative_path, a.offset, a.length) ==
        std::tie(b.label, b.relative_path, b.offset, b.length)) {
      return Status::InvalidArgument(
          manifest + ": sample \"" + a.relative_path + "\" (label " + std::to_string(a.label) +
          ", offset " + std::to_string(a.offset) + ") is listed twice; list each sample once");
    }
  }

  SortStamps(out.stamps);
  return out;
}

}  // namespace nopfs::service::scan
