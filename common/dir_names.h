// The names in a directory, read through its descriptor: for code that must not follow a path
// again once it holds the directory (root working in a user's tree).
//
// Thread safety: reentrant.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace nopfs {

// The names in the directory `dir_fd` but "." and "..", sorted. `dir_fd` stays open and at its
// place (the listing goes through a descriptor of its own). An error names `shown`.
Result<std::vector<std::string>> DirNames(int dir_fd, const std::string& shown);

}  // namespace nopfs
