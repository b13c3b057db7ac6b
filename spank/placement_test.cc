// Placement marks: their names, the node's features with them, the reconcile's rate limits, and
// contrib/slurm/job_submit.lua computing the same names as root on the node.
#include "spank/placement.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <lua.hpp>
#include <map>
#include <set>
#include <string>

#include "kept/area.h"
#include "kept/record.h"
#include "share/store.h"
#include "spank/ledger.h"

namespace nopfs::spank {
namespace {

namespace fs = std::filesystem;

TEST(PlacementTest, MarkPathIsLexical) {
  EXPECT_EQ(MarkPath("/pfs/ds"), "/pfs/ds");
  EXPECT_EQ(MarkPath("/pfs//ds/./"), "/pfs/ds");
  EXPECT_EQ(MarkPath("/"), "/");
  EXPECT_EQ(MarkPath("/a/b/"), "/a/b");
}

TEST(PlacementTest, MarkDependsOnKeyUserAndDataset) {
  const std::string key = "0123456789abcdef0123456789abcdef";
  const std::string m = PlacementMark(key, 1001, "/pfs/ds");
  EXPECT_TRUE(IsPlacementMark(m)) << m;
  EXPECT_EQ(m, PlacementMark(key, 1001, "/pfs//ds/"));
  EXPECT_NE(m, PlacementMark(key, 1002, "/pfs/ds"));
  EXPECT_NE(m, PlacementMark(key, 1001, "/pfs/ds2"));
  EXPECT_NE(m, PlacementMark(key + "x", 1001, "/pfs/ds"));
  // The first 8 bytes of HMAC-SHA256(key, "nopfs placement v1:1001:/pfs/ds"), as
  // `openssl dgst -sha256 -hmac KEY` prints them.
  EXPECT_EQ(m, "nopfs_21d59b9187e66a77");
  EXPECT_FALSE(IsPlacementMark("nopfs_0123"));
  EXPECT_FALSE(IsPlacementMark("nvme"));
  EXPECT_FALSE(IsPlacementMark("nopfs_0123456789ABCDEF"));
}

// A shared copy's mark is every user's, and no user's own mark.
TEST(PlacementTest, SharedMarkIsEveryUsersAndNoOnesOwn) {
  const std::string key = "0123456789abcdef0123456789abcdef";
  const std::string s = SharedMark(key, "/pfs/ds");
  EXPECT_TRUE(IsPlacementMark(s)) << s;
  EXPECT_EQ(s, SharedMark(key, "/pfs//ds/./"));
  EXPECT_NE(s, SharedMark(key, "/pfs/ds2"));
  EXPECT_NE(s, SharedMark(key + "x", "/pfs/ds"));
  for (uint32_t uid : {0u, 1001u, 4294967295u})
    EXPECT_NE(s, PlacementMark(key, uid, "/pfs/ds"));
  // The first 8 bytes of HMAC-SHA256(key, "nopfs placement v1:shared:/pfs/ds"), as
  // `openssl dgst -sha256 -hmac KEY` prints them.
  EXPECT_EQ(s, "nopfs_70660241596c7d34");
}

TEST(PlacementTest, WithMarksKeepsTheAdminsFeatures) {
  const NodeFeatures cur{"nvme,nopfs_0000000000000001,gpu", "nvme,nopfs_0000000000000001"};
  const NodeFeatures next = WithMarks(cur, {"nopfs_00000000000000ff", "nopfs_0000000000000002"});
  EXPECT_EQ(next.available, "nvme,gpu,nopfs_0000000000000002,nopfs_00000000000000ff");
  EXPECT_EQ(next.active, "nvme,nopfs_0000000000000002,nopfs_00000000000000ff");
  EXPECT_EQ(WithMarks(NodeFeatures{"(null)", "(null)"}, {}), (NodeFeatures{"", ""}));
  EXPECT_EQ(WithMarks(NodeFeatures{"nopfs_0000000000000001", "nopfs_0000000000000001"}, {}),
            (NodeFeatures{"", ""}));
}

// The script slurmctld runs computes the node's names (Lua 5.4 here; Slurm 22.05 runs it in 5.1,
// which the cluster test covers).
TEST(PlacementTest, JobSubmitLuaComputesTheSameMarks) {
  lua_State* L = luaL_newstate();
  luaL_openlibs(L);
  const std::string script = std::string(NOPFS_SOURCE_DIR) + "/contrib/slurm/job_submit.lua";
  ASSERT_EQ(luaL_dofile(L, script.c_str()), LUA_OK) << lua_tostring(L, -1);
  const std::string keys[] = {std::string(32, 'k'), std::string(100, '\x01'), "0123456789abcdef"};
  for (const std::string& key : keys) {
    for (const char* ds : {"/pfs/ds", "/a//b/./c/", "/"}) {
      lua_getglobal(L, "nopfs_placement_mark");
      lua_pushlstring(L, key.data(), key.size());
      lua_pushinteger(L, 1001);
      lua_pushstring(L, ds);
      ASSERT_EQ(lua_pcall(L, 3, 1, 0), LUA_OK) << lua_tostring(L, -1);
      EXPECT_EQ(std::string(lua_tostring(L, -1)), PlacementMark(key, 1001, ds)) << ds;
      lua_pop(L, 1);
      lua_getglobal(L, "nopfs_shared_mark");
      lua_pushlstring(L, key.data(), key.size());
      lua_pushstring(L, ds);
      ASSERT_EQ(lua_pcall(L, 2, 1, 0), LUA_OK) << lua_tostring(L, -1);
      EXPECT_EQ(std::string(lua_tostring(L, -1)), SharedMark(key, ds)) << ds;
      lua_pop(L, 1);
    }
  }
  lua_close(L);
}

// The job_submit hook: prefer by default, require as a constraint, the user's own prefer kept,
// a node list left alone.
TEST(PlacementTest, JobSubmitLuaSetsPreferOrConstraint) {
  const fs::path dir = fs::temp_directory_path() / ("placement_lua_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string key(32, 'z');
  std::ofstream(dir / "key") << key;
  lua_State* L = luaL_newstate();
  luaL_openlibs(L);
  lua_pushstring(L, (dir / "key").c_str());
  lua_setglobal(L, "nopfs_placement_key_file");
  const std::string script = std::string(NOPFS_SOURCE_DIR) + "/contrib/slurm/job_submit.lua";
  ASSERT_EQ(luaL_dofile(L, script.c_str()), LUA_OK) << lua_tostring(L, -1);
  const std::string mark = PlacementMark(key, 1001, "/pfs/ds");
  auto run = [&](const std::string& fields) {
    const std::string code =
        "local j = { user_id = 1001, spank_job_env = { "
        "'_SLURM_SPANK_OPTION_nopfs_nopfs=/pfs/ds' } }\n" +
        fields + "\nlocal what = nopfs_job_submit(j)\n" +
        "return tostring(what) .. ' ' .. tostring(j.prefer) .. ' ' .. "
        "tostring(j.features)";
    EXPECT_EQ(luaL_dostring(L, code.c_str()), LUA_OK) << lua_tostring(L, -1);
    std::string out = lua_tostring(L, -1);
    lua_pop(L, 1);
    return out;
  };
  EXPECT_EQ(run(""), "prefer " + mark + " nil");
  EXPECT_EQ(run("j.prefer = 'fast'"), "prefer (fast)&" + mark + " nil");
  EXPECT_EQ(run("j.features = 'nvme'"), "prefer " + mark + " nvme");
  EXPECT_EQ(run("table.insert(j.spank_job_env, '_SLURM_SPANK_OPTION_nopfs_nopfs_placement="
                "require')"),
            "require nil " + mark);
  EXPECT_EQ(run("table.insert(j.spank_job_env, '_SLURM_SPANK_OPTION_nopfs_nopfs_placement=off')"),
            "off nil nil");
  EXPECT_EQ(run("j.req_nodes = 'n2'"), "nodelist given nil nil");
  EXPECT_EQ(run("j.spank_job_env = {}"), "nil nil nil");
  // A shared dataset: the user's mark or the shared one, on each node of the job.
  const std::string either = mark + "|" + SharedMark(key, "/pfs/ds");
  ASSERT_EQ(luaL_dostring(L, "nopfs_shared_datasets = { '/other', '/pfs//ds/' }"), LUA_OK);
  EXPECT_EQ(run(""), "prefer " + either + " nil");
  EXPECT_EQ(run("j.prefer = 'fast'"), "prefer (fast)&(" + either + ") nil");
  EXPECT_EQ(run("table.insert(j.spank_job_env, '_SLURM_SPANK_OPTION_nopfs_nopfs_placement="
                "require'); j.features = 'nvme'"),
            "require nil (nvme)&(" + either + ")");
  ASSERT_EQ(luaL_dostring(L, "nopfs_shared_datasets = { '/pfs/ds/sub', 'pfs/ds', 7 }"), LUA_OK);
  EXPECT_EQ(run(""), "prefer " + mark + " nil");
  ASSERT_EQ(luaL_dostring(L, "nopfs_shared_datasets = nil"), LUA_OK);
  // The note in the AdminComment that the prolog reads: after the admin's own, only when the
  // script asked.
  auto note = [&](const std::string& fields) {
    const std::string code =
        "local j = { user_id = 1001, spank_job_env = { "
        "'_SLURM_SPANK_OPTION_nopfs_nopfs=/pfs/ds' } }\n" +
        fields + "\nnopfs_job_submit(j)\nreturn tostring(j.admin_comment)";
    EXPECT_EQ(luaL_dostring(L, code.c_str()), LUA_OK) << lua_tostring(L, -1);
    std::string out = lua_tostring(L, -1);
    lua_pop(L, 1);
    return out;
  };
  EXPECT_EQ(note(""), "nopfs_placement=prefer");
  EXPECT_EQ(note("j.admin_comment = 'audit'"), "audit,nopfs_placement=prefer");
  EXPECT_EQ(note("table.insert(j.spank_job_env, '_SLURM_SPANK_OPTION_nopfs_nopfs_placement="
                 "require')"),
            "nopfs_placement=require");
  EXPECT_EQ(note("j.req_nodes = 'n2'"), "nil");
  EXPECT_EQ(note("table.insert(j.spank_job_env, '_SLURM_SPANK_OPTION_nopfs_nopfs_placement=off')"),
            "nil");
  EXPECT_NE(std::string("nopfs_placement=prefer").find(kPlacementAsked), std::string::npos);

  // `nopfs where`'s test job: the user's own mark, to that user; the job is left as it is. Any
  // other job gets no message.
  auto where = [&](const std::string& fields) {
    const std::string code =
        "local said = {}\nslurm = { user_msg = function(m) said[#said + 1] = m end }\n"
        "local j = { user_id = 1001 }\n" +
        fields +
        "\nlocal what = nopfs_where(j)\n"
        "return tostring(what) .. ' ' .. tostring(j.prefer) .. ' ' .. table.concat(said, '|')";
    EXPECT_EQ(luaL_dostring(L, code.c_str()), LUA_OK) << lua_tostring(L, -1);
    std::string out = lua_tostring(L, -1);
    lua_pop(L, 1);
    return out;
  };
  EXPECT_EQ(where("j.comment = 'nopfs where:/pfs//ds/'"), "where nil nopfs where: mark " + mark);
  EXPECT_EQ(where("j.comment = 'nopfs where:/pfs/ds'; j.user_id = 1002"),
            "where nil nopfs where: mark " + PlacementMark(key, 1002, "/pfs/ds"));
  EXPECT_EQ(where("j.comment = 'nopfs where:/pfs/ds'; j.prefer = 'fast'"),
            "where fast nopfs where: mark " + mark);
  EXPECT_EQ(where("j.comment = 'nopfs where:ds'"),
            "where nil nopfs where: error: the dataset is not an absolute path");
  // A shared dataset: the shared copy's mark too, which names no user (the same for 1002).
  ASSERT_EQ(luaL_dostring(L, "nopfs_shared_datasets = { '/pfs/ds' }"), LUA_OK);
  EXPECT_EQ(where("j.comment = 'nopfs where:/pfs//ds/'"),
            "where nil nopfs where: mark " + mark + "; shared " + SharedMark(key, "/pfs/ds"));
  EXPECT_EQ(where("j.comment = 'nopfs where:/pfs/ds'; j.user_id = 1002"),
            "where nil nopfs where: mark " + PlacementMark(key, 1002, "/pfs/ds") + "; shared " +
                SharedMark(key, "/pfs/ds"));
  EXPECT_EQ(where("j.comment = 'nopfs where:/pfs/other'"),
            "where nil nopfs where: mark " + PlacementMark(key, 1001, "/pfs/other"));
  ASSERT_EQ(luaL_dostring(L, "nopfs_shared_datasets = nil"), LUA_OK);
  EXPECT_EQ(where("j.comment = 'training run'"), "nil nil ");
  EXPECT_EQ(where(""), "nil nil ");
  lua_pushstring(L, (dir / "absent").c_str());
  lua_setglobal(L, "nopfs_placement_key_file");
  // The key is read again a minute later at most: a minute on, it is gone.
  EXPECT_EQ(luaL_dostring(L, "local t = os.time() + 61; os.time = function() return t end"),
            LUA_OK);
  EXPECT_EQ(where("j.comment = 'nopfs where:/pfs/ds'"),
            "where nil nopfs where: error: slurmctld's host has no placement key at " +
                (dir / "absent").string());
  lua_close(L);
  fs::remove_all(dir);
}

// The reconcile against a fake slurmctld: the marks of the kept area, only nopfs's features
// changed, one line per change and per new failure, the rate limits.
TEST(PlacementTest, ReconcileAddsRemovesAndRateLimits) {
  if (geteuid() != 0) GTEST_SKIP() << "the placement key must be root's";
  const fs::path dir = fs::temp_directory_path() / ("placement_rec_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "node");
  fs::create_directories(dir / "ssd");
  const std::string key_path = (dir / "key").string();
  {
    std::ofstream(key_path) << std::string(32, 'q');
    ::chmod(key_path.c_str(), 0600);
  }
  NodeFeatures slurm{"nvme", "nvme"};
  int loads = 0, updates = 0;
  Status refuse = Status::Ok();
  PlacementRun run;
  run.node = "n2";
  run.node_dir = (dir / "node").string();
  run.key_path = key_path;
  run.ssd_paths = {(dir / "ssd").string()};
  run.now = 1000;
  run.load = [&](const std::string&) -> Result<NodeFeatures> {
    ++loads;
    if (!refuse.ok()) return refuse;
    return slurm;
  };
  run.update = [&](const std::string&, const NodeFeatures& f) {
    ++updates;
    slurm = f;
    return Status::Ok();
  };
  // No kept copies: slurmctld is asked once, nothing changes, no line.
  EXPECT_EQ(ReconcilePlacement(run), "");
  EXPECT_EQ(loads, 1);
  EXPECT_EQ(updates, 0);
  // Within a minute and with the same marks: slurmctld is not asked.
  run.now = 1030;
  EXPECT_EQ(ReconcilePlacement(run), "");
  EXPECT_EQ(loads, 1);
  // slurmctld forgot the marks (a restart): a minute later they are put back.
  run.now = 1061;
  slurm = NodeFeatures{"nvme,nopfs_00000000000000aa", "nvme,nopfs_00000000000000aa"};
  EXPECT_EQ(ReconcilePlacement(run), "placement: n2: marks 0 kept copies (0 added, 1 removed)");
  EXPECT_EQ(slurm, (NodeFeatures{"nvme", "nvme"}));
  // slurmctld refuses: one line, then silence while it keeps refusing, retried after 30 s.
  refuse = Status::Unavailable("Access/permission denied");
  run.force = true;
  const std::string line = ReconcilePlacement(run);
  EXPECT_NE(line.find("the node's marks are not in Slurm: Access/permission denied"),
            std::string::npos)
      << line;
  run.force = false;
  const int before = loads;
  run.now = 1070;
  EXPECT_EQ(ReconcilePlacement(run), "");
  EXPECT_EQ(loads, before);
  run.now = 1100;
  EXPECT_EQ(ReconcilePlacement(run), "");
  EXPECT_EQ(loads, before + 1);
  // A run for a job (the prolog's, the epilog's) records a failure without a line; the timer's
  // next run, after the retry period, says it.
  refuse = Status::Unavailable("Unable to contact slurm controller");
  run.report_failures = false;
  run.force = true;
  EXPECT_EQ(ReconcilePlacement(run), "");
  run.report_failures = true;
  run.force = false;
  run.now = 1110;
  EXPECT_EQ(ReconcilePlacement(run), "");
  run.now = 1131;
  EXPECT_NE(ReconcilePlacement(run).find("Unable to contact slurm controller"), std::string::npos);
  refuse = Status::Ok();
  run.now = 1162;
  EXPECT_EQ(ReconcilePlacement(run),
            "placement: n2: marks 0 kept copies (0 added, 0 removed); Slurm takes the node's "
            "marks again");
  fs::remove_all(dir);
}

// A copy past its user's lifetime, by root's record of its last use as gc reads it, has no mark
// (the admin's listing still shows it, as expired); a copy root has no record of, or a user
// without a lifetime, keeps its mark. The reconcile takes an expired copy's mark away at once.
TEST(PlacementTest, AnExpiredCopyIsNotMarked) {
  if (geteuid() != 0) GTEST_SKIP() << "root's record and the placement key must be root's";
  const fs::path dir = fs::temp_directory_path() / ("placement_exp_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "node");
  const std::string ssd = (dir / "ssd").string();
  const std::string kept = ssd + "/nopfs-0/kept";
  const std::string kA = "000000000000000a", kB = "000000000000000b";
  for (const std::string& k : {kA, kB}) {
    fs::create_directories(kept + "/" + k);
    std::ofstream(kept + "/" + k + "/data.0") << "xxxx";
    kept::KeptManifest m;
    m.key = k;
    m.dataset = "/pfs/" + k;
    m.created = 900;
    m.last_used = 5000;  // the MANIFEST's time, the user's to write, is not the one that counts
    m.samples = 1;
    ASSERT_TRUE(
        kept::WriteFileDurably(kept + "/" + k, "MANIFEST", kept::EncodeKeptManifest(m)).ok());
  }
  fs::create_directories(ssd + "/" + kept::kRootRecordDir);
  ::chmod((ssd + "/" + kept::kRootRecordDir).c_str(), 0700);
  std::map<kept::RootRecord::Key, kept::RootTimes> times;
  times[{0, kA}] = kept::RootTimes{900, 1000};  // kB: root has not seen it yet
  std::ofstream(ssd + "/" + kept::kRootRecordDir + "/kept") << kept::FormatRootRecord(times);
  const std::string key(32, 'k');
  const std::string markA = PlacementMark(key, 0, "/pfs/" + kA);
  const std::string markB = PlacementMark(key, 0, "/pfs/" + kB);
  auto life = [](int64_t seconds) { return [seconds](uint32_t) { return seconds; }; };
  // Within the lifetime, and without one: both marked.
  EXPECT_EQ(MarksOfNode(key, {ssd}, life(100), 1100).marks, (std::set<std::string>{markA, markB}));
  EXPECT_EQ(MarksOfNode(key, {ssd}, life(0), 99999).marks, (std::set<std::string>{markA, markB}));
  EXPECT_EQ(MarksOfNode(key, {ssd}, nullptr, 99999).marks, (std::set<std::string>{markA, markB}));
  // Past it: kB alone, whose last use root has no record of.
  const NodeMarks late = MarksOfNode(key, {ssd}, life(100), 1101);
  EXPECT_EQ(late.marks, (std::set<std::string>{markB}));
  EXPECT_EQ(late.copies, 1u);
  ASSERT_EQ(late.copies_held.size(), 2u);
  for (const NodeMarks::Copy& c : late.copies_held)
    EXPECT_EQ(c.expired, c.mark == markA) << c.dataset;

  // The reconcile, verified a moment ago, takes the mark away when the copy expires.
  const std::string key_path = (dir / "key").string();
  {
    std::ofstream(key_path) << key;
    ::chmod(key_path.c_str(), 0600);
  }
  NodeFeatures slurm{"nvme", "nvme"};
  PlacementRun run;
  run.node = "n2";
  run.node_dir = (dir / "node").string();
  run.key_path = key_path;
  run.ssd_paths = {ssd};
  run.lifetime = life(100);
  run.load = [&](const std::string&) -> Result<NodeFeatures> { return slurm; };
  run.update = [&](const std::string&, const NodeFeatures& f) {
    slurm = f;
    return Status::Ok();
  };
  run.now = 1090;
  EXPECT_EQ(ReconcilePlacement(run), "placement: n2: marks 2 kept copies (2 added, 0 removed)");
  run.now = 1101;
  EXPECT_EQ(ReconcilePlacement(run), "placement: n2: marks 1 kept copy (0 added, 1 removed)");
  EXPECT_EQ(slurm.active, "nvme," + markB);
  fs::remove_all(dir);
}

// A shared copy marks the node, for every user, once it holds half of its quota; a running job
// whose tiers serve a sibling marks the node with its user's mark while its process lives.
TEST(PlacementTest, SharedCopiesAndRunningJobsMarkTheNode) {
  if (geteuid() != 0) GTEST_SKIP() << "the share store and the ledger are root's";
  const fs::path dir = fs::temp_directory_path() / ("placement_more_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "pfs/ds");
  fs::create_directories(dir / "ssd");
  for (int i = 0; i < 4; ++i)
    std::ofstream(dir / "pfs/ds" / ("f" + std::to_string(i))) << std::string(1000, 'a' + i);
  const std::string key(32, 'k');
  const std::string root = (dir / "pfs/ds").string(), store = (dir / "store").string();
  const std::vector<SharedDataset> shared = {{root, store, 4000}};
  // No copy yet (the store was never made): no mark, no error.
  NodeMarks m = MarksOfNode(key, {(dir / "ssd").string()}, nullptr, 0, shared);
  EXPECT_TRUE(m.marks.empty());
  EXPECT_TRUE(m.errors.empty());
  {
    Result<std::unique_ptr<share::Store>> s =
        share::Store::Open(share::StoreOptions{root, store, 4000});
    ASSERT_TRUE(s.ok()) << s.status().message();
    auto serve = [&](const std::string& rel) {
      struct stat st {};
      ASSERT_EQ(::stat((dir / "pfs/ds" / rel).c_str(), &st), 0);
      EXPECT_EQ((*s)->Serve(rel, share::IdOf(st), false).outcome, share::Outcome::kReady);
      ASSERT_TRUE((*s)->Save().ok());
    };
    serve("f0");
    m = MarksOfNode(key, {(dir / "ssd").string()}, nullptr, 0, shared);
    ASSERT_EQ(m.shared_held.size(), 1u);
    EXPECT_EQ(m.shared_held[0].bytes, 1000u);
    EXPECT_EQ(m.shared_held[0].files, 1u);
    EXPECT_FALSE(m.shared_held[0].warm);  // a quarter of the quota
    EXPECT_TRUE(m.marks.empty());
    serve("f1");
    m = MarksOfNode(key, {(dir / "ssd").string()}, nullptr, 0, shared);
    ASSERT_EQ(m.shared_held.size(), 1u);
    EXPECT_TRUE(m.shared_held[0].warm);  // half
    EXPECT_EQ(m.marks, std::set<std::string>{SharedMark(key, root)});
    EXPECT_EQ(m.shared_marks.size(), 1u);
    // With a cache, a manifest is read again only when it was replaced.
    ManifestCache cache;
    m = MarksOfNode(key, {}, nullptr, 0, shared, {}, &cache);
    ASSERT_EQ(cache.count(store), 1u);
    EXPECT_EQ(cache[store].bytes, 2000u);
    EXPECT_EQ(cache[store].files, 2u);
    cache[store].bytes = 10;  // what an earlier read said of this very manifest
    m = MarksOfNode(key, {}, nullptr, 0, shared, {}, &cache);
    EXPECT_TRUE(m.marks.empty());
    serve("f2");  // a new manifest
    m = MarksOfNode(key, {}, nullptr, 0, shared, {}, &cache);
    EXPECT_EQ(cache[store].bytes, 3000u);
    EXPECT_EQ(m.marks, std::set<std::string>{SharedMark(key, root)});
    EXPECT_TRUE(MarksOfNode(key, {}, nullptr, 0, {}, {}, &cache).marks.empty());
    EXPECT_TRUE(cache.empty());  // only the datasets still declared
  }
  // A manifest that does not check counts nothing and says so.
  {
    std::fstream f(store + "/MANIFEST", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  m = MarksOfNode(key, {(dir / "ssd").string()}, nullptr, 0, shared);
  EXPECT_TRUE(m.marks.empty());
  ASSERT_EQ(m.errors.size(), 1u);
  EXPECT_NE(m.errors[0].find("does not check"), std::string::npos) << m.errors[0];

  // Running jobs: the ledger's entries with a sibling dataset whose process lives in this boot.
  const std::string ledger_dir = (dir / "ledger").string();
  Result<std::vector<RunningJob>> none = RunningJobs(ledger_dir);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_FALSE(fs::exists(ledger_dir));  // not made by a reader
  {
    Result<Ledger> l = Ledger::Lock(ledger_dir, std::chrono::seconds(5));
    ASSERT_TRUE(l.ok()) << l.status().message();
    LedgerEntry live;
    live.job_id = 7;
    live.uid = 1001;
    live.boot_id = BootId();
    live.pid = ::getpid();
    live.start_time = ProcessStartTime(::getpid()).value_or(0);
    live.sibling_dataset = "/pfs/ds";
    ASSERT_TRUE(l->Put(live).ok());
    LedgerEntry alone = live;  // --nopfs-share-running=no, or no tiers
    alone.job_id = 8;
    alone.uid = 1002;
    alone.sibling_dataset.clear();
    ASSERT_TRUE(l->Put(alone).ok());
    LedgerEntry dead = live;  // its epilog did not finish
    dead.job_id = 9;
    dead.uid = 1003;
    dead.start_time += 1;
    ASSERT_TRUE(l->Put(dead).ok());
    LedgerEntry old = live;  // an earlier boot
    old.job_id = 10;
    old.uid = 1004;
    old.boot_id = "another-boot";
    ASSERT_TRUE(l->Put(old).ok());
  }
  Result<std::vector<RunningJob>> running = RunningJobs(ledger_dir);
  ASSERT_TRUE(running.ok()) << running.status().message();
  ASSERT_EQ(running->size(), 1u);
  EXPECT_EQ((*running)[0].job_id, 7u);
  EXPECT_EQ((*running)[0].uid, 1001u);
  m = MarksOfNode(key, {(dir / "ssd").string()}, nullptr, 0, {}, *running);
  EXPECT_EQ(m.marks, std::set<std::string>{PlacementMark(key, 1001, "/pfs/ds")});
  EXPECT_EQ(m.running_marks.size(), 1u);
  ASSERT_EQ(m.running_held.size(), 1u);
  EXPECT_EQ(m.running_held[0].job_id, 7u);

  // The reconcile carries both, says what it marks, and drops the running job's mark with it.
  fs::create_directories(dir / "node");
  {
    std::ofstream(dir / "key") << key;
    ::chmod((dir / "key").c_str(), 0600);
  }
  fs::remove_all(store);
  {
    Result<std::unique_ptr<share::Store>> s =
        share::Store::Open(share::StoreOptions{root, store, 4000});
    ASSERT_TRUE(s.ok()) << s.status().message();
    for (const char* rel : {"f0", "f1", "f2"}) {
      struct stat st {};
      ASSERT_EQ(::stat((dir / "pfs/ds" / rel).c_str(), &st), 0);
      EXPECT_EQ((*s)->Serve(rel, share::IdOf(st), false).outcome, share::Outcome::kReady);
    }
    ASSERT_TRUE((*s)->Save().ok());
  }
  NodeFeatures slurm{"nvme", "nvme"};
  PlacementRun run;
  run.node = "n2";
  run.node_dir = (dir / "node").string();
  run.key_path = (dir / "key").string();
  run.ssd_paths = {(dir / "ssd").string()};
  run.shared = shared;
  run.ledger_dir = ledger_dir;
  run.now = 1000;
  run.load = [&](const std::string&) -> Result<NodeFeatures> { return slurm; };
  run.update = [&](const std::string&, const NodeFeatures& f) {
    slurm = f;
    return Status::Ok();
  };
  EXPECT_EQ(ReconcilePlacement(run),
            "placement: n2: marks 0 kept copies, 1 shared copy, 1 running job (2 added, 0 "
            "removed)");
  const std::set<std::string> both = {SharedMark(key, root), PlacementMark(key, 1001, "/pfs/ds")};
  EXPECT_EQ(slurm, WithMarks(NodeFeatures{"nvme", "nvme"}, both));
  {
    std::ifstream f(dir / "node" / ".placement");
    const std::string state((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(state.find(" 3 3000 " + store + "\n"), std::string::npos) << state;
  }
  {
    Result<Ledger> l = Ledger::Lock(ledger_dir, std::chrono::seconds(5));
    ASSERT_TRUE(l.ok());
    ASSERT_TRUE(l->Remove(7).ok());  // the job's epilog
  }
  run.now = 1001;
  EXPECT_EQ(ReconcilePlacement(run),
            "placement: n2: marks 0 kept copies, 1 shared copy (0 added, 1 removed)");
  EXPECT_EQ(slurm, WithMarks(NodeFeatures{"nvme", "nvme"}, {SharedMark(key, root)}));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace nopfs::spank
