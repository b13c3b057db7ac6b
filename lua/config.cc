#include "lua/config.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <set>
#include <tuple>

#include <lua.hpp>

#include "common/units.h"
#include "lua/lua_read.h"

namespace nopfs::lua {
namespace {

using internal::CheckKeys;
using internal::ReadBandwidth;
using internal::ReadCount;
using internal::ReadSize;
using internal::ReadString;
using internal::ReadTable;
using policy::BandwidthTable;
using policy::ClassKind;
using policy::StorageClass;

constexpr double kGB = 1e9;

// Conservative defaults for a node whose admin has not measured it (docs/config.md): RAM copy
// rates of a server socket, a SATA/NVMe SSD, and a busy PFS that gives one reader 200 MB/s.
BandwidthTable DefaultRead(ClassKind kind) {
  return kind == ClassKind::kRam ? BandwidthTable({{1, 6 * kGB}, {4, 16 * kGB}})
                                 : BandwidthTable({{1, 1.0 * kGB}, {4, 2.5 * kGB}});
}
BandwidthTable DefaultWrite(ClassKind kind) {
  return kind == ClassKind::kRam ? BandwidthTable({{1, 4 * kGB}, {4, 10 * kGB}})
                                 : BandwidthTable({{1, 0.8 * kGB}, {4, 1.6 * kGB}});
}
BandwidthTable DefaultPfs() {
  return BandwidthTable({{1, 0.2 * kGB}, {16, 1.5 * kGB}, {64, 2 * kGB}});
}
constexpr uint32_t kDefaultThreads = 4;
constexpr policy::Bytes kDefaultStagingBytes = policy::Bytes{1} << 30;

constexpr std::array kSettings = {
    "classes",       "staging",    "pfs",     "network",     "limits",   "log_level", "verify",
    "catalog_cache", "preprocess", "planner", "metrics_dir", "job_logs", "shared"};

// ram{...} and ssd{...}: mark the table with its kind and the line it was written on, so that
// errors found later can point at it.
int MakeClass(lua_State* L, const char* kind) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_getfield(L, 1, "kind");
  if (!lua_isnil(L, -1)) {
    return luaL_error(L, "%s{}: leave out 'kind' (the function says it)", kind);
  }
  lua_pop(L, 1);
  lua_pushstring(L, kind);
  lua_setfield(L, 1, "kind");
  lua_Debug ar;
  if (lua_getstack(L, 1, &ar) != 0 && lua_getinfo(L, "l", &ar) != 0 && ar.currentline > 0) {
    lua_pushinteger(L, ar.currentline);
    lua_setfield(L, 1, "__line");
  }
  return 1;
}
int RamClass(lua_State* L) {
  return MakeClass(L, "ram");
}
int SsdClass(lua_State* L) {
  return MakeClass(L, "ssd");
}

class Reader {
 public:
  // `builtins`: the globals that existed before the script ran (libraries, ram, ssd).
  Reader(lua_State* L, std::string name, policy::Bytes host_memory, std::set<std::string> builtins)
      : L_(L), name_(std::move(name)), host_memory_(host_memory), builtins_(std::move(builtins)) {}

  Status Read(policy::SystemModel* model, Limits* limits, std::string* log_level,
              std::string* catalog_cache, policy::Planner* planner, RamVerify* verify,
              std::string* metrics_dir, std::string* job_log_dir, uint32_t* job_log_days) {
    NOPFS_RETURN_IF_ERROR(CheckGlobals());
    model->pfs = DefaultPfs();
    model->staging = StorageClass{"staging",
                                  ClassKind::kRam,
                                  "",
                                  kDefaultStagingBytes,
                                  kDefaultThreads,
                                  DefaultRead(ClassKind::kRam),
                                  DefaultWrite(ClassKind::kRam)};

    if (Global("pfs")) {
      Result<BandwidthTable> t = ReadTable(L_, -1, name_ + ": pfs");
      lua_pop(L_, 1);
      if (!t.ok()) return t.status();
      model->pfs = std::move(*t);
    }
    if (Global("network")) {
      Result<double> bw = ReadBandwidth(L_, -1, name_ + ": network");
      lua_pop(L_, 1);
      if (!bw.ok()) return bw.status();
      model->network_bandwidth = *bw;
    }
    if (Global("preprocess")) {
      Result<double> bw = ReadBandwidth(L_, -1, name_ + ": preprocess");
      lua_pop(L_, 1);
      if (!bw.ok()) return bw.status();
      model->preprocess_rate = *bw;
    }
    if (Global("staging")) {
      Status s = ReadStaging(&model->staging);
      lua_pop(L_, 1);
      NOPFS_RETURN_IF_ERROR(s);
    }
    if (Global("classes")) {
      Status s = ReadClasses(&model->classes);
      lua_pop(L_, 1);
      NOPFS_RETURN_IF_ERROR(s);
    }
    if (Global("limits")) {
      Status s = ReadLimits(limits);
      lua_pop(L_, 1);
      NOPFS_RETURN_IF_ERROR(s);
    }
    if (Global("log_level")) {
      Result<std::string> level = ReadString(L_, -1, name_ + ": log_level");
      lua_pop(L_, 1);
      if (!level.ok()) return level.status();
      static constexpr std::array kLevels = {"trace", "debug",    "info", "warn",
                                             "error", "critical", "off"};
      if (std::find(kLevels.begin(), kLevels.end(), *level) == kLevels.end()) {
        return Status::InvalidArgument(name_ + ": log_level: \"" + *level +
                                       "\" is not a level; write one of trace, debug, info, "
                                       "warn, error, critical, off");
      }
      *log_level = *level;
    }
    if (Global("catalog_cache")) {
      Result<std::string> dir = ReadString(L_, -1, name_ + ": catalog_cache");
      lua_pop(L_, 1);
      if (!dir.ok()) return dir.status();
      if (!dir->empty() && dir->front() != '/') {
        return Status::InvalidArgument(name_ + ": catalog_cache: \"" + *dir +
                                       "\" must be an absolute path");
      }
      *catalog_cache = *dir;
    }
    if (Global("verify")) {
      Result<std::string> v = ReadString(L_, -1, name_ + ": verify");
      lua_pop(L_, 1);
      if (!v.ok()) return v.status();
      if (*v == "on_fill") {
        *verify = RamVerify::kOnFill;
      } else if (*v == "always") {
        *verify = RamVerify::kAlways;
      } else {
        return Status::InvalidArgument(name_ + ": verify: \"" + *v +
                                       "\"; write verify = \"on_fill\" (RAM hits served as "
                                       "filled) or verify = \"always\" (every RAM hit re-hashed)");
      }
    }
    if (Global("metrics_dir")) {
      Result<std::string> dir = ReadString(L_, -1, name_ + ": metrics_dir");
      lua_pop(L_, 1);
      if (!dir.ok()) return dir.status();
      if (!dir->empty() && dir->front() != '/') {
        return Status::InvalidArgument(
            name_ + ": metrics_dir: \"" + *dir +
            "\" must be an absolute path (node_exporter's textfile directory, for example "
            "\"/var/lib/prometheus/node-exporter\")");
      }
      *metrics_dir = *dir;
    }
    if (Global("job_logs")) {
      Status s = ReadJobLogs(job_log_dir, job_log_days);
      lua_pop(L_, 1);
      if (!s.ok()) return s;
    }
    if (Global("planner")) {
      Result<std::string> name = ReadString(L_, -1, name_ + ": planner");
      lua_pop(L_, 1);
      if (!name.ok()) return name.status();
      Result<policy::Planner> p = policy::ParsePlanner(*name);
      if (!p.ok()) {
        const std::string_view near =
            internal::Closest(*name, {"frequency", "staging", "fill-once"});
        return Status::InvalidArgument(
            name_ + ": " + p.status().message() +
            (near.empty() ? std::string() : " (did you mean '" + std::string(near) + "'?)"));
      }
      *planner = *p;
    }
    return model->Validate().WithContext(name_);
  }

  // `shared` (after Read: the copies live on the first SSD class).
  Status ReadSharedSetting(const policy::SystemModel& model, std::vector<SharedDecl>* out) {
    if (!Global("shared")) return Status::Ok();
    Status s = ReadShared(out);
    lua_pop(L_, 1);
    NOPFS_RETURN_IF_ERROR(s);
    const StorageClass* ssd = nullptr;
    for (const StorageClass& c : model.classes) {
      if (c.kind == ClassKind::kSsd && !c.path.empty()) {
        ssd = &c;
        break;
      }
    }
    if (!out->empty() && ssd == nullptr) {
      return Status::InvalidArgument(name_ +
                                     ": shared: the copies are kept on the node's SSD; add an "
                                     "ssd{ path = ... } class to classes");
    }
    // The copies' quotas come out of what the node offers jobs (SsdForJobs): together they fit
    // in the SSD class that holds them.
    policy::Bytes quotas = 0;
    for (const SharedDecl& d : *out)
      quotas += d.ssd;
    if (ssd != nullptr && quotas > ssd->capacity) {
      return Status::InvalidArgument(
          name_ + ": shared: the copies' ssd quotas (" + FormatBytes(static_cast<double>(quotas)) +
          " in all) exceed the capacity of the SSD class " + ssd->name + " that holds them (" +
          FormatBytes(static_cast<double>(ssd->capacity)) +
          "); lower the quotas or raise the class's capacity");
    }
    return Status::Ok();
  }

 private:
  // Pushes global `name` and returns true when it is set; pushes nothing otherwise.
  bool Global(const char* name) {
    if (lua_getglobal(L_, name) == LUA_TNIL) {
      lua_pop(L_, 1);
      return false;
    }
    return true;
  }

  // A global that is not a known setting but within two edits of one is a typo.
  Status CheckGlobals() {
    lua_pushglobaltable(L_);
    lua_pushnil(L_);
    while (lua_next(L_, -2) != 0) {
      lua_pop(L_, 1);
      if (lua_type(L_, -1) != LUA_TSTRING) continue;
      std::string_view key = lua_tostring(L_, -1);
      if (std::find(kSettings.begin(), kSettings.end(), key) != kSettings.end() ||
          builtins_.count(std::string(key)) != 0) {
        continue;
      }
      std::string_view near = internal::Closest(
          key, {"classes", "staging", "pfs", "network", "limits", "log_level", "verify",
                "catalog_cache", "preprocess", "planner", "metrics_dir", "job_logs", "shared"});
      if (!near.empty() && key.size() > 3) {
        std::string msg = name_ + ": unknown setting '" + std::string(key) + "' (did you mean '" +
                          std::string(near) + "'?)";
        lua_pop(L_, 2);
        return Status::InvalidArgument(msg);
      }
    }
    lua_pop(L_, 1);
    return Status::Ok();
  }

  Status ReadStaging(StorageClass* staging) {
    const std::string where = name_ + ": staging";
    if (!lua_istable(L_, -1)) {
      return Status::InvalidArgument(where +
                                     ": expected a table like { capacity = \"1G\", "
                                     "threads = 4 }");
    }
    NOPFS_RETURN_IF_ERROR(CheckKeys(L_, -1, {"capacity", "threads", "write"}, where));
    if (lua_getfield(L_, -1, "capacity") != LUA_TNIL) {
      Result<uint64_t> c = ReadSize(L_, -1, where + ": capacity", host_memory_);
      lua_pop(L_, 1);
      if (!c.ok()) return c.status();
      staging->capacity = *c;
    } else {
      lua_pop(L_, 1);
    }
    if (lua_getfield(L_, -1, "threads") != LUA_TNIL) {
      Result<uint32_t> t = ReadCount(L_, -1, where + ": threads", 1);
      lua_pop(L_, 1);
      if (!t.ok()) return t.status();
      staging->threads = *t;
    } else {
      lua_pop(L_, 1);
    }
    if (lua_getfield(L_, -1, "write") != LUA_TNIL) {
      Result<BandwidthTable> w = ReadTable(L_, -1, where + ": write");
      lua_pop(L_, 1);
      if (!w.ok()) return w.status();
      staging->write = std::move(*w);
    } else {
      lua_pop(L_, 1);
    }
    return Status::Ok();
  }

  Status ReadClasses(std::vector<StorageClass>* classes) {
    if (!lua_istable(L_, -1)) {
      return Status::InvalidArgument(name_ +
                                     ": classes: expected a list like { ram { capacity "
                                     "= \"20G\" } }");
    }
    const lua_Integer n = luaL_len(L_, -1);
    lua_pushnil(L_);
    while (lua_next(L_, -2) != 0) {
      lua_pop(L_, 1);
      if (!lua_isinteger(L_, -1) || lua_tointeger(L_, -1) < 1 || lua_tointeger(L_, -1) > n) {
        lua_pop(L_, 1);
        return Status::InvalidArgument(name_ +
                                       ": classes: expected a list like { ram { ... }, "
                                       "ssd { ... } } with no named fields or holes");
      }
    }
    for (lua_Integer i = 1; i <= n; ++i) {
      lua_geti(L_, -1, i);
      StorageClass c;
      Status s = ReadClass(static_cast<int>(i), &c);
      lua_pop(L_, 1);
      NOPFS_RETURN_IF_ERROR(s);
      classes->push_back(std::move(c));
    }
    return Status::Ok();
  }

  Status ReadClass(int i, StorageClass* c) {
    std::string where = name_;
    if (!lua_istable(L_, -1)) {
      return Status::InvalidArgument(where + ": classes[" + std::to_string(i) +
                                     "]: expected ram { ... } or ssd { ... }");
    }
    if (lua_getfield(L_, -1, "__line") == LUA_TNUMBER) {
      where += ":" + std::to_string(lua_tointeger(L_, -1));
    }
    lua_pop(L_, 1);
    where += ": classes[" + std::to_string(i) + "]";
    NOPFS_RETURN_IF_ERROR(
        CheckKeys(L_, -1, {"kind", "name", "path", "capacity", "threads", "read", "write"}, where));

    lua_getfield(L_, -1, "kind");
    Result<std::string> kind = lua_isnil(L_, -1)
                                   ? Result<std::string>(Status::InvalidArgument(
                                         where + ": no kind; write ram { ... } or ssd { ... }"))
                                   : ReadString(L_, -1, where + ": kind");
    lua_pop(L_, 1);
    if (!kind.ok()) return kind.status();
    if (*kind == "ram") {
      c->kind = ClassKind::kRam;
    } else if (*kind == "ssd") {
      c->kind = ClassKind::kSsd;
    } else {
      return Status::InvalidArgument(where + ": kind \"" + *kind +
                                     "\" is unknown; write \"ram\" "
                                     "or \"ssd\"");
    }
    c->name = *kind;
    if (lua_getfield(L_, -1, "name") != LUA_TNIL) {
      Result<std::string> name = ReadString(L_, -1, where + ": name");
      if (!name.ok()) {
        lua_pop(L_, 1);
        return name.status();
      }
      c->name = *name;
    }
    lua_pop(L_, 1);
    where += " (\"" + c->name + "\")";

    if (lua_getfield(L_, -1, "path") != LUA_TNIL) {
      Result<std::string> path = ReadString(L_, -1, where + ": path");
      lua_pop(L_, 1);
      if (!path.ok()) return path.status();
      if (c->kind == ClassKind::kRam) {
        return Status::InvalidArgument(where + ": a RAM class has no path; remove it");
      }
      if (path->empty() || path->front() != '/') {
        return Status::InvalidArgument(where + ": path \"" + *path +
                                       "\" must be an absolute directory, e.g. \"/scratch\"");
      }
      c->path = *path;
    } else {
      lua_pop(L_, 1);
      if (c->kind == ClassKind::kSsd) {
        return Status::InvalidArgument(where +
                                       ": an SSD class needs path = \"/local/scratch\" "
                                       "(the node's local scratch directory)");
      }
    }

    if (lua_getfield(L_, -1, "capacity") == LUA_TNIL) {
      lua_pop(L_, 1);
      return Status::InvalidArgument(where + ": no capacity; write capacity = \"20G\"");
    }
    Result<uint64_t> cap =
        ReadSize(L_, -1, where + ": capacity", c->kind == ClassKind::kRam ? host_memory_ : 0);
    lua_pop(L_, 1);
    if (!cap.ok()) return cap.status();
    c->capacity = *cap;

    c->threads = kDefaultThreads;
    if (lua_getfield(L_, -1, "threads") != LUA_TNIL) {
      Result<uint32_t> t = ReadCount(L_, -1, where + ": threads", 1);
      lua_pop(L_, 1);
      if (!t.ok()) return t.status();
      c->threads = *t;
    } else {
      lua_pop(L_, 1);
    }
    c->read = DefaultRead(c->kind);
    c->write = DefaultWrite(c->kind);
    for (auto [field, table] : {std::pair{"read", &c->read}, std::pair{"write", &c->write}}) {
      if (lua_getfield(L_, -1, field) != LUA_TNIL) {
        Result<BandwidthTable> t = ReadTable(L_, -1, where + ": " + field);
        lua_pop(L_, 1);
        if (!t.ok()) return t.status();
        *table = std::move(*t);
      } else {
        lua_pop(L_, 1);
      }
    }
    return Status::Ok();
  }

  // job_logs = { dir = "/var/log/nopfs", days = 14 }
  Status ReadShared(std::vector<SharedDecl>* out) {
    const std::string where = name_ + ": shared";
    const char* like = ": expected a list like { { path = \"/pfs/imagenet\", ssd = \"200G\" } }";
    if (!lua_istable(L_, -1)) return Status::InvalidArgument(where + like);
    const lua_Integer n = static_cast<lua_Integer>(lua_rawlen(L_, -1));
    for (lua_Integer i = 1; i <= n; ++i) {
      const std::string at = where + "[" + std::to_string(i) + "]";
      lua_rawgeti(L_, -1, i);
      if (!lua_istable(L_, -1)) {
        lua_pop(L_, 1);
        return Status::InvalidArgument(at + like);
      }
      Status s = CheckKeys(L_, -1, {"path", "ssd"}, at);
      SharedDecl d;
      if (s.ok()) {
        if (lua_getfield(L_, -1, "path") != LUA_TNIL) {
          Result<std::string> p = ReadString(L_, -1, at + ": path");
          if (p.ok())
            d.path = *p;
          else
            s = p.status();
        }
        lua_pop(L_, 1);
      }
      if (s.ok()) {
        if (lua_getfield(L_, -1, "ssd") != LUA_TNIL) {
          Result<uint64_t> v = ReadSize(L_, -1, at + ": ssd");
          if (v.ok())
            d.ssd = *v;
          else
            s = v.status();
        }
        lua_pop(L_, 1);
      }
      lua_pop(L_, 1);  // the element
      NOPFS_RETURN_IF_ERROR(s);
      while (d.path.size() > 1 && d.path.back() == '/')
        d.path.pop_back();
      if (d.path.empty() || d.path.front() != '/' || d.path.find("/./") != std::string::npos ||
          d.path.find("/../") != std::string::npos) {
        return Status::InvalidArgument(at + ": path: \"" + d.path +
                                       "\" must be the dataset's absolute directory, e.g. "
                                       "\"/pfs/imagenet\"");
      }
      if (d.ssd == 0) {
        return Status::InvalidArgument(at +
                                       ": give ssd = \"200G\": the SSD its copy may take "
                                       "on the node");
      }
      for (const SharedDecl& e : *out) {
        if (e.path == d.path) {
          return Status::InvalidArgument(at + ": " + d.path + " is declared twice");
        }
      }
      out->push_back(std::move(d));
    }
    return Status::Ok();
  }

  Status ReadJobLogs(std::string* dir, uint32_t* days) {
    const std::string where = name_ + ": job_logs";
    if (!lua_istable(L_, -1)) {
      return Status::InvalidArgument(where +
                                     ": expected a table like { dir = \"/var/log/nopfs\", days "
                                     "= 14 }");
    }
    NOPFS_RETURN_IF_ERROR(CheckKeys(L_, -1, {"dir", "days"}, where));
    if (lua_getfield(L_, -1, "dir") == LUA_TNIL) {
      lua_pop(L_, 1);
      return Status::InvalidArgument(where +
                                     ": give dir = \"/var/log/nopfs\" (root's directory "
                                     "for the jobs' nopfsd logs)");
    }
    Result<std::string> d = ReadString(L_, -1, where + ": dir");
    lua_pop(L_, 1);
    if (!d.ok()) return d.status();
    if (d->empty() || d->front() != '/') {
      return Status::InvalidArgument(where + ": dir: \"" + *d +
                                     "\" must be an absolute path, e.g. \"/var/log/nopfs\"");
    }
    *dir = *d;
    if (lua_getfield(L_, -1, "days") != LUA_TNIL) {
      Result<uint32_t> n = ReadCount(L_, -1, where + ": days", 1);
      lua_pop(L_, 1);
      if (!n.ok()) return n.status();
      *days = *n;
    } else {
      lua_pop(L_, 1);
    }
    return Status::Ok();
  }

  Status ReadLimits(Limits* limits) {
    const std::string where = name_ + ": limits";
    if (!lua_istable(L_, -1)) {
      return Status::InvalidArgument(where + ": expected a table like { jobs_per_node = 8 }");
    }
    NOPFS_RETURN_IF_ERROR(CheckKeys(
        L_, -1, {"jobs_per_node", "ram_per_job", "ssd_per_job", "streams_per_rank"}, where));
    for (auto [field, value, least] :
         {std::tuple{"jobs_per_node", &limits->jobs_per_node, 0u},
          std::tuple{"streams_per_rank", &limits->streams_per_rank, 1u}}) {
      if (lua_getfield(L_, -1, field) != LUA_TNIL) {
        Result<uint32_t> n = ReadCount(L_, -1, where + ": " + field, least);
        lua_pop(L_, 1);
        if (!n.ok()) return n.status();
        *value = *n;
      } else {
        lua_pop(L_, 1);
      }
    }
    for (auto [field, value] : {std::pair{"ram_per_job", &limits->ram_per_job},
                                std::pair{"ssd_per_job", &limits->ssd_per_job}}) {
      if (lua_getfield(L_, -1, field) != LUA_TNIL) {
        Result<uint64_t> v = ReadSize(L_, -1, where + ": " + field,
                                      std::string_view(field) == "ram_per_job" ? host_memory_ : 0);
        lua_pop(L_, 1);
        if (!v.ok()) return v.status();
        *value = *v;
      } else {
        lua_pop(L_, 1);
      }
    }
    return Status::Ok();
  }

  lua_State* L_;
  std::string name_;
  policy::Bytes host_memory_;
  std::set<std::string> builtins_;
};

std::set<std::string> GlobalNames(lua_State* L) {
  std::set<std::string> names;
  lua_pushglobaltable(L);
  lua_pushnil(L);
  while (lua_next(L, -2) != 0) {
    lua_pop(L, 1);
    if (lua_type(L, -1) == LUA_TSTRING) names.insert(lua_tostring(L, -1));
  }
  lua_pop(L, 1);
  return names;
}

}  // namespace

std::string NodeConfig::shared_store_dir() const {
  for (const StorageClass& c : model_.classes)
    if (c.kind == ClassKind::kSsd && !c.path.empty()) return c.path + "/.nopfs-shared";
  return "";
}

policy::Bytes NodeConfig::CapacityOf(policy::ClassKind kind) const {
  policy::Bytes sum = 0;
  for (const StorageClass& c : model_.classes)
    if (c.kind == kind) sum += c.capacity;
  return sum;
}

policy::Bytes NodeConfig::SsdForJobs() const {
  policy::Bytes shared = 0;
  for (const SharedDecl& d : shared_)
    shared += d.ssd;
  const policy::Bytes ssd = CapacityOf(ClassKind::kSsd);
  return ssd > shared ? ssd - shared : 0;
}

policy::Bytes HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return policy::Bytes{1} << 30;
  return static_cast<policy::Bytes>(pages) * static_cast<policy::Bytes>(page);
}

Result<NodeConfig> LoadNodeConfigFromString(std::string_view text, std::string_view name,
                                            policy::Bytes host_memory, const LuaLimits& limits) {
  LuaState state(limits);
  lua_State* L = state.get();
  lua_pushcfunction(L, RamClass);
  lua_setglobal(L, "ram");
  lua_pushcfunction(L, SsdClass);
  lua_setglobal(L, "ssd");
  std::set<std::string> builtins = GlobalNames(L);
  NOPFS_RETURN_IF_ERROR(state.RunString(text, name));
  NodeConfig config;
  config.source_ = std::string(name);
  Reader reader(L, std::string(name), host_memory, std::move(builtins));
  NOPFS_RETURN_IF_ERROR(reader.Read(
      &config.model_, &config.limits_, &config.log_level_, &config.catalog_cache_, &config.planner_,
      &config.ram_verify_, &config.metrics_dir_, &config.job_log_dir_, &config.job_log_days_));
  NOPFS_RETURN_IF_ERROR(reader.ReadSharedSetting(config.model_, &config.shared_));
  return config;
}

Result<NodeConfig> LoadNodeConfig(const std::string& path, policy::Bytes host_memory,
                                  const LuaLimits& limits) {
  std::string text;
  {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return Status::FromErrno(errno, "config " + path);
    char buf[8192];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
      text.append(buf, n);
      if (text.size() > (size_t{16} << 20)) {
        std::fclose(f);
        return Status::InvalidArgument("config " + path + ": larger than 16 MiB; is it a config?");
      }
    }
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) return Status::IoError("config " + path + ": read error");
  }
  return LoadNodeConfigFromString(text, path, host_memory, limits);
}

std::string_view RamVerifyName(RamVerify v) {
  return v == RamVerify::kAlways ? "always" : "on_fill";
}

NodeConfig DefaultNodeConfig(policy::Bytes host_memory) {
  NodeConfig config;
  config.source_ = "built-in defaults";
  config.model_.pfs = DefaultPfs();
  config.model_.staging = StorageClass{"staging",
                                       ClassKind::kRam,
                                       "",
                                       kDefaultStagingBytes,
                                       kDefaultThreads,
                                       DefaultRead(ClassKind::kRam),
                                       DefaultWrite(ClassKind::kRam)};
  config.model_.classes.push_back(StorageClass{"ram", ClassKind::kRam, "", host_memory / 8,
                                               kDefaultThreads, DefaultRead(ClassKind::kRam),
                                               DefaultWrite(ClassKind::kRam)});
  return config;
}

}  // namespace nopfs::lua
