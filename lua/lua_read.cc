#include "lua/lua_read.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "common/units.h"

namespace nopfs::lua::internal {

std::string_view TypeName(lua_State* L, int idx) {
  return luaL_typename(L, idx);
}

namespace {

// A Lua number as the admin wrote it: "3000000000", "1e9".
std::string NumberText(lua_State* L, int idx) {
  char buf[64];
  if (lua_isinteger(L, idx)) {
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(lua_tointeger(L, idx)));
  } else {
    std::snprintf(buf, sizeof(buf), "%.17g", lua_tonumber(L, idx));
  }
  return buf;
}

// A number of MiB (a size; per = "") or MiB/s (a bandwidth; per = "/s") from Lua, in bytes. A
// size of 1 PiB or more, or a bandwidth of 1 TiB/s or more, is a count of bytes, as these were
// written before sizes followed --mem: refused, saying what it reads as and what to write for
// that many bytes.
Result<double> ReadMiB(lua_State* L, int idx, const std::string& where, const std::string& per) {
  const double v = lua_tonumber(L, idx);
  if (!(v >= 0) || !std::isfinite(v)) {
    return Status::InvalidArgument(where + ": " + NumberText(L, idx) +
                                   " is not a size; a number is MiB" + per +
                                   ": write e.g. 16384 or \"16G" + per + "\" for 16 GiB" + per);
  }
  if (v >= static_cast<double>(per.empty() ? kGiB : kMiB)) {
    return Status::InvalidArgument(where + ": " + NumberText(L, idx) + " reads as " +
                                   FormatBytes(v * static_cast<double>(kMiB)) + per +
                                   ": a number is MiB" + per + ", as Slurm's --mem; for " +
                                   NumberText(L, idx) + " bytes" + per + " write \"" +
                                   FormatBytes(v) + per + "\"");
  }
  return v * static_cast<double>(kMiB);
}

}  // namespace

void PushSize(lua_State* L, uint64_t bytes) {
  if (bytes % kMiB == 0) {
    lua_pushinteger(L, static_cast<lua_Integer>(bytes / kMiB));
  } else {
    lua_pushnumber(L, static_cast<lua_Number>(bytes) / static_cast<lua_Number>(kMiB));
  }
}

Result<uint64_t> ReadSize(lua_State* L, int idx, const std::string& where, uint64_t percent_of) {
  // A number is MiB, as a bare number in a string and Slurm's --mem (and job.memory, node.ram_free
  // and the other sizes a policy is given): 16384 is 16 GiB.
  if (lua_type(L, idx) == LUA_TNUMBER) {
    if (lua_isinteger(L, idx)) {
      const lua_Integer v = lua_tointeger(L, idx);
      if (v < 0) return Status::InvalidArgument(where + ": a size cannot be negative");
      if (v < static_cast<lua_Integer>(kGiB)) return static_cast<uint64_t>(v) * kMiB;
    }
    Result<double> v = ReadMiB(L, idx, where, "");
    if (!v.ok()) return v.status();
    return static_cast<uint64_t>(std::llround(*v));
  }
  if (lua_type(L, idx) != LUA_TSTRING) {
    return Status::InvalidArgument(where +
                                   ": expected a size like \"20G\" or a number of MiB, "
                                   "got a " +
                                   std::string(TypeName(L, idx)));
  }
  std::string_view text = lua_tostring(L, idx);
  if (!text.empty() && text.back() == '%') {
    if (percent_of == 0) {
      return Status::InvalidArgument(where + ": \"" + std::string(text) +
                                     "\": a percentage is only allowed for RAM capacities; "
                                     "write a size like \"20G\"");
    }
    const std::string num(text.substr(0, text.size() - 1));
    char* end = nullptr;
    const double pct = std::strtod(num.c_str(), &end);
    if (num.empty() || end != num.c_str() + num.size() || !(pct >= 0) || pct > 100) {
      return Status::InvalidArgument(where + ": \"" + std::string(text) +
                                     "\" is not a percentage between 0% and 100%");
    }
    return static_cast<uint64_t>(static_cast<double>(percent_of) * pct / 100.0);
  }
  Result<uint64_t> size = ParseSize(text);
  if (!size.ok()) return size.status().WithContext(where);
  return *size;
}

Result<double> ReadBandwidth(lua_State* L, int idx, const std::string& where) {
  if (lua_type(L, idx) == LUA_TNUMBER) return ReadMiB(L, idx, where, "/s");
  if (lua_type(L, idx) != LUA_TSTRING) {
    return Status::InvalidArgument(where + ": expected a bandwidth like \"1.5G/s\", got a " +
                                   std::string(TypeName(L, idx)));
  }
  Result<double> bw = ParseBandwidth(lua_tostring(L, idx));
  if (!bw.ok()) return bw.status().WithContext(where);
  return *bw;
}

Result<policy::BandwidthTable> ReadTable(lua_State* L, int idx, const std::string& where) {
  idx = lua_absindex(L, idx);
  if (lua_type(L, idx) != LUA_TTABLE) {
    Result<double> flat = ReadBandwidth(L, idx, where);
    if (!flat.ok()) return flat.status();
    return policy::BandwidthTable::Constant(*flat);
  }
  std::vector<std::pair<double, double>> points;
  const lua_Integer n = luaL_len(L, idx);
  if (n == 0) {
    return Status::InvalidArgument(where +
                                   ": an empty table; write one bandwidth (\"2G/s\") or "
                                   "points like { {1, \"1G/s\"}, {8, \"4G/s\"} }");
  }
  for (lua_Integer i = 1; i <= n; ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    lua_geti(L, idx, i);
    if (lua_type(L, -1) != LUA_TTABLE || luaL_len(L, -1) != 2) {
      lua_pop(L, 1);
      return Status::InvalidArgument(at +
                                     ": expected a pair {threads, bandwidth} like {4, "
                                     "\"2G/s\"}");
    }
    lua_geti(L, -1, 1);
    if (lua_type(L, -1) != LUA_TNUMBER) {
      lua_pop(L, 2);
      return Status::InvalidArgument(at + ": the first element must be a number of threads");
    }
    const double x = lua_tonumber(L, -1);
    lua_pop(L, 1);
    lua_geti(L, -1, 2);
    Result<double> y = ReadBandwidth(L, -1, at);
    lua_pop(L, 2);
    if (!y.ok()) return y.status();
    points.emplace_back(x, *y);
  }
  policy::BandwidthTable table(std::move(points));
  if (Status s = table.Validate(); !s.ok()) return s.WithContext(where);
  return table;
}

Result<uint32_t> ReadCount(lua_State* L, int idx, const std::string& where, uint32_t min) {
  if (!lua_isinteger(L, idx)) {
    return Status::InvalidArgument(where + ": expected a whole number, got " +
                                   (lua_type(L, idx) == LUA_TNUMBER
                                        ? std::to_string(lua_tonumber(L, idx))
                                        : "a " + std::string(TypeName(L, idx))));
  }
  const lua_Integer v = lua_tointeger(L, idx);
  if (v < static_cast<lua_Integer>(min) || v > std::numeric_limits<int32_t>::max()) {
    return Status::InvalidArgument(where + ": " + std::to_string(v) + " is out of range; write " +
                                   std::to_string(min) + " or more");
  }
  return static_cast<uint32_t>(v);
}

Result<std::string> ReadString(lua_State* L, int idx, const std::string& where) {
  if (lua_type(L, idx) != LUA_TSTRING) {
    return Status::InvalidArgument(where + ": expected a string, got a " +
                                   std::string(TypeName(L, idx)));
  }
  size_t len = 0;
  const char* s = lua_tolstring(L, idx, &len);
  return std::string(s, len);
}

namespace {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string_view Closest(std::string_view word, std::initializer_list<std::string_view> known) {
  std::string_view best;
  size_t best_d = 3;
  for (std::string_view k : known) {
    const size_t d = EditDistance(word, k);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  return best;
}

Status CheckKeys(lua_State* L, int idx, std::initializer_list<std::string_view> known,
                 const std::string& where) {
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    lua_pop(L, 1);  // the value; keep the key for lua_next
    if (lua_type(L, -1) == LUA_TSTRING) {
      std::string_view key = lua_tostring(L, -1);
      if (key.starts_with("__") || std::find(known.begin(), known.end(), key) != known.end())
        continue;
      std::string msg = where + ": unknown field '" + std::string(key) + "'";
      if (std::string_view near = Closest(key, known); !near.empty())
        msg += " (did you mean '" + std::string(near) + "'?)";
      lua_pop(L, 1);
      return Status::InvalidArgument(msg);
    }
    lua_pop(L, 1);
    return Status::InvalidArgument(where + ": unexpected entry; write name = value fields");
  }
  return Status::Ok();
}

}  // namespace nopfs::lua::internal
