// `nopfs stream`: prints one rank's access stream, one sample id per line, epoch after epoch.
// It is the reference that every other implementation (nopfsd, the Python package, tests) is
// checked against.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

// Registers the subcommand; the returned flag is set when it ran with an exit code.
void RegisterStream(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
