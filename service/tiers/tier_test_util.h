// Helpers shared by the tier tests: deterministic sample contents and a temporary scratch root.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/status.h"
#include "policy/plan.h"

namespace nopfs::service::testing {

// Byte j of sample k: depends on both, so a misplaced or swapped sample is visible.
inline std::byte ContentByte(policy::SampleId k, uint64_t j) {
  return static_cast<std::byte>((k * 131u + j * 7u + (j >> 9) + 1u) & 0xffu);
}

inline void FillContent(policy::SampleId k, std::span<std::byte> dst) {
  for (uint64_t j = 0; j < dst.size(); ++j)
    dst[j] = ContentByte(k, j);
}

inline std::vector<std::byte> Content(policy::SampleId k, uint64_t size) {
  std::vector<std::byte> v(size);
  FillContent(k, v);
  return v;
}

inline uint64_t ContentHash(policy::SampleId k, uint64_t size) {
  const auto v = Content(k, size);
  return XXH3_64bits(v.data(), v.size());
}

// A plan holding `order` (in that prefetch order) with the bytes summed from sizes.
inline policy::TierPlan PlanOf(std::vector<policy::SampleId> order,
                               std::span<const uint64_t> sizes) {
  policy::TierPlan p;
  for (auto s : order)
    p.bytes += sizes[s];
  p.prefetch_order = std::move(order);
  return p;
}

// A fresh directory under `base` (default /tmp or $TMPDIR), removed at destruction.
class TempDir {
 public:
  explicit TempDir(const char* base = nullptr) {
    if (base == nullptr) base = std::getenv("TMPDIR");
    std::string t = std::string(base != nullptr ? base : "/tmp") + "/nopfs-tiers-test.XXXXXX";
    if (mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A FetchFn serving the deterministic contents of ContentByte.
inline Result<uint64_t> FetchContent(policy::SampleId k, std::span<std::byte> dst) {
  FillContent(k, dst);
  return XXH3_64bits(dst.data(), dst.size());
}

// Number of open descriptors of this process.
inline uint64_t OpenFdCount() {
  uint64_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
    ++n;
  return n;
}

}  // namespace nopfs::service::testing
