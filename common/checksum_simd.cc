// XXH3_64bits compiled for one vector unit (NOPFS_XXH3_VECTOR, NOPFS_XXH3_NAME), with only the
// C header xxhash.h inlined (XXH_INLINE_ALL: every function static), so that nothing built here
// for AVX2 or AVX-512 can stand in for a function the rest of the program calls on a CPU without
// them. common/checksum.cc picks the function at run time.
#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#define XXH_VECTOR NOPFS_XXH3_VECTOR
#include <xxhash.h>

namespace nopfs::checksum_detail {

uint64_t NOPFS_XXH3_NAME(const void* p, size_t n) {
  return XXH3_64bits(p, n);
}

}  // namespace nopfs::checksum_detail
