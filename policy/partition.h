// Which entries of an epoch's permutation each rank reads, in which order, in which step; and
// RankStream, a cursor over one rank's access stream that can start at any (epoch, step).
//
// All functions are pure and cheap (O(1) per entry): nothing here materializes a rank's stream
// except RankStream, which holds one epoch permutation at a time.
//
// Thread safety: free functions are reentrant; a RankStream is used by one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "policy/job.h"

namespace nopfs::policy {

// Every function below requires a valid job (JobSpec::Validate) and rank < N. In a valid job every
// rank runs the same number of steps in every epoch and reads at least one entry in each of them
// (docs/algorithm.md §2.2).

// T: steps per epoch, the same for every rank.
//   uniform: floor(F/B) with drop_last, ceil(F/B) without (the trailing partial batch is padded
//   with fewer than N entries from the head of the permutation so that no rank's slice is empty).
//   strided: the batch count of each rank's DataLoader. With M = ceil(F/N) entries per rank and
//   r = ceil(B/N): ceil(M/r) without drop_last, floor(floor(F/N)/r) with. This equals the uniform
//   count when B is a multiple of N (B = N*r); otherwise each step reads N*r > B entries and an
//   epoch can have fewer steps (F=10, N=3, B=4: r=2, M=4, 2 steps instead of 3).
uint64_t StepsPerEpoch(const JobSpec& job);

// Entries rank `rank` reads in one epoch (the same every epoch).
uint64_t RankEpochLength(const JobSpec& job, uint32_t rank);

// Entries all ranks of `node` read in one epoch.
uint64_t NodeEpochLength(const JobSpec& job, uint32_t node);

// [begin, end): the entries of the rank's epoch list that make up step `step` (< StepsPerEpoch,
// else throws std::out_of_range). Never empty.
struct EntryRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
};
EntryRange RankStepEntries(const JobSpec& job, uint32_t rank, uint64_t step);

// The position in pi_e (in [0, F)) of the rank's k-th entry of an epoch (k < RankEpochLength).
uint64_t RankEntryPosition(const JobSpec& job, uint32_t rank, uint64_t k);

// A point in a rank's stream, for resume: the first entry of `step` in `epoch`.
struct StreamPoint {
  uint32_t epoch = 0;
  uint64_t step = 0;
};
// Validates the point against the job (epoch < E, step < T) for the given rank.
Status ValidateStreamPoint(const JobSpec& job, StreamPoint p);

// One access of a rank's stream.
struct Access {
  uint32_t epoch = 0;
  uint64_t step = 0;
  uint64_t index = 0;  // entry index within the rank's epoch list
  SampleId sample = 0;
};

// Iterates one rank's stream from a StreamPoint to the end of the last epoch. The accesses it
// yields from (epoch, step) on are exactly the tail of the stream that starts at (0, 0). Holds one
// epoch permutation (4*F bytes), computed when the stream first enters that epoch.
class RankStream {
 public:
  // Throws std::invalid_argument if the job does not validate and std::out_of_range if
  // rank >= N. A start with step >= T means the start of the next epoch; a start with
  // epoch >= E gives an empty stream (ValidateStreamPoint rejects both for user input).
  RankStream(const JobSpec& job, uint32_t rank, StreamPoint start = {});
  // The next access, or false at the end of the job.
  bool Next(Access* out);

 private:
  void LoadEpoch(uint32_t epoch);

  JobSpec job_;
  uint32_t rank_;
  uint32_t epoch_;
  uint64_t index_;
  uint64_t epoch_length_;
  uint64_t steps_;
  uint64_t step_;
  EntryRange step_range_;
  bool loaded_ = false;  // perm_ holds pi_{loaded_epoch_}
  uint32_t loaded_epoch_ = 0;
  std::vector<SampleId> perm_;
};

}  // namespace nopfs::policy
