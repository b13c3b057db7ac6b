// The checksum nopfs keeps for every sample: XXH3 64-bit (Debian's libxxhash), seed 0.
//
// ColdXxh3 hashes bytes that are most likely not in any cache, such as a RAM-tier copy visited in
// the shuffled order of a stream: the hardware prefetcher starts over at every sample and a plain
// XXH3_64bits then waits on memory for much of each sample (a cold 128 KiB sample at 5.2 GB/s,
// against 7.9 GB/s for memcpy of it, on the 2-core benchmark machine; nopfs_checksum_bench,
// docs/PERFORMANCE.md). ColdXxh3 runs the streaming XXH3 over 1 KiB steps and prefetches 1.5 KiB
// ahead of them (9.3 GB/s there). The value is the same as XXH3_64bits of the same bytes (the
// streaming and one-shot forms agree by definition). Inputs under 16 KiB are hashed in one call
// (not tuned: the streamed form was only measured from 128 KiB up).
//
// Xxh3 is XXH3_64bits with the widest vector unit the CPU has: Debian's libxxhash is built for
// the x86-64 baseline (SSE2), where a warm 128 KiB sample takes 6.5 us on the 2-core benchmark
// machine, against 2.2 us with AVX2 and 1.5-2 us with AVX-512 (docs/PERFORMANCE.md).
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace nopfs {

// XXH3_64bits(bytes), computed with software prefetch for bytes that are not in cache.
uint64_t ColdXxh3(std::span<const std::byte> bytes);

// XXH3_64bits(bytes) (the same value), with AVX-512 or AVX2 where the CPU has them (chosen at the
// first call), else the library's own.
uint64_t Xxh3(std::span<const std::byte> bytes);

}  // namespace nopfs
