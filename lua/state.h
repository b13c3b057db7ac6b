// LuaState: one sandboxed Lua 5.4 interpreter, for the admin's config and policy scripts.
//
// What the sandbox promises:
//  - memory: every allocation goes through a capped allocator; past the cap Lua raises "not
//    enough memory" and the script fails, the process does not;
//  - time: a count hook charges every 1000 VM instructions against a budget that each Run/Call
//    starts afresh; past it the script fails with "instruction budget ... exceeded";
//  - reach: only the base (minus dofile, loadfile, load, require, collectgarbage), string (minus
//    string.dump), table, math and utf8 libraries, and an `os` table holding only getenv, time,
//    clock and date. No io, no debug, no package, no os.execute, no binary chunks. `print` writes
//    to stderr with a "lua: " prefix, for admins debugging a script.
//  - errors name the chunk ("@/etc/nopfs/nopfs.conf.lua" is shown as that path) and line.
//
// Thread safety: none; one thread uses a state at a time. Copying is deleted (owns a lua_State).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

struct lua_State;
struct lua_Debug;

namespace nopfs::lua {

struct LuaLimits {
  size_t memory_bytes = size_t{64} << 20;  // bytes the script may hold at once
  uint64_t instructions = 200'000'000;     // VM instructions per Run/Call (about 1 s)
};

class LuaState {
 public:
  // Throws std::bad_alloc only if the interpreter itself cannot be created.
  explicit LuaState(LuaLimits limits = {});
  ~LuaState();
  LuaState(const LuaState&) = delete;
  LuaState& operator=(const LuaState&) = delete;

  lua_State* get() const { return L_; }

  // Loads and runs a text chunk from `path`; errors read "<path>:<line>: <what>".
  Status RunFile(const std::string& path);
  // Loads and runs `code`, named `name` in errors.
  Status RunString(std::string_view code, std::string_view name);
  // Calls the function under `nargs` arguments on the stack (lua_pcall with a traceback handler),
  // leaving `nresults` results. On error the stack is as before the function was pushed, and the
  // message says which hook (`what`) failed and where.
  Status Call(int nargs, int nresults, std::string_view what);

  uint64_t instructions_used() const { return used_; }
  size_t memory_in_use() const { return in_use_; }

 private:
  static void* Alloc(void* ud, void* ptr, size_t osize, size_t nsize);
  static void CountHook(lua_State* L, lua_Debug* ar);
  void OpenSandbox();
  Status Load(std::string_view code, const std::string& chunkname, std::string_view display);

  LuaLimits limits_;
  size_t in_use_ = 0;
  uint64_t used_ = 0;
  lua_State* L_ = nullptr;
};

}  // namespace nopfs::lua
