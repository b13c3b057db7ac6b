// nopfs_plan_bench: how long one node's plan takes at ImageNet scale, and how much memory.
//
//   nopfs_plan_bench                       every case with 1 and 2 threads, each in its own process
//   nopfs_plan_bench --case 22k --threads 2   one case in this process
//
// Cases (synthetic sample sizes, deterministic, uniform in [20 KB, 200 KB], mean 110 KB):
//   1k:  ImageNet-1k,  F = 1,281,167,  E = 90, 16 nodes x 4 ranks,   B = 256 per rank (16,384)
//   22k: ImageNet-22k, F = 14,197,103, E = 90, 1024 nodes x 4 ranks, B = 256 per rank (1,048,576)
// The node (node 1) gets a RAM tier of 1/4 of its share of the dataset (total bytes / nodes) and
// an SSD tier of the other 3/4. Printed per case: wall time of counting (CountNodeAccesses), of
// planning (MakeNodePlan from the counts) and of the model's prediction (PredictNode), what the
// plan holds, and the process's peak RSS (getrusage ru_maxrss), which is why each case runs in a
// process of its own. A benchmark prints figures; it never passes or fails.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "policy/frequency.h"
#include "policy/model.h"
#include "policy/plan.h"
#include "policy/predict.h"
#include "policy/sampler.h"

namespace {

using nopfs::policy::Bytes;

struct Case {
  const char* name;
  uint64_t samples;
  uint32_t nodes;
};

constexpr Case kCases[] = {
    {"1k", 1'281'167, 16},
    {"22k", 14'197'103, 1024},
};
constexpr uint32_t kRanksPerNode = 4;
constexpr uint64_t kBatchPerRank = 256;
constexpr uint32_t kNode = 1;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

double PeakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

std::vector<Bytes> SyntheticSizes(uint64_t samples) {
  std::vector<Bytes> sizes(samples);
  nopfs::policy::SplitMix64 rng(0x5EED);
  for (Bytes& s : sizes)
    s = 20'000 + rng.Bounded(180'001);
  return sizes;
}

nopfs::policy::StorageClass Class(const char* name, Bytes capacity, double read, double write,
                                  uint32_t threads) {
  nopfs::policy::StorageClass c;
  c.name = name;
  c.capacity = capacity;
  c.threads = threads;
  c.read = nopfs::policy::BandwidthTable({{1, read / 4}, {4, read * 0.8}, {16, read}});
  c.write = nopfs::policy::BandwidthTable({{1, write / 4}, {4, write * 0.8}, {16, write}});
  if (std::strcmp(name, "ssd") == 0) {
    c.kind = nopfs::policy::ClassKind::kSsd;
    c.path = "/local/nopfs";
  }
  return c;
}

int RunCase(const Case& c, unsigned threads) {
  nopfs::policy::JobSpec job;
  job.seed = 1;
  job.samples = c.samples;
  job.epochs = 90;
  job.ranks = c.nodes * kRanksPerNode;
  job.ranks_per_node = kRanksPerNode;
  job.batch = kBatchPerRank * job.ranks;
  job.scheme = nopfs::policy::Scheme::kUniform;
  if (nopfs::Status s = job.Validate(); !s.ok()) {
    std::fprintf(stderr, "nopfs_plan_bench: %s\n", s.message().c_str());
    return 2;
  }
  const std::vector<Bytes> sizes = SyntheticSizes(c.samples);
  const Bytes total = std::accumulate(sizes.begin(), sizes.end(), Bytes{0});
  const Bytes share = total / c.nodes;
  const std::vector<Bytes> capacities = {share / 4, share - share / 4};

  // A plausible node: RAM 20 GB/s, SSD 3 GB/s, a PFS whose per-reader rate falls with readers,
  // ranks that each consume 1,000 samples/s (~110 MB/s).
  nopfs::policy::SystemModel model;
  model.compute_rate = 1000.0 * static_cast<double>(total) / static_cast<double>(c.samples);
  model.network_bandwidth = 12.5e9;
  model.pfs = nopfs::policy::BandwidthTable({{1, 1e9}, {64, 40e9}, {4096, 100e9}});
  model.staging = Class("staging", 64 << 20, 20e9, 10e9, 8);
  model.classes = {Class("ram", capacities[0], 20e9, 10e9, 8),
                   Class("ssd", capacities[1], 3e9, 2e9, 8)};

  const auto t0 = std::chrono::steady_clock::now();
  const nopfs::policy::NodeAccessCounts counts =
      nopfs::policy::CountNodeAccesses(job, kNode, threads);
  const double count_s = Seconds(t0);
  const auto t1 = std::chrono::steady_clock::now();
  const nopfs::policy::NodePlan plan = nopfs::policy::MakeNodePlan(counts, sizes, capacities);
  const double plan_s = Seconds(t1);
  const auto t2 = std::chrono::steady_clock::now();
  const nopfs::policy::NodePrediction pred = nopfs::policy::PredictNode(
      job, plan, sizes, model, job.nodes() * model.staging.threads, threads);
  const double predict_s = Seconds(t2);

  const double reads = static_cast<double>(plan.accesses);
  std::printf(
      "case %-3s threads %u: F %llu, E %u, %u nodes x %u ranks, B %llu | count %.2f s, plan "
      "%.2f s, predict %.2f s | node %u: %llu accesses, %llu distinct, ram %zu + ssd %zu "
      "samples, %.1f%% of reads cached, stall %.0f of %.0f s | peak RSS %.0f MiB\n",
      c.name, threads, static_cast<unsigned long long>(c.samples), job.epochs, c.nodes,
      kRanksPerNode, static_cast<unsigned long long>(job.batch), count_s, plan_s, predict_s, kNode,
      static_cast<unsigned long long>(plan.accesses),
      static_cast<unsigned long long>(plan.distinct), plan.tiers[0].prefetch_order.size(),
      plan.tiers[1].prefetch_order.size(),
      reads > 0 ? 100.0 * (reads - static_cast<double>(plan.uncached_accesses)) / reads : 0.0,
      pred.stall_seconds, pred.total_seconds, PeakRssMiB());
  std::fflush(stdout);
  return 0;
}

int Usage() {
  std::fprintf(stderr, "usage: nopfs_plan_bench [--case 1k|22k] [--threads N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const Case* only = nullptr;
  long threads = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--case" && i + 1 < argc) {
      const std::string name = argv[++i];
      for (const Case& c : kCases) {
        if (name == c.name) only = &c;
      }
      if (only == nullptr) return Usage();
    } else if (arg == "--threads" && i + 1 < argc) {
      char* end = nullptr;
      threads = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || threads < 0) return Usage();
    } else {
      return Usage();
    }
  }
  if (only != nullptr && threads >= 0) return RunCase(*only, static_cast<unsigned>(threads));

  // Each case in a child process, so that its peak RSS is its own.
  int status = 0;
  for (const Case& c : kCases) {
    if (only != nullptr && only != &c) continue;
    const std::vector<unsigned> thread_counts =
        threads >= 0 ? std::vector<unsigned>{static_cast<unsigned>(threads)}
                     : std::vector<unsigned>{1, 2};
    for (unsigned t : thread_counts) {
      std::fflush(stdout);
      const pid_t pid = fork();
      if (pid < 0) {
        std::perror("nopfs_plan_bench: fork");
        return 1;
      }
      if (pid == 0) _exit(RunCase(c, t));
      int child = 0;
      if (waitpid(pid, &child, 0) < 0 || !WIFEXITED(child) || WEXITSTATUS(child) != 0) {
        std::fprintf(stderr, "nopfs_plan_bench: case %s with %u threads failed\n", c.name, t);
        status = 1;
      }
    }
  }
  return status;
}
