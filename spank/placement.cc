#include "spank/placement.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <optional>

extern "C" {
#include <slurm/slurm.h>
#include <slurm/slurm_errno.h>
}

#include "common/lexical_path.h"
#include "common/printable.h"
#include "common/small_file.h"
#include "common/unique_fd.h"
#include "kept/record.h"
#include "kept/space.h"
#include "launch/process.h"
#include "share/store.h"
#include "spank/ledger.h"

namespace nopfs::spank {
namespace {

std::vector<std::string> SplitFeatures(const std::string& list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    if (comma > pos) out.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

std::string JoinFeatures(const std::vector<std::string>& features) {
  std::string out;
  for (const std::string& f : features)
    out += (out.empty() ? "" : ",") + f;
  return out;
}

// The state file: what the last reconcile found (docs/admin.md, "Placement").
struct PlacementState {
  int64_t attempt = 0;   // when slurmctld was last asked
  int64_t verified = 0;  // when slurmctld last had `marks`
  int64_t failed = 0;    // when the last attempt failed; 0: it did not
  std::string marks;     // sorted, comma-separated
  std::string error;     // the failure last logged; "": none since the last success
  ManifestCache shared;  // "shared <ino> <size> <mtime_ns> <files> <bytes> <store dir>" lines
};

PlacementState ReadState(const std::string& node_dir) {
  PlacementState s;
  Result<std::string> text = ReadSmallFile(node_dir + "/" + kPlacementStateName,
                                           SmallFileRules{.max_bytes = 1 << 20, .owner = 0});
  if (!text.ok()) return s;
  size_t pos = 0;
  while (pos < text->size()) {
    size_t nl = text->find('\n', pos);
    if (nl == std::string::npos) nl = text->size();
    const std::string line = text->substr(pos, nl - pos);
    pos = nl + 1;
    const size_t sp = line.find(' ');
    const std::string key = line.substr(0, sp);
    const std::string value = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (key == "attempt") s.attempt = std::atoll(value.c_str());
    if (key == "verified") s.verified = std::atoll(value.c_str());
    if (key == "failed") s.failed = std::atoll(value.c_str());
    if (key == "marks") s.marks = value;
    if (key == "error") s.error = value;
    if (key == "shared") {
      ManifestSeen m;
      unsigned long long v[5] = {};
      long long mtime = 0;
      int used = 0;
      if (std::sscanf(value.c_str(), "%llu %llu %lld %llu %llu %n", &v[0], &v[1], &mtime, &v[3],
                      &v[4], &used) == 5 &&
          used > 0 && static_cast<size_t>(used) < value.size()) {
        m.ino = v[0];
        m.size = v[1];
        m.mtime_ns = mtime;
        m.files = v[3];
        m.bytes = v[4];
        s.shared[value.substr(static_cast<size_t>(used))] = m;
      }
    }
  }
  return s;
}

void WriteState(const std::string& node_dir, const PlacementState& s) {
  const std::string path = node_dir + "/" + kPlacementStateName;
  const std::string tmp = path + ".tmp";
  std::string text = "attempt " + std::to_string(s.attempt) + "\nverified " +
                     std::to_string(s.verified) + "\nfailed " + std::to_string(s.failed) +
                     "\nmarks " + s.marks + "\nerror " + s.error + "\n";
  for (const auto& [dir, m] : s.shared) {
    if (dir.find('\n') != std::string::npos) continue;
    text += "shared " + std::to_string(m.ino) + " " + std::to_string(m.size) + " " +
            std::to_string(m.mtime_ns) + " " + std::to_string(m.files) + " " +
            std::to_string(m.bytes) + " " + dir + "\n";
  }
  ::unlink(tmp.c_str());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return;
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    ::unlink(tmp.c_str());
    return;
  }
  fd.Reset();
  (void)::rename(tmp.c_str(), path.c_str());
}

// Root's records of the SSD paths (kept/record.h), each read once when first needed: whole, as
// its writer replaces it, in a directory of root's that no link leads to. One that cannot be
// read is empty: its copies have no last use here and do not expire (as gc takes them as used
// now).
using RootRecords = std::map<std::string, std::map<kept::RootRecord::Key, kept::RootTimes>>;

std::optional<int64_t> RootLastUse(RootRecords* records, const std::vector<std::string>& ssd_paths,
                                   const std::string& copy_dir, uint32_t uid,
                                   const std::string& key) {
  for (const std::string& path : ssd_paths) {
    if (copy_dir.rfind(path + "/nopfs-" + std::to_string(uid) + "/", 0) != 0) continue;
    auto [it, fresh] = records->try_emplace(path);
    if (fresh) {
      const std::string dir = path + "/" + kept::kRootRecordDir;
      struct stat st {};
      if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == 0) {
        Result<std::string> text = ReadSmallFile(
            dir + "/kept", SmallFileRules{.max_bytes = kept::kMaxRootRecordBytes, .owner = 0});
        if (text.ok()) it->second = kept::ParseRootRecord(*text);
      }
    }
    const auto found = it->second.find({uid, key});
    if (found != it->second.end()) return found->second.last_used;
  }
  return std::nullopt;
}

std::string SlurmError(const std::string& what) {
  const int e = slurm_get_errno();
  return what + ": " + slurm_strerror(e);
}

}  // namespace

std::string MarkPath(std::string_view dataset) {
  return LexicalPath(dataset);
}

Result<std::string> ReadPlacementKey(const std::string& path) {
  const std::string make = " (make one with: (umask 077; head -c 32 /dev/urandom > " + path +
                           "), the same file on every node and on slurmctld's host)";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return Status::FromErrno(errno, "placement_key " + path + make);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 ||
      (st.st_mode & 077) != 0) {
    return Status::InvalidArgument("placement_key " + path +
                                   ": must be a regular file owned by root with mode 0600" + make);
  }
  std::string key(4096, '\0');
  const ssize_t n = ::read(fd.get(), key.data(), key.size());
  if (n < 16 || n >= 4096) {
    return Status::InvalidArgument("placement_key " + path + ": must hold 16 to 4095 bytes" + make);
  }
  key.resize(static_cast<size_t>(n));
  return key;
}

namespace {

std::string MarkOf(std::string_view key, const std::string& msg) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len) == nullptr ||
      len < kMarkHexDigits / 2) {
    return "";
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string mark(kMarkPrefix);
  for (size_t i = 0; i < kMarkHexDigits / 2; ++i) {
    mark += kHex[out[i] >> 4];
    mark += kHex[out[i] & 15];
  }
  return mark;
}

}  // namespace

std::string PlacementMark(std::string_view key, uint32_t uid, std::string_view dataset) {
  return MarkOf(key, "nopfs placement v1:" + std::to_string(uid) + ":" + MarkPath(dataset));
}

std::string SharedMark(std::string_view key, std::string_view dataset) {
  return MarkOf(key, "nopfs placement v1:shared:" + MarkPath(dataset));
}

Result<std::vector<RunningJob>> RunningJobs(const std::string& ledger_dir) {
  std::vector<RunningJob> out;
  struct stat st {};
  if (ledger_dir.empty() || ::lstat(ledger_dir.c_str(), &st) != 0) return out;
  Result<Ledger> l = Ledger::Lock(ledger_dir, std::chrono::seconds(5));
  if (!l.ok()) return l.status();
  Result<std::vector<LedgerEntry>> entries = l->Entries();
  if (!entries.ok()) return entries.status();
  const std::string boot = BootId();
  for (const LedgerEntry& e : *entries) {
    // An entry of a job whose epilog did not finish (an earlier boot, its process gone) is
    // stale: the next prolog removes it; it marks nothing.
    if (e.sibling_dataset.empty() || e.boot_id != boot ||
        !IsProcessAlive(static_cast<pid_t>(e.pid), e.start_time)) {
      continue;
    }
    out.push_back({e.job_id, e.uid, e.sibling_dataset});
  }
  return out;
}

bool IsPlacementMark(std::string_view feature) {
  if (feature.size() != kMarkPrefix.size() + kMarkHexDigits ||
      feature.substr(0, kMarkPrefix.size()) != kMarkPrefix) {
    return false;
  }
  return std::all_of(feature.begin() + static_cast<ptrdiff_t>(kMarkPrefix.size()), feature.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

NodeFeatures WithMarks(const NodeFeatures& current, const std::set<std::string>& marks) {
  auto replace = [&](const std::string& list) {
    std::vector<std::string> out;
    for (std::string& f : SplitFeatures(list)) {
      if (!IsPlacementMark(f) && f != "(null)") out.push_back(std::move(f));
    }
    out.insert(out.end(), marks.begin(), marks.end());
    return JoinFeatures(out);
  };
  return NodeFeatures{replace(current.available), replace(current.active)};
}

NodeMarks MarksOfNode(std::string_view key, const std::vector<std::string>& ssd_paths,
                      const std::function<int64_t(uint32_t uid)>& lifetime, int64_t now,
                      const std::vector<SharedDataset>& shared,
                      const std::vector<RunningJob>& running, ManifestCache* cache) {
  NodeMarks out;
  if (now == 0) now = static_cast<int64_t>(::time(nullptr));
  // The user's view of every user (kept/ only, no root record to lock): whatever a complete
  // MANIFEST names. A user who writes another dataset there marks the node for that user alone.
  const kept::KeptNode node = kept::KeptNode::Scan(ssd_paths);
  for (const std::string& e : node.errors())
    out.errors.push_back("kept area: " + e);
  RootRecords records;
  for (const kept::KeptEntry& e : node.entries()) {
    if (!e.Complete() || e.stray || e.Pending() || e.data.dataset.empty() ||
        e.data.dataset.front() != '/') {
      continue;
    }
    const std::string mark = PlacementMark(key, e.uid, e.data.dataset);
    bool expired = false;
    if (lifetime) {
      const int64_t life = lifetime(e.uid);
      const std::optional<int64_t> used =
          life > 0 ? RootLastUse(&records, ssd_paths, e.data.dir, e.uid, e.data.key) : std::nullopt;
      expired = used.has_value() && *used + life < now;
    }
    if (!expired) {
      ++out.copies;
      out.marks.insert(mark);
      out.kept_marks.insert(mark);
    }
    out.copies_held.push_back(
        {e.uid, e.data.dataset, e.data.bytes, e.data.last_used, mark, expired});
  }
  // The share service's copies (root's, as this process is): what each manifest names, read
  // again only when the manifest was replaced (its identity before the read: a manifest replaced
  // during the read is read again at the next run).
  ManifestCache now_seen;
  for (const SharedDataset& d : shared) {
    NodeMarks::Shared held{d.dataset, 0, 0, d.quota, false, SharedMark(key, d.dataset)};
    struct stat st {};
    ManifestSeen seen;
    const bool have = ::lstat((d.store_dir + "/MANIFEST").c_str(), &st) == 0;
    if (have) {
      seen.ino = static_cast<uint64_t>(st.st_ino);
      seen.size = static_cast<uint64_t>(st.st_size);
      seen.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
    }
    const auto it = cache != nullptr ? cache->find(d.store_dir) : ManifestCache::iterator();
    if (have && cache != nullptr && it != cache->end() && it->second.ino == seen.ino &&
        it->second.size == seen.size && it->second.mtime_ns == seen.mtime_ns) {
      seen = it->second;
    } else {
      Result<share::StoredCopy> copy = share::ReadStoredCopy(d.store_dir);
      if (!copy.ok()) {
        if (copy.status().code() != StatusCode::kNotFound) {
          out.errors.push_back("shared copy of " + d.dataset + ": " + copy.status().message());
        }
        continue;
      }
      seen.files = copy->files;
      seen.bytes = copy->bytes;
    }
    if (have) now_seen[d.store_dir] = seen;
    held.files = seen.files;
    held.bytes = seen.bytes;
    // bytes >= quota * percent / 100, without overflow.
    held.warm = d.quota > 0 && held.bytes >= d.quota / 100 * kSharedWarmPercent +
                                                 d.quota % 100 * kSharedWarmPercent / 100;
    if (held.warm) {
      out.marks.insert(held.mark);
      out.shared_marks.insert(held.mark);
    }
    out.shared_held.push_back(std::move(held));
  }
  for (const RunningJob& j : running) {
    if (j.dataset.empty() || j.dataset.front() != '/') continue;
    const std::string mark = PlacementMark(key, j.uid, j.dataset);
    out.marks.insert(mark);
    out.running_marks.insert(mark);
    out.running_held.push_back({j.job_id, j.uid, j.dataset, mark});
  }
  if (cache != nullptr) *cache = std::move(now_seen);
  return out;
}

std::string ReconcilePlacement(const PlacementRun& run) {
  const std::string where = "placement: " + run.node + ": ";
  const int64_t now = run.now != 0 ? run.now : static_cast<int64_t>(::time(nullptr));
  UniqueFd lock(::open((run.node_dir + "/" + kPlacementLockName).c_str(),
                       O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!lock.valid()) return where + Status::FromErrno(errno, "lock in " + run.node_dir).message();
  // Another reconcile runs: wait for it (a while at most), so that the change this run was
  // started for (a job's start or end) is not missed by a run that looked before it.
  for (int waited_ms = 0; ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0; waited_ms += 100) {
    if (waited_ms >= kPlacementLockWaitSeconds * 1000) return "";
    ::usleep(100'000);
  }
  PlacementState state = ReadState(run.node_dir);
  const PlacementState before = state;
  // A line when the failure is new (not one per attempt); the state remembers it.
  auto failed = [&](const std::string& why) {
    state.failed = now;
    // A run for a job leaves the line to the timer's run, so that it is in one place.
    if (run.report_failures) state.error = Printable(why, 400);
    WriteState(run.node_dir, state);
    if (!run.report_failures || state.error == before.error) return std::string();
    return where + "the node's marks are not in Slurm: " + state.error +
           "; its jobs run as without placement (tried again within " +
           std::to_string(kPlacementRetrySeconds) + " s)";
  };
  Result<std::string> key = ReadPlacementKey(run.key_path);
  if (!key.ok()) {
    state.attempt = now;
    return failed(key.status().message());
  }
  // A ledger that cannot be read leaves the marks as they are: dropping its jobs' marks now
  // would only put them back at the next run.
  Result<std::vector<RunningJob>> running = RunningJobs(run.ledger_dir);
  if (!running.ok()) {
    return where + "the node's ledger: " + Printable(running.status().message(), 300) +
           "; marks left as they are";
  }
  const NodeMarks marks =
      MarksOfNode(*key, run.ssd_paths, run.lifetime, now, run.shared, *running, &state.shared);
  const std::string wanted = JoinFeatures({marks.marks.begin(), marks.marks.end()});
  if (!run.force && before.failed == 0 && wanted == before.marks &&
      now - before.verified < kPlacementVerifySeconds && now >= before.verified) {
    if (!(state.shared == before.shared)) WriteState(run.node_dir, state);
    return "";  // slurmctld had these marks a moment ago
  }
  if (!run.force && before.failed != 0 && now - before.failed < kPlacementRetrySeconds &&
      now >= before.failed) {
    if (!(state.shared == before.shared)) WriteState(run.node_dir, state);
    return "";  // slurmctld failed a moment ago: leave it alone for a while
  }
  state.attempt = now;
  Result<NodeFeatures> current = run.load(run.node);
  if (!current.ok()) return failed(current.status().message());
  const NodeFeatures next = WithMarks(*current, marks.marks);
  size_t added = 0, removed = 0;
  if (!(next == *current)) {
    std::set<std::string> had;
    for (const std::string& f : SplitFeatures(current->active))
      if (IsPlacementMark(f)) had.insert(f);
    for (const std::string& m : marks.marks)
      added += had.count(m) == 0 ? 1 : 0;
    for (const std::string& m : had)
      removed += marks.marks.count(m) == 0 ? 1 : 0;
    if (Status s = run.update(run.node, next); !s.ok()) return failed(s.message());
  }
  state.verified = now;
  state.failed = 0;
  state.marks = wanted;
  state.error.clear();
  WriteState(run.node_dir, state);
  std::string line;
  if (added + removed > 0 || !before.error.empty()) {
    auto count = [](size_t n, const char* one, const char* many) {
      return std::to_string(n) + " " + (n == 1 ? one : many);
    };
    line = where + "marks " + count(marks.kept_marks.size(), "kept copy", "kept copies");
    if (!marks.shared_marks.empty())
      line += ", " + count(marks.shared_marks.size(), "shared copy", "shared copies");
    if (!marks.running_marks.empty())
      line += ", " + count(marks.running_marks.size(), "running job", "running jobs");
    line += " (" + std::to_string(added) + " added, " + std::to_string(removed) + " removed)";
    if (!before.error.empty()) line += "; Slurm takes the node's marks again";
  }
  for (const std::string& e : marks.errors)
    line += (line.empty() ? where : "; ") + Printable(e, 300);
  return line;
}

Result<NodeFeatures> LoadNodeFeatures(const std::string& node) {
  node_info_msg_t* msg = nullptr;
  std::string name = node;
  if (slurm_load_node_single(&msg, name.data(), SHOW_ALL) != SLURM_SUCCESS) {
    return Status::Unavailable(SlurmError("asking slurmctld for node " + node));
  }
  NodeFeatures f;
  bool found = false;
  for (uint32_t i = 0; msg != nullptr && i < msg->record_count; ++i) {
    const node_info_t& n = msg->node_array[i];
    if (n.name == nullptr || node != n.name) continue;
    found = true;
    f.available = n.features != nullptr ? n.features : "";
    f.active = n.features_act != nullptr ? n.features_act : "";
  }
  slurm_free_node_info_msg(msg);
  if (!found) return Status::NotFound("slurmctld has no node " + node);
  return f;
}

Status UpdateNodeFeatures(const std::string& node, const NodeFeatures& features) {
  update_node_msg_t msg;
  slurm_init_update_node_msg(&msg);
  std::string name = node, available = features.available, active = features.active;
  msg.node_names = name.data();
  msg.features = available.data();
  msg.features_act = active.data();
  if (slurm_update_node(&msg) != SLURM_SUCCESS) {
    return Status::Unavailable(SlurmError("updating node " + node + "'s features"));
  }
  return Status::Ok();
}

void RunDetached(const std::vector<std::string>& argv) {
  if (argv.empty()) return;
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The detached process, reparented to init, runs the reconcile.
  if (launch::Detach() != launch::Detached::kDetached) return;
  ::execv(args[0], args.data());
  _exit(127);
}

}  // namespace nopfs::spank
