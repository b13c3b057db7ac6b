// `nopfs share warm DATASET`: fills the node's shared copy of a dataset the node config declares
// shared (docs/admin.md, "Shared datasets") ahead of the jobs. It walks the dataset as whoever
// runs it and proves each file it can open to the node's share service, which reads the PFS
// itself; a file the caller cannot read is not filled by this call (a job of a user who can read
// it fills it). Prints what was filled.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterShare(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
