// `nopfs config FILE [--policy FILE ...]`: loads a node config the way nopfsd and the Slurm
// plugin will, prints what it resolved to (classes, capacities, bandwidth tables, limits), and
// with --policy asks the admission policy about a job described by flags. Admins run it before
// deploying a change; a bad file fails with the file, line and field.
#pragma once

#include <CLI/CLI.hpp>

namespace nopfs::cli {

void RegisterConfig(CLI::App* app, int* exit_code);

}  // namespace nopfs::cli
