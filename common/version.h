// The version nopfs was built as: the project's version in the top CMakeLists.txt, given to every
// target that links nopfs_common as NOPFS_VERSION. Every program prints it for --version, the
// prolog's line and the metrics carry it, so that an admin sees which nopfs ran a job.
#pragma once

#ifndef NOPFS_VERSION
#error "NOPFS_VERSION is set by common/CMakeLists.txt for every target that links nopfs_common"
#endif

namespace nopfs {

inline constexpr const char* kVersion = NOPFS_VERSION;

}  // namespace nopfs
