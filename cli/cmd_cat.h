// `nopfs cat [--verify]`: a client of the local nopfsd. Reads one rank's whole stream (rank and
// socket from NOPFS_RANK and NOPFS_SOCKET unless given) and prints a summary; with --verify it
// reads every sample's file from the PFS and compares the bytes. Its last line reads
// `N samples, M bytes, K mismatches`; the exit status is non-zero on any mismatch or error.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterCat(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
