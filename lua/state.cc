#include "lua/state.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <sstream>

#include <lua.hpp>

namespace nopfs::lua {
namespace {

constexpr int kHookEvery = 1000;  // instructions between two count-hook calls

LuaState* Self(lua_State* L) {
  return *static_cast<LuaState**>(lua_getextraspace(L));
}

int SafePrint(lua_State* L) {
  const int n = lua_gettop(L);
  std::string line = "lua: ";
  for (int i = 1; i <= n; ++i) {
    if (i > 1) line += '\t';
    size_t len = 0;
    const char* s = luaL_tolstring(L, i, &len);
    line.append(s, len);
    lua_pop(L, 1);
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
  return 0;
}

// Message handler: the error text plus a traceback, unless the error is not a string.
int Traceback(lua_State* L) {
  const char* msg = lua_tostring(L, 1);
  if (msg == nullptr) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

// "[string \"...\"]" and "@path" prefixes are Lua's own; the traceback's frames inside the C
// sandbox ("[C]: in ?") add nothing for an admin, so the message keeps the first line and the
// frames that name a script line.
std::string Tidy(std::string_view raw) {
  std::string out;
  std::istringstream in{std::string(raw)};
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    if (first) {
      out = line;
      first = false;
      continue;
    }
    if (line.find("[C]:") != std::string::npos || line == "stack traceback:") continue;
    std::string_view t = line;
    while (!t.empty() && (t.front() == '\t' || t.front() == ' '))
      t.remove_prefix(1);
    out += "\n  ";
    out += t;
  }
  return out;
}

}  // namespace

LuaState::LuaState(LuaLimits limits) : limits_(limits) {
  L_ = lua_newstate(&LuaState::Alloc, this);
  if (L_ == nullptr) throw std::bad_alloc();
  *static_cast<LuaState**>(lua_getextraspace(L_)) = this;
  OpenSandbox();
  lua_sethook(L_, &LuaState::CountHook, LUA_MASKCOUNT, kHookEvery);
}

LuaState::~LuaState() {
  if (L_ != nullptr) lua_close(L_);
}

void* LuaState::Alloc(void* ud, void* ptr, size_t osize, size_t nsize) {
  auto* self = static_cast<LuaState*>(ud);
  // osize is the block's size only when ptr != nullptr (otherwise it encodes the object type).
  const size_t old = ptr != nullptr ? osize : 0;
  if (nsize == 0) {
    std::free(ptr);
    self->in_use_ -= old;
    return nullptr;
  }
  if (nsize > old && self->in_use_ - old + nsize > self->limits_.memory_bytes) return nullptr;
  void* p = std::realloc(ptr, nsize);
  if (p != nullptr) self->in_use_ = self->in_use_ - old + nsize;
  return p;
}

void LuaState::CountHook(lua_State* L, lua_Debug* /*ar*/) {
  LuaState* self = Self(L);
  self->used_ += kHookEvery;
  if (self->used_ > self->limits_.instructions) {
    luaL_error(L, "instruction budget of %d million exceeded (an endless loop?)",
               static_cast<int>(self->limits_.instructions / 1'000'000));
  }
}

void LuaState::OpenSandbox() {
  static constexpr luaL_Reg kLibs[] = {
      {LUA_GNAME, luaopen_base},        {LUA_TABLIBNAME, luaopen_table},
      {LUA_STRLIBNAME, luaopen_string}, {LUA_MATHLIBNAME, luaopen_math},
      {LUA_UTF8LIBNAME, luaopen_utf8},  {LUA_OSLIBNAME, luaopen_os},
  };
  for (const luaL_Reg& lib : kLibs) {
    luaL_requiref(L_, lib.name, lib.func, 1);
    lua_pop(L_, 1);
  }
  for (const char* name : {"dofile", "loadfile", "load", "require", "collectgarbage"}) {
    lua_pushnil(L_);
    lua_setglobal(L_, name);
  }
  lua_pushcfunction(L_, SafePrint);
  lua_setglobal(L_, "print");
  // string.dump makes bytecode, which nothing here loads; drop it all the same.
  lua_getglobal(L_, LUA_STRLIBNAME);
  lua_pushnil(L_);
  lua_setfield(L_, -2, "dump");
  lua_pop(L_, 1);
  // os: keep only what cannot touch the system.
  lua_getglobal(L_, LUA_OSLIBNAME);
  lua_newtable(L_);
  for (const char* keep : {"getenv", "time", "clock", "date"}) {
    lua_getfield(L_, -2, keep);
    lua_setfield(L_, -2, keep);
  }
  lua_setglobal(L_, LUA_OSLIBNAME);
  lua_pop(L_, 1);
}

Status LuaState::Load(std::string_view code, const std::string& chunkname,
                      std::string_view display) {
  if (luaL_loadbufferx(L_, code.data(), code.size(), chunkname.c_str(), "t") != LUA_OK) {
    std::string msg = lua_tostring(L_, -1) != nullptr ? lua_tostring(L_, -1) : "load error";
    lua_pop(L_, 1);
    if (msg.find("attempt to load a binary chunk") != std::string::npos) {
      return Status::InvalidArgument(std::string(display) +
                                     ": is compiled Lua bytecode; give the Lua source instead");
    }
    return Status::InvalidArgument(msg);
  }
  return Call(0, 0, display);
}

Status LuaState::RunFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::FromErrno(errno, path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::FromErrno(errno, path);
  return Load(text.str(), "@" + path, path);
}

Status LuaState::RunString(std::string_view code, std::string_view name) {
  std::string chunk = "@";  // appended, not "@" + std::string: GCC 12 -O3 -Wrestrict (bug 105329)
  chunk.append(name);
  return Load(code, chunk, name);
}

Status LuaState::Call(int nargs, int nresults, std::string_view what) {
  used_ = 0;
  const int base = lua_gettop(L_) - nargs;  // the function's slot
  lua_pushcfunction(L_, Traceback);
  lua_insert(L_, base);
  const int rc = lua_pcall(L_, nargs, nresults, base);
  lua_remove(L_, base);
  if (rc == LUA_OK) return Status::Ok();
  std::string msg = lua_tostring(L_, -1) != nullptr ? lua_tostring(L_, -1) : "error";
  lua_pop(L_, 1);
  msg = Tidy(msg);
  if (rc == LUA_ERRMEM) {
    return Status::ResourceExhausted(std::string(what) + ": the script used more than " +
                                     std::to_string(limits_.memory_bytes >> 20) + " MiB of memory");
  }
  if (msg.find("instruction budget") != std::string::npos) {
    return Status::ResourceExhausted(msg);
  }
  return Status::InvalidArgument(msg);
}

}  // namespace nopfs::lua
