#include "lua/admit.h"

#include <pwd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <limits>
#include <sstream>

#include <lua.hpp>

#include "common/units.h"
#include "lua/lua_read.h"

namespace nopfs::lua {
namespace {

// size("20G") -> 20480 (MiB, as every size the policy sees), for policies that compare sizes.
int SizeFn(lua_State* L) {
  Result<uint64_t> v = internal::ReadSize(L, 1, "size()");
  if (!v.ok()) return luaL_error(L, "%s", v.status().message().c_str());
  internal::PushSize(L, *v);
  return 1;
}

int ReadOnlyError(lua_State* L) {
  return luaL_error(L, "job and node are read-only; keep your own values in locals");
}

// Pushes a read-only proxy of the table on top of the stack (replacing it).
void MakeReadOnly(lua_State* L) {
  lua_newtable(L);       // proxy
  lua_newtable(L);       // metatable
  lua_pushvalue(L, -3);  // the data
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, ReadOnlyError);
  lua_setfield(L, -2, "__newindex");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
  lua_remove(L, -2);
}

void SetInt(lua_State* L, const char* key, uint64_t v) {
  lua_pushinteger(L, static_cast<lua_Integer>(std::min<uint64_t>(v, INT64_MAX)));
  lua_setfield(L, -2, key);
}
// A size, in MiB (lua_read.h PushSize).
void SetSize(lua_State* L, const char* key, uint64_t bytes) {
  internal::PushSize(L, bytes);
  lua_setfield(L, -2, key);
}
void SetStr(lua_State* L, const char* key, const std::string& v) {
  lua_pushlstring(L, v.data(), v.size());
  lua_setfield(L, -2, key);
}

policy::Bytes Free(policy::Bytes total, policy::Bytes reserved) {
  return total > reserved ? total - reserved : 0;
}

// Clamps *v to cap (when cap is set), noting why in *reason.
void Clamp(policy::Bytes* v, policy::Bytes cap, const char* what, const char* by,
           std::string* reason) {
  if (*v <= cap) return;
  *v = cap;
  if (!reason->empty()) *reason += "; ";
  *reason +=
      std::string(what) + " limited to " + FormatBytes(static_cast<double>(cap)) + " by " + by;
}

// Pushes the read-only `node` table of both hooks.
void PushNode(lua_State* L, const NodeState& node) {
  lua_newtable(L);
  SetStr(L, "name", node.name);
  SetSize(L, "ram_total", node.ram_total);
  SetSize(L, "ssd_total", node.ssd_total);
  SetSize(L, "ram_reserved", node.ram_reserved);
  SetSize(L, "ssd_reserved", node.ssd_reserved);
  SetSize(L, "ram_free", Free(node.ram_total, node.ram_reserved));
  SetSize(L, "ssd_free", Free(node.ssd_total, node.ssd_reserved));
  SetSize(L, "ssd_kept", node.ssd_kept);
  SetInt(L, "jobs", node.jobs);
  MakeReadOnly(L);
}

// Reads the policy file at `path` (not empty).
Result<std::string> ReadPolicy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::FromErrno(errno, "policy " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) {
    return Status::InvalidArgument("policy " + path +
                                   ": is empty; define function admit(job, node)");
  }
  return text.str();
}

}  // namespace

Result<Admission> AdmitWithPolicyText(std::string_view policy_text, std::string_view name,
                                      const NodeConfig& config, const JobRequest& job,
                                      const NodeState& node, const LuaLimits& limits) {
  const Limits& caps = config.limits();
  if (caps.jobs_per_node != 0 && node.jobs >= caps.jobs_per_node) {
    Admission refused;
    refused.reason = "node " + node.name + " already runs " + std::to_string(node.jobs) +
                     " nopfs jobs, the limit is " + std::to_string(caps.jobs_per_node);
    return refused;
  }
  const policy::Bytes ram_free = Free(node.ram_total, node.ram_reserved);
  const policy::Bytes ssd_free = Free(node.ssd_total, node.ssd_reserved);

  Admission a;
  a.admitted = true;
  a.ram = job.ram != 0 ? job.ram : (job.memory != 0 ? job.memory / 2 : node.ram_total);
  a.ssd = job.ssd != 0 ? job.ssd : node.ssd_total;

  if (!policy_text.empty()) {
    LuaState state(limits);
    lua_State* L = state.get();
    lua_pushcfunction(L, SizeFn);
    lua_setglobal(L, "size");
    NOPFS_RETURN_IF_ERROR(state.RunString(policy_text, name));
    // A policy file that runs but defines no admit() (a typo such as `function Admit`) would
    // otherwise admit every job with the default: fail closed instead.
    if (const int type = lua_getglobal(L, "admit"); type != LUA_TFUNCTION) {
      return Status::InvalidArgument(
          std::string(name) + ": defines no function admit (the global admit is " +
          (type == LUA_TNIL ? std::string("not set") : "a " + std::string(lua_typename(L, type))) +
          "); define function admit(job, node) (the name is lower case)");
    }
    {
      lua_newtable(L);
      SetInt(L, "id", job.job_id);
      SetInt(L, "uid", job.uid);
      SetInt(L, "gid", job.gid);
      SetStr(L, "user", job.user);
      SetStr(L, "account", job.account);
      SetStr(L, "partition", job.partition);
      SetStr(L, "qos", job.qos);
      SetStr(L, "dataset", job.dataset);
      SetInt(L, "nodes", job.nodes);
      SetSize(L, "ram", job.ram);
      SetSize(L, "ssd", job.ssd);
      SetSize(L, "memory", job.memory);
      MakeReadOnly(L);
      PushNode(L, node);
      NOPFS_RETURN_IF_ERROR(state.Call(2, 2, std::string(name) + ": admit()"));
      const std::string where = std::string(name) + ": admit() returned";
      if (lua_isnil(L, -2) || (lua_isboolean(L, -2) && !lua_toboolean(L, -2))) {
        Admission refused;
        refused.reason = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                        : "refused by the site's nopfs policy";
        return refused;
      }
      if (!lua_istable(L, -2)) {
        return Status::InvalidArgument(where + " a " + std::string(luaL_typename(L, -2)) +
                                       "; return { ram = SIZE, ssd = SIZE } or nil, \"reason\"");
      }
      lua_pop(L, 1);
      NOPFS_RETURN_IF_ERROR(internal::CheckKeys(L, -1, {"ram", "ssd"}, where));
      for (auto [field, value] : {std::pair{"ram", &a.ram}, std::pair{"ssd", &a.ssd}}) {
        if (lua_getfield(L, -1, field) != LUA_TNIL) {
          Result<uint64_t> v = internal::ReadSize(L, -1, where + " " + field);
          if (!v.ok()) return v.status();
          *value = *v;
        }
        lua_pop(L, 1);
      }
    }
  }

  if (job.no_ram) Clamp(&a.ram, 0, "RAM", "the request (--nopfs-ram=0)", &a.reason);
  if (job.no_ssd) Clamp(&a.ssd, 0, "SSD", "the request (--nopfs-ssd=0)", &a.reason);
  if (job.ram != 0) Clamp(&a.ram, job.ram, "RAM", "the request", &a.reason);
  if (job.ssd != 0) Clamp(&a.ssd, job.ssd, "SSD", "the request", &a.reason);
  if (job.memory != 0) Clamp(&a.ram, job.memory, "RAM", "the job's memory allocation", &a.reason);
  if (caps.ram_per_job != 0)
    Clamp(&a.ram, caps.ram_per_job, "RAM", "limits.ram_per_job", &a.reason);
  if (caps.ssd_per_job != 0)
    Clamp(&a.ssd, caps.ssd_per_job, "SSD", "limits.ssd_per_job", &a.reason);
  Clamp(&a.ram, ram_free, "RAM", "what is free on the node", &a.reason);
  Clamp(&a.ssd, ssd_free, "SSD", "what is free on the node", &a.reason);
  return a;
}

Result<Admission> Admit(const std::string& policy_path, const NodeConfig& config,
                        const JobRequest& job, const NodeState& node, const LuaLimits& limits) {
  if (policy_path.empty()) return AdmitWithPolicyText("", "", config, job, node, limits);
  Result<std::string> text = ReadPolicy(policy_path);
  if (!text.ok()) return text.status();
  return AdmitWithPolicyText(*text, policy_path, config, job, node, limits);
}

Result<int64_t> ParseLifetime(std::string_view text) {
  const std::string shown(text.substr(0, 40));
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9')
    ++digits;
  const std::string_view unit = text.substr(digits);
  int64_t scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  if (unit == "m") scale = 60;
  if (unit == "h") scale = 3600;
  if (unit == "d") scale = 86400;
  int64_t v = 0;
  const auto r = std::from_chars(text.data(), text.data() + digits, v);
  if (digits == 0 || scale == 0 || r.ec != std::errc() || v > INT64_MAX / scale / 2) {
    return Status::InvalidArgument("lifetime '" + shown +
                                   "': write whole seconds or a number with s, m, h or d, e.g. "
                                   "\"12h\" or \"7d\"");
  }
  return v * scale;
}

Result<KeepGrant> KeepWithPolicyText(std::string_view policy_text, std::string_view name,
                                     const NodeConfig& /*config*/, const KeepUser& user,
                                     const NodeState& node, const LuaLimits& limits) {
  KeepGrant none;
  if (policy_text.empty()) return none;
  LuaState state(limits);
  lua_State* L = state.get();
  lua_pushcfunction(L, SizeFn);
  lua_setglobal(L, "size");
  NOPFS_RETURN_IF_ERROR(state.RunString(policy_text, name));
  if (const int type = lua_getglobal(L, "keep"); type != LUA_TFUNCTION) {
    if (type == LUA_TNIL) return none;  // no keep hook: nothing is kept
    return Status::InvalidArgument(std::string(name) + ": the global keep is a " +
                                   lua_typename(L, type) +
                                   "; define function keep(user, node), or leave keep unset");
  }
  lua_newtable(L);
  SetInt(L, "uid", user.uid);
  SetInt(L, "gid", user.gid);
  SetStr(L, "name", user.name);
  MakeReadOnly(L);
  PushNode(L, node);
  NOPFS_RETURN_IF_ERROR(state.Call(2, 1, std::string(name) + ": keep()"));
  const std::string where = std::string(name) + ": keep() returned";
  if (lua_isnil(L, -1) || (lua_isboolean(L, -1) && !lua_toboolean(L, -1))) return none;
  if (!lua_istable(L, -1)) {
    return Status::InvalidArgument(where + " a " + std::string(luaL_typename(L, -1)) +
                                   "; return { quota = SIZE, lifetime = SECONDS } or nil");
  }
  NOPFS_RETURN_IF_ERROR(internal::CheckKeys(L, -1, {"quota", "lifetime"}, where));
  KeepGrant g;
  if (lua_getfield(L, -1, "quota") != LUA_TNIL) {
    Result<uint64_t> v = internal::ReadSize(L, -1, where + " quota");
    if (!v.ok()) return v.status();
    g.quota = *v;
  }
  lua_pop(L, 1);
  const int type = lua_getfield(L, -1, "lifetime");
  if (type == LUA_TNUMBER && lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 0) {
    g.lifetime = static_cast<int64_t>(lua_tointeger(L, -1));
  } else if (type == LUA_TSTRING) {
    Result<int64_t> v = ParseLifetime(lua_tostring(L, -1));
    if (!v.ok()) return Status::InvalidArgument(where + " " + v.status().message());
    g.lifetime = *v;
  } else if (type != LUA_TNIL) {
    return Status::InvalidArgument(where + " lifetime as a " + std::string(luaL_typename(L, -1)) +
                                   "; write whole seconds or a string such as \"7d\"");
  }
  lua_pop(L, 1);
  return g;
}

Result<KeepGrant> Keep(const std::string& policy_path, const NodeConfig& config,
                       const KeepUser& user, const NodeState& node, const LuaLimits& limits) {
  if (policy_path.empty()) return KeepGrant{};
  Result<std::string> text = ReadPolicy(policy_path);
  if (!text.ok()) return text.status();
  return KeepWithPolicyText(*text, policy_path, config, user, node, limits);
}

KeepGrant KeepGrants::For(uint32_t uid) {
  if (auto it = grants_.find(uid); it != grants_.end()) return it->second.first;
  KeepUser user;
  user.uid = uid;
  if (const passwd* pw = ::getpwuid(uid); pw != nullptr) {
    user.gid = pw->pw_gid;
    user.name = pw->pw_name;
  }
  Result<KeepGrant> g = Keep(policy_, config_, user, node_);
  if (g.ok()) {
    grants_[uid] = {*g, false};
    return *g;
  }
  errors_.push_back("keep policy for uid " + std::to_string(uid) + ": " + g.status().message());
  KeepGrant unlimited;
  unlimited.quota = std::numeric_limits<policy::Bytes>::max();
  grants_[uid] = {unlimited, true};
  return unlimited;
}

bool KeepGrants::Failed(uint32_t uid) {
  (void)For(uid);
  return grants_[uid].second;
}

}  // namespace nopfs::lua
