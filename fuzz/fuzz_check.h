// What the fuzz targets share: NOPFS_FUZZ_CHECK, which turns a broken property into a crash that
// libFuzzer records (abort), naming the property, and helpers to view fuzz input as bytes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>
#include <vector>

#define NOPFS_FUZZ_CHECK(cond)                                                            \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "nopfs: fuzz: property broken: %s (%s:%d)\n", #cond, __FILE__, \
                   __LINE__);                                                             \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

namespace nopfs::fuzz {

inline std::span<const std::byte> AsBytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

inline std::string_view AsText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

inline bool SameBytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace nopfs::fuzz
