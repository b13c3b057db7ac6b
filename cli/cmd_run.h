// `nopfs run --dataset DIR --ranks N [job flags] [--config FILE] -- CMD...`: nopfs without Slurm.
// Starts nopfsd for this node, runs CMD once per local rank as srun would (each with NOPFS_RANK,
// NOPFS_SOCKET and the rest of the NOPFS_* environment), then stops nopfsd, checks that it left
// nothing behind, and prints per source the bytes served and the stall the clients saw.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterRun(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
