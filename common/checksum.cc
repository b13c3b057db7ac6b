#include "common/checksum.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>

namespace nopfs {
#ifdef NOPFS_XXH3_X86
namespace checksum_detail {
uint64_t Xxh3Avx2(const void* p, size_t n);    // checksum_simd.cc, built with -mavx2
uint64_t Xxh3Avx512(const void* p, size_t n);  // the same with -mavx512f
}  // namespace checksum_detail
#endif

namespace {
using Xxh3Fn = uint64_t (*)(const void*, size_t);

uint64_t LibraryXxh3(const void* p, size_t n) {
  return XXH3_64bits(p, n);
}

Xxh3Fn PickXxh3() {
#ifdef NOPFS_XXH3_X86
  // libgcc's check includes the operating system's support (XCR0) for the registers.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return checksum_detail::Xxh3Avx512;
  if (__builtin_cpu_supports("avx2")) return checksum_detail::Xxh3Avx2;
#endif
  return LibraryXxh3;
}

constexpr size_t kStep = 1024;          // bytes hashed per update
constexpr size_t kAhead = 1536;         // prefetch distance ahead of the update
constexpr size_t kLine = 64;            // prefetch granularity
constexpr size_t kMinStreamed = 16384;  // below this, one call (see checksum.h)
}  // namespace

uint64_t Xxh3(std::span<const std::byte> bytes) {
  static const Xxh3Fn xxh3 = PickXxh3();
  return xxh3(bytes.data(), bytes.size());
}

uint64_t ColdXxh3(std::span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  const size_t n = bytes.size();
  if (n < kMinStreamed) return XXH3_64bits(p, n);
  // The first kAhead bytes are requested at once; then each step requests the lines kAhead past
  // its own end, so that memory works on the next steps while this one is hashed.
  for (size_t k = 0; k < kAhead; k += kLine)
    __builtin_prefetch(p + k);
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t off = 0; off < n; off += kStep) {
    const size_t len = std::min(kStep, n - off);
    for (size_t k = off + kAhead; k < std::min(off + kAhead + kStep, n); k += kLine)
      __builtin_prefetch(p + k);
    XXH3_64bits_update(&state, p + off, len);
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace nopfs
