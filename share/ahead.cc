#include "share/ahead.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace nopfs::share {
namespace {

// The first request's files; each next request doubles, up to Options::max_batch.
constexpr size_t kFirstBatch = 8;

// An open that failed for want of a resource says nothing about the user's access: that file is
// asked for again at its read.
bool Transient(int open_errno) {
  return open_errno == EMFILE || open_errno == ENFILE || open_errno == ENOMEM ||
         open_errno == EINTR || open_errno == EAGAIN;
}

}  // namespace

AheadReader::AheadReader(ShareClient& client, std::vector<std::string_view> files,
                         std::vector<uint32_t> uses, Options options)
    : client_(client), files_(std::move(files)), options_(options) {
  MutexLock l(&mu_);
  state_.assign(files_.size(), kNotAsked);
  uses_ = std::move(uses);
  uses_.resize(files_.size(), 1);
  for (uint32_t& u : uses_)
    u = std::max<uint32_t>(u, 1);
  batch_ = std::min({kFirstBatch, std::max<size_t>(options_.max_batch, 1), size_t{kMaxBatch}});
}

AheadReader::~AheadReader() {
  Stop();
}

void AheadReader::Start() {
  if (!threads_.empty()) return;
  {
    MutexLock l(&mu_);
    stop_ = false;
  }
  for (unsigned t = 0; t < std::max(1u, options_.threads); ++t)
    threads_.emplace_back([this] { AskLoop(); });
}

void AheadReader::Stop() {
  {
    MutexLock l(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  for (std::thread& t : threads_)
    t.join();
  threads_.clear();
}

size_t AheadReader::held() const {
  MutexLock l(&mu_);
  return held_.size();
}

bool AheadReader::MakeRoom(size_t room) {
  while (held_.size() + asking_ + room > options_.max_held && !held_.empty() &&
         held_.begin()->first < furthest_) {
    const size_t i = held_.begin()->first;
    held_.erase(held_.begin());
    state_[i] = kDone;
  }
  return held_.size() + asking_ + room <= options_.max_held;
}

void AheadReader::Release(size_t index) {
  if (uses_[index] > 1) {
    --uses_[index];
    return;
  }
  uses_[index] = 0;
  held_.erase(index);
  state_[index] = kDone;
  cv_.SignalAll();
}

void AheadReader::AskLoop() {
  std::vector<size_t> batch;
  std::vector<std::string> rels;
  while (true) {
    batch.clear();
    {
      MutexLock l(&mu_);
      while (true) {
        if (stop_) return;
        // Files far behind the furthest read are left to their reads (asked alone): the
        // descriptors go to what is ahead.
        const size_t slack = options_.max_held / 2;
        if (furthest_ > slack) next_ = std::max(next_, furthest_ - slack);
        while (next_ < files_.size() && state_[next_] != kNotAsked)
          ++next_;
        if (next_ >= files_.size()) return;
        if (MakeRoom(1)) break;
        cv_.Wait(&mu_);
      }
      const size_t room = options_.max_held - held_.size() - asking_;
      const size_t want = std::min(batch_, room);
      for (; next_ < files_.size() && batch.size() < want; ++next_) {
        if (state_[next_] != kNotAsked) continue;
        state_[next_] = kAsking;
        batch.push_back(next_);
      }
      asking_ += batch.size();
      batch_ = std::min({batch_ * 2, options_.max_batch, size_t{kMaxBatch}});
    }
    rels.clear();
    for (size_t i : batch)
      rels.emplace_back(files_[i]);
    Result<std::vector<ShareClient::Copy>> got = client_.Ask(Op::kOpen, rels);
    MutexLock l(&mu_);
    asking_ -= batch.size();
    cv_.SignalAll();
    if (!got.ok()) {
      // The service could not be asked: each read asks alone (and reads the PFS when that fails
      // too); the asking stops rather than fail again and again.
      for (size_t i : batch)
        state_[i] = kNotAsked;
      stop_ = true;
      return;
    }
    asked_ahead_.fetch_add(batch.size());
    for (size_t k = 0; k < batch.size(); ++k) {
      const size_t i = batch[k];
      ShareClient::Copy& c = (*got)[k];
      if (c.outcome == Outcome::kReady && c.fd.valid()) {
        held_[i] = Held{std::make_shared<const UniqueFd>(std::move(c.fd)), c.size};
        state_[i] = kHeld;
      } else if (c.outcome == Outcome::kBusy ||
                 (c.outcome == Outcome::kDenied && Transient(c.open_errno))) {
        state_[i] = kNotAsked;  // asked again, alone, at its read
      } else {
        state_[i] = kNoCopy;
      }
    }
  }
}

Status AheadReader::ReadCopy(const UniqueFd& fd, uint64_t size, uint64_t offset,
                             std::span<std::byte> dst) {
  if (offset > size || dst.size() > size - offset) {
    return Status::NotFound("the shared copy is shorter than the catalog says");
  }
  size_t done = 0;
  while (done < dst.size()) {
    const ssize_t n =
        ::pread(fd.get(), dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::NotFound("reading the shared copy failed");
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status AheadReader::ReadAlone(const std::string& rel, uint64_t offset, std::span<std::byte> dst) {
  asked_alone_.fetch_add(1);
  Result<std::vector<ShareClient::Copy>> got = client_.Ask(Op::kOpen, std::span(&rel, 1));
  if (!got.ok()) return got.status();
  ShareClient::Copy& c = (*got)[0];
  if (c.outcome != Outcome::kReady) return Status::NotFound("not in the shared copy");
  return ReadCopy(c.fd, c.size, offset, dst);
}

Status AheadReader::Read(size_t index, uint64_t offset, std::span<std::byte> dst) {
  if (index >= files_.size()) {
    return Status::InvalidArgument("share: file " + std::to_string(index) + " is not in the order");
  }
  Held h;
  {
    MutexLock l(&mu_);
    furthest_ = std::max(furthest_, index + 1);
    while (state_[index] == kAsking)
      cv_.Wait(&mu_);
    switch (state_[index]) {
      case kHeld:
        h = held_.at(index);
        Release(index);
        break;
      case kNoCopy:
        Release(index);
        return Status::NotFound("not in the shared copy");
      default:
        // Not reached yet, closed, or busy when asked: this read asks alone; the asking skips it.
        state_[index] = kDone;
        cv_.SignalAll();
        break;
    }
  }
  if (h.fd) {
    read_ahead_.fetch_add(1);
    return ReadCopy(*h.fd, h.size, offset, dst);
  }
  return ReadAlone(std::string(files_[index]), offset, dst);
}

}  // namespace nopfs::share
