// Job cgroup adoption against the real cgroup v1 hierarchy of this machine (root only; skipped
// otherwise): the layout slurmd makes for a job's extern step, made here by hand.
#include "spank/job_cgroup.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

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
    opts_.controllers = {"memory", "cpuset", "freezer"};
    for (const std::string& c : opts_.controllers) {
      std::string d = "/sys/fs/cgroup/" + c;
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

TEST_F(JobCgroupTest, FindsAndAdoptsIntoTheExternStep) {
  EXPECT_TRUE(FindExternCgroups(opts_, 77, 4242).empty());
  MakeExternStep();
  const std::vector<std::string> dirs = FindExternCgroups(opts_, 77, 4242);
  ASSERT_EQ(dirs.size(), tops_.size());
  EXPECT_EQ(dirs[0], tops_[0] + "/uid_4242/job_77/step_extern");
  ASSERT_TRUE(AdoptInto(dirs, child_).ok());
  EXPECT_EQ(CgroupOf("memory"), "/slurm_" + opts_.node + "/uid_4242/job_77/step_extern");
  // Back out, so that TearDown can remove the directories.
  ASSERT_TRUE(
      AdoptInto({"/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/freezer"},
                child_)
          .ok());
  EXPECT_FALSE(AdoptInto({"/sys/fs/cgroup/memory/no-such-cgroup"}, child_).ok());
}

TEST_F(JobCgroupTest, AdoptLaterWaitsForTheExternStepThatSlurmdMakesAfterTheProlog) {
  ASSERT_TRUE(AdoptLater(opts_, 77, 4242, child_, StartTicks(child_), 10s));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(CgroupOf("memory").find("step_extern"), std::string::npos);
  MakeExternStep();
  // The adopter waits for memory and cpuset where they are mounted (this test needs memory).
  std::vector<std::string> controllers = {"memory"};
  struct stat st {};
  if (::stat("/sys/fs/cgroup/cpuset", &st) == 0) controllers.push_back("cpuset");
  const std::string want = "/slurm_" + opts_.node + "/uid_4242/job_77/step_extern";
  EXPECT_EQ(WaitForCgroups(controllers, want), want);
  ASSERT_TRUE(
      AdoptInto({"/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/freezer"},
                child_)
          .ok());
}

TEST_F(JobCgroupTest, AdoptLaterWaitsForTheMemoryCgroupEvenWhenOthersAreThereFirst) {
  if (tops_.size() < 3) GTEST_SKIP() << "needs the memory, cpuset and freezer controllers";
  ASSERT_TRUE(AdoptLater(opts_, 77, 4242, child_, StartTicks(child_), 10s));
  // slurmd's order: proctrack/cgroup's freezer, then task/cgroup's cpuset, then memory.
  MakeExternStep("/freezer/");
  MakeExternStep("/cpuset/");
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(CgroupOf("memory").find("step_extern"), std::string::npos);
  MakeExternStep("/memory/");
  const std::string want = "/slurm_" + opts_.node + "/uid_4242/job_77/step_extern";
  EXPECT_EQ(WaitForCgroups({"memory", "cpuset", "freezer"}, want), want);
  ASSERT_TRUE(
      AdoptInto({"/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpuset", "/sys/fs/cgroup/freezer"},
                child_)
          .ok());
}

TEST_F(JobCgroupTest, AdoptLaterNeverMovesARecycledPid) {
  // The start time does not match: the pid is taken to belong to another process now.
  ASSERT_TRUE(AdoptLater(opts_, 77, 4242, child_, StartTicks(child_) + 1, 10s));
  MakeExternStep();
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(CgroupOf("memory").find("step_extern"), std::string::npos) << CgroupOf("memory");
}

}  // namespace
}  // namespace nopfs::spank
