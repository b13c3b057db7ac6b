#include "kept/space.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <ctime>
#include <map>
#include <set>

#include "common/dir_names.h"
#include "common/printable.h"
#include "common/unique_fd.h"
#include "common/units.h"
#include "kept/tree.h"

namespace nopfs::kept {

// One user's directory under one SSD path, held open.
struct KeptNode::Area {
  uint32_t uid = 0;
  size_t path = 0;    // which SSD path (records_)
  int fd = -1;        // <ssd path>/nopfs-<uid>
  std::string shown;  // <ssd path>/nopfs-<uid>
  std::string dir;    // /proc/self/fd/<fd>
  ~Area() {
    if (fd >= 0) ::close(fd);
  }
};

namespace {

// The uid of a name "nopfs-<decimal>", or nullopt.
std::optional<uint32_t> UidOf(const std::string& name) {
  if (name.rfind("nopfs-", 0) != 0 || name.size() == 6 || name.size() > 16) return std::nullopt;
  uint32_t uid = 0;
  const char* b = name.data() + 6;
  const char* e = name.data() + name.size();
  const auto r = std::from_chars(b, e, uid);
  if (r.ec != std::errc() || r.ptr != e || (*b == '0' && e - b > 1)) return std::nullopt;
  return uid;
}

bool OlderFirst(const KeptEntry& a, const KeptEntry& b) {
  if (a.times.last_used != b.times.last_used) return a.times.last_used < b.times.last_used;
  return a.data.key < b.data.key;
}

}  // namespace

bool IsJobDir(const std::string& name, uint64_t job_id, uint32_t index) {
  const std::string dir = std::to_string(job_id) + "." + std::to_string(index);
  return name == dir || name.rfind(".tmp." + dir + ".", 0) == 0;
}

KeptNode::KeptNode() = default;
KeptNode::KeptNode(KeptNode&&) noexcept = default;
KeptNode& KeptNode::operator=(KeptNode&&) noexcept = default;
KeptNode::~KeptNode() = default;

KeptNode KeptNode::Scan(const std::vector<std::string>& ssd_paths, const ScanOptions& o) {
  KeptNode node;
  node.now_ = o.now != 0 ? o.now : int64_t(::time(nullptr));
  for (size_t p = 0; p < ssd_paths.size(); ++p) {
    const std::string& path = ssd_paths[p];
    node.records_.emplace_back();
    std::vector<std::string> names;
    if (o.only_uid) {
      names.push_back("nopfs-" + std::to_string(*o.only_uid));
    } else {
      DIR* d = ::opendir(path.c_str());
      if (d == nullptr) {
        if (errno != ENOENT)
          node.errors_.push_back(Printable(Status::FromErrno(errno, path).message()));
        continue;
      }
      while (const dirent* e = ::readdir(d)) {
        if (UidOf(e->d_name)) names.emplace_back(e->d_name);
      }
      ::closedir(d);
      std::sort(names.begin(), names.end());
    }
    const int pfd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0) {
      if (errno != ENOENT)
        node.errors_.push_back(Printable(Status::FromErrno(errno, path).message()));
      continue;
    }
    RootRecord* record = nullptr;
    if (o.root) {
      std::string note;
      Result<RootRecord> r = RootRecord::Open(path, kRootRecordTimeout, &note);
      if (!note.empty()) node.errors_.push_back(Printable(note));
      if (!r.ok()) {
        node.errors_.push_back(Printable(r.status().message()) +
                               " (its datasets count as used now)");
      } else {
        node.records_.back() = std::make_unique<RootRecord>(std::move(*r));
        record = node.records_.back().get();
      }
    }
    std::set<RootRecord::Key> present;
    std::set<uint32_t> listed;  // users whose whole directory was listed (their records prune)
    for (const std::string& name : names) {
      const uint32_t uid = *UidOf(name);
      auto area = std::make_unique<Area>();
      area->uid = uid;
      area->path = p;
      area->fd = ::openat(pfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      struct stat st {};
      if (area->fd < 0 || ::fstat(area->fd, &st) != 0) {
        if (errno != ENOENT && errno != ELOOP && errno != ENOTDIR) {
          node.errors_.push_back(Printable(Status::FromErrno(errno, path + "/" + name).message()));
        } else {
          listed.insert(uid);  // no directory: nothing of that user's is kept here
        }
        continue;
      }
      if (st.st_uid != uid) continue;  // not that user's directory: none of its business
      area->shown = path + "/" + name;
      area->dir = "/proc/self/fd/" + std::to_string(area->fd);
      const size_t index = node.areas_.size();
      node.areas_.push_back(std::move(area));
      Area* const user = node.areas_.back().get();
      bool whole = true;
      // kept/: the datasets.
      struct stat kst {};
      const bool kept_is_dir =
          ::fstatat(user->fd, "kept", &kst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(kst.st_mode);
      // Root's view: a `kept` that is not a directory is a stray (below), never followed.
      Result<std::vector<KeptDataset>> list =
          kept_is_dir || !o.root ? ListKept(user->dir + "/kept") : std::vector<KeptDataset>();
      if (!list.ok()) {
        whole = false;
        node.errors_.push_back(Printable(user->shown + "/kept: " + list.status().message()));
        list = std::vector<KeptDataset>();
      }
      for (KeptDataset& k : *list) {
        KeptEntry e;
        e.uid = uid;
        e.area = index;
        k.dir = user->shown + "/kept/" + k.key;
        e.data = std::move(k);
        // A complete entry is in use while a job that keeps nothing reads it (its lock held).
        e.in_use = e.Pending() ? KeptEntryInUse(user->dir + "/kept", e.data.key)
                               : KeptLockHeld(user->dir + "/kept", e.data.key);
        if (!o.root) {
          e.times = {e.data.created, e.data.last_used};
        } else if (e.Complete()) {
          const RootRecord::Key key{uid, e.data.key};
          present.insert(key);
          const auto it = record != nullptr ? record->times().find(key)
                                            : std::map<RootRecord::Key, RootTimes>::iterator();
          if (record != nullptr && it != record->times().end()) {
            e.times = it->second;
          } else {
            e.times = {node.now_, node.now_};
            if (record != nullptr && o.record_new) {
              record->times()[key] = e.times;
              record->Touch();
            }
          }
        }
        node.entries_.push_back(std::move(e));
      }
      // Everything else in nopfs-<uid>/ (root's view).
      if (o.root) {
        Result<std::vector<std::string>> all = DirNames(user->fd, user->shown);
        if (!all.ok()) {
          whole = false;
          node.errors_.push_back(Printable(all.status().message()));
          all = std::vector<std::string>();
        }
        for (const std::string& n : *all) {
          if (o.live && o.live(uid, n)) continue;
          if (n == "kept" && kept_is_dir) continue;
          if (n == kLiveDir && o.live) {
            struct stat lst {};
            if (::fstatat(user->fd, n.c_str(), &lst, AT_SYMLINK_NOFOLLOW) == 0 &&
                S_ISDIR(lst.st_mode)) {
              node.ScanLive(index, o);
              continue;
            }
          }
          KeptEntry e;
          e.uid = uid;
          e.area = index;
          e.stray = true;
          e.data.key = n;
          e.data.dir = user->shown + "/" + n;
          const TreeUsage u = UsageAt(user->fd, n, e.data.dir);
          e.data.bytes = u.bytes;
          if (!u.status.ok()) node.errors_.push_back(Printable(u.status.message()));
          // A job directory being made (.tmp.*) may have no lock file yet: the grace applies to
          // those only; anything else is in use only while its lock file is held.
          // (user->dir + "/.": with the descriptor's magic link as the path's last component,
          // O_NOFOLLOW would refuse it.)
          const std::string here = user->dir + "/.";
          e.in_use = n.rfind(".tmp.", 0) == 0 ? KeptEntryInUse(here, n) : KeptLockHeld(here, n);
          // Without the ledger (`nopfs gc`), the running jobs' sibling registry is in use.
          e.in_use = e.in_use || (n == kLiveDir && !o.live);
          e.times = {node.now_, node.now_};
          node.entries_.push_back(std::move(e));
        }
      }
      if (whole) listed.insert(uid);
    }
    ::close(pfd);
    if (record != nullptr) {
      // Records of datasets that are gone (removed, or by their user).
      std::erase_if(record->times(), [&](const auto& kv) {
        const bool gone = (!o.only_uid || kv.first.first == *o.only_uid) &&
                          listed.count(kv.first.first) != 0 && present.count(kv.first) == 0;
        if (gone) record->Touch();
        return gone;
      });
      // Whole users' directories gone (a full scan only).
      if (!o.only_uid) {
        std::set<uint32_t> seen;
        for (const std::string& name : names)
          seen.insert(*UidOf(name));
        std::erase_if(record->times(), [&](const auto& kv) {
          const bool gone = seen.count(kv.first.first) == 0;
          if (gone) record->Touch();
          return gone;
        });
      }
    }
  }
  node.SaveRecords();
  return node;
}

void KeptNode::ScanLive(size_t index, const ScanOptions& o) {
  const Area& area = *areas_[index];
  const std::string shown = area.shown + "/" + kLiveDir;
  UniqueFd dir(::openat(area.fd, kLiveDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  Result<std::vector<std::string>> names =
      dir.valid() ? DirNames(dir.get(), shown) : Status::FromErrno(errno, shown);
  if (!names.ok()) {
    if (names.status().code() != StatusCode::kNotFound)
      errors_.push_back(Printable(names.status().message()));
    return;
  }
  for (const std::string& n : *names) {
    // <key>.<job>.<node>, or .tmp.<key>.<job>.<node> while it is written.
    const std::string entry = n.rfind(".tmp.", 0) == 0 ? n.substr(5) : n;
    if (entry.size() > 17 && IsKeptKey(entry.substr(0, 16)) && entry[16] == '.' &&
        o.live(area.uid, entry.substr(17))) {
      continue;
    }
    KeptEntry e;
    e.uid = area.uid;
    e.area = index;
    e.stray = true;
    e.under = kLiveDir;
    e.data.key = n;
    e.data.dir = shown + "/" + n;
    const TreeUsage u = UsageAt(dir.get(), n, e.data.dir);
    e.data.bytes = u.bytes;
    if (!u.status.ok()) errors_.push_back(Printable(u.status.message()));
    // A job that started after the ledger was read (the epilog) registers meanwhile: an entry
    // changed in the last kKeptLockGraceSeconds is in use.
    struct stat st {};
    e.in_use = ::fstatat(dir.get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
               now_ - int64_t(st.st_ctime) < kKeptLockGraceSeconds;
    e.times = {now_, now_};
    entries_.push_back(std::move(e));
  }
}

void KeptNode::SaveRecords() {
  for (const auto& r : records_) {
    if (r == nullptr) continue;
    if (Status s = r->Save(); !s.ok()) errors_.push_back(Printable(s.message()));
  }
}

std::vector<uint32_t> KeptNode::Users() const {
  std::vector<uint32_t> out;
  for (const auto& a : areas_)
    out.push_back(a->uid);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

uint64_t KeptNode::Bytes() const {
  uint64_t sum = 0;
  for (const KeptEntry& e : entries_)
    sum += e.data.bytes;
  return sum;
}

uint64_t KeptNode::BytesOf(uint32_t uid) const {
  uint64_t sum = 0;
  for (const KeptEntry& e : entries_) {
    if (e.uid == uid) sum += e.data.bytes;
  }
  return sum;
}

uint64_t KeptNode::HeldBytes() const {
  uint64_t sum = 0;
  for (const KeptEntry& e : entries_) {
    if (e.in_use) sum += e.data.bytes;
  }
  return sum;
}

void KeptNode::MarkUsed(uint32_t uid, const std::function<bool(const KeptEntry&)>& used) {
  for (KeptEntry& e : entries_) {
    if (e.uid != uid || !e.Complete() || !used(e)) continue;
    e.times.last_used = now_;
    RootRecord* r = records_[areas_[e.area]->path].get();
    if (r == nullptr) continue;
    RootTimes& t = r->times()[{e.uid, e.data.key}];
    if (t.first_seen == 0) t.first_seen = e.times.first_seen;
    t.last_used = now_;
    r->Touch();
  }
  SaveRecords();
}

void KeptNode::Forget(const KeptEntry& e) {
  std::erase_if(entries_, [&](const KeptEntry& x) {
    return x.area == e.area && x.stray == e.stray && x.under == e.under && x.data.key == e.data.key;
  });
  RootRecord* r = records_.empty() ? nullptr : records_[areas_[e.area]->path].get();
  if (r != nullptr && !e.stray && r->times().erase({e.uid, e.data.key}) != 0) r->Touch();
}

Removal KeptNode::Remove(const KeptEntry& e, std::string why) {
  Removal r{e, std::move(why), Status::Ok()};
  if (e.area >= areas_.size()) {
    r.status = Status::InvalidArgument("no such kept area");
    return r;
  }
  const Area& a = *areas_[e.area];
  if (!e.stray) {
    r.status = RemoveKept(a.dir + "/kept", e.data.key);
  } else if (e.under.empty()) {
    r.status = RemoveTreeAt(a.fd, e.data.key, e.data.dir);
  } else {
    UniqueFd under(
        ::openat(a.fd, e.under.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    r.status = under.valid()     ? RemoveTreeAt(under.get(), e.data.key, e.data.dir)
               : errno == ENOENT ? Status::Ok()
                                 : Status::FromErrno(errno, a.shown + "/" + e.under);
  }
  if (r.status.ok()) Forget(e);
  return r;
}

std::vector<Removal> KeptNode::Sweep(const std::function<KeepLimits(uint32_t uid)>& limits,
                                     int64_t now) {
  std::vector<Removal> out;
  std::vector<uint32_t> users;  // with entries: the policy is asked only about them
  for (const KeptEntry& e : entries_)
    users.push_back(e.uid);
  std::sort(users.begin(), users.end());
  users.erase(std::unique(users.begin(), users.end()), users.end());
  for (const uint32_t uid : users) {
    const KeepLimits l = limits(uid);
    // Remove() changes entries_: collect first.
    std::vector<std::pair<KeptEntry, const char*>> doomed;
    for (const KeptEntry& e : entries_) {
      if (e.uid != uid || e.in_use) continue;
      if (e.stray) {
        doomed.emplace_back(e, "stray");
      } else if (!e.Complete()) {
        doomed.emplace_back(e, "incomplete");
      } else if (l.lifetime > 0 && e.times.last_used + l.lifetime < now) {
        doomed.emplace_back(e, "expired");
      }
    }
    for (const auto& [e, why] : doomed)
      out.push_back(Remove(e, why));
    std::vector<KeptEntry> lru;
    for (const KeptEntry& e : entries_) {
      if (e.uid == uid && e.Complete() && !e.stray && !e.in_use) lru.push_back(e);
    }
    std::sort(lru.begin(), lru.end(), OlderFirst);
    for (const KeptEntry& e : lru) {
      if (BytesOf(uid) <= l.quota && l.quota != 0) break;
      out.push_back(Remove(e, "over quota"));
    }
  }
  SaveRecords();
  return out;
}

std::vector<Removal> KeptNode::MakeRoom(uint64_t room,
                                        const std::function<bool(const KeptEntry&)>& keep) {
  std::vector<Removal> out;
  std::vector<KeptEntry> lru;
  for (const KeptEntry& e : entries_) {
    if (e.Complete() && !e.stray && !e.in_use && !(keep && keep(e))) lru.push_back(e);
  }
  std::sort(lru.begin(), lru.end(), OlderFirst);
  for (const KeptEntry& e : lru) {
    if (Bytes() - HeldBytes() <= room) break;
    out.push_back(Remove(e, "space"));
  }
  SaveRecords();
  return out;
}

std::string DescribeRemovals(const std::vector<Removal>& removals) {
  std::string out;
  for (const Removal& r : removals) {
    if (!out.empty()) out += "; ";
    // The key, the dataset and the error's paths come from the user's files: made printable.
    out += "uid " + std::to_string(r.entry.uid) + " " +
           (r.entry.stray ? "nopfs-" + std::to_string(r.entry.uid) + "/" +
                                (r.entry.under.empty() ? "" : r.entry.under + "/")
                          : "") +
           Printable(r.entry.data.key) + " (" +
           (r.entry.data.dataset.empty() ? "" : Printable(r.entry.data.dataset) + ", ") +
           FormatBytes(static_cast<double>(r.entry.data.bytes)) + ", " + r.why +
           (r.status.ok() ? "" : ", not removed: " + Printable(r.status.message())) + ")";
  }
  return out;
}

std::string FormatAge(int64_t seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds < 120) return std::to_string(seconds) + "s";
  if (seconds < 7200) return std::to_string(seconds / 60) + "m";
  if (seconds < 2 * 86400) return std::to_string(seconds / 3600) + "h";
  return std::to_string(seconds / 86400) + "d";
}

}  // namespace nopfs::kept
