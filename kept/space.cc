#include "kept/space.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <map>

#include "common/printable.h"
#include "common/units.h"

namespace nopfs::kept {

// One user's kept area under one SSD path, held open.
struct KeptNode::Area {
  uint32_t uid = 0;
  int fd = -1;           // <ssd path>/nopfs-<uid>
  std::string shown;     // <ssd path>/nopfs-<uid>/kept
  std::string kept_dir;  // /proc/self/fd/<fd>/kept
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

bool OlderFirst(const KeptEntry* a, const KeptEntry* b) {
  if (a->data.last_used != b->data.last_used) return a->data.last_used < b->data.last_used;
  return a->data.key < b->data.key;
}

}  // namespace

KeptNode::KeptNode() = default;
KeptNode::KeptNode(KeptNode&&) noexcept = default;
KeptNode& KeptNode::operator=(KeptNode&&) noexcept = default;
KeptNode::~KeptNode() = default;

KeptNode KeptNode::Scan(const std::vector<std::string>& ssd_paths,
                        std::optional<uint32_t> only_uid) {
  KeptNode node;
  for (const std::string& path : ssd_paths) {
    std::vector<std::string> names;
    if (only_uid) {
      names.push_back("nopfs-" + std::to_string(*only_uid));
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
    for (const std::string& name : names) {
      const uint32_t uid = *UidOf(name);
      auto area = std::make_unique<Area>();
      area->uid = uid;
      area->fd = ::openat(pfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      struct stat st {};
      if (area->fd < 0 || ::fstat(area->fd, &st) != 0) {
        if (errno != ENOENT && errno != ELOOP && errno != ENOTDIR) {
          node.errors_.push_back(Printable(Status::FromErrno(errno, path + "/" + name).message()));
        }
        continue;
      }
      if (st.st_uid != uid) continue;  // not that user's directory: none of its business
      area->shown = path + "/" + name + "/kept";
      area->kept_dir = "/proc/self/fd/" + std::to_string(area->fd) + "/kept";
      Result<std::vector<KeptDataset>> list = ListKept(area->kept_dir);
      if (!list.ok()) {
        node.errors_.push_back(Printable(area->shown + ": " + list.status().message()));
        continue;
      }
      const size_t index = node.areas_.size();
      for (KeptDataset& k : *list) {
        KeptEntry e;
        e.uid = uid;
        e.area = index;
        k.dir = area->shown + "/" + k.key;
        e.data = std::move(k);
        node.entries_.push_back(std::move(e));
      }
      node.areas_.push_back(std::move(area));
    }
    ::close(pfd);
  }
  return node;
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

Removal KeptNode::Remove(const KeptEntry& e, std::string why) {
  Removal r{e, std::move(why), Status::Ok()};
  if (e.area >= areas_.size()) {
    r.status = Status::InvalidArgument("no such kept area");
    return r;
  }
  r.status = RemoveKept(areas_[e.area]->kept_dir, e.data.key);
  if (r.status.ok()) {
    std::erase_if(entries_,
                  [&](const KeptEntry& x) { return x.area == e.area && x.data.key == e.data.key; });
  }
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
      if (e.uid != uid) continue;
      if (!e.Complete()) {
        if (!e.Pending() || !KeptEntryInUse(areas_[e.area]->kept_dir, e.data.key)) {
          doomed.emplace_back(e, "incomplete");
        }
      } else if (l.lifetime > 0 && e.data.last_used + l.lifetime < now) {
        doomed.emplace_back(e, "expired");
      }
    }
    for (const auto& [e, why] : doomed)
      out.push_back(Remove(e, why));
    std::vector<KeptEntry> lru;
    for (const KeptEntry& e : entries_) {
      if (e.uid == uid && e.Complete()) lru.push_back(e);
    }
    std::sort(lru.begin(), lru.end(),
              [](const KeptEntry& a, const KeptEntry& b) { return OlderFirst(&a, &b); });
    for (const KeptEntry& e : lru) {
      if (BytesOf(uid) <= l.quota && l.quota != 0) break;
      out.push_back(Remove(e, "over quota"));
    }
  }
  return out;
}

std::vector<Removal> KeptNode::MakeRoom(uint64_t room,
                                        const std::function<bool(const KeptEntry&)>& keep) {
  std::vector<Removal> out;
  std::vector<KeptEntry> lru;
  for (const KeptEntry& e : entries_) {
    if (e.Complete() && !(keep && keep(e))) lru.push_back(e);
  }
  std::sort(lru.begin(), lru.end(),
            [](const KeptEntry& a, const KeptEntry& b) { return OlderFirst(&a, &b); });
  for (const KeptEntry& e : lru) {
    if (Bytes() <= room) break;
    out.push_back(Remove(e, "space"));
  }
  return out;
}

std::string DescribeRemovals(const std::vector<Removal>& removals) {
  std::string out;
  for (const Removal& r : removals) {
    if (!out.empty()) out += "; ";
    // The key, the dataset and the error's paths come from the user's files: made printable.
    out += "uid " + std::to_string(r.entry.uid) + " " + Printable(r.entry.data.key) + " (" +
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
