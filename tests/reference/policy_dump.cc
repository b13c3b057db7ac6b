// policy_ref_dump: prints what policy/ computes for commands read from stdin, one answer line per
// command, so that tests/reference/sampler_ref.py can compare it with its independent reference.
//
//   splitmix STATE N                          N outputs of SplitMix64(STATE)
//   bounded STATE RANGE N                     N successive Bounded(RANGE) of SplitMix64(STATE)
//   perm SEED EPOCH F                         pi_EPOCH
//   partition SCHEME SEED EPOCH F N B DROP    T, then for each rank i and step h: i h size samples
//
// Exits 1 with a message on a malformed command or an invalid job.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "policy/partition.h"
#include "policy/sampler.h"

namespace {

using nopfs::policy::JobSpec;

int Fail(const std::string& line, const std::string& why) {
  std::fprintf(stderr, "policy_ref_dump: %s: %s\n", why.c_str(), line.c_str());
  return 1;
}

void Print(const std::vector<uint64_t>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i != 0) out += ' ';
    out += std::to_string(values[i]);
  }
  out += '\n';
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    std::vector<uint64_t> out;
    if (command == "splitmix") {
      uint64_t state = 0;
      uint64_t n = 0;
      if (!(in >> state >> n)) return Fail(line, "expected STATE N");
      nopfs::policy::SplitMix64 rng(state);
      for (uint64_t i = 0; i < n; ++i)
        out.push_back(rng.Next());
    } else if (command == "bounded") {
      uint64_t state = 0;
      uint64_t range = 0;
      uint64_t n = 0;
      if (!(in >> state >> range >> n) || range == 0) return Fail(line, "expected STATE RANGE N");
      nopfs::policy::SplitMix64 rng(state);
      for (uint64_t i = 0; i < n; ++i)
        out.push_back(rng.Bounded(range));
    } else if (command == "perm") {
      uint64_t seed = 0;
      uint32_t epoch = 0;
      uint64_t f = 0;
      if (!(in >> seed >> epoch >> f)) return Fail(line, "expected SEED EPOCH F");
      for (nopfs::policy::SampleId s : nopfs::policy::EpochPermutation(seed, epoch, f)) {
        out.push_back(s);
      }
    } else if (command == "partition") {
      std::string scheme;
      JobSpec job;
      uint32_t epoch = 0;
      int drop = 0;
      if (!(in >> scheme >> job.seed >> epoch >> job.samples >> job.ranks >> job.batch >> drop)) {
        return Fail(line, "expected SCHEME SEED EPOCH F N B DROP");
      }
      auto parsed = nopfs::policy::ParseScheme(scheme);
      if (!parsed.ok()) return Fail(line, parsed.status().message());
      job.scheme = *parsed;
      job.drop_last = drop != 0;
      job.epochs = 1;  // the partition does not depend on the epoch; the permutation does
      if (auto s = job.Validate(); !s.ok()) return Fail(line, s.message());
      const std::vector<nopfs::policy::SampleId> perm =
          nopfs::policy::EpochPermutation(job.seed, epoch, job.samples);
      const uint64_t steps = nopfs::policy::StepsPerEpoch(job);
      out.push_back(steps);
      for (uint32_t i = 0; i < job.ranks; ++i) {
        for (uint64_t h = 0; h < steps; ++h) {
          const nopfs::policy::EntryRange r = nopfs::policy::RankStepEntries(job, i, h);
          out.push_back(i);
          out.push_back(h);
          out.push_back(r.size());
          for (uint64_t k = r.begin; k < r.end; ++k) {
            out.push_back(perm[nopfs::policy::RankEntryPosition(job, i, k)]);
          }
        }
      }
    } else {
      return Fail(line, "unknown command");
    }
    Print(out);
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}
