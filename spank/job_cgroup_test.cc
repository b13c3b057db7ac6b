// The job's cgroup against the real cgroup v1 hierarchy of this machine, a real cgroup v2
// hierarchy mounted for the test in a private mount namespace, and a directory tree laid out as
// Slurm 22.05 lays out v2 with every controller (root only; skipped otherwise): the layout
// slurmd makes for a job and its extern step, made here by hand.
#include "spank/job_cgroup.h"

#include <sched.h>
#include <sys/mount.h>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "launch/process.h"

namespace nopfs::spank {
namespace {

using namespace std::chrono_literals;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uint64_t StartTicks(pid_t pid) {
  const std::string text = Read("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string f;
  for (int i = 3; i <= 22 && rest >> f; ++i)
    if (i == 22) return std::stoull(f);
  return 0;
}

class JobCgroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    struct stat st {};
    if (::geteuid() != 0 || ::stat("/sys/fs/cgroup/memory/cgroup.procs", &st) != 0) {
      GTEST_SKIP() << "needs root and the cgroup v1 memory controller";
    }
    opts_.node = "nopfstest" + std::to_string(::getpid());
    opts_.controllers = {"memory", "cpuset"};
    for (const char* c : {"memory", "cpuset", "freezer"}) {
      std::string d = std::string("/sys/fs/cgroup/") + c;
      if (::stat(d.c_str(), &st) == 0) tops_.push_back(d + "/slurm_" + opts_.node);
    }
    child_ = ::fork();
    if (child_ == 0) {
      ::pause();
      _exit(0);
    }
  }
  void TearDown() override {
    if (child_ > 0) {
      ::kill(child_, SIGKILL);
      ::waitpid(child_, nullptr, 0);
    }
    for (const std::string& t : tops_) {
      for (const char* d : {"/uid_4242/job_77/step_extern", "/uid_4242/job_77", "/uid_4242", ""})
        ::rmdir((t + d).c_str());
    }
  }
  // Makes the extern step's directories for every controller, or for those whose top `only`
  // contains (slurmd makes them one controller after another).
  void MakeExternStep(const std::string& only = "") {
    for (const std::string& t : tops_) {
      if (t.find(only) == std::string::npos) continue;
      std::string p = t;
      for (const char* d : {"", "/uid_4242", "/uid_4242/job_77", "/uid_4242/job_77/step_extern"}) {
        ASSERT_TRUE(::mkdir((t + d).c_str(), 0755) == 0 || errno == EEXIST) << t + d;
        if (t.find("/cpuset/") != std::string::npos) {
          // A cpuset cgroup takes tasks only once it has cpus and mems (slurmd writes them).
          const std::string parent = std::string(t + d).substr(0, std::string(t + d).rfind('/'));
          for (const char* f : {"cpuset.cpus", "cpuset.mems"}) {
            std::ofstream(t + d + "/" + f) << Read(parent + "/" + f);
          }
        }
      }
    }
  }
  std::string CgroupOf(const std::string& controller) {
    std::istringstream in(Read("/proc/" + std::to_string(child_) + "/cgroup"));
    std::string line;
    while (std::getline(in, line)) {
      const size_t a = line.find(':'), b = line.find(':', a + 1);
      if (line.substr(a + 1, b - a - 1) == controller) return line.substr(b + 1);
    }
    return "";
  }
  // Polls until every one of `controllers` puts the child in `want`, for up to 5 s, and returns
  // what the first one that differs says (or `want`). The adopter writes one controller's
  // cgroup.procs after another and retries a cpuset that is not ready yet 50 ms later, so one
  // controller can be there well before the next.
  std::string WaitForCgroups(const std::vector<std::string>& controllers, const std::string& want) {
    std::string got;
    for (int i = 0; i < 100; ++i) {
      got = want;
      for (const std::string& c : controllers) {
        if (CgroupOf(c) != want) {
          got = c + ":" + CgroupOf(c);
          break;
        }
      }
      if (got == want) break;
      std::this_thread::sleep_for(50ms);
    }
    return got;
  }

  JobCgroupOptions opts_;
  std::vector<std::string> tops_;
  pid_t child_ = -1;
};

std::string JobLevel(const std::string& node) {
  return "/slurm_" + node + "/uid_4242/job_77";
}

// A child that sleeps, started as nopfs-job starts nopfsd: joining `procs` before exec.
launch::Child SpawnInto(int procs) {
  launch::Child::Options o;
  o.cgroup_fds = {procs};
  Result<launch::Child> c = launch::Child::Spawn({"/bin/sleep", "30"}, o);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(*c) : launch::Child();
}

std::string CgroupLine(pid_t pid, const std::string& controller) {
  std::istringstream in(Read("/proc/" + std::to_string(pid) + "/cgroup"));
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (line.substr(a + 1, b - a - 1) == controller) return line.substr(b + 1);
  }
  return "";
}

TEST_F(JobCgroupTest, NopfsdStartsInTheJobsMemoryCgroupWithTheJobsLimit) {
  ASSERT_EQ(DetectCgroupVersion("/sys/fs/cgroup"), CgroupVersion::kV1);
  Result<JobCgroup> cg = PrepareJobCgroup(opts_, 77, 4242, 300ull << 20);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  EXPECT_EQ(cg->version, CgroupVersion::kV1);
  EXPECT_EQ(cg->dir, "/sys/fs/cgroup/memory" + JobLevel(opts_.node));
  EXPECT_EQ(std::stoull(Read(cg->dir + "/memory.limit_in_bytes")), 300ull << 20);
  EXPECT_NE(cg->note.find("memory limit"), std::string::npos) << cg->note;
  launch::Child child = SpawnInto(cg->procs.get());
  // In the job's memory cgroup from before exec: every byte it allocates is the job's.
  EXPECT_EQ(CgroupLine(child.pid(), "memory"), JobLevel(opts_.node));
  EXPECT_EQ(FindJobCgroups(opts_, 77, 4242, false).front(), cg->dir);
  // While it lives the directory stays (slurmd's rmdir fails the same way).
  EXPECT_EQ(RemoveJobCgroup(opts_, 77, 4242), "");
  EXPECT_TRUE(::access(cg->dir.c_str(), F_OK) == 0);
  child.Signal(SIGKILL);
  (void)child.Wait();
  // Gone with the user's directory, once empty; the top stays, as slurmd leaves it.
  for (int i = 0; i < 50 && ::access(cg->dir.c_str(), F_OK) == 0; ++i) {
    EXPECT_EQ(RemoveJobCgroup(opts_, 77, 4242), "");
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_NE(::access(cg->dir.c_str(), F_OK), 0);
  EXPECT_NE(::access(("/sys/fs/cgroup/memory/slurm_" + opts_.node + "/uid_4242").c_str(), F_OK), 0);
  EXPECT_EQ(::access(("/sys/fs/cgroup/memory/slurm_" + opts_.node).c_str(), F_OK), 0);
}

TEST_F(JobCgroupTest, FindsTheJobAndItsExternStep) {
  EXPECT_TRUE(FindJobCgroups(opts_, 77, 4242, true).empty());
  MakeExternStep();
  const std::vector<std::string> steps = FindJobCgroups(opts_, 77, 4242, true);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps[0], "/sys/fs/cgroup/memory" + JobLevel(opts_.node) + "/step_extern");
  const std::vector<std::string> jobs = FindJobCgroups(opts_, 77, 4242, false);
  ASSERT_EQ(jobs.size(), steps.size());
  ASSERT_TRUE(AdoptInto(jobs, child_).ok());
  EXPECT_EQ(CgroupOf("memory"), JobLevel(opts_.node));
  ASSERT_TRUE(AdoptInto({"/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpuset"}, child_).ok());
  EXPECT_FALSE(AdoptInto({"/sys/fs/cgroup/memory/no-such-cgroup"}, child_).ok());
}

TEST_F(JobCgroupTest, AdoptLaterWaitsForTheExternStepAndAdoptsIntoTheJobNeverTheFreezer) {
  ASSERT_TRUE(AdoptLater(opts_, 77, 4242, child_, StartTicks(child_), 10s));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(CgroupOf("memory").find("job_77"), std::string::npos);
  MakeExternStep();
  std::vector<std::string> controllers = {"memory"};
  struct stat st {};
  if (::stat("/sys/fs/cgroup/cpuset", &st) == 0) controllers.push_back("cpuset");
  const std::string want = JobLevel(opts_.node);
  EXPECT_EQ(WaitForCgroups(controllers, want), want);
  // Not in the freezer's extern step, which slurmstepd SIGKILLs at the job's end.
  EXPECT_EQ(CgroupOf("freezer").find("job_77"), std::string::npos) << CgroupOf("freezer");
  ASSERT_TRUE(AdoptInto({"/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpuset"}, child_).ok());
}

TEST_F(JobCgroupTest, AdoptLaterWaitsForTheMemoryCgroupEvenWhenOthersAreThereFirst) {
  if (tops_.size() < 3) GTEST_SKIP() << "needs the memory, cpuset and freezer controllers";
  ASSERT_TRUE(AdoptLater(opts_, 77, 4242, child_, StartTicks(child_), 10s));
  // slurmd's order: proctrack/cgroup's freezer, then task/cgroup's cpuset, then memory.
  MakeExternStep("/freezer/");
  MakeExternStep("/cpuset/");
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(CgroupOf("memory").find("job_77"), std::string::npos);
  MakeExternStep("/memory/");
  const std::string want = JobLevel(opts_.node);
  EXPECT_EQ(WaitForCgroups({"memory", "cpuset"}, want), want);
  ASSERT_TRUE(AdoptInto({"/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpuset"}, child_).ok());
}

TEST_F(JobCgroupTest, AdoptLaterNeverMovesARecycledPid) {
  // The start time does not match: the pid is taken to belong to another process now.
  ASSERT_TRUE(AdoptLater(opts_, 77, 4242, child_, StartTicks(child_) + 1, 10s));
  MakeExternStep();
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(CgroupOf("memory").find("job_77"), std::string::npos) << CgroupOf("memory");
}

// Slurm 22.05's v2 layout as a plain directory tree, every controller enabled for the jobs:
// what the kernel would show in a new directory (its control files) is made beside it by hand.
class JobCgroupV2TreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nopfs-cgv2-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    opts_.root = root_;
    opts_.node = "n1";
    scope_ = root_ + "/system.slice/n1_slurmstepd.scope";
    std::ofstream(root_ + "/cgroup.controllers") << "cpuset cpu io memory pids\n";
    ASSERT_EQ(std::system(("mkdir -p " + scope_ + "/job_77/nopfs").c_str()), 0);
    std::ofstream(scope_ + "/cgroup.subtree_control") << "cpuset cpu memory pids\n";
    for (const char* f : {"cgroup.subtree_control", "memory.max"})
      std::ofstream(scope_ + "/job_77/" + f);
    std::ofstream(scope_ + "/job_77/nopfs/cgroup.procs");
  }
  void TearDown() override { EXPECT_EQ(std::system(("rm -rf " + root_).c_str()), 0); }
  std::string root_, scope_;
  JobCgroupOptions opts_;
};

TEST_F(JobCgroupV2TreeTest, NopfsdStartsInALeafOfTheJobsDirectoryWithTheJobsLimit) {
  ASSERT_EQ(DetectCgroupVersion(root_), CgroupVersion::kV2);
  Result<JobCgroup> cg = PrepareJobCgroup(opts_, 77, 4242, 300ull << 20);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  EXPECT_EQ(cg->version, CgroupVersion::kV2);
  EXPECT_EQ(cg->dir, scope_ + "/job_77/nopfs");
  EXPECT_EQ(Read(scope_ + "/job_77/memory.max"), std::to_string(300ull << 20));
  EXPECT_EQ(cg->limit, 300ull << 20);
  EXPECT_EQ(cg->note.rfind("cgroup v2 /system.slice/n1_slurmstepd.scope/job_77/nopfs", 0), 0u)
      << cg->note;
  launch::Child child = SpawnInto(cg->procs.get());
  ASSERT_TRUE(child.running());
  child.Signal(SIGKILL);
  (void)child.Wait();
  EXPECT_EQ(Read(cg->dir + "/cgroup.procs"), "0\n");  // the child wrote itself in, before exec
}

TEST_F(JobCgroupV2TreeTest, WithoutTheScopeNothingIsMade) {
  ASSERT_EQ(std::system(("rm -rf " + root_ + "/system.slice").c_str()), 0);
  Result<JobCgroup> cg = PrepareJobCgroup(opts_, 77, 4242, 300ull << 20);
  EXPECT_EQ(cg.status().code(), StatusCode::kNotFound);
  EXPECT_NE(cg.status().message().find("slurmstepd scope"), std::string::npos);
  EXPECT_NE(::access((root_ + "/system.slice").c_str(), F_OK), 0);
}

// A real cgroup v2 hierarchy, mounted in this process's own mount namespace. This machine's
// controllers are bound to v1, so it has none of memory or cpuset: what runs for real is the
// layout, the move of a process before exec and the removal.
class JobCgroupV2MountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root";
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      GTEST_SKIP() << "cannot make a private mount namespace: " << std::strerror(errno);
    }
    char tmpl[] = "/tmp/nopfs-cgroup2-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    if (::mount("none", root_.c_str(), "cgroup2", 0, nullptr) != 0) {
      ::rmdir(root_.c_str());
      GTEST_SKIP() << "cannot mount cgroup2: " << std::strerror(errno);
    }
    mounted_ = true;
    opts_.root = root_;
    opts_.node = "nopfstest" + std::to_string(::getpid());
    scope_ = root_ + "/system.slice/" + opts_.node + "_slurmstepd.scope";
    ::mkdir((root_ + "/system.slice").c_str(), 0755);
    ASSERT_EQ(::mkdir(scope_.c_str(), 0755), 0) << scope_;
  }
  void TearDown() override {
    if (!mounted_) return;
    for (const std::string& d :
         {scope_ + "/job_77/nopfs", scope_ + "/job_77", scope_, root_ + "/system.slice"})
      ::rmdir(d.c_str());
    ::umount2(root_.c_str(), MNT_DETACH);
    ::rmdir(root_.c_str());
  }
  std::string root_, scope_;
  bool mounted_ = false;
  JobCgroupOptions opts_;
};

TEST_F(JobCgroupV2MountTest, NopfsdRunsInTheLeafAndTheEpilogRemovesTheJobsDirectory) {
  ASSERT_EQ(DetectCgroupVersion(root_), CgroupVersion::kV2);
  Result<JobCgroup> cg = PrepareJobCgroup(opts_, 77, 4242, 300ull << 20);
  ASSERT_TRUE(cg.ok()) << cg.status().message();
  EXPECT_EQ(cg->limit, 0u);  // no memory controller here: nothing to write
  EXPECT_NE(cg->note.find("no memory controller"), std::string::npos) << cg->note;
  // slurmd makes the job's extern step beside the leaf: the job's directory holds no process.
  ASSERT_EQ(::mkdir((scope_ + "/job_77/step_extern").c_str(), 0755), 0);
  launch::Child child = SpawnInto(cg->procs.get());
  ASSERT_TRUE(child.running());
  const std::string want = "/system.slice/" + opts_.node + "_slurmstepd.scope/job_77/nopfs";
  EXPECT_EQ(CgroupLine(child.pid(), ""), want);
  // slurmd removes its step at the job's end, and cannot remove the job's directory.
  ASSERT_EQ(::rmdir((scope_ + "/job_77/step_extern").c_str()), 0);
  EXPECT_NE(::rmdir((scope_ + "/job_77").c_str()), 0);
  // An epilog that could not stop nopfsd says what is left.
  EXPECT_NE(RemoveJobCgroup(opts_, 77, 4242).find("still has processes"), std::string::npos);
  child.Signal(SIGKILL);
  (void)child.Wait();
  std::string left = "not yet";
  for (int i = 0; i < 50 && !left.empty(); ++i) {
    left = RemoveJobCgroup(opts_, 77, 4242);
    if (!left.empty()) std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(left, "");
  EXPECT_NE(::access((scope_ + "/job_77").c_str(), F_OK), 0);
  EXPECT_EQ(::access(scope_.c_str(), F_OK), 0);  // slurmd's
}

}  // namespace
}  // namespace nopfs::spank
