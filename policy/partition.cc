#include "policy/partition.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "policy/epoch_shape.h"
#include "policy/sampler.h"

namespace nopfs::policy {

namespace internal {

EpochShape::EpochShape(const JobSpec& job)
    : scheme(job.scheme), samples(job.samples), ranks(job.ranks), batch(job.batch) {
  if (scheme == Scheme::kUniform) {
    full_steps = samples / batch;
    tail = job.drop_last ? 0 : samples % batch;
    if (tail != 0) tail = std::max(tail, (ranks - 1) * ((tail + ranks - 1) / ranks) + 1);
    steps = full_steps + (tail != 0 ? 1 : 0);
    return;
  }
  rank_batch = job.rank_batch();
  if (job.drop_last) {
    steps = samples / ranks / rank_batch;
    per_rank = steps * rank_batch;
  } else {
    per_rank = samples / ranks + (samples % ranks != 0 ? 1 : 0);
    steps = per_rank / rank_batch + (per_rank % rank_batch != 0 ? 1 : 0);
  }
}

}  // namespace internal

namespace {

using internal::EpochShape;

// uniform: entries the rank takes from a batch of b.
uint64_t SliceSize(const EpochShape& s, uint64_t b, uint64_t rank) {
  uint64_t begin = 0;
  uint64_t end = 0;
  s.Slice(b, rank, &begin, &end);
  return end - begin;
}

}  // namespace

uint64_t StepsPerEpoch(const JobSpec& job) {
  return EpochShape(job).steps;
}

uint64_t RankEpochLength(const JobSpec& job, uint32_t rank) {
  const EpochShape s(job);
  if (s.scheme == Scheme::kStrided) return s.per_rank;
  uint64_t n = s.full_steps * SliceSize(s, s.batch, rank);
  if (s.tail != 0) n += SliceSize(s, s.tail, rank);
  return n;
}

uint64_t NodeEpochLength(const JobSpec& job, uint32_t node) {
  const uint32_t first = job.first_rank(node);
  const uint32_t count = job.ranks_on_node(node);
  const EpochShape s(job);
  if (s.scheme == Scheme::kStrided) return s.per_rank * count;
  uint64_t n = 0;
  for (uint32_t l = 0; l < count; ++l) {
    n += s.full_steps * SliceSize(s, s.batch, first + l);
    if (s.tail != 0) n += SliceSize(s, s.tail, first + l);
  }
  return n;
}

EntryRange RankStepEntries(const JobSpec& job, uint32_t rank, uint64_t step) {
  const EpochShape s(job);
  if (step >= s.steps) {
    throw std::out_of_range("RankStepEntries: step " + std::to_string(step) + " of " +
                            std::to_string(s.steps));
  }
  if (s.scheme == Scheme::kStrided) {
    const uint64_t begin = step * s.rank_batch;
    return {begin, begin + std::min(s.rank_batch, s.per_rank - begin)};
  }
  // Every step before `step` is full, so the rank's list has step * (full slice) entries before.
  const uint64_t begin = step * SliceSize(s, s.batch, rank);
  return {begin, begin + SliceSize(s, s.BatchSize(step), rank)};
}

uint64_t RankEntryPosition(const JobSpec& job, uint32_t rank, uint64_t k) {
  const EpochShape s(job);
  if (s.scheme == Scheme::kStrided) return s.StridedPosition(rank, k);
  uint64_t begin = 0;
  uint64_t end = 0;
  s.Slice(s.batch, rank, &begin, &end);
  const uint64_t full = end - begin;
  if (full != 0 && k < s.full_steps * full) {
    return k / full * s.batch + begin + k % full;
  }
  s.Slice(s.tail, rank, &begin, &end);
  return s.Wrap(s.full_steps * s.batch + begin + (k - s.full_steps * full));
}

Status ValidateStreamPoint(const JobSpec& job, StreamPoint p) {
  if (p.epoch >= job.epochs) {
    return Status::InvalidArgument("--start-epoch " + std::to_string(p.epoch) +
                                   " is out of range: the job has " + std::to_string(job.epochs) +
                                   " epochs, write 0 to " + std::to_string(job.epochs - 1));
  }
  const uint64_t steps = StepsPerEpoch(job);
  if (p.step >= steps) {
    return Status::InvalidArgument("--start-step " + std::to_string(p.step) +
                                   " is out of range: an epoch has " + std::to_string(steps) +
                                   " steps, write 0 to " + std::to_string(steps - 1));
  }
  return Status::Ok();
}

RankStream::RankStream(const JobSpec& job, uint32_t rank, StreamPoint start)
    : job_(job), rank_(rank), epoch_(start.epoch), index_(0), step_(start.step) {
  if (Status s = job.Validate(); !s.ok()) {
    throw std::invalid_argument("RankStream: invalid job: " + s.message());
  }
  if (rank >= job.ranks) {
    throw std::out_of_range("RankStream: rank " + std::to_string(rank) + " of " +
                            std::to_string(job.ranks));
  }
  epoch_length_ = RankEpochLength(job, rank);
  steps_ = StepsPerEpoch(job);
  // The end of an epoch is the start of the next one.
  if (epoch_ < job_.epochs && step_ >= steps_) {
    ++epoch_;
    step_ = 0;
  }
  if (epoch_ < job_.epochs) {
    step_range_ = RankStepEntries(job_, rank_, step_);
    index_ = step_range_.begin;
  }
}

void RankStream::LoadEpoch(uint32_t epoch) {
  perm_.resize(job_.samples);
  EpochPermutation(job_.seed, epoch, perm_);
  loaded_ = true;
  loaded_epoch_ = epoch;
}

bool RankStream::Next(Access* out) {
  if (epoch_ >= job_.epochs) return false;
  while (index_ >= step_range_.end) {
    if (++step_ >= steps_) {
      step_ = 0;
      if (++epoch_ >= job_.epochs) return false;
    }
    step_range_ = RankStepEntries(job_, rank_, step_);
    index_ = step_range_.begin;
  }
  if (!loaded_ || loaded_epoch_ != epoch_) LoadEpoch(epoch_);
  out->epoch = epoch_;
  out->step = step_;
  out->index = index_;
  out->sample = perm_[RankEntryPosition(job_, rank_, index_)];
  ++index_;
  return true;
}

}  // namespace nopfs::policy
