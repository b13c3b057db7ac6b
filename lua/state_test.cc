#include "lua/state.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <lua.hpp>

namespace nopfs::lua {
namespace {

TEST(LuaStateTest, RunsCodeAndReadsGlobals) {
  LuaState s;
  ASSERT_TRUE(s.RunString("x = 6 * 7; name = string.upper('ram')", "t.lua").ok());
  lua_getglobal(s.get(), "x");
  EXPECT_EQ(lua_tointeger(s.get(), -1), 42);
  lua_getglobal(s.get(), "name");
  EXPECT_STREQ(lua_tostring(s.get(), -1), "RAM");
}

TEST(LuaStateTest, DangerousFunctionsAreAbsent) {
  for (const char* code : {"os.execute('true')", "io.open('/etc/passwd')", "dofile('/etc/passwd')",
                           "loadfile('/etc/passwd')", "load('return 1')", "require('os')",
                           "debug.getinfo(1)", "string.dump(print)", "os.remove('/tmp/x')",
                           "package.loadlib('x', 'y')", "collectgarbage()"}) {
    LuaState s;
    Status st = s.RunString(code, "sandbox.lua");
    EXPECT_FALSE(st.ok()) << code;
    EXPECT_NE(st.message().find("sandbox.lua:1:"), std::string::npos) << st.message();
  }
}

TEST(LuaStateTest, HarmlessOsFunctionsRemain) {
  LuaState s;
  EXPECT_TRUE(
      s.RunString("t = os.time(); c = os.clock(); h = os.getenv('HOME'); d = os.date()", "os.lua")
          .ok());
}

TEST(LuaStateTest, SyntaxErrorNamesFileAndLine) {
  LuaState s;
  Status st = s.RunString("a = 1\nb = = 2\n", "/etc/nopfs/bad.lua");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("/etc/nopfs/bad.lua:2:"), std::string::npos) << st.message();
}

TEST(LuaStateTest, RuntimeErrorNamesLineAndTracesFunctions) {
  LuaState s;
  Status st = s.RunString("local function f()\n  return nil + 1\nend\nf()\n", "rt.lua");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("rt.lua:2:"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rt.lua:4:"), std::string::npos) << st.message();
}

TEST(LuaStateTest, EndlessLoopHitsTheInstructionBudget) {
  LuaState s(LuaLimits{.memory_bytes = size_t{16} << 20, .instructions = 2'000'000});
  Status st = s.RunString("while true do end", "loop.lua");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("instruction budget"), std::string::npos) << st.message();
  EXPECT_GE(s.instructions_used(), 2'000'000u);
  // The state stays usable, with a fresh budget per run.
  EXPECT_TRUE(s.RunString("y = 1", "after.lua").ok());
}

TEST(LuaStateTest, ProtectedCallCannotEscapeTheBudget) {
  LuaState s(LuaLimits{.memory_bytes = size_t{16} << 20, .instructions = 2'000'000});
  Status st =
      s.RunString("for i = 1, 100 do pcall(function() while true do end end) end", "pcall.lua");
  // Each pcall catches one budget error, but the budget is not reset, so the next loop fails at
  // once and the script ends after at most ~100 hook calls.
  EXPECT_LT(s.instructions_used(), 3'000'000u);
  EXPECT_TRUE(st.ok() || st.code() == StatusCode::kResourceExhausted) << st.message();
}

TEST(LuaStateTest, MemoryHogFailsCleanly) {
  LuaState s(LuaLimits{.memory_bytes = size_t{8} << 20, .instructions = 100'000'000});
  Status st =
      s.RunString("local t = {} for i = 1, 1e8 do t[i] = string.rep('x', 100) .. i end", "hog.lua");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_LE(s.memory_in_use(), size_t{8} << 20);
  Status big = s.RunString("s = string.rep('x', 1 << 30)", "big.lua");
  EXPECT_FALSE(big.ok());
}

TEST(LuaStateTest, BinaryChunksAreRefused) {
  // Bytecode is produced by a separate, unsandboxed state: the sandbox has no string.dump.
  lua_State* L = luaL_newstate();
  luaL_openlibs(L);
  ASSERT_EQ(luaL_dostring(L, "bc = string.dump(function() return 1 end)"), LUA_OK);
  lua_getglobal(L, "bc");
  size_t len = 0;
  const char* bc = lua_tolstring(L, -1, &len);
  std::string bytecode(bc, len);
  lua_close(L);

  LuaState s;
  Status st = s.RunString(bytecode, "compiled.luac");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("bytecode"), std::string::npos) << st.message();
}

TEST(LuaStateTest, MissingFileSaysSo) {
  LuaState s;
  Status st = s.RunFile("/nonexistent/nopfs.conf.lua");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("/nonexistent/nopfs.conf.lua"), std::string::npos);
}

TEST(LuaStateTest, RunFileNamesThePath) {
  const std::filesystem::path p =
      std::filesystem::temp_directory_path() / ("nopfs-state-test-" + std::to_string(getpid()));
  { std::ofstream(p) << "x = 1\nerror('boom')\n"; }
  LuaState s;
  Status st = s.RunFile(p.string());
  std::filesystem::remove(p);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(p.string() + ":2: boom"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace nopfs::lua
