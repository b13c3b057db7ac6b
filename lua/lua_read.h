// Helpers that read typed values out of Lua tables with messages naming where the value was
// (internal to lua/).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include <lua.hpp>

#include "common/status.h"
#include "policy/model.h"

namespace nopfs::lua::internal {

std::string_view TypeName(lua_State* L, int idx);

// The value at idx as a size: a number of MiB (16384, 0.5: as a bare number in a string and
// Slurm's --mem) or a string in the units of common/units.h ("20G", "512M", "110K").
// With percent_of != 0, "12.5%" means that share of percent_of.
Result<uint64_t> ReadSize(lua_State* L, int idx, const std::string& where, uint64_t percent_of = 0);
// A size as Lua sees it: a number of MiB, an integer when whole (what ReadSize reads back).
void PushSize(lua_State* L, uint64_t bytes);
// A bandwidth: a number (MiB/s) or a string ("1.5G/s", units of common/units.h).
Result<double> ReadBandwidth(lua_State* L, int idx, const std::string& where);
// A bandwidth table: one bandwidth (flat), or a list of {x, bandwidth} pairs.
Result<policy::BandwidthTable> ReadTable(lua_State* L, int idx, const std::string& where);
// A positive integer below 2^31.
Result<uint32_t> ReadCount(lua_State* L, int idx, const std::string& where, uint32_t min);
Result<std::string> ReadString(lua_State* L, int idx, const std::string& where);

// InvalidArgument naming the first key of the table at idx that is not in `known` (skipping
// keys that start with "__"), with a suggestion when one is close.
Status CheckKeys(lua_State* L, int idx, std::initializer_list<std::string_view> known,
                 const std::string& where);
// The entry of `known` closest to `word` (edit distance <= 2), or "".
std::string_view Closest(std::string_view word, std::initializer_list<std::string_view> known);

}  // namespace nopfs::lua::internal
