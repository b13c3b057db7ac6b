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

// T: steps per epoch (floor(F/B) with drop_last, ceil(F/B) without).
uint64_t StepsPerEpoch(const JobSpec& job);

// Entries rank `rank` reads in one epoch (the same every epoch).
uint64_t RankEpochLength(const JobSpec& job, uint32_t rank);

// Entries all ranks of `node` read in one epoch.
uint64_t NodeEpochLength(const JobSpec& job, uint32_t node);

// [begin, end): the entries of the rank's epoch list that make up step `step` (< StepsPerEpoch).
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

// Iterates one rank's stream from a StreamPoint to the end of the last epoch.
class RankStream {
 public:
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
  std::vector<SampleId> perm_;
};

}  // namespace nopfs::policy
