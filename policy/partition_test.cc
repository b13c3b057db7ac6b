#include "policy/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "policy/job.h"
#include "policy/sampler.h"

namespace nopfs::policy {
namespace {

using Steps = std::vector<std::vector<uint64_t>>;  // [step] -> entries
using Ranks = std::vector<Steps>;                  // [rank][step] -> entries

JobSpec Job(uint64_t f, uint32_t n, uint64_t b, Scheme scheme, bool drop, uint32_t epochs = 1,
            uint32_t per_node = 1, uint64_t seed = 1) {
  JobSpec j;
  j.seed = seed;
  j.samples = f;
  j.epochs = epochs;
  j.ranks = n;
  j.batch = b;
  j.scheme = scheme;
  j.drop_last = drop;
  j.ranks_per_node = per_node;
  return j;
}

// What policy/ says: [rank][step] -> positions in pi_e.
Ranks Positions(const JobSpec& job) {
  Ranks out(job.ranks);
  const uint64_t steps = StepsPerEpoch(job);
  for (uint32_t i = 0; i < job.ranks; ++i) {
    uint64_t next = 0;
    for (uint64_t h = 0; h < steps; ++h) {
      const EntryRange r = RankStepEntries(job, i, h);
      EXPECT_EQ(r.begin, next) << "steps of a rank are consecutive in its list";
      next = r.end;
      std::vector<uint64_t> step;
      for (uint64_t k = r.begin; k < r.end; ++k)
        step.push_back(RankEntryPosition(job, i, k));
      out[i].push_back(step);
    }
    EXPECT_EQ(next, RankEpochLength(job, i));
  }
  return out;
}

// ---- Golden vectors ----------------------------------------------------------------------------
// From tests/reference/sampler_ref.py --golden (the "Partitions" block): for each rank, separated
// by '|', its steps separated by ';', each the samples it reads in that step. Regenerate as said
// in sampler_test.cc.

struct GoldenPartition {
  Scheme scheme;
  uint64_t seed;
  uint32_t epoch;
  uint64_t samples;
  uint32_t ranks;
  uint64_t batch;
  bool drop_last;
  const char* text;
};

std::string Render(const JobSpec& job, uint32_t epoch) {
  const std::vector<SampleId> perm = EpochPermutation(job.seed, epoch, job.samples);
  const Ranks pos = Positions(job);
  std::string out;
  for (size_t i = 0; i < pos.size(); ++i) {
    if (i != 0) out += '|';
    for (size_t h = 0; h < pos[i].size(); ++h) {
      if (h != 0) out += ';';
      for (size_t k = 0; k < pos[i][h].size(); ++k) {
        if (k != 0) out += ' ';
        out += std::to_string(perm[pos[i][h][k]]);
      }
    }
  }
  return out;
}

TEST(PartitionTest, GoldenPartitions) {
  const GoldenPartition cases[] = {
      {Scheme::kUniform, 5, 0, 10, 3, 5, false, "8 7;1 5|2 3;6 0|4;9"},
      {Scheme::kUniform, 5, 0, 10, 3, 5, true, "8 7;1 5|2 3;6 0|4;9"},
      {Scheme::kUniform, 9, 2, 11, 4, 8, false, "9 2;5|10 6;0|7 4;1|8 3;9"},
      {Scheme::kUniform, 3, 0, 65, 2, 8, false,
       "23 35 1 12;27 64 28 36;59 9 31 29;2 4 17 20;25 8 42 10;51 46 61 52;44 33 3 15;22 50 57 "
       "63;47|5 16 62 24;53 43 32 18;60 21 19 30;13 45 58 56;26 11 41 7;34 54 38 0;55 14 6 40;48 "
       "49 39 37;23"},
      {Scheme::kStrided, 5, 0, 10, 3, 4, false, "8 3;5 9|7 4;6 8|2 1;0 7"},
      {Scheme::kStrided, 5, 0, 10, 3, 4, true, "8 3|7 4|2 1"},
      {Scheme::kStrided, 9, 2, 11, 4, 6, false, "9 7;5|2 4;0|10 8;1|6 3;9"},
      {Scheme::kStrided, 3, 0, 65, 2, 8, false,
       "23 1 5 62;27 28 53 32;59 31 60 19;2 17 13 58;25 42 26 41;51 61 34 38;44 3 55 6;22 57 48 "
       "39;47|35 12 16 24;64 36 43 18;9 29 21 30;4 20 45 56;8 10 11 7;46 52 54 0;33 15 14 40;50 63 "
       "49 37;23"},
  };
  for (const GoldenPartition& c : cases) {
    const JobSpec job =
        Job(c.samples, c.ranks, c.batch, c.scheme, c.drop_last, c.epoch + 1, 1, c.seed);
    ASSERT_TRUE(job.Validate().ok()) << job.Validate().message();
    EXPECT_EQ(Render(job, c.epoch), c.text)
        << SchemeName(c.scheme) << " F " << c.samples << " N " << c.ranks << " B " << c.batch
        << " drop_last " << c.drop_last;
  }
}

// ---- uniform -----------------------------------------------------------------------------------

// The uniform scheme straight from its definition: batch h is [hB, min((h+1)B, F')); a trailing
// partial batch of t entries grows, one entry at a time from the head of the permutation, until
// every rank's slice is non-empty; rank i takes [i*ceil(b/N), min((i+1)*ceil(b/N), b)) of it.
Ranks UniformByDefinition(uint64_t f, uint32_t n, uint64_t b, bool drop) {
  const uint64_t steps = drop ? f / b : (f + b - 1) / b;
  const uint64_t usable = drop ? steps * b : f;
  Ranks out(n, Steps(steps));
  for (uint64_t h = 0; h < steps; ++h) {
    const uint64_t lo = h * b;
    uint64_t size = std::min((h + 1) * b, usable) - lo;
    auto last_empty = [&] { return (n - 1) * ((size + n - 1) / n) >= size; };
    if (size < b) {
      while (last_empty())
        ++size;
    }
    const uint64_t q = (size + n - 1) / n;
    for (uint32_t i = 0; i < n; ++i) {
      for (uint64_t p = i * q; p < std::min((i + 1) * q, size); ++p)
        out[i][h].push_back((lo + p) % f);
    }
  }
  return out;
}

TEST(PartitionTest, UniformMatchesItsDefinition) {
  for (uint64_t f = 1; f <= 41; f += (f < 12 ? 1 : 7)) {
    for (uint32_t n = 1; n <= 7; ++n) {
      for (uint64_t b = 1; b <= 13; ++b) {
        for (bool drop : {false, true}) {
          const JobSpec job = Job(f, n, b, Scheme::kUniform, drop);
          if (!job.Validate().ok()) continue;
          const std::string where = "F " + std::to_string(f) + " N " + std::to_string(n) + " B " +
                                    std::to_string(b) + " drop " + std::to_string(drop);
          const Ranks got = Positions(job);
          ASSERT_EQ(got, UniformByDefinition(f, n, b, drop)) << where;
          EXPECT_EQ(StepsPerEpoch(job), drop ? f / b : (f + b - 1) / b) << where;
        }
      }
    }
  }
}

// ---- strided -----------------------------------------------------------------------------------

// PyTorch's DistributedSampler(shuffle=False, drop_last=D) over range(F), restated: pad the list
// by repeating it (or truncate it) to num_samples * N, rank i takes every N-th from i. Then a
// DataLoader(batch_size=r, drop_last=D) cuts it into batches.
Ranks StridedByTorchArithmetic(uint64_t f, uint32_t n, uint64_t b, bool drop) {
  // num_samples = ceil((F - N) / N) with drop_last when N does not divide F (0 if F < N).
  const int64_t short_by = static_cast<int64_t>(f) - n;
  const uint64_t num_samples =
      (drop && f % n != 0) ? (short_by <= 0 ? 0 : (static_cast<uint64_t>(short_by) + n - 1) / n)
                           : (f + n - 1) / n;
  const uint64_t total = num_samples * n;
  std::vector<uint64_t> indices;
  for (uint64_t p = 0; p < f; ++p)
    indices.push_back(p);
  if (!drop) {
    while (indices.size() < total)
      indices.push_back(indices[indices.size() - f]);
  } else {
    indices.resize(total);
  }
  const uint64_t r = (b + n - 1) / n;
  Ranks out(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::vector<uint64_t> mine;
    for (uint64_t p = i; p < total; p += n)
      mine.push_back(indices[p]);
    for (uint64_t k = 0; k < mine.size(); k += r) {
      std::vector<uint64_t> batch(mine.begin() + static_cast<long>(k),
                                  mine.begin() + static_cast<long>(std::min(k + r, mine.size())));
      if (drop && batch.size() < r) break;
      out[i].push_back(batch);
    }
  }
  return out;
}

TEST(PartitionTest, StridedEqualsDistributedSamplerAndDataLoader) {
  for (uint64_t f = 1; f <= 40; f += (f < 14 ? 1 : 5)) {
    for (uint32_t n = 1; n <= 9; ++n) {
      for (uint64_t b = 1; b <= 20; ++b) {
        for (bool drop : {false, true}) {
          const JobSpec job = Job(f, n, b, Scheme::kStrided, drop);
          const std::string where = "F " + std::to_string(f) + " N " + std::to_string(n) + " B " +
                                    std::to_string(b) + " drop " + std::to_string(drop);
          const Ranks expected = StridedByTorchArithmetic(f, n, b, drop);
          if (!job.Validate().ok()) {
            // Rejected exactly when some rank would read nothing: more ranks than samples, or a
            // DataLoader that yields no batch at all.
            bool empty = n > f;
            for (const Steps& rank : expected)
              empty = empty || rank.empty();
            EXPECT_TRUE(empty) << where;
            continue;
          }
          ASSERT_EQ(Positions(job), expected) << where;
          EXPECT_EQ(StepsPerEpoch(job), expected[0].size()) << where;
        }
      }
    }
  }
}

TEST(PartitionTest, StridedPaddingAndDropCountsArePrecise) {
  // Without drop_last, positions [0, N*M - F) are read twice (padding repeats the head), the rest
  // once; with it, positions [0, N*M) once and the rest never (M after truncation to batches).
  for (uint64_t f : {7ULL, 10ULL, 16ULL, 23ULL}) {
    for (uint32_t n : {1u, 2u, 3u, 4u, 6u}) {
      for (uint64_t b : {1ULL, 3ULL, 4ULL, 8ULL}) {
        for (bool drop : {false, true}) {
          const JobSpec job = Job(f, n, b, Scheme::kStrided, drop);
          if (!job.Validate().ok()) continue;
          const uint64_t m = RankEpochLength(job, 0);
          const uint64_t r = job.rank_batch();
          if (drop) {
            EXPECT_EQ(m, f / n / r * r);
          } else {
            EXPECT_EQ(m, (f + n - 1) / n);
          }
          std::vector<uint64_t> seen(f, 0);
          for (const Steps& rank : Positions(job)) {
            for (const auto& s : rank) {
              for (uint64_t p : s)
                ++seen[p];
            }
          }
          for (uint64_t p = 0; p < f; ++p) {
            const uint64_t want = drop ? (p < n * m ? 1 : 0) : (p < n * m - f ? 2 : 1);
            EXPECT_EQ(seen[p], want) << "F " << f << " N " << n << " B " << b << " p " << p;
          }
        }
      }
    }
  }
}

TEST(PartitionTest, StepsPerEpochOfStridedIsPerRankBatches) {
  // B a multiple of N: the same as uniform.
  EXPECT_EQ(StepsPerEpoch(Job(100, 4, 8, Scheme::kStrided, false)), 13u);
  EXPECT_EQ(StepsPerEpoch(Job(100, 4, 8, Scheme::kStrided, true)), 12u);
  // B not a multiple of N: N*r > B entries per step, fewer steps (the documented example).
  EXPECT_EQ(StepsPerEpoch(Job(10, 3, 4, Scheme::kStrided, false)), 2u);
  EXPECT_EQ(StepsPerEpoch(Job(10, 3, 5, Scheme::kUniform, false)), 2u);
  EXPECT_EQ(StepsPerEpoch(Job(10, 3, 4, Scheme::kStrided, true)), 1u);
  EXPECT_EQ(StepsPerEpoch(Job(10, 3, 5, Scheme::kUniform, true)), 2u);
  for (uint64_t f = 1; f < 60; f += 3) {
    for (uint32_t n = 1; n < 6; ++n) {
      for (uint64_t r = 1; r < 5; ++r) {
        for (bool drop : {false, true}) {
          const JobSpec s = Job(f, n, n * r, Scheme::kStrided, drop);
          const JobSpec u = Job(f, n, n * r, Scheme::kUniform, drop);
          if (!s.Validate().ok() || !u.Validate().ok()) continue;
          EXPECT_EQ(StepsPerEpoch(s), StepsPerEpoch(u)) << f << " " << n << " " << r;
        }
      }
    }
  }
}

TEST(PartitionTest, LengthsAddUp) {
  for (Scheme scheme : {Scheme::kUniform, Scheme::kStrided}) {
    for (bool drop : {false, true}) {
      const JobSpec job = Job(103, 10, 30, scheme, drop, 1, 4);  // 3 nodes: 4, 4, 2 ranks
      ASSERT_TRUE(job.Validate().ok());
      ASSERT_EQ(job.nodes(), 3u);
      EXPECT_EQ(job.ranks_on_node(0), 4u);
      EXPECT_EQ(job.ranks_on_node(2), 2u);
      EXPECT_EQ(job.ranks_on_node(3), 0u);
      EXPECT_EQ(job.node_of(9), 2u);
      uint64_t total = 0;
      for (uint32_t node = 0; node < job.nodes(); ++node) {
        uint64_t sum = 0;
        for (uint32_t l = 0; l < job.ranks_on_node(node); ++l) {
          sum += RankEpochLength(job, job.first_rank(node) + l);
        }
        EXPECT_EQ(NodeEpochLength(job, node), sum);
        total += sum;
      }
      // uniform: F' = 90 with drop_last, else 90 + the trailing 13 padded to 9*2+1 = 19;
      // strided: N*M with M = 9 or 11.
      const uint64_t want = scheme == Scheme::kUniform ? (drop ? 90 : 109) : (drop ? 90 : 110);
      EXPECT_EQ(total, want);
    }
  }
}

TEST(PartitionTest, StepOutOfRangeThrows) {
  const JobSpec job = Job(10, 2, 4, Scheme::kUniform, false);
  EXPECT_NO_THROW(RankStepEntries(job, 1, 2));
  EXPECT_THROW(RankStepEntries(job, 1, 3), std::out_of_range);
}

// ---- Equal steps: a property over a grid of shapes
// -----------------------------------------------

// For every valid (F, N, B, drop_last, scheme): every rank runs T steps and reads at least one
// entry in each; RankStream yields exactly RankStepEntries/RankEntryPosition in order. Without
// drop_last, every position of the epoch is read at least once and fewer than N entries are
// padding, each repeating a distinct position of the head once more (DistributedSampler's
// guarantee: total_size - F < N extra indices, taken from the head). With drop_last, a prefix of
// the epoch is read once each and the rest never. Invalid jobs are exactly those where some rank
// would read nothing.
void CheckShape(uint64_t f, uint32_t n, uint64_t b, bool drop, Scheme scheme) {
  const JobSpec job = Job(f, n, b, scheme, drop, 2, 1, f * 31 + n);
  const std::string where = std::string(SchemeName(scheme)) + " F " + std::to_string(f) + " N " +
                            std::to_string(n) + " B " + std::to_string(b) + " drop " +
                            std::to_string(drop);
  const uint64_t q = (b + n - 1) / n;
  const bool degenerate = n > f || (scheme == Scheme::kUniform && (n - 1) * q >= b);
  const Status valid = job.Validate();
  if (degenerate) {
    ASSERT_FALSE(valid.ok()) << where;
    return;
  }
  if (!valid.ok()) {
    // The only other refusals: drop_last leaves no step at all.
    ASSERT_TRUE(drop) << where << ": " << valid.message();
    return;
  }
  const uint64_t steps = StepsPerEpoch(job);
  ASSERT_GE(steps, 1u) << where;
  std::vector<uint64_t> seen(f, 0);
  uint64_t entries = 0;
  for (uint32_t i = 0; i < n; ++i) {
    std::vector<uint64_t> positions;
    for (uint64_t h = 0; h < steps; ++h) {
      const EntryRange r = RankStepEntries(job, i, h);
      ASSERT_GT(r.size(), 0u) << where << " rank " << i << " step " << h;
      for (uint64_t k = r.begin; k < r.end; ++k) {
        positions.push_back(RankEntryPosition(job, i, k));
        ASSERT_LT(positions.back(), f) << where;
        ++seen[positions.back()];
      }
    }
    ASSERT_EQ(positions.size(), RankEpochLength(job, i)) << where;
    entries += positions.size();
    if (f > 2000) continue;  // the stream check materializes permutations
    RankStream stream(job, i);
    Access a;
    for (uint32_t e = 0; e < job.epochs; ++e) {
      const std::vector<SampleId> perm = EpochPermutation(job.seed, e, f);
      uint64_t k = 0;
      for (uint64_t h = 0; h < steps; ++h) {
        const EntryRange r = RankStepEntries(job, i, h);
        for (uint64_t x = r.begin; x < r.end; ++x, ++k) {
          ASSERT_TRUE(stream.Next(&a)) << where;
          ASSERT_TRUE(a.epoch == e && a.step == h && a.index == x && a.sample == perm[positions[k]])
              << where << " rank " << i << " epoch " << e << " entry " << k;
        }
      }
    }
    ASSERT_FALSE(stream.Next(&a)) << where;
  }
  if (!drop) {
    ASSERT_GE(entries, f) << where;
    const uint64_t pad = entries - f;
    ASSERT_LT(pad, n) << where;
    for (uint64_t p = 0; p < f; ++p)
      ASSERT_EQ(seen[p], p < pad ? 2u : 1u) << where << " position " << p;
  } else {
    uint64_t p = 0;
    while (p < f && seen[p] == 1)
      ++p;
    ASSERT_EQ(p, entries) << where;
    for (; p < f; ++p)
      ASSERT_EQ(seen[p], 0u) << where << " position " << p;
  }
}

TEST(PartitionTest, EveryRankRunsTheSameNonEmptyStepsOverAGridOfShapes) {
  std::vector<uint64_t> samples;
  for (uint64_t f = 1; f <= 70; ++f)
    samples.push_back(f);
  for (uint64_t f : {97ULL, 128ULL, 1000ULL, 1023ULL, 4099ULL, 100003ULL})
    samples.push_back(f);
  for (uint64_t f : samples) {
    for (uint32_t n = 1; n <= 9; ++n) {
      for (uint64_t b = 1; b <= 20; ++b) {
        for (bool drop : {false, true}) {
          for (Scheme scheme : {Scheme::kUniform, Scheme::kStrided})
            CheckShape(f, n, b, drop, scheme);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  // The shape of the report: 65 samples, 2 ranks, batch 8 gives 9 steps on each rank.
  for (Scheme scheme : {Scheme::kUniform, Scheme::kStrided}) {
    const JobSpec job = Job(65, 2, 8, scheme, false);
    EXPECT_EQ(StepsPerEpoch(job), 9u);
    EXPECT_EQ(RankStepEntries(job, 1, 8).size(), 1u);
    EXPECT_EQ(RankEpochLength(job, 0), 33u);
    EXPECT_EQ(RankEpochLength(job, 1), 33u);
  }
  // ImageNet-1k on 64 ranks with a global batch of 2048: 626 steps on every rank.
  const JobSpec imagenet = Job(1281167, 64, 2048, Scheme::kUniform, false);
  EXPECT_EQ(StepsPerEpoch(imagenet), 626u);
  // The trailing 1167 are padded to 63 * ceil(1167/64) + 1 = 1198: rank 0 takes 19, rank 63 one.
  EXPECT_EQ(RankStepEntries(imagenet, 0, 625).size(), 19u);
  EXPECT_EQ(RankStepEntries(imagenet, 63, 625).size(), 1u);
}

// ---- RankStream --------------------------------------------------------------------------------

std::vector<Access> Drain(RankStream& s) {
  std::vector<Access> out;
  Access a;
  while (s.Next(&a))
    out.push_back(a);
  EXPECT_FALSE(s.Next(&a)) << "an ended stream stays ended";
  return out;
}

bool Same(const Access& a, const Access& b) {
  return a.epoch == b.epoch && a.step == b.step && a.index == b.index && a.sample == b.sample;
}

TEST(RankStreamTest, YieldsThePartitionOfEveryEpoch) {
  for (Scheme scheme : {Scheme::kUniform, Scheme::kStrided}) {
    const JobSpec job = Job(29, 3, 7, scheme, false, 4, 1, 77);
    for (uint32_t rank = 0; rank < job.ranks; ++rank) {
      RankStream stream(job, rank);
      const std::vector<Access> got = Drain(stream);
      std::vector<Access> want;
      const Ranks pos = Positions(job);
      for (uint32_t e = 0; e < job.epochs; ++e) {
        const std::vector<SampleId> perm = EpochPermutation(job.seed, e, job.samples);
        uint64_t index = 0;
        for (uint64_t h = 0; h < pos[rank].size(); ++h) {
          for (uint64_t p : pos[rank][h])
            want.push_back({e, h, index++, perm[p]});
        }
      }
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_TRUE(Same(got[i], want[i])) << i;
    }
  }
}

TEST(RankStreamTest, ResumeIsTheTailOfTheFullStream) {
  for (Scheme scheme : {Scheme::kUniform, Scheme::kStrided}) {
    for (bool drop : {false, true}) {
      // uniform: the trailing batch of 1 is padded to 4, one entry per rank.
      const JobSpec job = Job(31, 4, 10, scheme, drop, 3, 2, 5);
      const uint64_t steps = StepsPerEpoch(job);
      for (uint32_t rank = 0; rank < job.ranks; ++rank) {
        RankStream full_stream(job, rank);
        const std::vector<Access> full = Drain(full_stream);
        for (uint32_t e = 0; e <= job.epochs; ++e) {
          for (uint64_t h = 0; h <= steps; ++h) {
            RankStream resumed(job, rank, {e, h});
            const std::vector<Access> tail = Drain(resumed);
            // The tail starts at the first access at or after (e, h); step T is epoch e+1's start.
            const auto first = std::find_if(full.begin(), full.end(), [&](const Access& a) {
              return a.epoch > e || (a.epoch == e && a.step >= h);
            });
            ASSERT_EQ(tail.size(), static_cast<size_t>(full.end() - first))
                << "rank " << rank << " start " << e << "/" << h;
            for (size_t i = 0; i < tail.size(); ++i)
              ASSERT_TRUE(Same(tail[i], first[i]));
          }
        }
      }
    }
  }
}

TEST(RankStreamTest, RejectsInvalidJobsAndRanks) {
  EXPECT_THROW(RankStream(Job(0, 1, 1, Scheme::kUniform, false), 0), std::invalid_argument);
  EXPECT_THROW(RankStream(Job(10, 2, 2, Scheme::kUniform, false), 2), std::out_of_range);
}

TEST(RankStreamTest, ValidateStreamPointNamesTheFlag) {
  const JobSpec job = Job(10, 2, 4, Scheme::kUniform, false, 3);  // T = 3
  EXPECT_TRUE(ValidateStreamPoint(job, {2, 2}).ok());
  const Status e = ValidateStreamPoint(job, {3, 0});
  EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.message().find("--start-epoch 3"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("0 to 2"), std::string::npos) << e.message();
  const Status s = ValidateStreamPoint(job, {0, 3});
  EXPECT_NE(s.message().find("--start-step 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("0 to 2"), std::string::npos) << s.message();
}

// ---- JobSpec -----------------------------------------------------------------------------------

void ExpectRejected(const JobSpec& job, const std::vector<std::string>& words) {
  const Status s = job.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const std::string& w : words) {
    EXPECT_NE(s.message().find(w), std::string::npos) << "'" << w << "' not in: " << s.message();
  }
}

TEST(JobSpecTest, ValidateNamesTheFlagAndTheFix) {
  EXPECT_TRUE(Job(10, 2, 4, Scheme::kUniform, false).Validate().ok());
  EXPECT_TRUE(Job(kMaxSamples, 1, 1, Scheme::kUniform, false).Validate().ok());
  EXPECT_TRUE(Job(10, 2, 100, Scheme::kUniform, false).Validate().ok());  // one short step
  EXPECT_TRUE(Job(10, 2, 10, Scheme::kUniform, true).Validate().ok());

  ExpectRejected(Job(0, 1, 1, Scheme::kUniform, false), {"--samples", "at least 1"});
  ExpectRejected(Job(kMaxSamples + 1, 1, 1, Scheme::kUniform, false),
                 {"--samples 4294967296", "4294967295"});
  ExpectRejected(Job(10, 1, 1, Scheme::kUniform, false, 0), {"--epochs", "at least 1"});
  ExpectRejected(Job(10, 0, 1, Scheme::kUniform, false), {"--ranks", "at least 1"});
  ExpectRejected(Job(10, 1, 0, Scheme::kUniform, false), {"--batch", "at least 1"});
  ExpectRejected(Job(10, 4, 1, Scheme::kUniform, false, 1, 0), {"--ranks-per-node 0", "1 to"});
  ExpectRejected(Job(10, 4, 1, Scheme::kUniform, false, 1, 5), {"--ranks-per-node 5", "(4)"});
  ExpectRejected(Job(10, 1, 11, Scheme::kUniform, true),
                 {"--drop-last", "--batch 11", "--samples 10", "at most 10"});
  // strided + drop_last: floor(10/3) = 3 entries per rank, r = ceil(12/3) = 4: no step.
  ExpectRejected(Job(10, 3, 10, Scheme::kStrided, true),
                 {"--drop-last", "--scheme strided", "at most 9"});
  EXPECT_TRUE(Job(10, 3, 9, Scheme::kStrided, true).Validate().ok());
  // Some rank would read nothing: more ranks than samples (either scheme, with or without
  // drop_last), or a uniform batch whose last slice is empty (B < N, or F = 10, N = 3, B = 4:
  // slices of 2, 2 and 0).
  for (Scheme scheme : {Scheme::kUniform, Scheme::kStrided}) {
    for (bool drop : {false, true}) {
      ExpectRejected(Job(3, 5, 5, scheme, drop),
                     {"--ranks 5 is more than --samples 3", "at most 3 --ranks"});
    }
  }
  ExpectRejected(Job(10, 4, 2, Scheme::kUniform, false),
                 {"--scheme uniform", "--batch 2", "--ranks 4", "rank 3", "--scheme strided",
                  "multiple of --ranks (4)"});
  ExpectRejected(Job(10, 3, 4, Scheme::kUniform, false),
                 {"--batch 4", "rank 2", "takes 2", "multiple of --ranks (6)"});
  EXPECT_TRUE(Job(10, 4, 2, Scheme::kStrided, false).Validate().ok());
  EXPECT_TRUE(Job(10, 3, 4, Scheme::kStrided, false).Validate().ok());
  // Stream positions and counts must fit: padding reads a sample twice per epoch.
  ExpectRejected(Job(3, 2, 2, Scheme::kUniform, false, UINT32_MAX), {"--epochs"});
  EXPECT_TRUE(Job(3, 2, 2, Scheme::kUniform, false, UINT32_MAX / 2).Validate().ok());
  ExpectRejected(Job(kMaxSamples, 1, 1, Scheme::kUniform, false, UINT32_MAX), {"--epochs"});
}

TEST(JobSpecTest, RankBatchDoesNotOverflow) {
  JobSpec j = Job(10, 3, UINT64_MAX, Scheme::kUniform, false);
  EXPECT_EQ(j.rank_batch(), UINT64_MAX / 3);  // 2^64-1 is divisible by 3
  j.ranks = 2;
  EXPECT_EQ(j.rank_batch(), UINT64_MAX / 2 + 1);
  EXPECT_TRUE(j.Validate().ok());
  EXPECT_EQ(StepsPerEpoch(j), 1u);
  j.scheme = Scheme::kStrided;
  EXPECT_EQ(StepsPerEpoch(j), 1u);
}

TEST(JobSpecTest, SchemeNamesRoundTrip) {
  for (Scheme s : {Scheme::kUniform, Scheme::kStrided}) {
    const Result<Scheme> parsed = ParseScheme(SchemeName(s));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, s);
  }
  const Result<Scheme> bad = ParseScheme("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--scheme \"random\""), std::string::npos);
  EXPECT_NE(bad.status().message().find("uniform"), std::string::npos);
  EXPECT_NE(bad.status().message().find("strided"), std::string::npos);
}

}  // namespace
}  // namespace nopfs::policy
