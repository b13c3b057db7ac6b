// The cross-job catalog cache's file protocol: the per-user cache directory and its checks, the
// entry's name, and installing a finished catalog DB atomically over whatever entry is there so
// that jobs racing on one entry each end with a correct catalog. Internal to the catalog
// (service/catalog/catalog.cc); docs/catalog.md describes the rules.
//
// Thread safety: the functions are reentrant; concurrent processes are what Install is built for.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace nopfs::service::cache {

// mkdir -m mode `path` unless it exists as a directory.
Status EnsureDir(const std::string& path, mode_t mode);

// The per-user cache directory cache_dir/<uid>: created 0700, must be a real directory owned by
// `uid` that no one else can write to (others could plant a catalog otherwise).
Result<std::string> UserCacheDir(const std::string& cache_dir, uint32_t uid);

// The entry of the dataset whose absolute real path is `real` in `user_dir`.
std::string EntryPath(const std::string& user_dir, const std::string& real);

// 16 lowercase hex digits.
std::string Hex16(uint64_t v);

// A name no other process uses: host-unique pid plus a per-process counter and the clock.
std::string UniqueSuffix();

// Removes `.tmp-*` and `.old-*` entries older than six hours from `dir` (left by crashed jobs).
void RemoveStale(const std::string& dir);

// Puts the finished DB `tmp` at `entry`, replacing whatever is there, atomically: readers see
// either the old complete DB or the new complete one (or, without RENAME_EXCHANGE, briefly none).
Status Install(const std::string& tmp, const std::string& entry);

}  // namespace nopfs::service::cache
